"""Start-up shared by the command-line entry points."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Iterable

from mortal import config as mcfg

LOG_FORMAT = '%(asctime)s %(levelname)s %(name)s: %(message)s'


def parser(description: str | None = None, *, config: bool = True, **kwargs) -> argparse.ArgumentParser:
    """An ``argparse.ArgumentParser`` with ``-c/--config PATH`` unless ``config`` is False."""
    p = argparse.ArgumentParser(description=description, **kwargs)
    if config:
        p.add_argument('-c', '--config', default=None, help='config file (default: $MORTAL_CFG or config.toml)')
    return p


def drop_rust_backtrace() -> None:
    """Unset ``RUST_BACKTRACE`` here and in children (every Rust error would collect a slow backtrace)."""
    os.environ.pop('RUST_BACKTRACE', None)


def apply_env() -> mcfg.EnvOverrides:
    """Read the environment overrides once, set ``obs_v4.SP_THREADS``, and return them to pass down."""
    overrides = mcfg.EnvOverrides.from_env()
    # A process that never loads the version-4 search keeps it unloaded; one that has it gets the value (None too,
    # so that a second start in the same process, e.g. a test, does not keep the first one's).
    if overrides.sp_threads is not None or 'mortal.features.obs_v4' in sys.modules:
        from mortal.features import obs_v4
        obs_v4.SP_THREADS = overrides.sp_threads
    return overrides


def start(parser: argparse.ArgumentParser, argv: list[str] | None = None, *,
          log_level: int | None = logging.INFO) -> argparse.Namespace:
    """Parse ``argv`` (usage error: status 2) and prepare the process; the arguments plus ``args.overrides``."""
    drop_rust_backtrace()
    args = parser.parse_args(argv)
    if log_level is not None:
        logging.basicConfig(level=log_level, format=LOG_FORMAT, handlers=[AboveBars(sys.stderr)])
    args.overrides = apply_env()
    return args


class AboveBars(logging.StreamHandler):
    """A stream handler writing above the tqdm bars (``tqdm.write``) so a log line is not glued to a bar. On a
    terminal the line is cleared first: the supervisor's lines come while its learner's full-width bar is drawn."""

    def emit(self, record):
        try:
            from tqdm import tqdm
            isatty = getattr(self.stream, 'isatty', None)
            clear = '\r\x1b[K' if isatty is not None and isatty() else ''  # another process's bar: erased
            tqdm.write(clear + self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def error(message, status: int = 2) -> int:
    """Print one ``error: <message>`` line on stderr and return ``status`` (2: bad config or input)."""
    print(f'error: {message}', file=sys.stderr)
    return status


def load_config(args: argparse.Namespace, required: mcfg.Required) -> dict:
    """The config of ``args.config`` with the ``required`` sections; ``ConfigError``, also for v4 without the core."""
    config = mcfg.load_config(args.config, required=required, env=args.overrides)
    names = required(config) if callable(required) else required
    if 'control' in names and mcfg.typed(config).control.version == 4:
        from mortal.features.sp import calc
        if not calc.HAVE_CORE:
            raise mcfg.ConfigError(mcfg.resolve_path(args.config, args.overrides), [calc.CORE_MISSING])
    return config


def load_config_or_exit(args: argparse.Namespace, required: mcfg.Required) -> dict:
    """``load_config``; a ``ConfigError`` becomes one ``error: ...`` line and exit status 2."""
    try:
        return load_config(args, required)
    except mcfg.ConfigError as exc:
        raise SystemExit(error(exc)) from None


#: The device keys of each process (dotted, for :func:`check_devices`); a key the file lacks is skipped.
TRAIN_DEVICES = ('control.device', 'baseline.test.device')
CLIENT_DEVICES = ('control.device', 'baseline.train.device')
GRP_DEVICES = ('grp.control.device',)
ONE_VS_THREE_DEVICES = ('1v3.challenger.device', '1v3.champion.device')


def device_problems(config: dict, keys: Iterable[str]) -> list[str]:
    """One line (key and fix) per device of ``keys`` this torch cannot use."""
    given = [(dotted, value) for dotted in keys if isinstance(value := mcfg.lookup(config, dotted), str)]
    if not given:
        return []
    import torch
    out = []
    for dotted, value in given:
        *table, name = mcfg.table_path(dotted)
        key = f'[{mcfg.table_name(table)}] {name}'
        shown = repr(value[:200]) + ('...' if len(value) > 200 else '')
        try:
            device = torch.device(value)
        except (RuntimeError, ValueError) as e:
            out.append(f"{key} = {shown} is not a torch device ({str(e).splitlines()[0][:120]}): use 'cpu', "
                       f"'cuda', 'cuda:N' or 'mps'")
            continue
        if device.type == 'cpu':
            continue
        if device.type == 'mps':
            if not torch.backends.mps.is_available():
                out.append(f"{key} = {shown}, but this torch ({torch.__version__}) cannot use an Apple GPU (mps): "
                           f"set {key} = 'cpu'")
        elif device.type != 'cuda':
            out.append(f"{key} = {shown} is a {device.type!r} device, which the processes do not run on: use "
                       f"'cpu', 'cuda', 'cuda:N' or 'mps'")
        elif not torch.backends.cuda.is_built():
            out.append(f"{key} = {shown}, but this torch ({torch.__version__}) is a CPU-only build: install a "
                       f"CUDA build of torch, or set {key} = 'cpu'")
        elif not torch.cuda.is_available():
            out.append(f"{key} = {shown}, but torch sees no CUDA device (driver, CUDA_VISIBLE_DEVICES): make a "
                       f"GPU visible, or set {key} = 'cpu'")
        elif device.index is not None and device.index >= torch.cuda.device_count():
            out.append(f"{key} = {shown}, but torch sees {torch.cuda.device_count()} CUDA device(s) (indices from "
                       f"0): set a visible index, or {key} = 'cpu'")
    return out


def check_devices(config: dict, keys: Iterable[str]) -> None:
    """Exit with status 2 after one ``error: ...`` line per ``device_problems``; nothing when all are usable."""
    problems = device_problems(config, keys)
    for line in problems:
        error(line)
    if problems:
        raise SystemExit(2)


#: The keys a user tunes, per process (``train_play``: the profile in use), which ``log_settings`` prints.
SETTINGS = {
    'learner': ('control.version', 'control.online', 'control.device', 'control.batch_size',
                'control.opt_step_every', 'control.save_every', 'control.test_every', 'control.submit_every',
                'control.enable_amp', 'control.state_file', 'control.best_state_file', 'control.tensorboard_dir',
                'optim.scheduler.peak', 'test_play.games', 'test_play.best_rule', 'test_play.min_deals',
                'baseline.test.state_file', 'online.remote.host', 'online.remote.port'),
    'client': ('control.version', 'control.device', 'train_play.games', 'train_play.boltzmann_epsilon',
               'train_play.boltzmann_temp', 'train_play.top_p', 'train_play.repeats', 'train_play.log_dir',
               'baseline.train.state_file', 'online.history_window', 'online.no_param_warn_minutes',
               'online.remote.host', 'online.remote.port'),
    'server': ('online.remote.host', 'online.remote.port', 'online.server.capacity',
               'online.server.force_sequential', 'online.server.buffer_dir', 'online.server.drain_dir'),
}


def log_settings(log: logging.Logger, config: dict, process: str, path: str | None = None, env=os.environ) -> None:
    """Log at INFO the config file's name, then one line per table of ``SETTINGS[process]`` with the effective
    values (``[control] version = 3, device = 'cpu', batch_size = 64``); tables the config lacks are left out."""
    from mortal.util.config_diff import shown
    log.info('settings (config %s):', os.path.abspath(mcfg.resolve_path(path, env)))
    tables = {}
    for dotted in SETTINGS[process]:
        table, name = dotted.rsplit('.', 1)
        if table == 'train_play':
            table = mcfg.profile_table(mcfg.profile_name(env))
        tables.setdefault(table, []).append(name)
    for table, names in tables.items():
        try:
            sec = mcfg.section(config, table)
        except KeyError:  # a table this config does not have
            continue
        log.info('  [%s] %s', table, ', '.join(f'{n} = {shown(getattr(sec, n))}' for n in names))


class Stopped(KeyboardInterrupt):
    """A stop signal as an exception (a KeyboardInterrupt), so ``main()`` unwinds as on Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def stop_on_sigterm():
    """SIGTERM raises ``Stopped`` in the main thread from now on; returns the previous handler."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _raise_stopped)
    return None


@contextlib.contextmanager
def stops_deferred():
    """SIGINT and SIGTERM that arrive inside are handled on leaving, by the handlers in place before (``Stopped``,
    ``KeyboardInterrupt``, ...), so that a stop never cuts a file write in half. Main thread only (elsewhere a no-op);
    start no long wait inside: a stop waits for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in stops}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if got:  # the first stop, as its own handler would have taken it
        handler = previous[got[0]]
        if callable(handler):
            handler(got[0], None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), got[0])


def stop_cause(exc: BaseException) -> str:
    """``'SIGTERM'`` for ``Stopped`` of SIGTERM, else ``'SIGINT'``."""
    return signal.Signals(exc.signum).name if isinstance(exc, Stopped) else 'SIGINT'


def stop_status(exc: BaseException, default: int = 0) -> int:
    """Exit status after a stop: 128 + the signal for ``Stopped``, ``default`` for Ctrl-C."""
    return 128 + exc.signum if isinstance(exc, Stopped) else default
