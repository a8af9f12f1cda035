"""Which row did the target refuse? The search behind a chunk that failed with ``DataRejected``.

A chunk is one downstream transaction, so the target's refusal (a column too narrow, a NOT NULL or CHECK constraint
someone added to the target, a value out of range, a converter that cannot store a value) ends the whole chunk, and
the database's message names at best a column and a position in a statement. A person needs the table and the
row's key. :func:`find_refused_row` finds it, only after a chunk failed (the copy's happy path pays nothing):

1. The chunk is read again, parsed (``SnapshotReader.read_chunk``, under the job's snapshot, the same rows), and
   written in batches of :data:`PROBE_ROWS` rows through ``TxnSink.write`` with a fence that always raises, so every
   probe is rolled back and nothing of the search stays downstream (``sinks.base.AtomicTxnSink``; sinks that cannot take a
   write back are not searched). A key-less table's whole chunk is probed after the same ``TRUNCATE`` its copy
   starts with (rolled back too).
2. In the first batch the target refuses, the shortest refused prefix is found by bisection (about 10 probes for
   1,000 rows): its last row is the refused one. Written alone, it gives the database's reason without the other
   rows of a multi-row statement (when it passes alone, it was refused together with rows before it, e.g. a
   UNIQUE constraint, and the prefix's reason is kept).
3. The result is a ``DataRejected`` naming the table, the key values (all values, for a table without a key), the
   reason and the fix; the changefeed fails with it (not retried: the same row would be refused again).

When nothing is found (the parsed rows pass where the chunk's text did not, a deferred constraint that fails only at
commit, a row that conflicts with one of an earlier batch, a table whose key is deferred) the chunk's own error is
reported unchanged. Memory: one batch of parsed rows.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from cdc.errors import DataRejected, TidewaterError
from cdc.events import OpType, RowChange
from sinks.base import AtomicTxnSink, TxnSink
from upstream.base import SnapshotReader

log = logging.getLogger(__name__)

PROBE_ROWS = 1000
"""Rows per probe while looking for the refused batch (then bisected)."""
VALUE_CHARS = 80
"""A key value longer than this is shown cut, with its length."""


class _Accepted(Exception):
    """Raised by a probe's fence: the target took every row of the probe, which is rolled back."""


def _accept(*_: object) -> None:
    raise _Accepted


def probe(sink: TxnSink, rows: Sequence[RowChange]) -> TidewaterError | None:
    """Write ``rows`` in one downstream transaction that is always rolled back; the error the target raised, or None
    when it took them all."""
    try:
        sink.write(rows, _accept)
    except _Accepted:
        return None
    except TidewaterError as exc:
        return exc
    return None


def _batches(rows: Iterator[RowChange], size: int) -> Iterator[list[RowChange]]:
    while batch := list(itertools.islice(rows, size)):
        yield batch


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= VALUE_CHARS else f"{text[:VALUE_CHARS]}... ({len(text)} characters)"


def key_text(row: RowChange) -> str:
    """The row's key as ``id=42`` or ``(a, b)=(1, 'x')``; for a table without a key, every value, so a person can
    find the row."""
    schema = row.schema
    values = row.values or {}
    names = list(schema.key) if schema.has_key else [c.name for c in schema.columns]
    if len(names) == 1:
        return f"{names[0]}={_shown(values.get(names[0]))}"
    return f"({', '.join(names)})=({', '.join(_shown(values.get(n)) for n in names)})"


def find_refused_row(reader: SnapshotReader, sink: TxnSink, task: Any, first: DataRejected) -> DataRejected | None:
    """The row of ``task``'s chunk the target refuses, as a ``DataRejected`` naming table, key, reason and fix; None
    when it cannot be told (see the module docstring). ``first`` is the chunk's own error. Raises nothing but
    ``TidewaterError`` (reading the chunk again may fail: the caller keeps ``first`` then)."""
    job, schema, chunk = task.job, task.schema, task.chunk
    if not isinstance(sink, AtomicTxnSink) or getattr(task, "deferred", False):
        return None
    head = [RowChange(OpType.TRUNCATE, schema, job.commit_ts, job.commit_time)] if chunk.whole else []
    rows = reader.read_chunk(schema, chunk, commit_ts=job.commit_ts, commit_time=job.commit_time)
    probes = 0
    try:
        for batch in _batches(iter(rows), PROBE_ROWS):
            err = probe(sink, head + batch)
            probes += 1
            if err is None:
                continue
            if not isinstance(err, DataRejected):  # the target went away, or refuses the table itself: not a row
                log.info("%s: chunk %s: the search for the refused row stopped: %s", job.label, chunk.label, err)
                return None
            lo, hi = 1, len(batch)  # batch[:hi] is refused; every prefix shorter than lo is taken
            while lo < hi:
                mid = (lo + hi) // 2
                got = probe(sink, head + batch[:mid])
                probes += 1
                if got is None:
                    lo = mid + 1
                else:
                    hi, err = mid, got
            row = batch[hi - 1]
            alone = probe(sink, [*head, row])
            probes += 1
            reason = (alone if isinstance(alone, DataRejected) else err).reason
            table = str(schema.name)
            log.info("%s: chunk %s: the target refuses the row %s of %s (found in %d probes, all rolled back)",
                     job.label, chunk.label, key_text(row), table, probes)
            return DataRejected(
                f"table {table}: the target refused the row with key {key_text(row)}: {reason.rstrip('. ')}. Fix: "
                "make the target take it (widen the column, relax or drop the constraint, or let Tidewater create "
                "the table) or correct the row upstream, then resume the changefeed", reason=reason)
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()  # stop the chunk's COPY if the search ended early
        reader.release()
    log.info("%s: chunk %s: no row of it is refused when written parsed in batches (%d probes): reporting the "
             "chunk's error", job.label, chunk.label, probes)
    return None
