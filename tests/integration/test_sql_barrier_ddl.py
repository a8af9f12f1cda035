"""Schema changes under ``[consistency] mode = "snapshot"`` in SQLite, MariaDB and PostgreSQL targets (the sink's half of
docs/consistency.md "Schema changes"): a DDL that alters a table's shape is applied only once the target shows the
barrier just before its transaction, exactly once (a replay after a restart finds it applied), the coordinator applies
the staged rows of the new shape after it, and a DDL whose own transaction staged rows of its table before it is
refused, naming the table, the commit Ts and the statement. The span's wait for the barrier: tests/e2e/
test_consistency_ddl.py."""

from __future__ import annotations

import pytest
from test_sql_barrier_apply import ORIGIN, SCHEMAS, Bank, Target, stage_all, target  # noqa: F401 - the fixture

from cdc.errors import SinkError
from cdc.events import ColumnFill, ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableSchema
from sinks.sql.sink import SQLSink

pytestmark = pytest.mark.integration

OLD = SCHEMAS[0]  # public.acct0 (id, balance)
NEW = TableSchema(OLD.name, (*OLD.columns, ColumnSchema("memo", 25, "text", type_name="text", default="'d'::text")),
                  ("id",))
ADD = "ALTER TABLE acct0 ADD COLUMN memo text DEFAULT 'd'"


def add_memo(ts: int) -> DdlEvent:
    return DdlEvent(ts, float(ts), OLD.name, (DdlChange(DdlKind.ADD_COLUMN, "memo"),), OLD, NEW, query=ADD,
                    fills=(ColumnFill("memo", "d"),))


def span_sink(into: Target, span: int) -> SQLSink:
    sink = into.sink()
    sink.stage_barriers(ORIGIN)
    sink.open_position("cf", span, origin=ORIGIN)
    return sink


def rows(into: Target) -> list[tuple[object, ...]]:
    return sorted(into.query(f"SELECT id, balance, memo FROM {into.table(0)}"))


def test_an_add_column_waits_for_the_barrier_and_is_applied_once(target: Target) -> None:  # noqa: F811 - the fixture
    """Staged rows of the old shape, then ADD COLUMN: refused until the target shows the barrier just before the DDL's
    transaction, then applied once; the rows after it (new shape, same transaction and later) are staged and the same
    coordinator applies them after it: row by row what the upstream holds. A restarted span finds the DDL applied."""
    bank = Bank(11)
    bank.opening()
    stage_all(target, bank, 0, bank.ts)
    coordinator = target.sink()
    coordinator.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False)
    sink = span_sink(target, 0)
    old_ts = bank.ts + 10
    sink.write([RowChange(OpType.UPDATE, OLD, old_ts, float(old_ts), values={"id": 1, "balance": 900})])
    ts = old_ts + 10
    with pytest.raises(SinkError, match=f"only when the target shows barrier {ts - 1}"):
        sink.apply_ddl(add_memo(ts))  # the staged row at old_ts is not in the real table yet
    coordinator.apply_barrier("cf", ORIGIN, ts - 1, float(ts - 1), history=False)
    assert sink.apply_ddl(add_memo(ts)) is True
    expected = {(i, 1000 if i != 1 else 900, "d") for i in range(10)}
    assert set(rows(target)) == expected  # barrier ts - 1 (the old row applied before the DDL) with the new column
    after = [RowChange(OpType.INSERT, NEW, ts, float(ts), values={"id": 10, "balance": 5, "memo": "new"}),
             RowChange(OpType.UPDATE, NEW, ts, float(ts), values={"id": 2, "balance": 1000, "memo": "x"})]
    assert sink.write(after) == 2  # the rest of the DDL's transaction (the position was reopened at ts)
    later = ts + 10
    assert sink.write([RowChange(OpType.UPDATE, NEW, later, float(later),
                                 values={"id": 3, "balance": 1000, "memo": "y"})]) == 1
    sink.close()
    assert set(rows(target)) == expected  # staged: not visible before the barrier
    coordinator.apply_barrier("cf", ORIGIN, later, float(later), history=False)  # (the coordinator that saw the old shape)
    coordinator.close()
    expected = (expected - {(2, 1000, "d"), (3, 1000, "d")}) | {(10, 5, "new"), (2, 1000, "x"), (3, 1000, "y")}
    assert set(rows(target)) == expected
    # a span restarted from a checkpoint before the DDL: the DDL is in the record, not applied again, nothing staged twice
    again = span_sink(target, 0)
    assert again.write([RowChange(OpType.UPDATE, OLD, old_ts, float(old_ts), values={"id": 1, "balance": 900})]) == 0
    assert again.apply_ddl(add_memo(ts)) is False
    assert again.write(after) == 0
    again.close()
    assert target.staged() == []
    assert set(rows(target)) == expected


def test_rows_of_its_table_before_it_in_its_transaction_are_refused_loudly(target: Target) -> None:  # noqa: F811 - the fixture
    """``BEGIN; UPDATE acct0 ..; ALTER TABLE acct0 ADD COLUMN ..; COMMIT``: the UPDATE is staged in the old shape and would
    be applied with the transaction's barrier, after the ADD COLUMN. The DDL is refused, naming the table, the commit Ts
    and the statement; the target is unchanged. Rows of *another* table before it in its transaction are fine."""
    bank = Bank(12)
    bank.opening()
    stage_all(target, bank, 0, bank.ts)
    coordinator = target.sink()
    coordinator.apply_barrier("cf", ORIGIN, bank.ts, float(bank.ts), history=False)
    ts = bank.ts + 10
    sink = span_sink(target, 0)
    assert sink.write([RowChange(OpType.UPDATE, SCHEMAS[1], ts, float(ts), values={"id": 1, "balance": 999}),
                       RowChange(OpType.UPDATE, OLD, ts, float(ts), values={"id": 1, "balance": 900})]) == 2
    coordinator.apply_barrier("cf", ORIGIN, ts - 1, float(ts - 1), history=False)
    with pytest.raises(SinkError) as info:
        sink.apply_ddl(add_memo(ts))
    message = str(info.value)
    assert f"public.acct0 at commit {ts}" in message and ADD[:40] in message
    assert "changed rows of public.acct0 before it" in message
    sink.close()
    assert "memo" not in {c.lower() for c in _columns(target)}  # not applied
    # the same transaction with only another table's row before the DDL: applied, and that row with the barrier
    other = Bank(13)
    other.opening()
    ts2 = ts + 100
    fresh = span_sink(target, 0)
    coordinator.apply_barrier("cf", ORIGIN, ts2 - 1, float(ts2 - 1), history=False)
    fresh.write([RowChange(OpType.UPDATE, SCHEMAS[1], ts2, float(ts2), values={"id": 2, "balance": 998})])
    assert fresh.apply_ddl(add_memo(ts2)) is True
    fresh.close()
    coordinator.close()


def _columns(into: Target) -> list[str]:
    if into.kind == "sqlite":
        return [str(r[1]) for r in into.query("PRAGMA table_info(acct0)")]
    schema = "'public'" if into.kind == "postgresql" else "DATABASE()"
    return [str(r[0]) for r in into.query(
        f"SELECT column_name FROM information_schema.columns WHERE table_name = 'acct0' AND table_schema = {schema}")]
