"""``changefeed create --wait`` and ``changefeed query --watch``: the initial copy's progress, live.

On a terminal: a progress bar per table and one for the whole copy (rich), redrawn about once a second. Not on
a terminal (a pipe, a log, CI): one plain line per change, at most every ``plain_every`` seconds. Either way it
returns when the changefeed streams (every span's copy done), and raises :class:`WatchEnded` when it stops
being able to get there (failed, stopped, removed), with the reason.

A changefeed in ``warning`` (the copy failed and is retried: a target or upstream away, no Spark executor, a table
not published yet) shows the warning's code and message: at once when it appears or changes (not only every
``plain_every`` seconds), on every plain line while it lasts, and as a line above the bars on a terminal. Without
it the watch would go on showing the same progress while nothing moves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["WatchEnded", "watch"]

WHOLE_TABLE = "whole table (no key)"  # a table's "chunking" in the API's progress (cdc.snapshot.WHOLE_TABLE)

_ENDED = {"failed", "stopped", "removed", "finished"}


class WatchEnded(Exception):
    """The changefeed left the path to streaming; ``query`` is its last state."""

    def __init__(self, message: str, query: dict[str, Any]) -> None:
        super().__init__(message)
        self.query = query


def warning(q: dict[str, Any]) -> str | None:
    """``[CODE] message`` of a changefeed in ``warning`` (its error is retried), None otherwise."""
    err = q.get("error") or {}
    if q.get("state") != "warning" or not err:
        return None
    return f"[{err.get('code', '?')}] {' '.join(str(err.get('message', '')).split())}"


def rows_text(copied: int, redone: int) -> str:
    """``N rows copied``, with ``(M redone)`` when M of them were written under a plan dropped since (the copy of
    their table started over: they are copied again)."""
    return f"{copied:,} rows copied" + (f" ({redone:,} redone)" if redone else "")


def summary(q: dict[str, Any]) -> str:
    """One line: phase, chunks and rows done, speed and ETA of the copy (the API's totals: the ETA only once it
    can be estimated); a warning's code and message."""
    snap = q.get("snapshot") or {}
    speed = snap.get("rows_per_second")
    eta = snap.get("eta_seconds")
    line = (f"{q.get('id')}: {q.get('state')}, {q.get('phase')}: {snap.get('chunks_done', 0)}/"
            f"{snap.get('chunks_total', 0)} chunks, {rows_text(snap.get('rows_copied', 0), snap.get('rows_redone', 0))}")
    if speed:
        line += f", {speed:,.0f} rows/s"
    if eta is not None and snap.get("chunks_done", 0) < snap.get("chunks_total", 0):
        line += f", ETA {math.ceil(eta)} s"
    warn = warning(q)
    if warn:
        line += f"; warning, retrying: {warn}"
    return line


def _finished(q: dict[str, Any]) -> bool:
    """True once the changefeed streams; :class:`WatchEnded` when it can no longer get there."""
    state = q.get("state")
    if state in _ENDED:
        err = q.get("error") or {}
        raise WatchEnded(f"changefeed {q.get('id')} is {state}" + (f": {err.get('message')}" if err.get("message")
                                                                     else ""), q)
    return q.get("phase") == "streaming"


def watch(fetch: Callable[[], dict[str, Any]], out: IO[str], *, tty: bool | None = None, interval: float = 1.0,
          plain_every: float = 5.0) -> dict[str, Any]:
    """Poll ``fetch()`` (the changefeed's query) and show the copy until the changefeed streams."""
    if tty is None:
        tty = out.isatty()
    if tty:
        return _watch_rich(fetch, out, interval)
    last_line, last_time, last_warning = "", 0.0, None
    while True:
        q = fetch()
        line = summary(q)
        warn = warning(q)
        now = time.monotonic()
        if line != last_line and (not last_line or now - last_time >= plain_every or q.get("phase") == "streaming"
                                  or warn != last_warning):
            print(line, file=out, flush=True)
            last_line, last_time = line, now
        last_warning = warn
        if _finished(q):
            return q
        time.sleep(interval)


def _watch_rich(fetch: Callable[[], dict[str, Any]], out: IO[str], interval: float) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(file=out)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rows]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        total = bar.add_task("all tables", total=None, rows="")
        tasks: dict[str, Any] = {}
        last_warning: str | None = None
        while True:
            q = fetch()
            warn = warning(q)
            if warn != last_warning:
                bar.console.print(f"{q.get('id')}: warning, retrying: {warn}" if warn else f"{q.get('id')}: warning "
                                  "cleared", markup=False, highlight=False)
                last_warning = warn
            snap = q.get("snapshot") or {}
            bar.update(total, total=snap.get("chunks_total") or None, completed=snap.get("chunks_done", 0),
                       rows=rows_text(snap.get("rows_copied", 0), snap.get("rows_redone", 0)),
                       description=f"{q.get('id')} ({q.get('phase')}{', warning' if warn else ''})")
            for t in snap.get("tables") or []:
                name = t["table"]
                if name not in tasks:
                    whole = t.get("chunking") == WHOLE_TABLE
                    tasks[name] = bar.add_task(f"{name} (one chunk: no key)" if whole else name,
                                               total=t["chunks_total"], rows="")
                speed = f", {t['rows_per_second']:,.0f}/s" if t.get("rows_per_second") else ""
                redone = t.get("rows_redone") or 0
                again = f" (+{redone:,} redone)" if redone else ""
                bar.update(tasks[name], completed=t["chunks_done"], total=t["chunks_total"] or None,
                           rows=f"{t['rows_copied'] - redone:,}/{t['rows_planned']:,} rows{again}{speed}")
            if _finished(q):
                return q
            time.sleep(interval)
