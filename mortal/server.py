"""Parameter store and replay buffer between self-play clients and the trainer (Mortal's ``server.py``).

The state and the buffer are ``mortal.net.replay_store.ReplayStore``, the TCP front
``mortal.net.param_server.ParamServer``; this module builds both from the config and runs them. The requests,
their replies and the limits on hostile peers: docs/operations.md and docs/architecture.md."""

if __package__ in (None, ''):  # run as a script: python mortal/server.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import errno
import logging

from mortal.config import section
from mortal.net import wire
from mortal.net.param_server import ParamServer
from mortal.net.replay_store import ReplayStore

logger = logging.getLogger('mortal.server' if __name__ == '__main__' else __name__)


class ServerStartError(RuntimeError):
    """The server cannot listen on its address; raised before anything on disk is touched."""


def build_server(config: dict) -> ParamServer:
    """Create the store from ``[online.server]``, bind to ``[online.remote]``, then clear the dirs.

    Binding comes first so that a second server with the same config fails on the busy port before it wipes the
    running one's buffer. Raises ServerStartError (also when a dir cannot be emptied), ValueError (unsafe bind, bad
    limits)."""
    cfg = section(config, 'online.server')  # typed, with the defaults of mortal/config_schema.py
    remote = wire.Remote.from_config(section(config, 'online.remote'), cfg)
    store = ReplayStore(cfg.buffer_dir, cfg.drain_dir, cfg.capacity, cfg.force_sequential)
    address = (remote.host, remote.port)
    try:
        server = ParamServer(address, store, token=remote.token, max_frame_size=remote.max_frame_size,
                             timeout=remote.timeout, max_pending=cfg.max_pending_connections,
                             max_inflight_bytes=cfg.max_inflight_bytes, payload_min_rate=cfg.payload_min_bytes_per_s)
    except OSError as ex:
        hint = (' (is a server with this config already running? its buffer_dir and drain_dir were left alone)'
                if ex.errno == errno.EADDRINUSE else '')
        raise ServerStartError(f'cannot listen on {address[0]}:{address[1]} ([online.remote] host/port): '
                               f'{ex.strerror or ex}{hint}') from None
    try:
        store.reset_dirs()
    except BaseException as ex:
        server.server_close()
        if isinstance(ex, OSError):  # a file in the way, a folder holding a config: one line, not a traceback
            raise ServerStartError(f'[online.server] buffer_dir / drain_dir cannot be emptied: {ex}') from None
        raise
    return server


def main(argv=None):
    """Entry point: ``python mortal/server.py`` (config from MORTAL_CFG or ``--config``)."""
    from mortal import entry
    from mortal.config import SERVER_SECTIONS
    args = entry.start(entry.parser(__doc__.splitlines()[0]), argv)
    config = entry.load_config_or_exit(args, SERVER_SECTIONS)
    entry.log_settings(logger, config, 'server', args.config, args.overrides)
    entry.stop_on_sigterm()
    try:
        server = build_server(config)
    except ServerStartError as ex:
        logger.error("%s", ex)  # one line, no traceback
        raise SystemExit(2) from None
    with server:
        host, port = server.server_address[:2]
        try:  # from the line a supervisor waits for on: a SIGTERM right after it is still a clean stop
            logger.info('listening on %s:%d (capacity %d, force_sequential %s)', host, port,
                        server.store.capacity, server.store.force_sequential)
            server.serve_forever()
        except KeyboardInterrupt as exc:  # also SIGTERM (entry.stop_on_sigterm)
            logger.info('stopped on %s; %s', entry.stop_cause(exc), stop_summary(server.store))
            raise SystemExit(entry.stop_status(exc)) from None


def stop_summary(store: ReplayStore) -> str:
    """What a stopping server discards: its buffered logs and the parameters it holds in memory."""
    buffered = store.buffered()
    logs = (f'{buffered} buffered logs discarded (buffer_dir is emptied at the next start)' if buffered
            else 'no buffered log discarded')
    held = (f'parameters version {store.param_version} dropped from memory (the trainer submits them again)'
            if store.mortal_param is not None else 'no parameters held')
    return f'{logs}; {held}'


if __name__ == '__main__':
    main()
