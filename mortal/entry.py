"""Start-up shared by the command-line entry points: ``parser`` (adds ``-c/--config``), ``start`` and
``load_config``/``load_config_or_exit``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Iterable, Mapping

from mortal import config as mcfg

LOG_FORMAT = '%(asctime)s %(levelname)s %(name)s: %(message)s'
CONFIG_HELP = 'config file (default: $MORTAL_CFG or config.toml)'


def parser(description: str | None = None, *, config: bool = True, **kwargs) -> argparse.ArgumentParser:
    """An ``argparse.ArgumentParser(description=..., **kwargs)`` that takes ``-c/--config PATH`` unless
    ``config`` is False (``args.config`` is None when it is not given: :func:`load_config` then falls back to
    ``$MORTAL_CFG``, else ``config.toml``)."""
    p = argparse.ArgumentParser(description=description, **kwargs)
    if config:
        p.add_argument('-c', '--config', default=None, help=CONFIG_HELP)
    return p


def drop_rust_backtrace() -> None:
    """Unset ``RUST_BACKTRACE`` for this process and the ones it starts: with it set, every error that the
    mjai/riichienv bindings raise (a refused action, a bad log) first collects a full backtrace, which is slow."""
    os.environ.pop('RUST_BACKTRACE', None)


def apply_env(env: Mapping[str, str] = os.environ) -> mcfg.EnvOverrides:
    """Read the environment overrides once (``mortal.config.EnvOverrides``) and apply the process-wide one:
    ``MORTAL_SP_THREADS`` becomes ``mortal.features.obs_v4.SP_THREADS``. Returns the overrides, to pass down."""
    overrides = mcfg.EnvOverrides.from_env(env)
    # A process that never loads the version-4 search keeps it unloaded; one that has it gets the value (None too,
    # so that a second start in the same process, e.g. a test, does not keep the first one's).
    if overrides.sp_threads is not None or 'mortal.features.obs_v4' in sys.modules:
        from mortal.features import obs_v4
        obs_v4.SP_THREADS = overrides.sp_threads
    return overrides


def start(parser: argparse.ArgumentParser, argv: list[str] | None = None, *,
          log_level: int | None = logging.INFO) -> argparse.Namespace:
    """Parse ``argv`` (usage error: status 2) and prepare the process (:func:`drop_rust_backtrace`, logging at
    ``log_level`` in ``LOG_FORMAT`` unless None, :func:`apply_env`); the arguments plus ``args.overrides``."""
    drop_rust_backtrace()
    args = parser.parse_args(argv)
    if log_level is not None:
        logging.basicConfig(level=log_level, format=LOG_FORMAT, handlers=[AboveBars(sys.stderr)])
    args.overrides = apply_env()
    return args


class AboveBars(logging.StreamHandler):
    """A stream handler that writes each line above the tqdm bars drawn on its stream (``tqdm.write``), so that a
    line logged while the TRAIN or game bar is drawn is not glued to it."""

    def emit(self, record):
        try:
            from tqdm import tqdm
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def error(message, status: int = 2) -> int:
    """Report a user error as one ``error: <message>`` line on stderr (no traceback) and return ``status``, for
    ``return entry.error(exc)`` in a ``main()`` (2: bad config or input, as argparse's usage errors)."""
    print(f'error: {message}', file=sys.stderr)
    return status


def load_config(args: argparse.Namespace, required: mcfg.Required) -> dict:
    """The config of ``args.config`` (else ``$MORTAL_CFG``, else ``config.toml``) with the ``required``
    sections; raises ``ConfigError``, also for version 4 without the compiled single-player core."""
    config = mcfg.load_config(args.config, required=required, env=args.overrides)
    problem = sp_core_problem(config, required)
    if problem:
        raise mcfg.ConfigError(mcfg.resolve_path(args.config, args.overrides), [problem])
    return config


def sp_core_problem(config: dict, required: mcfg.Required) -> str | None:
    """``mortal.features.sp.calc.CORE_MISSING`` when the process (its ``required`` sections include ``[control]``)
    is asked for ``[control] version = 4`` and the compiled core is not built, else None: the process then stops
    at start-up with that one line rather than at its first version-4 observation."""
    names = required(config) if callable(required) else required
    if 'control' not in names or mcfg.typed(config).control.version != 4:
        return None
    from mortal.features.sp import calc
    return None if calc.HAVE_CORE else calc.CORE_MISSING


def load_config_or_exit(args: argparse.Namespace, required: mcfg.Required) -> dict:
    """:func:`load_config`, but a ``ConfigError`` becomes one ``error: ...`` line on stderr and exit status 2
    (``SystemExit``)."""
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
    """One line, naming the key and the fix, for each of ``keys`` (dotted) whose device this torch cannot use: not
    a device string, not ``cpu``/``cuda[:N]``/``mps``, no MPS, no CUDA build or GPU, an index beyond the GPUs."""
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
    """At process start: each of :func:`device_problems` as one ``error: ...`` line on stderr, then exit status 2
    (``SystemExit``); nothing when every device of ``keys`` is usable."""
    problems = device_problems(config, keys)
    for line in problems:
        error(line)
    if problems:
        raise SystemExit(2)


# -- what a process runs with, and why it stopped ---------------------------------------------------------------

#: The keys a user tunes, per process, as ``table.key`` (``train_play`` stands for the profile in use): what
#: :func:`log_settings` prints at start. Not every key: the rest is in the file.
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


def settings_lines(config: dict, keys, env=os.environ) -> list[str]:
    """One line per table of ``keys`` (``SETTINGS``' form), in their order, with the loaded (effective) values:
    ``[control] version = 3, device = 'cpu', batch_size = 64``. ``train_play`` is the ``[train_play.<profile>]``
    of ``TRAIN_PLAY_PROFILE`` in ``env``; a table the config lacks is left out."""
    from mortal.util.config_diff import shown
    tables = {}
    for dotted in keys:
        table, name = dotted.rsplit('.', 1)
        if table == 'train_play':
            table = mcfg.profile_table(mcfg.profile_name(env))
        tables.setdefault(table, []).append(name)
    lines = []
    for table, names in tables.items():
        try:
            sec = mcfg.section(config, table)
        except KeyError:  # a table this config does not have
            continue
        lines.append(f'[{table}] ' + ', '.join(f'{n} = {shown(getattr(sec, n))}' for n in names))
    return lines


def log_settings(log: logging.Logger, config: dict, process: str, path: str | None = None, env=os.environ) -> None:
    """Log at INFO the ``SETTINGS`` of ``process`` in ``config`` (as loaded: defaults filled), one line per table
    after a line naming the config file (``path``, else ``MORTAL_CFG`` of ``env``, else ``config.toml``; ``env``
    also gives ``TRAIN_PLAY_PROFILE``)."""
    log.info('settings (config %s):', os.path.abspath(mcfg.resolve_path(path, env)))
    for line in settings_lines(config, SETTINGS[process], env):
        log.info('  %s', line)


class Stopped(KeyboardInterrupt):
    """A stop signal turned into an exception (:func:`stop_on_sigterm`), so that a ``main()`` unwinds as on Ctrl-C
    (every ``except KeyboardInterrupt`` still applies) and can say why it stopped (:func:`stop_cause`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def stop_on_sigterm():
    """SIGTERM raises :class:`Stopped` in the main thread from now on, so the process can say why it stops;
    returns the previous handler (None outside the main thread, where nothing is set)."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _raise_stopped)
    return None


def stop_cause(exc: BaseException) -> str:
    """The signal behind a stop, by name: ``'SIGTERM'`` for :class:`Stopped` of SIGTERM, ``'SIGINT'`` for any
    other KeyboardInterrupt (Ctrl-C)."""
    return signal.Signals(exc.signum).name if isinstance(exc, Stopped) else 'SIGINT'


def stop_status(exc: BaseException, default: int = 0) -> int:
    """The exit status after a stop: 128 + the signal number for :class:`Stopped` (what a shell reports for a
    process the signal ended), ``default`` for Ctrl-C."""
    return 128 + exc.signum if isinstance(exc, Stopped) else default
