"""Server memory under unauthenticated load (issue 13, item 5): resident set size of a real server process.

Starts ``mortal.net.param_server.ParamServer`` with a token in a child process bound to 127.0.0.1 (a throw-away
buffer under a temporary directory), then, from this process, only towards 127.0.0.1:

1. ``idle``: the server alone;
2. ``200 conns in header phase``: 200 concurrent connections that send 10 header bytes and hold;
3. ``200 conns, bad MAC + 1 MiB``: 200 concurrent connections, each a full header with a wrong MAC
   announcing ``--frame-mib`` MiB, then 1 MiB of payload;
4. ``2 max-size frames, bad MAC``: two concurrent connections, each a header with a wrong MAC and a payload
   of ``--frame-mib`` MiB, sent in full (the server must drop it unread);
5. ``2 max-size frames, no token``: the same two frames to a second server without a token (loopback), correctly
   framed, so both are authentic: the payload budget (``max_inflight_bytes`` = ``max_frame_bytes``) lets one be
   read at a time.

For each phase it prints the child's peak VmRSS sampled every 5 ms (and VmHWM), in MiB. Every loop is bounded
(fixed connection counts, fixed byte counts, socket timeouts); the child is stopped at the end.
Usage: ``python bench/server_auth_memory.py [--frame-mib 400] [--conns 200]``.
"""

if __package__ in (None, ''):  # run as a script: python bench/server_auth_memory.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time

import msgpack

from mortal.net import wire

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOST = '127.0.0.1'
CHUNK = b'\0' * (1 << 20)

SERVER = r'''
import sys
sys.path.insert(0, sys.argv[1])
from mortal.net.param_server import ParamServer
from mortal.net.replay_store import ReplayStore
store = ReplayStore(sys.argv[2] + '/buffer', sys.argv[2] + '/drain', 1000)
store.reset_dirs()
token = sys.argv[4] or None
s = ParamServer(('127.0.0.1', 0), store, token=token, max_frame_size=int(sys.argv[3]), timeout=60)
print(s.server_address[1], flush=True)
s.serve_forever(0.05)
'''


def status_mib(pid: int, field: str) -> float:
    """``field`` (VmRSS, VmHWM) of /proc/PID/status in MiB."""
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


class Sampler:
    """Peak VmRSS of ``pid`` while the ``with`` block runs (sampled every 5 ms)."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()

    def __enter__(self):
        self.peak = status_mib(self.pid, 'VmRSS')
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, status_mib(self.pid, 'VmRSS'))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_mib(self.pid, 'VmRSS'))


def start_server(tmp: str, frame: int, token: str):
    proc = subprocess.Popen([sys.executable, '-c', SERVER, str(ROOT), tmp, str(frame), token],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = int(proc.stdout.readline())
    return proc, port


def bad_header(length: int) -> bytes:
    """A well-formed header announcing ``length`` payload bytes, signed with a token the server does not have."""
    return wire.encode_header(b'', 'not-the-token')[:6] + wire.REST.pack(length, b'\0' * 32, b'\0' * 32)


def send_stream(port: int, head: bytes, size: int, result: list) -> None:
    """Send ``head`` then ``size`` zero bytes (1 MiB at a time); record how many payload bytes went out."""
    sent = 0
    try:
        with socket.create_connection((HOST, port), timeout=30) as s:
            s.sendall(head)
            while sent < size:
                n = min(len(CHUNK), size - sent)
                s.sendall(CHUNK[:n])
                sent += n
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(65536):
                pass
    except OSError:
        pass
    result.append(sent)


def run_threads(targets) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def main(argv=None):
    from mortal import entry

    parser = entry.parser(__doc__.splitlines()[0], config=False)
    parser.add_argument('--frame-mib', type=int, default=400, help='max_frame_bytes of the servers, MiB')
    parser.add_argument('--conns', type=int, default=200, help='concurrent connections in phases 2-3')
    args = entry.start(parser, argv, log_level=None)
    frame = args.frame_mib << 20
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(tmp + '/a')
        os.makedirs(tmp + '/b')
        hwm_a = _with_token(tmp + '/a', frame, args, rows)
        hwm_b = _without_token(tmp + '/b', frame, args, rows)

    print(f'server RSS (MiB), max_frame_bytes = {args.frame_mib} MiB, max_pending_connections = '
          f'{64}, max_inflight_bytes = max_frame_bytes')
    for name, mib in rows:
        print(f'  {name:<40} {mib:8.1f}')
    print(f'  VmHWM with token {hwm_a:.1f}, without token {hwm_b:.1f}')


def _with_token(work, frame, args, rows):
    """Phases 1-3 against a server with a token: idle, ``--conns`` stalled headers, ``--conns`` bad-MAC streams
    and two whole frames with a bad MAC; appends ``(phase, peak RSS MiB)`` to ``rows``, returns the VmHWM."""
    proc, port = start_server(work, frame, 'bench-token')
    try:
        time.sleep(0.5)
        rows.append(('idle', status_mib(proc.pid, 'VmRSS')))

        with Sampler(proc.pid) as smp:
            socks = []
            for _ in range(args.conns):
                try:
                    s = socket.create_connection((HOST, port), timeout=10)
                    s.sendall(bad_header(frame)[:10])
                    socks.append(s)
                except OSError:
                    pass
            time.sleep(2.0)
            for s in socks:
                s.close()
        rows.append((f'{args.conns} conns in header phase', smp.peak))
        time.sleep(1.0)

        sent = []
        with Sampler(proc.pid) as smp:
            run_threads([lambda: send_stream(port, bad_header(frame), 1 << 20, sent)
                         for _ in range(args.conns)])
        rows.append((f'{args.conns} conns, bad MAC + 1 MiB', smp.peak))

        sent = []
        with Sampler(proc.pid) as smp:
            run_threads([lambda: send_stream(port, bad_header(frame), frame, sent) for _ in range(2)])
        rows.append((f'2 x {args.frame_mib} MiB frames, bad MAC', smp.peak))
        print(f'  (payload bytes the two peers got out: {sorted(sent)})')
        return status_mib(proc.pid, 'VmHWM')
    finally:
        proc.terminate()
        proc.wait(30)


def _without_token(work, frame, args, rows):
    """Phase 4 against a server without a token: idle, then two correctly framed get_param requests padded to
    ``frame`` bytes; appends ``(phase, peak RSS MiB)`` to ``rows``, returns the VmHWM."""
    proc, port = start_server(work, frame, '')
    try:
        time.sleep(0.5)
        rows.append(('idle (no token)', status_mib(proc.pid, 'VmRSS')))
        # a correctly framed get_param padded to the largest payload (the server ignores extra fields)
        msg = {'type': 'get_param', 'param_version': -1, 'pad': b''}
        overhead = len(msgpack.packb({**msg, 'pad': b'x' * 70000})) - 70000
        payload = msgpack.packb({**msg, 'pad': bytes(frame - overhead)})
        head = wire.encode_header(payload)
        body = payload
        del payload

        def send_full(result):
            try:
                with socket.create_connection((HOST, port), timeout=60) as s:
                    s.sendall(head)
                    s.sendall(body)
                    s.settimeout(60)
                    result.append(wire.recv_msg(s).get('status'))
            except (OSError, wire.ProtocolError) as ex:
                result.append(repr(ex))

        got = []
        with Sampler(proc.pid) as smp:
            run_threads([lambda: send_full(got) for _ in range(2)])
        rows.append((f'2 x {args.frame_mib} MiB frames, no token', smp.peak))
        print(f'  (replies without token: {got})')
        return status_mib(proc.pid, 'VmHWM')
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == '__main__':
    main()
