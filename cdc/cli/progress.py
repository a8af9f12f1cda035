"""``changefeed create --wait`` and ``changefeed query --watch``: the initial copy's progress, live.

On a terminal: a progress bar per table and one for the whole copy (rich), redrawn about once a second. Not on
a terminal (a pipe, a log, CI): one plain line per change, at most every ``plain_every`` seconds. Either way it
returns when the changefeed streams (every span's copy done), and raises :class:`WatchEnded` when it stops
being able to get there (failed, stopped, removed), with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["WatchEnded", "watch"]

_ENDED = {"failed", "stopped", "removed", "finished"}


class WatchEnded(Exception):
    """The changefeed left the path to streaming; ``query`` is its last state."""

    def __init__(self, message: str, query: dict[str, Any]) -> None:
        super().__init__(message)
        self.query = query


def summary(q: dict[str, Any]) -> str:
    """One line: phase, chunks and rows done, speed and ETA of the copy."""
    snap = q.get("snapshot") or {}
    tables = snap.get("tables") or []
    speed = sum(t.get("rows_per_second") or 0 for t in tables)
    etas = [t["eta_seconds"] for t in tables if t.get("eta_seconds") is not None]
    line = (f"{q.get('id')}: {q.get('state')}, {q.get('phase')}: {snap.get('chunks_done', 0)}/"
            f"{snap.get('chunks_total', 0)} chunks, {snap.get('rows_copied', 0)} rows copied")
    if speed:
        line += f", {speed:,.0f} rows/s"
    if etas:
        line += f", ETA {max(etas):.0f} s"
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
    last_line, last_time = "", 0.0
    while True:
        q = fetch()
        line = summary(q)
        now = time.monotonic()
        if line != last_line and (now - last_time >= plain_every or q.get("phase") == "streaming"):
            print(line, file=out, flush=True)
            last_line, last_time = line, now
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
        while True:
            q = fetch()
            snap = q.get("snapshot") or {}
            bar.update(total, total=snap.get("chunks_total") or None, completed=snap.get("chunks_done", 0),
                       rows=f"{snap.get('rows_copied', 0):,} rows", description=f"{q.get('id')} ({q.get('phase')})")
            for t in snap.get("tables") or []:
                name = t["table"]
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=t["chunks_total"], rows="")
                speed = f", {t['rows_per_second']:,.0f}/s" if t.get("rows_per_second") else ""
                bar.update(tasks[name], completed=t["chunks_done"], total=t["chunks_total"],
                           rows=f"{t['rows_copied']:,}/{t['rows_planned']:,} rows{speed}")
            if _finished(q):
                return q
            time.sleep(interval)
