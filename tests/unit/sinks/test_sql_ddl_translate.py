"""DDL translation for the SQL sink (sinks.sql.dialect.ddl), pure: upstream defaults as values, the widening
rules, and per-dialect statements whose column types are exactly those of streaming's CREATE TABLE."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite

from cdc.config import ChangefeedConfig
from cdc.errors import DdlRejected
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, IndexSpec, TableName, TableSchema
from sinks.sql.dialect.ddl import FILL, REBUILD, RESCALE, SQL, Translator, default_value, widening_refusal
from sinks.sql.dialect.typemap import plan_table

pytestmark = pytest.mark.unit
K = DdlKind
PREPARERS = {"postgresql": postgresql.dialect().identifier_preparer, "mysql": mysql.dialect().identifier_preparer,
             "sqlite": sqlite.dialect().identifier_preparer}


def col(name: str, base: str, type_name: str = "", mod: int = -1, default: str | None = None,
        key: bool = False) -> ColumnSchema:
    return ColumnSchema(name, 0, base, False, type_name or base, mod, not key, key, default)


def table(*cols: ColumnSchema, key: tuple[str, ...] = ("id",), name: str = "t") -> TableSchema:
    if not key:
        return TableSchema(TableName("public", name), cols, tuple(c.name for c in cols), "f", has_key=False)
    return TableSchema(TableName("public", name), cols, key)


def parts(dialect: str) -> Any:
    return lambda t: (t.schema, t.table) if dialect == "postgresql" else (None, t.table)


def translate(dialect: str, ev: DdlEvent, **kw: Any) -> Any:
    return Translator(dialect, PREPARERS[dialect], parts(dialect), **kw).translate(ev)


ID = col("id", "int4", "integer", key=True)
A = col("a", "varchar", "character varying(10)", 14)
N = col("n", "numeric", "numeric(6,2)", (6 << 16 | 2) + 4)


@pytest.mark.parametrize(("c", "value"), [
    (col("c", "int4", default="7"), 7),
    (col("c", "int4", default="'-1'::integer"), -1),
    (col("c", "int8", default="(-5)"), -5),
    (col("c", "text", default="'it''s'::text"), "it's"),
    (col("c", "varchar", "character varying(5)", 9, default="'ab'::character varying"), "ab"),
    (col("c", "bpchar", "character(4)", 8, default="'ab'::bpchar"), "ab  "),
    (col("c", "numeric", "numeric(8,3)", (8 << 16 | 3) + 4, default="1.5"), Decimal("1.500")),
    (col("c", "float8", default="'2.5'::double precision"), 2.5),
    (col("c", "bool", default="true"), True),
    (col("c", "date", default="'2024-02-29'::date"), datetime.date(2024, 2, 29)),
    (col("c", "uuid", default="'00000000-0000-0000-0000-000000000001'::uuid"), uuid.UUID(int=1)),
    (col("c", "text", default="NULL::text"), None),
    (col("c", "text"), None),
])
def test_constant_defaults_become_values(c: ColumnSchema, value: Any) -> None:
    dv = default_value(c)
    assert dv.known and dv.value == value and type(dv.value) is type(value)


@pytest.mark.parametrize(("expr", "why"), [
    ("now()", "volatile"), ("nextval('t_id_seq'::regclass)", "volatile"), ("random()", "volatile"),
    ("CURRENT_TIMESTAMP", "volatile"), ("gen_random_uuid()", "volatile"), ("lower('ABC'::text)", "not a constant"),
])
def test_other_defaults_are_not_reproduced(expr: str, why: str) -> None:
    dv = default_value(col("c", "text", default=expr))
    assert not dv.known and why in dv.reason and expr in dv.reason


@pytest.mark.parametrize(("old", "new", "ok"), [
    (col("c", "int2"), col("c", "int4"), True), (col("c", "int4"), col("c", "int8"), True),
    (col("c", "int8"), col("c", "int4"), False), (col("c", "float4"), col("c", "float8"), True),
    (A, col("a", "varchar", "character varying(50)", 54), True), (A, col("a", "text"), True),
    (A, col("a", "varchar", "character varying(5)", 9), False), (col("a", "text"), A, False),
    (N, col("n", "numeric", "numeric(10,3)", (10 << 16 | 3) + 4), True),
    (N, col("n", "numeric", "numeric(6,3)", (6 << 16 | 3) + 4), False),  # fewer integer digits
    (N, col("n", "numeric", "numeric"), True), (col("n", "numeric", "numeric"), N, False),
    (col("c", "int4"), col("c", "text"), False), (col("c", "bpchar", "character(2)", 6), col("c", "bpchar", "character(3)", 7), False),
])
def test_widening_rules(old: ColumnSchema, new: ColumnSchema, ok: bool) -> None:
    assert (widening_refusal(old, new) is None) is ok


def ev(kind: DdlKind, before: TableSchema | None, after: TableSchema | None, *changes: DdlChange,
       new_table: TableName | None = None) -> DdlEvent:
    return DdlEvent(10, 0.0, TableName("public", "t"), changes or (DdlChange(kind),), before, after, f"-- {kind}",
                    new_table=new_table)


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_alter_type_uses_the_create_table_type(dialect: str) -> None:
    a2 = col("a", "varchar", "character varying(300)", 304)
    before, after = table(ID, A, N), table(ID, a2, N)
    plan = translate(dialect, ev(K.ALTER_COLUMN_TYPE, before, after, DdlChange(K.ALTER_COLUMN_TYPE, "a")))
    fresh = plan_table(after, dialect, target_schema=None, target_name="t").column("a").ddl_type
    assert fresh is not None
    if dialect == "sqlite":  # TEXT both: nothing to do
        assert plan.steps == []
    else:
        (step,) = plan.steps
        assert step.kind == SQL and step.sql.endswith(fresh)


def test_numeric_scale_growth_rewrites_sqlite_text_and_alters_elsewhere() -> None:
    n2 = col("n", "numeric", "numeric(10,3)", (10 << 16 | 3) + 4)
    e = ev(K.ALTER_COLUMN_TYPE, table(ID, A, N), table(ID, A, n2), DdlChange(K.ALTER_COLUMN_TYPE, "n"))
    (step,) = translate("sqlite", e).steps
    assert step.kind == RESCALE and step.params[0] == 3
    (step,) = translate("mysql", e).steps
    assert "MODIFY COLUMN `n` DECIMAL(10,3)" in step.sql


def test_narrowing_is_refused_before_any_statement() -> None:
    a5 = col("a", "varchar", "character varying(5)", 9)
    with pytest.raises(DdlRejected, match="narrowing character varying.10. to character varying.5."):
        translate("postgresql", ev(K.ALTER_COLUMN_TYPE, table(ID, A), table(ID, a5), DdlChange(K.ALTER_COLUMN_TYPE, "a")))


def test_add_column_fills_with_the_converted_default() -> None:
    c = col("c", "bool", default="true")
    e = ev(K.ADD_COLUMN, table(ID, A), table(ID, A, c), DdlChange(K.ADD_COLUMN, "c"))
    add, fill = translate("mysql", e).steps
    assert add.sql == "ALTER TABLE `t` ADD COLUMN `c` TINYINT(1)"
    assert fill.kind == FILL and fill.sql == "UPDATE `t` SET `c` = %s" and fill.params == (True,)
    add, fill = translate("sqlite", e).steps
    assert fill.sql == 'UPDATE "t" SET "c" = ?'


def test_sqlite_rebuilds_for_drop_column_and_key_changes_and_maps_renames() -> None:
    b = col("b", "text")
    e = ev(K.DROP_COLUMN, table(ID, A, b), table(ID, col("a2", "varchar", "character varying(10)", 14)),
           DdlChange(K.DROP_COLUMN, "b"), DdlChange(K.RENAME_COLUMN, "a", "a2"))
    (step,) = translate("sqlite", e).steps
    assert step.kind == REBUILD and step.rebuild is not None
    assert step.rebuild.copy == 'INSERT INTO "_tidewater_rebuild_t" ("id", "a2") SELECT "id", "a" FROM "t"'
    pg = translate("postgresql", e).steps
    assert [s.sql for s in pg] == ['ALTER TABLE "public"."t" DROP COLUMN "b"',
                                   'ALTER TABLE "public"."t" RENAME COLUMN "a" TO "a2"']


def test_key_change_drops_reshapes_and_adds_the_primary_key() -> None:
    v = col("v", "text")
    keyless = table(col("id", "int4", "integer"), v, key=())
    keyed = table(ID, v)
    steps = translate("mysql", ev(K.ADD_PRIMARY_KEY, keyless, keyed)).steps
    assert [s.sql for s in steps] == ["ALTER TABLE `t` MODIFY COLUMN `id` INT NOT NULL",
                                      "ALTER TABLE `t` ADD PRIMARY KEY (`id`)"]
    steps = translate("postgresql", ev(K.DROP_PRIMARY_KEY, keyed, keyless)).steps
    assert [s.kind for s in steps] == ["drop pk", SQL]
    assert steps[1].sql == 'ALTER TABLE "public"."t" ALTER COLUMN "id" DROP NOT NULL'


def test_no_op_kinds_and_indexes_off_produce_no_statement() -> None:
    t = table(ID, A)
    for k in (K.SET_DEFAULT, K.DROP_DEFAULT, K.SET_NOT_NULL, K.DROP_NOT_NULL, K.OTHER):
        assert translate("postgresql", ev(k, t, t, DdlChange(k, "a"))).steps == []
    ix = DdlChange(K.CREATE_INDEX, index=IndexSpec("t_a", ("a",)))
    assert translate("mysql", ev(K.CREATE_INDEX, t, t, ix)).steps == []
    (step,) = translate("mysql", ev(K.CREATE_INDEX, t, t, ix), replicate_indexes=True).steps
    assert step.sql == "CREATE INDEX `t_a` ON `t` (`a`)"


def test_rename_table_follows_the_sinks_routing() -> None:
    e = ev(K.RENAME_TABLE, table(ID), table(ID), DdlChange(K.RENAME_TABLE, new_name="other.u"),
           new_table=TableName("other", "u"))
    pg = translate("postgresql", e)
    assert [s.sql for s in pg.steps] == ['CREATE SCHEMA IF NOT EXISTS "other"',
                                         'ALTER TABLE "public"."t" SET SCHEMA "other"',
                                         'ALTER TABLE "other"."t" RENAME TO "u"']
    assert pg.touched == {("public", "t"), ("other", "u")}
    (step,) = translate("mysql", e).steps  # the upstream schema is dropped on MySQL
    assert step.sql == "RENAME TABLE `t` TO `u`"


def test_ddl_config_section() -> None:
    cfg = ChangefeedConfig.from_toml("[ddl]\nreplicate-indexes = true\n")
    assert cfg.ddl.replicate_indexes is True
    assert ChangefeedConfig.from_dict(cfg.to_dict()).ddl.replicate_indexes is True


def test_a_default_unknown_because_the_ddl_came_from_the_stream_alone_is_not_taken_for_none() -> None:
    c = col("c", "int4")
    assert default_value(c).known
    dv = default_value(c, known_schema=False)
    assert not dv.known and "unknown" in dv.reason
    e = DdlEvent(10, 0.0, TableName("public", "t"), (DdlChange(K.ADD_COLUMN, "c"),), table(ID), table(ID, c), "")
    add, fill = translate("postgresql", e).steps
    assert fill.kind == FILL and "unknown" in fill.note and fill.sql.startswith("SELECT 1 FROM")


def test_an_event_without_the_schemas_it_needs_is_rejected() -> None:
    with pytest.raises(DdlRejected, match="lacks the table's schema"):
        translate("mysql", ev(K.ADD_PRIMARY_KEY, None, table(ID)))
    with pytest.raises(DdlRejected, match="lacks the table's schema"):
        translate("sqlite", ev(K.DROP_COLUMN, table(ID, A), None, DdlChange(K.DROP_COLUMN, "a")))


def test_a_column_change_without_its_column_name_is_rejected() -> None:
    with pytest.raises(DdlRejected, match="does not name its column"):
        translate("postgresql", ev(K.RENAME_COLUMN, table(ID, A), table(ID, A), DdlChange(K.RENAME_COLUMN, "a")))


def test_fills_the_event_carries_become_an_update_or_a_read_back_by_key() -> None:
    import dataclasses

    from cdc.errors import DataRejected
    from cdc.events import ColumnFill
    from sinks.sql.dialect.ddl import REREAD

    at = col("at", "timestamptz", "timestamp with time zone", default="now()")
    u = col("u", "uuid", "uuid", default="gen_random_uuid()")
    k = col("k", "int4", "integer", default="5")
    when = datetime.datetime(2026, 11, 28, 8, 6, 35, 839083, tzinfo=datetime.UTC)
    added = ev(K.ADD_COLUMN, table(ID), table(ID, at, u, k), DdlChange(K.ADD_COLUMN, "at"), DdlChange(K.ADD_COLUMN, "u"),
               DdlChange(K.ADD_COLUMN, "k"))
    added = dataclasses.replace(added, fills=(ColumnFill("at", when), ColumnFill("u", per_row=True),
                                              ColumnFill("k", per_row=True)))
    steps = translate("mysql", added).steps
    fills = [s for s in steps if s.kind in (FILL, REREAD)]
    assert [s.kind for s in fills] == [FILL, REREAD, REREAD]  # k: per row as the event says (the default now may
    # not be the one the rows got: a schema seen in the stream only is enriched from the catalog of a later time)
    assert fills[0].params == ("2026-11-28 08:06:35.839083",) and not fills[0].note  # as rows: UTC text
    rr = fills[1].reread
    assert rr is not None and rr.schema.column_names == ("id", "u") and rr.update.endswith("WHERE `id` = %s")
    # no key to read back by: the reason, raised as a warning when the table has rows
    keyless = dataclasses.replace(added, before=table(ID, key=()), after=table(ID, at, u, k, key=()))
    notes = [s.note for s in translate("postgresql", keyless).steps if s.kind == FILL and s.note]
    assert len(notes) == 2 and all("no key" in n for n in notes), notes
    # a value the target DECIMAL would round is refused, as a row's would be
    big = col("big", "numeric", "numeric")
    wide = dataclasses.replace(ev(K.ADD_COLUMN, table(ID), table(ID, big), DdlChange(K.ADD_COLUMN, "big")),
                               fills=(ColumnFill("big", Decimal("1." + "1" * 40)),))
    with pytest.raises(DataRejected, match="fractional digits"):
        translate("mysql", wide)
