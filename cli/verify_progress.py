"""``changefeed verify``'s progress while the CLI waits for the report: what the job does (holding the changefeed,
checksums, drill-down), chunks done of chunks, rows/s and an ETA estimated from the rows planned. On a terminal: a
bar (rich) redrawn on each poll; elsewhere one plain line per change, at most every ``plain_every`` seconds."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["VerifyProgress"]


class VerifyProgress:
    """Call :meth:`show` with each polled ``VerifyRun``; :meth:`close` at the end (ends the bar)."""

    def __init__(self, out: IO[str], *, tty: bool | None = None, plain_every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.plain_every = plain_every
        self.clock = clock
        self._phase = ""
        self._since = 0.0
        self._last_line = ""
        self._last_time = -math.inf
        self._bar: Any = None
        self._task: Any = None

    def line(self, run: dict[str, Any]) -> str:
        """One line: phase, chunks, rows/s and ETA (rows planned x the share of chunks done: an estimate)."""
        phase, done, total = run.get("phase") or "starting", run.get("chunks_done", 0), run.get("chunks", 0)
        now = self.clock()
        if phase != self._phase:
            self._phase, self._since = phase, now
        text = f"verify {run.get('id', '')[:8]}: {phase}"
        if total:
            text += f" {done}/{total} chunks"
        rows = run.get("rows") or 0
        elapsed = now - self._since
        if phase == "checksums" and total and done and rows and elapsed > 0:
            rate = rows * done / total / elapsed
            text += f", ~{rate:,.0f} rows/s"
            if done < total and rate > 0:
                text += f", ETA {math.ceil(rows * (total - done) / total / rate)} s"
        return text

    def show(self, run: dict[str, Any]) -> None:
        text = self.line(run)
        if self.tty:
            self._show_bar(run, text)
            return
        now = self.clock()
        if text != self._last_line and now - self._last_time >= self.plain_every:
            print(text, file=self.out, flush=True)
            self._last_line, self._last_time = text, now

    def _show_bar(self, run: dict[str, Any], text: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        if self._bar is None:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 console=Console(file=self.out), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(text, total=None)
        self._bar.update(self._task, description=text, total=run.get("chunks") or None,
                         completed=run.get("chunks_done", 0))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
