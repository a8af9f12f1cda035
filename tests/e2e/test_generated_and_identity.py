"""End to end: stored generated columns are replicated as plain columns (issue 8 item 6), tables whose key
cannot serve as replica identity are refused at create (item 4), and a REPLICA IDENTITY FULL table with a
DEFERRABLE primary key is replicated keyed by it.

PostgreSQL 18 -> `cdc server` -> SQLite, MariaDB and PostgreSQL; every replication test ends with a
row-by-row comparison (the generated columns' values included), every refusal asserts its message.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import assert_converged, run_sql

from playground.cluster import ApiError, CdcServer
from playground.compare import sqlalchemy_url
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

TABLES = ["public.gen_items", "public.gen_key", "public.fdpk"]
SCHEMA = """
CREATE TABLE gen_items (
    id int PRIMARY KEY,
    price numeric(10,2) NOT NULL,
    qty int NOT NULL,
    total numeric(12,2) GENERATED ALWAYS AS (price * qty) STORED,
    label text GENERATED ALWAYS AS ('item-' || id::text || '-' || qty::text) STORED
);
CREATE TABLE gen_key (a int NOT NULL, id int GENERATED ALWAYS AS (a * 2) STORED PRIMARY KEY, v text);
CREATE TABLE fdpk (id int PRIMARY KEY DEFERRABLE, v text);
ALTER TABLE fdpk REPLICA IDENTITY FULL;
"""
CONFIG = "[filter]\nrules = ['public.gen_*', 'public.fdpk']\n"


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


def test_stored_generated_columns_are_replicated_as_plain_columns(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc_server.create_changefeed("gen", pg_server.uri(pg_database), sink_uri, config=CONFIG, snapshot="none")
    run_sql(source,
          "INSERT INTO gen_items (id, price, qty) SELECT g, g * 1.25, g % 7 FROM generate_series(1, 200) g",
          "INSERT INTO gen_key (a, v) SELECT g, 'v' || g FROM generate_series(1, 100) g",
          "INSERT INTO fdpk SELECT g, 'f' || g FROM generate_series(1, 50) g")
    assert_converged(cdc_server, "gen", source, sink_uri, tables=TABLES)
    run_sql(source,
          "UPDATE gen_items SET qty = qty + 3 WHERE id % 3 = 0",  # every generated value changes with it
          "UPDATE gen_items SET price = 9.99 WHERE id BETWEEN 50 AND 60",
          "DELETE FROM gen_items WHERE id % 10 = 0",
          "UPDATE gen_key SET v = 'changed' WHERE a % 4 = 0",
          "UPDATE gen_key SET a = a + 1000 WHERE a % 5 = 0",  # the generated key moves
          "DELETE FROM gen_key WHERE a BETWEEN 20 AND 25",
          "UPDATE fdpk SET v = 'u' || id WHERE id % 2 = 0",
          "DELETE FROM fdpk WHERE id > 45")
    info = assert_converged(cdc_server, "gen", source, sink_uri, tables=TABLES)
    assert info["state"] == "normal" and info["error"] is None, info
    # stated explicitly: the generated values are downstream as values, not NULLs
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.connect() as conn:
            t = "public.gen_items" if sink_uri.startswith("postgresql") else "gen_items"
            row = conn.execute(sa.text(f"SELECT total, label FROM {t} WHERE id = 3")).one()
    finally:
        engine.dispose()
    assert (float(row[0]), row[1]) == (3 * 1.25 * 6, "item-3-6")


def test_create_refuses_tables_that_would_break_the_application(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Any
) -> None:
    run_sql(source, "CREATE TABLE bad_dpk (id int PRIMARY KEY DEFERRABLE, u int NOT NULL, v text)",
          "CREATE UNIQUE INDEX bad_dpk_u ON bad_dpk (u)",
          "CREATE TABLE bad_virtual (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) VIRTUAL)")
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    with pytest.raises(ApiError) as ei:
        cdc_server.create_changefeed("bad", pg_server.uri(pg_database), sink, config="[filter]\nrules = ['public.bad_*']\n")
    assert ei.value.status == 400 and ei.value.body["error_code"] == "CDC:ErrTableIneligible"
    assert ei.value.body["error_msg"] == (
        '2 table(s) cannot be replicated (each needs a primary key, a replica identity index or REPLICA IDENTITY '
        'FULL): table "public"."bad_dpk" has a DEFERRABLE primary key, which PostgreSQL cannot use as replica '
        'identity: once published, every UPDATE and DELETE of "public"."bad_dpk" would fail; fix with ALTER TABLE '
        '"public"."bad_dpk" REPLICA IDENTITY USING INDEX "bad_dpk_u" or ALTER TABLE "public"."bad_dpk" REPLICA '
        'IDENTITY FULL; "public"."bad_virtual" has VIRTUAL generated column(s) "twice", which PostgreSQL never '
        'publishes: they would be missing downstream; make them STORED (drop the column and add it again with '
        'GENERATED ALWAYS AS (...) STORED), or exclude "public"."bad_virtual" with the filter')
    # nothing was created upstream, and the application's writes still work
    assert pg_server.execute("SELECT count(*) FROM pg_publication", db=pg_database)[0][0] == 0
    run_sql(source, "INSERT INTO bad_dpk VALUES (1, 1, 'x')", "UPDATE bad_dpk SET v = 'y'", "DELETE FROM bad_dpk")


def test_create_refuses_target_names_differing_only_in_case_on_sqlite(
    cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Any
) -> None:
    run_sql(source, 'CREATE TABLE public."Mixed" (id int PRIMARY KEY)', "CREATE SCHEMA other",
          "CREATE TABLE other.mixed (id int PRIMARY KEY)")
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    config = "[filter]\nrules = ['public.Mixed', 'other.*']\n"
    with pytest.raises(ApiError) as ei:
        cdc_server.create_changefeed("case", pg_server.uri(pg_database), sink, config=config)
    assert ei.value.body["error_code"] == "CDC:ErrTargetTableConflict"
    assert ei.value.body["error_msg"] == (
        f"tables other.mixed and public.Mixed would both land on 'mixed' and 'Mixed' (one table there: names differ "
        f"only in case) in the sink {sink}: exclude one of them with the filter")
    # PostgreSQL keeps schema and case: no conflict
    target = f"target_case_{pg_database[-8:]}"
    pg_server.create_database(target)
    assert cdc_server.create_changefeed("case", pg_server.uri(pg_database), pg_server.uri(target),
                                        config=config)["state"] == "normal"
