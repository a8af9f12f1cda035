"""processor.barrier: a copy planned under a snapshot after a name-changing DDL contradicts it."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.events import DdlChange, DdlEvent, DdlKind, TableName
from cdc.snapshot import ChunkDone, TablePlan
from processor.barrier import copied_after, ddl_names
from tests.unit.processor.test_span_warnings import SCHEMA

pytestmark = pytest.mark.unit

STOCK, FRESH = TableName("public", "stock"), TableName("public", "fresh")


class Plans:
    def __init__(self, plans: dict[tuple[int, TableName], int], chunks: dict[tuple[int, TableName], int] | None = None
                 ) -> None:
        self.plans = plans
        self.chunks = chunks or {}
        self.asked: list[tuple[str, int, TableName]] = []

    def done_chunks(self, cf: str, span: int, table: TableName) -> dict[int, Any]:
        ts = self.chunks.get((span, table))
        return {} if ts is None else {0: ChunkDone(1, 0.0, 0.0, "s", ts)}

    def get_plan(self, cf: str, span: int, table: TableName) -> Any:
        self.asked.append((cf, span, table))
        ts = self.plans.get((span, table))
        return None if ts is None else TablePlan(table.schema, table.table, rows=1, chunk_rows=10, chunks=(), ts=ts)


def test_a_plan_after_the_ddl_is_named_one_at_or_before_it_is_not() -> None:
    plans = Plans({(1, STOCK): 130, (2, STOCK): 120, (3, FRESH): 90})
    found = copied_after(plans, "cf", [1, 2, 3], [STOCK, FRESH], 120)  # type: ignore[arg-type]
    assert found == ["span cf/1 copied table public.stock as of Ts 130, after this DDL"]
    assert {(s, t) for _, s, t in plans.asked} == {(s, t) for s in (1, 2, 3) for t in (STOCK, FRESH)}


def test_a_plan_before_the_ddl_with_a_chunk_read_after_it_is_named() -> None:
    """A run that restarted keeps a table's plan (made before the DDL) and reads its chunks left under its own, later
    snapshot (processor.snapshot ``_keep_renamed``, or any restart): those chunks are as of after the DDL too."""
    plans = Plans({(1, FRESH): 90, (2, FRESH): 90}, {(1, FRESH): 130, (2, FRESH): 110})
    found = copied_after(plans, "cf", [1, 2], [FRESH], 120)  # type: ignore[arg-type]
    assert found == ["span cf/1 copied table public.fresh as of Ts 130, after this DDL"]


def test_a_rename_names_both_its_old_and_its_new_name() -> None:
    rename = DdlEvent(120, 120.0, FRESH, (DdlChange(DdlKind.RENAME_TABLE, "x"),), SCHEMA, None, "", new_table=STOCK)
    assert ddl_names(rename) == [FRESH, STOCK]
    drop = DdlEvent(120, 120.0, STOCK, (DdlChange(DdlKind.DROP_TABLE, "x"),), SCHEMA, None, "")
    assert ddl_names(drop) == [STOCK]
