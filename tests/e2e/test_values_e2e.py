"""Values exactly as upstream (issue 8 item 7) end to end: `cdc server` replicates edge values (numeric text,
-0, multi-dimensional arrays, enums, domains) into every SQL sink and the exact row-by-row compare agrees; an
array with a lower bound other than 1 fails a changefeed into SQLite with the table and column named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_workload import assert_converged, wait_state

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
    cdc_server.create_changefeed("vals", pg_server.uri(pg_database), sink_uri)
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
    cdc_server.create_changefeed("bounds", pg_server.uri(pg_database), sink)
    with source.cursor() as cur:
        cur.execute("INSERT INTO vals (id, grid) VALUES (1, '[0:1]={7,8}')")
    q = wait_state(cdc_server, "bounds", "failed", timeout=120)
    assert q["error"]["code"] == "CDC:ErrSinkFatal", q["error"]
    assert "vals" in q["error"]["message"] and "column 'grid'" in q["error"]["message"], q["error"]
    assert "lower bound is not 1" in q["error"]["message"], q["error"]
