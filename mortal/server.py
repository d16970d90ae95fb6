"""Parameter store and replay buffer between self-play clients and the trainer (Mortal's ``server.py``).

Behaviour as Mortal's server, with its faults fixed:
- ``get_param`` answers 'samples overflow' while the buffer holds >= ``capacity`` logs, 'empty param' before the
  trainer's first submission, 'trainer is busy' under ``force_sequential`` when the client already has the newest
  idle version, else the parameters.
- ``submit_replay`` stores each log as ``{submission_id}_{name}`` (two submissions never overwrite each other),
  written under a temporary name and renamed, so a crash leaves no half-written log; each log remembers the
  ``param_version`` it was played with, so the trainer can measure staleness. Every log must start with an mjai
  ``start_game`` line (gzip or plain), else the request is a 'bad request' and nothing is stored. A submission
  is stored whole or not at all: a disk failure (e.g. an unwritable ``buffer_dir``) is answered 'error'.
- ``submit_param`` bumps ``param_version`` (and the idle version when ``is_idle``). Its key names, dtypes and
  shapes (read from the safetensors headers; no network is built) must match the first accepted submission of
  this server's lifetime unless the request says ``arch_change: true``; empty state dicts are always refused.
- ``submit_param`` may carry the trainer's play settings (``steps``, ``epsilon_factor``, ``temp_factor``,
  ``baseline_version``: ``mortal.learning.server_traffic.play_settings``); they are checked (finite, in
  range) and handed to every client with the parameters. A trainer that sends none leaves Mortal's (factors 1,
  version 0).
- ``submit_baseline`` stores the trainer's ``[baseline.train]`` weights (safetensors, key names, dtypes and shapes
  read from the headers), their architecture, version and digest (``wire.baseline_digest``, checked by the client
  that fetches them); every 'ok' ``get_param`` reply then names the digest, and ``get_baseline`` hands the
  weights to a client whose own file lacks or differs from them ('empty baseline' before any submission). Kept
  in memory only: the trainer submits it again at each start and after a server restart.
- ``drain`` moves the whole buffer into a freshly emptied ``drain_dir`` (under ``force_sequential`` only once the
  buffer is full) and answers ``{count, drain_dir, files, param_versions, ...}``. A drain that fails midway
  answers 'error' and keeps the logs it moved in ``drain_dir`` for the next drain: none is lost or duplicated.
- Both dirs are cleared and recreated at start. Counts come only from files this server wrote: stray entries are
  logged and ignored in ``buffer_dir``, logged and removed when ``drain_dir`` is emptied.
- Every request is one connection; a malformed frame closes that connection only (see ``mortal/net/wire.py``).
  The header's MAC is checked before any payload is read; at most ``max_pending_connections`` connections may
  be unauthenticated at once (a new one closes the oldest; a header must come within 5 s; a bad MAC closes at
  once), and payloads being read or handled hold at most ``max_inflight_bytes`` bytes together, taken as they
  arrive (small frames such as get_param have a share of their own); a payload must keep
  ``payload_min_bytes_per_s`` over every 2 s or is closed, and so must a reply (sent without a copy of the
  parameters); a request's msgpack objects are counted before it is decoded (no decoding bomb); at most 256
  connections are served at once; a new frame that waited 1 s for a full budget preempts the slowest readers. An
  authentic frame above ``max_frame_bytes`` is answered 'bad request' naming the limit. ``submit_param``'s
  ``learner`` must be printable (it is logged).
- Each server instance has a random ``server_id``; a client or trainer that reconnects after a restart is
  recognised as holding no parameters of this instance (otherwise ``force_sequential`` would deadlock).

The state and the buffer are ``mortal.net.replay_store.ReplayStore``, the TCP front is
``mortal.net.param_server.ParamServer``; this module builds both from the config and runs them.
"""

if __package__ in (None, ''):  # run as a script: python mortal/server.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import errno
import logging
from typing import Optional

from mortal.config import section
from mortal.net import wire
from mortal.net.param_server import ParamServer, check_bind_security
from mortal.net.replay_store import ReplayStore

logger = logging.getLogger('mortal.server' if __name__ == '__main__' else __name__)


class ServerStartError(RuntimeError):
    """The server cannot listen on its address (e.g. the port is taken by a server already running with this
    config); raised before anything on disk is touched."""


def build_server(config: dict, *, host: Optional[str] = None, port: Optional[int] = None) -> ParamServer:
    """Create the store from ``[online.server]``, bind to ``[online.remote]`` (or host/port), then clear the dirs.

    Binding comes first: a second server started with the same config must fail on the busy port before it
    wipes the buffer of the one already running. Raises ServerStartError (the address cannot be bound),
    ValueError (unsafe bind, bad limits), OSError (the dirs cannot be recreated)."""
    cfg = section(config, 'online.server')  # typed, with the defaults of mortal/config_schema.py
    remote = wire.Remote.from_config(section(config, 'online.remote'), cfg)
    store = ReplayStore(cfg.buffer_dir, cfg.drain_dir, cfg.capacity, cfg.force_sequential)
    address = (remote.host if host is None else host, remote.port if port is None else port)
    check_bind_security(address[0], remote.token)
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
    except BaseException:
        server.server_close()
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
        logger.error('%s', ex)  # one line, no traceback: nothing was started or touched
        raise SystemExit(2) from None
    with server:
        host, port = server.server_address[:2]
        logger.info('listening on %s:%d (capacity %d, force_sequential %s)', host, port,
                    server.store.capacity, server.store.force_sequential)
        try:
            server.serve_forever()
        except KeyboardInterrupt as exc:  # also SIGTERM (entry.stop_on_sigterm)
            logger.info('stopped on %s; %s', entry.stop_cause(exc), stop_summary(server.store))
            raise SystemExit(entry.stop_status(exc)) from None


def stop_summary(store: ReplayStore) -> str:
    """What a stopping server discards: the logs still buffered (``buffer_dir`` is emptied at the next start) and
    the parameters it holds (only in memory: the trainer submits them again)."""
    buffered = store.buffered()
    logs = (f'{buffered} buffered logs discarded (buffer_dir is emptied at the next start)' if buffered
            else 'no buffered log discarded')
    held = (f'parameters version {store.param_version} dropped from memory (the trainer submits them again)'
            if store.mortal_param is not None else 'no parameters held')
    return f'{logs}; {held}'


if __name__ == '__main__':
    main()
