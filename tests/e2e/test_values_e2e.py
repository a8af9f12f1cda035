"""Values exactly as upstream (issue 8 item 7) end to end: `cdc server` replicates edge values (numeric text,
-0, multi-dimensional arrays, enums, domains) into every SQL sink and the exact row-by-row compare agrees; an
array with a lower bound other than 1 fails a changefeed into SQLite with the table and column named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, wait_for, wait_state

from playground.cluster import CdcServer
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

VALUES_SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN amount AS numeric(10,2);
CREATE TABLE vals (id int PRIMARY KEY, n numeric, n7 numeric(12,7), f8 float8, amt amount, m mood, ms mood[],
                   grid int[], na numeric[]);
"""


@pytest.fixture
def source_schema() -> str:
    return VALUES_SCHEMA


def test_edge_values_replicate_exactly(cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str,
                                       source: Any, sink_uri: str) -> None:
    cdc_server.create_changefeed("vals", pg_server.uri(pg_database), sink_uri, snapshot="none")
    with source.cursor() as cur:
        cur.execute("INSERT INTO vals VALUES "
                    "(1, 0.0000001, 0.0000001, '-0', 1.50, 'happy', '{sad,ok}', '{{1,2},{3,4}}', '{0.0000001,1.50}'),"
                    "(2, 123456789012345678901234567890.123456789, 99999.9999999, 5e-324, 0.00, NULL, '{}', '{}', NULL)")
        cur.execute("UPDATE vals SET n = 1.500, n7 = 0 WHERE id = 2")
        cur.execute("INSERT INTO vals SELECT g, g * 0.0000001, g * 0.0000001, g, g / 100.0, 'ok', '{ok}', "
                    "ARRAY[[g, g], [g, g]], ARRAY[g * 0.01] FROM generate_series(10, 60) g")  # >= 32 rows: COPY
    info = assert_converged(cdc_server, "vals", source, sink_uri, ["public.vals"])
    assert info["state"] == "normal"


def test_an_array_with_other_bounds_fails_a_json_target_with_table_and_column(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("bounds", pg_server.uri(pg_database), sink, snapshot="none")
    with source.cursor() as cur:
        cur.execute("INSERT INTO vals (id, grid) VALUES (1, '[0:1]={7,8}')")
    q = wait_state(cdc_server, "bounds", "failed", timeout=120)
    assert q["error"]["code"] == "CDC:ErrSinkDataRejected", q["error"]
    assert "vals" in q["error"]["message"] and "column 'grid'" in q["error"]["message"], q["error"]
    assert "lower bound is not 1" in q["error"]["message"], q["error"]


EDGE_ROWS = ("(0.0000001, 0.0000001, '-0', 1.50, 'happy', '{sad,ok}', '{{1,2},{3,4}}', '{0.0000001,1.50}')",
             "(123456789012345678901234567890.123456789, 99999.9999999, 5e-324, 0.00, NULL, '{}', '{}', NULL)",
             "(0.10, -0.0000001, 1e-300, NULL, 'sad', NULL, '{{{7}}}', '{-0.5}')")


def _insert_edges(cur: Any, offset: int, one_by_one: bool) -> None:
    cols = "(id, n, n7, f8, amt, m, ms, grid, na)"
    rows = [f"({offset + i}, {r[1:]}" for i, r in enumerate(EDGE_ROWS, start=1)]
    if one_by_one:  # small transactions: the sink sends parameters converted from the parsed values
        for r in rows:
            cur.execute(f"INSERT INTO vals {cols} VALUES {r}")
        return
    cur.execute(f"INSERT INTO vals {cols} VALUES {', '.join(rows)};"  # with 40 more rows: the sink's COPY (PostgreSQL)
                f"INSERT INTO vals SELECT {offset} + g, g * 0.0000001, g * 0.0000001, g / 7.0, g / 100.0, 'ok', '{{ok}}', "
                f"ARRAY[[g, g], [g, g]], ARRAY[g * 0.01] FROM generate_series(10, 49) g")


def test_a_copied_row_and_the_same_row_streamed_are_stored_identically(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str,
        tmp_path: Path) -> None:
    """Rows 1..: copied by the initial snapshot (into PostgreSQL: the upstream's COPY text passed through, see
    sinks/sql/ops/bulk.py); rows 1001..: the same values streamed in one transaction; rows 2001..: streamed one row per
    transaction. Every stored value of a row must be the same in the three, and the whole equal to the upstream."""
    import sqlalchemy as sa

    from playground.compare import sqlalchemy_url

    with source.cursor() as cur:
        _insert_edges(cur, 0, one_by_one=False)
    cdc_server.create_changefeed("copied", pg_server.uri(pg_database), sink_uri)
    wait_for(cdc_server, "copied", lambda q: q["phase"] == "streaming", "phase streaming", timeout=120)
    with source.cursor() as cur:
        _insert_edges(cur, 1000, one_by_one=False)
        _insert_edges(cur, 2000, one_by_one=True)
    assert_converged(cdc_server, "copied", source, sink_uri, ["public.vals"])
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.connect() as conn:
            table = sa.Table("vals", sa.MetaData(), autoload_with=conn,
                             schema="public" if sink_uri.startswith("postgresql") else None)
            stored = {r[0]: r[1:] for r in conn.execute(sa.select(table))}
    finally:
        engine.dispose()
    if sink_uri.startswith("postgresql"):  # the copy really took the passthrough (the job's log says how)
        logs = "".join(p.read_text() for p in (tmp_path / "cdc").glob("data-*/snapshot/snapshot-copied-0.log"))
        assert "chunk public.vals#0 copied as COPY text: 43 rows" in logs, logs[-3000:]
    for i in (*range(1, len(EDGE_ROWS) + 1), *range(10, 50)):
        copied, streamed = repr(stored[i]), repr(stored[1000 + i])
        assert copied == streamed, (i, copied, streamed)
        if i <= len(EDGE_ROWS):
            assert repr(stored[2000 + i]) == copied, (i, copied, stored[2000 + i])
