"""The SQL sink's statement pipeline: one worker thread per sink runs the statements of a write in order
while the caller builds the next one."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from cdc.errors import SinkError


class Pipeline:
    """Runs one connection's statements in a worker thread, so that the caller builds the next statement
    while the target executes the previous one.

    Guarantees: statements run strictly in submit order, one at a time, on whatever cursor each job
    names; at most ``depth`` jobs are queued or running (``submit`` blocks beyond that: memory stays
    bounded). The caller may use the connection itself (reads, commit, rollback) only after :meth:`drain`
    or :meth:`quiesce` returned: then the worker is idle and its writes happen-before the caller's next
    steps, so a connection is never used by two threads at once. The first failing job's exception is
    kept with the table it concerned and raised by the next ``submit`` or ``drain`` (after the queue is
    empty); jobs queued after it are dropped, never executed. ``threaded=False`` (SQLite: the work is
    in-process) runs every job in the caller's thread at submit.

    Thread-safety: one caller thread at a time (the sink's); ``close`` stops the worker and may be called
    from any thread once the caller is done.
    """

    def __init__(self, *, threaded: bool = True, depth: int = 2) -> None:
        self.threaded = threaded
        self._depth = max(1, depth)
        self._cond = threading.Condition(threading.Lock())
        self._jobs: collections.deque[tuple[str | None, Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._error: tuple[BaseException, str | None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = False

    @property
    def worker(self) -> threading.Thread | None:
        """The worker thread (None until the first threaded job; it ends once closed)."""
        return self._thread

    def queued(self) -> int:
        """Jobs queued or running now."""
        with self._cond:
            return len(self._jobs)

    def submit(self, table: str | None, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` after every job submitted before. False (``fn`` dropped) when an earlier job
        failed: the caller then takes the error with :meth:`quiesce`."""
        if not self.threaded:
            fn(*args)
            return True
        cond = self._cond
        with cond:
            if self._error is None:
                if self._thread is None:
                    self._start()
                while len(self._jobs) >= self._depth and self._error is None:
                    cond.wait()
                if self._error is None:
                    self._jobs.append((table, fn, args))
                    cond.notify_all()
                    return True
        return False

    def drain(self) -> None:
        """Wait until every submitted job ran; raise the first error (and forget it)."""
        error = self.quiesce()
        if error is not None:
            raise error[0]

    def quiesce(self) -> tuple[BaseException, str | None] | None:
        """Wait until the worker is idle; return (and forget) the first error with its table, or None."""
        if not self.threaded:
            return None
        cond = self._cond
        with cond:
            while self._jobs:
                cond.wait()
            error, self._error = self._error, None
        return error

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)

    def _start(self) -> None:
        if self._stop:
            raise SinkError("sink is closed")
        self._thread = threading.Thread(target=self._work, name="sql-sink-executor", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        cond = self._cond
        jobs = self._jobs
        while True:
            with cond:
                while not jobs and not self._stop:
                    cond.wait()
                if not jobs:
                    return
                table, fn, args = jobs[0]
                failed = self._error is not None
            if not failed:
                try:
                    fn(*args)
                except BaseException as exc:  # kept for the caller, never lost
                    with cond:
                        self._error = (exc, table)
            with cond:
                jobs.popleft()
                cond.notify_all()
