"""Server under hostile connections before and after authentication (issue 35, item 2): does a real peer get through?

For each kind of hostile load it starts a real server process (``mortal.net.param_server.ParamServer`` with the
defaults of ``[online.server]``: max_frame_bytes 512 MiB, max_pending_connections 64, max_inflight_bytes =
max_frame_bytes) on 127.0.0.1, a hostile process keeping ``--conns`` connections of that kind open (each renewed
``--renew`` s after the server drops it), and, from this process, a real peer that sends ``get_param`` and a
111 KB ``submit_replay`` in turn for ``--seconds`` s. The kinds:

- ``wrong-mac``: a header with a wrong MAC declaring 512 MiB, then silence (server with a token);
- ``oversized``: a header declaring 1 TiB, beyond max_frame_bytes, then silence (server without a token: there
  is no MAC, the length is what is refused);
- ``slowloris``: a valid header sent one byte every ``--interval`` s (server with a token);
- ``slowloris-no-token``: the same, server without a token;
- ``stalled``: a header with a valid MAC declaring 512 MiB, then silence (server with a token);
- ``trickle``: a header with a valid MAC declaring max_frame_bytes, then its payload at 160 KiB/s, just above
  ``payload_min_bytes_per_s`` (server with a token; the server's max_frame_bytes = max_inflight_bytes =
  ``--trickle-budget`` MiB, 8 by default, so that 200 connections fill it within seconds);
- ``no-read``: a valid get_param, then never reading the reply (the server serves 8 MiB of parameters; its
  receive buffer is 4 KiB).

Separately, ``--bombs`` sends one decoding bomb (a get_param of empty lists) per size to a fresh server and
prints its peak RSS.

Per kind it prints the real peer's success rate, p50/p99 latency, the hostile connections opened and dropped, and
the server's VmRSS before the load and its peak during it (sampled every 20 ms from /proc/<pid>/status). Only
127.0.0.1; every loop is bounded (fixed counts, socket timeouts, ``--seconds`` per kind); the processes are
stopped at the end, so it ends by itself (about 5 x (--seconds + 4) s).
Usage: ``python bench/server_exhaustion.py [--conns 200] [--seconds 15] [--kinds wrong-mac,stalled]``.
The hostile side alone: ``python bench/server_exhaustion.py --hostile KIND --port P [--token T]``.
"""

if __package__ in (None, ''):  # run as a script: python bench/server_exhaustion.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import gzip
import hashlib
import hmac
import json
import os
import pathlib
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from mortal.config_schema import DEFAULT_MAX_FRAME_BYTES
from mortal.net import wire

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOST = '127.0.0.1'
TOKEN = 'bench-token'
KINDS = {  # kind: whether its server has a token
    'wrong-mac': True, 'oversized': False, 'slowloris': True, 'slowloris-no-token': False, 'stalled': True,
    'trickle': True, 'no-read': True,
}
NO_READ_PARAM_BYTES = 8 << 20  # no-read: the parameters the server serves
NO_READ_HOLD = 6.0  # no-read: seconds before a connection is closed and renewed (the server gives up within ~4)
TRICKLE_STEP = 16 * 1024  # trickle: payload bytes sent every 0.1 s (160 KiB/s, above the 128 KiB/s floor)

SERVER = r'''
import logging, sys
sys.path.insert(0, sys.argv[1])
from mortal.net.param_server import ParamServer
from mortal.net.replay_store import ReplayStore
logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
store = ReplayStore(sys.argv[2] + '/buffer', sys.argv[2] + '/drain', 1_000_000)
store.reset_dirs()
frame = int(sys.argv[4]) if len(sys.argv) > 4 else None
s = ParamServer(('127.0.0.1', 0), store, token=sys.argv[3] or None,
                **({'max_frame_size': frame, 'max_inflight_bytes': frame} if frame else {}))
if len(sys.argv) > 5:  # parameters to serve (no-read): one tensor of that many bytes
    import torch
    from mortal.net import wire
    store.submit_param(wire.pack_state_dict({'w': torch.zeros(int(sys.argv[5]) // 4)}),
                       wire.pack_state_dict({'b': torch.zeros(4)}), True)
print(s.server_address[1], flush=True)
s.serve_forever(0.05)
'''


