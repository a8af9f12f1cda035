"""SpanRunner at a DDL barrier: rows before it written, the DDL applied (or skipped knowingly, loudly), rows
after it written, the checkpoint moved only past the whole transaction; a rejected DDL fails the span."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from cdc.config import DdlConfig
from cdc.errors import DdlOrderUnknown, DdlRejected
from cdc.events import DdlChange, DdlEvent, DdlKind, RowChange, TableName
from cdc.ts import Watermark
from processor.span import SchemaRecorder, SinkPlan, SpanHooks, SpanRunner
from sinks.testing import MemoryDdlSink
from sorter.base import SortedTxn
from tests.pgoutput_wire import enc_insert
from tests.settle import SETTLE_S
from tests.unit.processor.test_span_warnings import SCHEMA, FakeSorter, FakeSource
from upstream.base import SCHEMA_CHANGE, encode_payload
from upstream.postgres.source import PgChangeDecoder

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("source_mode")]

T = TableName("public", "t")


class DdlDecoder(PgChangeDecoder):
    def schema_changes(self, raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
        return [DdlEvent(commit_ts, commit_time, T, (DdlChange(DdlKind.ADD_COLUMN, raw.decode()),), SCHEMA, SCHEMA,
                         f"ALTER TABLE t ADD COLUMN {raw.decode()} int")]


class DdlSource(FakeSource):
    def __init__(self, resolved: int, commits: set[int]) -> None:
        super().__init__(resolved)
        self.commits = commits

    def schema_change_commits(self) -> set[int]:  # type: ignore[override]
        return self.commits

    def decoder(self) -> DdlDecoder:
        return DdlDecoder(lambda version: SCHEMA)


class RecordingSink(MemoryDdlSink):
    """The DDL twin (``sinks.testing``), its row ids per write and its DDLs in one ``log``."""

    def __init__(self, reject: bool = False) -> None:
        super().__init__("the target has no such type" if reject else None)
        self.log: list[Any] = []

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        rows = [c.values["id"] for c in changes]
        self.log.append(rows)
        return len(rows)

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        super().apply_ddl(event, fence, skip=skip)
        self.log.append(("skip" if skip else "ddl", event.changes[0].column))
        return True


def row(i: int) -> bytes:
    return encode_payload(0, enc_insert(None, 16384, [str(i)]))


def run(sink: RecordingSink, ddl: DdlConfig | None = None, source: DdlSource | None = None,
        history: SchemaRecorder | None = None) -> SpanRunner:
    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 4, [row(2), encode_payload(SCHEMA_CHANGE, b"c"), row(3), row(4)]),
            SortedTxn(130, 130.0, 1, [row(5)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), source or DdlSource(130, {120}),  # type: ignore[arg-type]
                        FakeSorter(txns), SinkPlan(lambda: sink, txn_rows=10, ddl=ddl or DdlConfig()),
                        hooks=SpanHooks(schema_history=history))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while runner.checkpoint.ts < 130 and time.monotonic() < deadline and not runner.failed.is_set():
        time.sleep(0.01)
    runner.stop()
    return runner


def test_rows_before_the_ddl_then_the_ddl_then_the_rows_after_it() -> None:
    sink = RecordingSink()
    runner = run(sink)
    assert runner.error is None and runner.checkpoint.ts == 130
    assert sink.log == [[1], [2], ("ddl", "c"), [3, 4], [5]]
    assert runner.warnings.current() == ()


@pytest.mark.parametrize("ddl, code", [(DdlConfig(mode="ignore"), "CDC:NoticeDdlSkipped"),
                                       (DdlConfig(skip_ts=(120,)), "CDC:NoticeDdlSkipped")])
def test_a_ddl_skipped_knowingly_is_recorded_and_shown(ddl: DdlConfig, code: str) -> None:
    sink = RecordingSink(reject=True)
    runner = run(sink, ddl)
    assert runner.error is None and sink.log == [[1], [2], ("skip", "c"), [3, 4], [5]]
    (w,) = runner.warnings.current()
    assert w.code == code and w.table == "public.t" and "ALTER TABLE t ADD COLUMN c int" in w.message


def test_a_rejected_ddl_fails_the_span_before_any_row_after_it() -> None:
    sink = RecordingSink(reject=True)
    runner = run(sink)
    assert isinstance(runner.error, DdlRejected) and "no such type" in str(runner.error)
    assert sink.log == [[1], [2]] and runner.checkpoint.ts == 110


def test_on_error_skip_skips_a_rejected_ddl_with_a_divergence_warning() -> None:
    sink = RecordingSink(reject=True)
    runner = run(sink, DdlConfig(on_error="skip"))
    assert runner.error is None and sink.log == [[1], [2], ("skip", "c"), [3, 4], [5]]
    (w,) = runner.warnings.current()
    assert (w.code, w.severity) == ("CDC:WarnDdlSkipped", "divergence") and "no such type" in w.message


def test_schema_versions_are_stored_in_the_history_before_the_checkpoint_passes_them() -> None:
    """The source's versions and each DDL's new schema reach the schema history (docs/ddl.md) before the span
    writes past them: a restart from any stored checkpoint finds the schema of its time."""
    sink = RecordingSink(reject=True)
    source = DdlSource(130, {120})
    source.versions = [(105, SCHEMA)]
    recorded: list[tuple[list[tuple[int, int, Any]], int, list[Any]]] = []

    def history(versions: list[tuple[int, int, Any]], keep_after: int) -> None:
        recorded.append((versions, keep_after, list(sink.log)))

    runner = run(sink, DdlConfig(skip_ts=(120,)), source, history)
    assert runner.error is None
    relid = SCHEMA.relation_id
    assert [r[0] for r in recorded] == [[(105, relid, SCHEMA)], [(120, relid, SCHEMA)]]
    assert recorded[0][2] == []  # before anything was written
    assert recorded[1][2] == [[1], [2]]  # the DDL's version before it and the rows after it
    assert [r[1] for r in recorded] == [100, 100]  # nothing older than the stored checkpoint is needed


class DropDecoder(PgChangeDecoder):
    def schema_changes(self, raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
        kind = DdlKind.DROP_TABLE if raw == b"drop" else DdlKind.ADD_COLUMN
        return [DdlEvent(commit_ts, commit_time, T, (DdlChange(kind, raw.decode()),), SCHEMA, None, raw.decode())]


class DropSource(DdlSource):
    def decoder(self) -> DropDecoder:  # type: ignore[override]
        return DropDecoder(lambda version: SCHEMA)


@pytest.mark.parametrize("what, waits", [(b"drop", True), (b"c", False)])
def test_a_ddl_changing_table_names_waits_at_the_changefeed_barrier_with_everything_before_it_checkpointed(
    what: bytes, waits: bool
) -> None:
    sink = RecordingSink()
    calls: list[tuple[int, int, list[Any]]] = []
    runner: list[SpanRunner] = []

    def barrier(event: Any, stop: Any) -> list[str]:
        calls.append((event.commit_ts, runner[0].checkpoint.ts, list(sink.log)))
        return []

    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 3, [row(2), encode_payload(SCHEMA_CHANGE, what), row(3)])]
    r = SpanRunner("cf/0", Watermark(100, 100.0), DropSource(120, {120}), FakeSorter(txns),  # type: ignore[arg-type]
                   SinkPlan(lambda: sink, txn_rows=10), hooks=SpanHooks(barrier=barrier))
    runner.append(r)
    r.start()
    deadline = time.monotonic() + SETTLE_S
    while r.checkpoint.ts < 120 and time.monotonic() < deadline and not r.failed.is_set():
        time.sleep(0.01)
    r.stop()
    assert r.error is None and r.checkpoint.ts == 120
    # the barrier is asked with every earlier transaction written; the checkpoint stays at the last whole one (110):
    # a restart point inside the DDL's commit record (119) would make PostgreSQL skip the DDL's transaction; waiting,
    # the span counts as 119 through barrier_at (cdc.model.SpanStatus.covered_ts)
    assert calls == ([(120, 110, [[1], [2]])] if waits else [])


@pytest.mark.parametrize("skip_ts", [(), (120,)])
def test_a_name_changing_ddl_that_another_spans_copy_ran_ahead_of_fails_the_span_unless_skipped_knowingly(
    skip_ts: tuple[int, ...]
) -> None:
    """The barrier reports that another span's copy wrote the DDL's table as of a later Ts: applying the DROP would
    remove the copied rows, so the span fails naming the table and the fix, and applies nothing; with the DDL's
    commit Ts in ``[ddl] skip-ts`` (the fix) it is skipped and the span goes on."""
    sink = RecordingSink()

    def barrier(event: Any, stop: Any) -> list[str]:
        return [f"span cf/1 copied table {event.table} as of Ts 130, after this DDL"]

    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 3, [row(2), encode_payload(SCHEMA_CHANGE, b"drop"), row(3)])]
    r = SpanRunner("cf/0", Watermark(100, 100.0), DropSource(120, {120}), FakeSorter(txns),  # type: ignore[arg-type]
                   SinkPlan(lambda: sink, txn_rows=10, ddl=DdlConfig(skip_ts=skip_ts)), hooks=SpanHooks(barrier=barrier))
    r.start()
    deadline = time.monotonic() + SETTLE_S
    while r.checkpoint.ts < 120 and time.monotonic() < deadline and not r.failed.is_set():
        time.sleep(0.01)
    r.stop()
    if skip_ts:
        assert r.error is None and r.checkpoint.ts == 120
        assert sink.log[-1] == [3]
    else:
        assert r.error is not None and r.error.code == "CDC:ErrSnapshotTableChanged" and not r.error.retryable
        assert "public.t" in str(r.error) and "--skip-ddl-ts 120" in str(r.error)
        assert not any(isinstance(e, DdlEvent) for e in sink.log) and r.checkpoint.ts < 120


def test_a_span_publishes_where_it_waits_at_the_changefeed_barrier_only_while_it_waits() -> None:
    """``barrier_at`` (stored as ``SpanStatus.barrier_ts``/``barrier_seq``, read by the other spans' barriers:
    processor.barrier) is the DDL's (commit Ts, seq), set with everything before the DDL's transaction written (the
    checkpoint at the last whole transaction before it: a safe restart point), and gone once the span passed."""
    sink = RecordingSink()
    seen: list[tuple[Any, int]] = []
    runner: list[SpanRunner] = []

    def barrier(event: Any, stop: Any) -> list[str]:
        seen.append((runner[0].barrier_at, runner[0].checkpoint.ts))
        return []

    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 3, [row(2), encode_payload(SCHEMA_CHANGE, b"drop"), row(3)])]
    r = SpanRunner("cf/0", Watermark(100, 100.0), DropSource(120, {120}), FakeSorter(txns),  # type: ignore[arg-type]
                   SinkPlan(lambda: sink, txn_rows=10), hooks=SpanHooks(barrier=barrier))
    runner.append(r)
    r.start()
    deadline = time.monotonic() + SETTLE_S
    while r.checkpoint.ts < 120 and time.monotonic() < deadline and not r.failed.is_set():
        time.sleep(0.01)
    r.stop()
    assert r.error is None and seen == [((120, 0), 110)] and r.barrier_at is None


@pytest.mark.parametrize("skip_ts", [(), (120,)])
def test_a_ddl_whose_order_against_another_spans_is_unknown_fails_the_span_unless_skipped_knowingly(
    skip_ts: tuple[int, ...]
) -> None:
    """The barrier refuses a DROP without a position across spans that meets another span's name-changing DDL of
    the same transaction (``CDC:ErrDdlOrderUnknown``): nothing is applied, the span fails; skipped knowingly (the
    fix), it goes on."""
    sink = RecordingSink()

    def barrier(event: Any, stop: Any) -> list[str]:
        raise DdlOrderUnknown(f"span cf/0: schema change on {event.table} (commit Ts 120): order unknown; fix: "
                              "--skip-ddl-ts 120")

    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 3, [row(2), encode_payload(SCHEMA_CHANGE, b"drop"), row(3)])]
    r = SpanRunner("cf/0", Watermark(100, 100.0), DropSource(120, {120}), FakeSorter(txns),  # type: ignore[arg-type]
                   SinkPlan(lambda: sink, txn_rows=10, ddl=DdlConfig(skip_ts=skip_ts)), hooks=SpanHooks(barrier=barrier))
    r.start()
    deadline = time.monotonic() + SETTLE_S
    while r.checkpoint.ts < 120 and time.monotonic() < deadline and not r.failed.is_set():
        time.sleep(0.01)
    r.stop()
    if skip_ts:
        assert r.error is None and r.checkpoint.ts == 120 and ("skip", "drop") in sink.log
    else:
        assert r.error is not None and r.error.code == "CDC:ErrDdlOrderUnknown" and not r.error.retryable
        assert not any(isinstance(e, tuple) for e in sink.log) and r.checkpoint.ts < 120
