"""Game logs written off the arena's decision path.

``write_log_atomic`` gzips one mjai log (level 9, as Mortal) through a temporary name and a rename.
``LogWriter`` runs those writes on one background thread: zlib releases the GIL while it compresses, so on a
machine with a spare core the arena's loop does not wait for them. The files are the same (same text, same
compression level); only when they appear changes: every log is on disk once ``close`` returns.
"""

from __future__ import annotations

import gzip
from concurrent.futures import Future, ThreadPoolExecutor

from mortal.util.fsutil import atomic_write

MAX_PENDING = 64  # logs queued at most (a hanchan's text is ~0.3-1 MB): the loop waits for the oldest beyond


def write_log_atomic(path: str, text: str) -> None:
    """gzip ``text`` (best compression, as Mortal) to ``path`` through a temporary name and a rename
    (``mortal.util.fsutil.atomic_write``), without fsync: a round writes hundreds of logs, and a crash loses the round
    anyway. Raises OSError."""
    # filename='': no file name in the gzip header (the temporary one would be recorded)
    with atomic_write(path, fsync=False) as raw, \
            gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw) as gz:
        gz.write(text.encode())


class LogWriter:
    """Writes logs (``write_log_atomic``) on one background thread, in submission order.

    ``submit(path, text)`` queues one log (waiting for the oldest when ``max_pending`` are queued); ``close()``
    waits for every queued log. Either raises the first write error (an ``OSError``) met so far; after an error
    no further log is written. Use as a context manager: leaving the block closes it (and, when the block raised,
    waits for the logs without masking that exception).
    """

    def __init__(self, max_pending: int = MAX_PENDING):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.written = 0  # logs on disk

    def submit(self, path: str, text: str) -> None:
        """Queue ``text`` for ``path``; raises the error of an earlier write, if any."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arena-logs")
        while self._pending and (self._pending[0].done() or len(self._pending) >= self.max_pending):
            self._reap()
        self._pending.append(self._pool.submit(write_log_atomic, path, text))

    def _reap(self) -> None:
        fut = self._pending.pop(0)
        try:
            fut.result()
        except BaseException:
            for f in self._pending:  # no log written after a failure
                f.cancel()
            self._pending.clear()
            raise
        self.written += 1

    def close(self) -> None:
        """Wait for every queued log; raises the first write error."""
        try:
            while self._pending:
                self._reap()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # the block's own exception is the one to see
            pass
