"""The initial copy's metrics (owner only): whether each changefeed still copies, and per table of a copying
changefeed its chunks and rows; nothing per table once it streams (no etcd read for it either)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from capture.metrics import snapshot_families
from cdc.model import SpanInfo, SpanSnapshot, SpanStatus, TableCopy
from cdc.snapshot import SnapshotProgress, TableProgress

pytestmark = pytest.mark.unit


def _snap(initial: bool, phases: list[str | None]) -> Any:
    info = SimpleNamespace(initial_copy=initial, table_copies=(),
                           spans=tuple(SpanInfo(i, f"s{i}", f"p{i}") for i in range(len(phases))))
    statuses = {i: SpanStatus("c", 1, snapshot=None if p is None else SpanSnapshot(p)) for i, p in enumerate(phases)}
    return SimpleNamespace(changefeeds={"cf": SimpleNamespace(value=info)}, span_statuses={"cf": statuses})


def _values(families: list[Any]) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    return {f.name: [(tuple(s.labels.values()), s.value) for s in f.samples] for f in families}


def test_a_copying_changefeed_shows_its_tables_progress() -> None:
    asked: list[str] = []

    def progress(cf: str) -> SnapshotProgress:
        asked.append(cf)
        return SnapshotProgress(cf, -1, (TableProgress("0:public.t", 3, 8, 150, 400, 50.0, 5.0, rows_redone=30),
                                         TableProgress("0:public.u", 0, 2, 0, 90)),  # (no chunk copied yet)
                                eta_seconds=None)

    v = _values(list(snapshot_families(_snap(True, ["done", "copying"]), progress)))
    assert v["tidewater_changefeed_snapshot_copying"] == [(("cf",), 1.0)]
    assert v["tidewater_snapshot_chunks_done"] == [(("cf", "0:public.t"), 3.0), (("cf", "0:public.u"), 0.0)]
    assert v["tidewater_snapshot_chunks_planned"] == [(("cf", "0:public.t"), 8.0), (("cf", "0:public.u"), 2.0)]
    assert v["tidewater_snapshot_rows_copied"] == [(("cf", "0:public.t"), 150.0), (("cf", "0:public.u"), 0.0)]
    assert v["tidewater_snapshot_rows_planned"] == [(("cf", "0:public.t"), 400.0), (("cf", "0:public.u"), 90.0)]
    # speed and ETA per copying table, as changefeed query shows them; none for a table not started yet
    assert v["tidewater_snapshot_rows_per_second"] == [(("cf", "0:public.t"), 50.0)]
    assert v["tidewater_snapshot_eta_seconds"] == [(("cf", "0:public.t"), 5.0)]
    assert v["tidewater_snapshot_rows_redone"] == [(("cf", "0:public.t"), 30.0), (("cf", "0:public.u"), 0.0)]
    # public.u has chunks left and no rate yet: the changefeed's ETA is absent (not the max of the tables' ETAs)
    assert v["tidewater_changefeed_snapshot_eta_seconds"] == []
    assert asked == ["cf"]


@pytest.mark.parametrize(("initial", "phases"), [(True, ["done", "done"]), (False, [None])])
def test_a_streaming_changefeed_has_no_table_series_and_costs_no_read(initial: bool, phases: list[str | None]) -> None:
    def progress(cf: str) -> SnapshotProgress:
        raise AssertionError("no etcd read for a changefeed that streams")

    v = _values(list(snapshot_families(_snap(initial, phases), progress)))
    assert v["tidewater_changefeed_snapshot_copying"] == [(("cf",), 0.0)]
    assert v["tidewater_snapshot_chunks_done"] == []


def test_a_span_that_has_not_reported_yet_still_copies() -> None:
    v = _values(list(snapshot_families(_snap(True, [None]), None)))
    assert v["tidewater_changefeed_snapshot_copying"] == [(("cf",), 1.0)]


def test_a_streaming_changefeed_with_a_table_copy_counts_it_and_shows_its_progress() -> None:
    snap = _snap(True, ["done", "done"])
    snap.span_statuses["cf"][1] = SpanStatus("c", 1, snapshot=SpanSnapshot("copying", tables=("public.t",), request=2))
    snap.changefeeds["cf"].value.table_copies = (TableCopy("public.u", 0, 3),)  # asked, not taken up yet
    v = _values(list(snapshot_families(snap, lambda cf: SnapshotProgress(cf, -1, (
        TableProgress("1:public.t", 1, 4, 10, 40),)))))
    assert v["tidewater_changefeed_snapshot_copying"] == [(("cf",), 0.0)]  # it streams: its checkpoint is valid
    assert v["tidewater_changefeed_table_copies"] == [(("cf",), 2.0)]
    assert v["tidewater_snapshot_chunks_done"] == [(("cf", "1:public.t"), 1.0)]