def header(length: int, key) -> bytes:
    """A 78-byte frame header declaring ``length`` payload bytes (a zero digest), signed with ``key`` (a str,
    or None for the empty key a server without a token expects)."""
    signed = wire.PREFIX.pack(wire.MAGIC, wire.PROTOCOL_VERSION) + struct.pack('<Q32s', length, b'\0' * 32)
    return signed + hmac.new((key or '').encode(), signed, hashlib.sha256).digest()


def hostile_bytes(kind: str, token, max_frame: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """What one hostile connection of ``kind`` sends (all at once, or one byte at a time for the slowloris
    kinds) to a server with ``token`` (None: none) and ``max_frame`` bytes of max_frame_bytes."""
    if kind == 'wrong-mac':
        return header(max_frame, 'not-the-token')
    if kind == 'oversized':
        return header(1 << 40, 'not-the-token')
    if kind in ('slowloris', 'slowloris-no-token'):
        return wire.encode_frame({'type': 'get_param', 'param_version': -1}, token)
    if kind in ('stalled', 'trickle'):
        return header(max_frame, token)
    if kind == 'no-read':
        return wire.encode_frame({'type': 'get_param', 'param_version': -1}, token)
    raise ValueError(f'unknown hostile kind {kind!r} (one of {", ".join(KINDS)})')


class Hostile:
    """``count`` hostile connections of ``kind`` to 127.0.0.1:``port``, driven by one thread with a selector.

    Each sends ``hostile_bytes`` (the slowloris kinds one byte every ``interval`` s, staggered), then stays
    silent; when the server drops it (EOF, reset, refused send) it is renewed ``renew`` s later. Everything stops
    at ``stop()`` or after ``limit`` s. ``opened`` and ``dropped`` count connections."""

    def __init__(self, kind, port, count, *, token=None, max_frame=DEFAULT_MAX_FRAME_BYTES, renew=1.0,
                 interval=2.0, limit=150.0):
        self.data = hostile_bytes(kind, token, max_frame)
        self.trickle = kind.startswith('slowloris')
        self.payload = max_frame if kind == 'trickle' else 0  # payload bytes sent after the header, 16 KiB a time
        self.no_read = kind == 'no-read'
        if self.payload:
            interval = 0.1
        self.port, self.count, self.renew, self.interval, self.limit = port, count, renew, interval, limit
        self.opened = self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> 'Hostile':
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def run(self) -> None:
        """The driver loop (``start`` runs it in a thread; the hostile process runs it directly)."""
        sel = selectors.DefaultSelector()
        end = time.monotonic() + self.limit
        # per slot: [socket or None, bytes sent, when to send the next byte or to reconnect]
        slots = [[None, 0, time.monotonic() + i * self.interval / self.count if self.trickle else 0.0]
                 for i in range(self.count)]

        def drop(slot, now):
            if not self.no_read:
                sel.unregister(slot[0])
            slot[0].close()
            slot[0], slot[1], slot[2] = None, 0, now + self.renew
            self.dropped += 1

        try:
            while not self._stop.is_set() and time.monotonic() < end:
                now = time.monotonic()
                for slot in slots:
                    total = len(self.data) + self.payload
                    if self.no_read and slot[0] is not None and slot[1] >= total and now >= slot[2]:
                        drop(slot, now - self.renew)  # it never learns that the server closed it: renew it now
                    if now < slot[2] or (slot[0] is not None and (not (self.trickle or self.payload)
                                                                  or slot[1] >= total)):
                        continue
                    if slot[0] is None:
                        try:
                            slot[0] = socket.socket()
                            if self.no_read:  # the reply fills the socket buffers at once, then waits
                                slot[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                            slot[0].settimeout(2)
                            slot[0].connect((HOST, self.port))
                        except OSError:
                            slot[0].close()
                            slot[0], slot[2] = None, now + self.renew
                            continue
                        self.opened += 1
                        slot[0].setblocking(False)  # at most 78 bytes at once (trickle: 16 KiB) fit in its buffer
                        if not self.no_read:
                            sel.register(slot[0], selectors.EVENT_READ, slot)
                    if slot[1] < len(self.data):
                        part = self.data[slot[1]:slot[1] + 1] if self.trickle else self.data
                    else:
                        part = bytes(min(TRICKLE_STEP, total - slot[1]))
                    try:
                        sent = slot[0].send(part)
                    except BlockingIOError:
                        sent = 0  # the server does not read now (trickle: waiting for its budget)
                    except OSError:
                        if not self.no_read:
                            drop(slot, now)
                        continue
                    slot[1] += sent
                    slot[2] = now + (NO_READ_HOLD if self.no_read else self.interval)
                for key, _ in sel.select(timeout=0.02):
                    slot = key.data
                    try:
                        got = slot[0].recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        got = b''
                    if not got:
                        drop(slot, time.monotonic())
        finally:
            for slot in slots:
                if slot[0] is not None:
                    slot[0].close()
            sel.close()


def replay_logs(noise: int = 94_700) -> dict:
    """One gz mjai log (a start_game line, then the hex of ``noise`` random bytes, which gzip cannot squeeze much),
    as a submit_replay carries them: about 111 KB with the default."""
    text = json.dumps({'type': 'start_game', 'names': ['a', 'b', 'c', 'd']}) + '\n' + os.urandom(noise).hex() + '\n'
    return {'bench.json.gz': gzip.compress(text.encode(), compresslevel=1)}


def real_requests(port, token, *, seconds=None, count=None, logs=None, pause=0.0, timeout=5.0):
    """A real peer: ``get_param`` then ``submit_replay`` (``logs``, default ``replay_logs()``) in turn, for
    ``seconds`` s or ``count`` requests, ``pause`` s apart. Returns ``[(type, ok, seconds)]``: ok when the reply's
    status is 'ok' or 'empty param'; a refused, reset or timed-out request is not ok."""
    remote = wire.Remote(HOST, port, token=token, timeout=timeout)
    logs = replay_logs() if logs is None else logs
    msgs = [{'type': 'get_param', 'param_version': -1}, {'type': 'submit_replay', 'logs': logs, 'param_version': 0}]
    out = []
    end = time.monotonic() + (seconds if seconds is not None else 1e9)
    while time.monotonic() < end and (count is None or len(out) < count):
        msg = msgs[len(out) % 2]
        t0 = time.monotonic()
        try:
            ok = remote.request(msg).get('status') in (wire.STATUS_OK, wire.STATUS_EMPTY_PARAM)
        except (OSError, wire.ProtocolError, wire.RequestRefused):
            ok = False
        out.append((msg['type'], ok, time.monotonic() - t0))
        time.sleep(pause)
    return out


def percentile(values, q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` by the nearest rank."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * len(values) + 0.5)) - 1))]


def vm_rss_mib(pid: int) -> float:
    """VmRSS of process ``pid`` in MiB (from /proc/<pid>/status)."""
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'no VmRSS for pid {pid}')


def run_kind(kind: str, args, tmp: str) -> dict:
    """One kind: server process, hostile process, real peer; returns the figures."""
    token = TOKEN if KINDS[kind] else None
    work = os.path.join(tmp, kind)
    os.makedirs(work)
    with open(os.path.join(work, 'server.log'), 'w') as log:
        frame = int(args.trickle_budget * 2 ** 20) if kind == 'trickle' else 0
        extra = [str(frame)] + ([str(NO_READ_PARAM_BYTES)] if kind == 'no-read' else [])
        server = subprocess.Popen([sys.executable, '-c', SERVER, str(ROOT), work, token or ''] + extra,
                                  stdout=subprocess.PIPE, stderr=log, text=True)
    hostile = None
    try:
        port = int(server.stdout.readline())
        real_requests(port, token, count=2)  # warm up: both request kinds once
        rss_before = vm_rss_mib(server.pid)
        peak = [rss_before]
        stop = threading.Event()

        def sample():
            while not stop.wait(0.02):
                peak[0] = max(peak[0], vm_rss_mib(server.pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        hostile = subprocess.Popen(
            [sys.executable, __file__, '--hostile', kind, '--port', str(port), '--token', token or '',
             '--conns', str(args.conns), '--renew', str(args.renew), '--interval', str(args.interval),
             '--limit', str(args.seconds + 10), '--max-frame', str(frame or DEFAULT_MAX_FRAME_BYTES)],
            stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)  # the hostile connections are up (slowloris: a first byte each)
        results = real_requests(port, token, seconds=args.seconds, pause=args.pause)
        stop.set()
        sampler.join()
        hostile.terminate()  # the hostile process prints its counts on SIGTERM
        opened, dropped = hostile.communicate(timeout=20)[0].split()
        hostile = None
    finally:
        if hostile is not None:
            hostile.kill()
        server.terminate()
        server.wait(10)
    lat = [t for _, _, t in results]
    ok = sum(1 for _, good, _ in results if good)
    with open(os.path.join(work, 'server.log')) as f:
        log_lines = sum(1 for _ in f)
    return {'kind': kind, 'token': bool(token), 'requests': len(results), 'ok': ok,
            'ok_get_param': sum(1 for t, good, _ in results if good and t == 'get_param'),
            'ok_submit_replay': sum(1 for t, good, _ in results if good and t == 'submit_replay'),
            'p50': percentile(lat, 0.5), 'p99': percentile(lat, 0.99), 'max': max(lat),
            'opened': int(opened), 'dropped': int(dropped), 'rss_before': rss_before, 'rss_peak': peak[0],
            'log_lines': log_lines}


def bomb_payload(size: int) -> bytes:
    """A get_param of about ``size`` bytes whose extra field is a list of empty lists (1 byte each): decoded
    whole, each costs about 70 bytes."""
    import msgpack
    return msgpack.packb({'type': 'get_param', 'x': [[]] * max(0, size - 32)}, use_bin_type=True)


def run_bomb(size: int, tmp: str) -> dict:
    """One decoding bomb of ``size`` bytes sent (no token) to a fresh server process; returns its VmRSS before and
    its peak (sampled every 5 ms) until the server has closed the connection, and the seconds that took."""
    payload = bomb_payload(size)
    work = os.path.join(tmp, f'bomb{size}')
    os.makedirs(work)
    with open(os.path.join(work, 'server.log'), 'w') as log:
        server = subprocess.Popen([sys.executable, '-c', SERVER, str(ROOT), work, ''],
                                  stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        port = int(server.stdout.readline())
        real_requests(port, None, count=2)  # warm up: both request kinds once
        rss_before = peak = vm_rss_mib(server.pid)
        t0 = time.monotonic()
        with socket.create_connection((HOST, port), timeout=60) as s:
            s.sendall(wire.encode_header(payload) + payload)
            s.setblocking(False)
            while time.monotonic() - t0 < 60:
                peak = max(peak, vm_rss_mib(server.pid))
                try:
                    if not s.recv(65536):
                        break  # closed by the server
                except BlockingIOError:
                    time.sleep(0.005)
                except OSError:
                    break
        seconds = time.monotonic() - t0
        peak = max(peak, vm_rss_mib(server.pid))
    finally:
        server.terminate()
        server.wait(10)
    return {'size': len(payload), 'rss_before': rss_before, 'rss_peak': peak, 'seconds': seconds}


def hostile_main(args) -> None:
    """The hostile process: run ``Hostile`` until SIGTERM or ``--limit``, then print opened and dropped."""
    import signal
    h = Hostile(args.hostile, args.port, args.conns, token=args.token or None, max_frame=args.max_frame,
                renew=args.renew,
                interval=args.interval, limit=args.limit)
    signal.signal(signal.SIGTERM, lambda *_: h._stop.set())
    h.run()
    print(h.opened, h.dropped, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--conns', type=int, default=200, help='hostile connections per kind')
    p.add_argument('--seconds', type=float, default=15.0, help='seconds of real requests per kind')
    p.add_argument('--renew', type=float, default=1.0, help='seconds before a dropped hostile connection is renewed')
    p.add_argument('--interval', type=float, default=2.0, help='seconds between slowloris header bytes')
    p.add_argument('--pause', type=float, default=0.05, help='seconds between real requests')
    p.add_argument('--kinds', default=','.join(KINDS), help='comma-separated kinds')
    p.add_argument('--bombs', default='4,16', help='sizes in MiB of the decoding bombs (one each; "" for none)')
    p.add_argument('--hostile', help=argparse.SUPPRESS)
    p.add_argument('--port', type=int, help=argparse.SUPPRESS)
    p.add_argument('--token', default='', help=argparse.SUPPRESS)
    p.add_argument('--limit', type=float, default=150.0, help=argparse.SUPPRESS)
    p.add_argument('--max-frame', type=int, default=DEFAULT_MAX_FRAME_BYTES, help=argparse.SUPPRESS)
    p.add_argument('--trickle-budget', type=float, default=8.0,
                   help='trickle: the server\'s max_frame_bytes = max_inflight_bytes, MiB')
    args = p.parse_args()
    if args.hostile:
        return hostile_main(args)
    if not 1 <= args.conns <= 1000 or not 0 < args.seconds <= 60:
        sys.exit('error: --conns must be within [1, 1000] and --seconds within (0, 60]')
    sizes = [float(x) for x in args.bombs.split(',') if x]
    if any(not 0 < x <= 64 for x in sizes):
        sys.exit('error: --bombs sizes must be within (0, 64] MiB')
    with tempfile.TemporaryDirectory() as tmp:
        for mib in sizes:
            r = run_bomb(int(mib * 2 ** 20), tmp)
            print(f'decoding bomb of {r["size"] / 2 ** 20:.1f} MiB (empty lists): server RSS {r["rss_before"]:.1f} '
                  f'-> peak {r["rss_peak"]:.1f} MiB, closed after {r["seconds"]:.2f} s', flush=True)
        kinds = [k for k in args.kinds.split(',') if k]
        if kinds:
            print(f'{args.conns} hostile connections per kind, renewed {args.renew:g} s after a drop; a real peer '
                  f'alternating get_param and a 111 KB submit_replay for {args.seconds:g} s; server defaults '
                  '(max_pending_connections 64, max_frame_bytes = max_inflight_bytes = 512 MiB)')
            print(f'{"kind":<20} {"token":<5} {"ok":>9} {"get_param":>9} {"submit":>7} {"p50 ms":>7} {"p99 ms":>7} '
                  f'{"max ms":>7} {"opened":>7} {"dropped":>7} {"RSS MiB before/peak":>20} {"log lines":>9}')
        for kind in kinds:
            r = run_kind(kind, args, tmp)
            print(f'{r["kind"]:<20} {"yes" if r["token"] else "no":<5} {r["ok"]:>4}/{r["requests"]:<4} '
                  f'{r["ok_get_param"]:>9} {r["ok_submit_replay"]:>7} {r["p50"] * 1000:>7.1f} '
                  f'{r["p99"] * 1000:>7.1f} {r["max"] * 1000:>7.1f} {r["opened"]:>7} {r["dropped"]:>7} '
                  f'{r["rss_before"]:>9.1f} / {r["rss_peak"]:<8.1f} {r["log_lines"]:>9}', flush=True)


if __name__ == '__main__':
    main()
