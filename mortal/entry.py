"""Start-up shared by the command-line entry points (``mortal.server``, ``mortal.client``, ``mortal.train``, ...).

A ``main()`` builds its parser with :func:`parser` (which adds ``-c/--config``), hands it to :func:`start`, which
parses the arguments and prepares the process once, and reads its config with :func:`load_config` or
:func:`load_config_or_exit`::

    def main(argv=None):
        args = entry.start(entry.parser('What it does.'), argv)
        config = entry.load_config_or_exit(args, SERVER_SECTIONS)

The ``sys.path`` line of a module run as a script (``python mortal/server.py``) stays in that module: it is what
makes this package importable in the first place.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
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
    """Parse ``argv`` (None: ``sys.argv[1:]``; a usage error exits with status 2, as argparse does) and prepare
    the process: :func:`drop_rust_backtrace`, logging to stderr at ``log_level`` in ``LOG_FORMAT`` (None: logging
    is left as it is), :func:`apply_env`.

    Returns the parsed arguments plus ``args.overrides``, the ``EnvOverrides`` to pass down (``env=``).
    """
    drop_rust_backtrace()
    args = parser.parse_args(argv)
    if log_level is not None:
        logging.basicConfig(level=log_level, format=LOG_FORMAT)
    args.overrides = apply_env()
    return args


def error(message, status: int = 2) -> int:
    """Report a user error as one ``error: <message>`` line on stderr (no traceback) and return ``status``, for
    ``return entry.error(exc)`` in a ``main()`` (2: bad config or input, as argparse's usage errors)."""
    print(f'error: {message}', file=sys.stderr)
    return status


def load_config(args: argparse.Namespace, required: mcfg.Required) -> dict:
    """The config of ``args.config`` (else ``$MORTAL_CFG``, else ``config.toml``) with the ``required`` sections
    (names, or a function of the file's dict: ``mortal.config.Required``), read with ``args.overrides``; raises
    ``mortal.config.ConfigError`` (for a ``main()`` that reports it its own way)."""
    return mcfg.load_config(args.config, required=required, env=args.overrides)


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
    """One line for each of ``keys`` (dotted, e.g. ``'control.device'``) whose value in ``config`` is a CUDA device
    that this torch cannot use, naming the key and both fixes: a CUDA build of torch (or a visible GPU, when this
    torch has CUDA) or ``device = 'cpu'``. ``[]`` when every device is usable or not CUDA. Imports torch."""
    cuda = [(dotted, value) for dotted in keys
            if isinstance(value := mcfg.lookup(config, dotted), str) and value.strip().lower().startswith('cuda')]
    if not cuda:
        return []
    import torch
    if torch.cuda.is_available():
        return []
    out = []
    for dotted, value in cuda:
        *table, name = mcfg.table_path(dotted)
        key = f'[{mcfg.table_name(table)}] {name}'
        if not torch.backends.cuda.is_built():
            out.append(f"{key} = {value!r}, but this torch ({torch.__version__}) is a CPU-only build: install a "
                       f"CUDA build of torch, or set {key} = 'cpu'")
        else:
            out.append(f"{key} = {value!r}, but torch sees no CUDA device (driver, CUDA_VISIBLE_DEVICES): make a "
                       f"GPU visible, or set {key} = 'cpu'")
    return out


def check_devices(config: dict, keys: Iterable[str]) -> None:
    """At process start: each of :func:`device_problems` as one ``error: ...`` line on stderr, then exit status 2
    (``SystemExit``); nothing when every device of ``keys`` is usable."""
    problems = device_problems(config, keys)
    for line in problems:
        error(line)
    if problems:
        raise SystemExit(2)
