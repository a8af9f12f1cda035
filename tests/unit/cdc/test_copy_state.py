"""Which spans still copy (cdc.model.still_copying / span_copying), which table copies a span has not taken up
(pending_table_copies) and which the owner may drop (owner.reconcile.served_table_copies)."""

from __future__ import annotations

import pytest

from cdc.model import (
    ChangefeedInfo,
    SpanInfo,
    SpanSnapshot,
    SpanStatus,
    TableCopy,
    pending_table_copies,
    span_copying,
    still_copying,
)
from owner.reconcile import served_table_copies

pytestmark = pytest.mark.unit


def _info(initial: bool = True, copies: tuple[TableCopy, ...] = ()) -> ChangefeedInfo:
    spans = tuple(SpanInfo(i, f"slot{i}", f"pub{i}", 10) for i in range(2))
    return ChangefeedInfo("cf", "postgresql://u@h/db", "sqlite:///t.db", {}, 10, 1.0, 1.0, spans,
                          initial_copy=initial, table_copies=copies, table_copy_seq=len(copies))


def _status(snap: SpanSnapshot | None) -> SpanStatus:
    return SpanStatus("c1", 1, checkpoint_ts=20, snapshot=snap)


def test_the_initial_copy_holds_the_changefeed_until_every_span_stored_it_done_a_table_copy_does_not() -> None:
    info = _info()
    assert span_copying(info, None) and span_copying(info, _status(None))
    assert span_copying(info, _status(SpanSnapshot("copying")))
    assert not span_copying(info, _status(SpanSnapshot("done")))
    assert not span_copying(info, _status(SpanSnapshot("copying", tables=("public.t",), request=1)))
    assert still_copying(info, {0: _status(SpanSnapshot("done")), 1: _status(SpanSnapshot("copying"))})
    assert not still_copying(info, {0: _status(SpanSnapshot("done")),
                                    1: _status(SpanSnapshot("copying", tables=("public.t",), request=3))})
    assert not span_copying(_info(initial=False), None)


def test_a_span_takes_up_the_requests_above_the_last_it_took_and_the_owner_drops_those() -> None:
    copies = (TableCopy("public.a", 0, 1), TableCopy("public.b", 1, 2, "joined"), TableCopy("public.c", 0, 3))
    info = _info(copies=copies)
    assert pending_table_copies(info, 0, None) == (copies[0], copies[2])
    assert pending_table_copies(info, 0, SpanSnapshot("done", request=1)) == (copies[2],)
    assert pending_table_copies(info, 0, SpanSnapshot("copying", tables=("public.a", "public.c"), request=3)) == ()
    statuses = {0: _status(SpanSnapshot("copying", tables=("public.a",), request=1)), 1: _status(None)}
    assert served_table_copies(info, statuses) == [copies[0]]
