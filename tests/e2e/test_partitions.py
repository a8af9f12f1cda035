"""End to end: partitioned tables (issue 8 item 5).

Rows of every partition land in one downstream table for the root (``publish_via_partition_root``), and
a TRUNCATE of the root is streamed: both end with a row-by-row compare. TRUNCATE of one partition, DETACH,
DROP of a partition and ATTACH of a table holding rows reach pgoutput's stream as nothing at all (measured
on PostgreSQL 18.6): Tidewater's upstream triggers put their rows into the stream, and every step ends equal
with the changefeed ``normal`` and no warning. Without those triggers (a user who may not create event
triggers), the owner's look finds the operations and raises divergence warnings; that test proves the
downstream differs by exactly the rows a warning names, follows its advice, and ends equal.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import assert_converged, run_sql, server_config, targets_in_make_test, wait_for

from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables, sqlalchemy_url
from playground.servers import EtcdServer, PostgresServer
from upstream.postgres import capture_objects

pytestmark = pytest.mark.e2e

TABLES = ["public.m"]
SCHEMA = """
CREATE TABLE m (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k);
CREATE TABLE m_a PARTITION OF m FOR VALUES FROM (0) TO (10);
CREATE TABLE m_b PARTITION OF m FOR VALUES FROM (10) TO (20);
CREATE TABLE m_c PARTITION OF m FOR VALUES FROM (20) TO (30);
"""
FILL = "INSERT INTO m SELECT g, g % 30, 'v' || g FROM generate_series(1, 300) g"


@pytest.fixture
def source_schema() -> str:
    return SCHEMA


@pytest.fixture
def cdc_fast_watch(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> Any:
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path, "upstream-check-interval = 1.0\n")).start()
    yield server
    server.terminate()


def _wait_warning(cdc: CdcServer, code: str, timeout: float = 30.0) -> str:
    """The message of the changefeed's data warning ``code``, once ``changefeed query`` shows it (and the state
    is ``warning``: the rows downstream differ)."""
    q = wait_for(cdc, "part", lambda q: q["state"] == "warning" and any(w["code"] == code for w in q["warnings"]),
                 f"state warning with {code}", timeout)
    return next(w["message"] for w in q["warnings"] if w["code"] == code)




def _assert_extra_rows(cdc: CdcServer, conn: Any, sink: str, keys: list[Any]) -> None:
    """The downstream holds exactly the upstream rows plus the rows with ``keys`` (compare lists 20 keys)."""
    cdc.wait_checkpoint("part", current_lsn(conn))
    (diff,) = compare_tables(conn, TABLES, sink)
    assert not diff.missing and not diff.different, diff
    assert diff.target_rows - diff.source_rows == len(keys) > 20
    assert sorted(diff.extra) == keys[:20]


def _delete_downstream(sink: str, where: str) -> None:
    engine = sa.create_engine(sqlalchemy_url(sink))
    table = "public.m" if sink.startswith("postgresql") else "m"
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM {table} WHERE {where}"))
    finally:
        engine.dispose()


def _assert_normal(cdc: CdcServer) -> None:
    q = cdc.changefeed("part")
    assert q["state"] == "normal" and not q["warnings"], q


def test_partition_truncate_detach_drop_and_attach_are_repaired_in_the_stream(
    cdc_fast_watch: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc = cdc_fast_watch
    cdc.create_changefeed("part", pg_server.uri(pg_database), sink_uri, config="[filter]\nrules = ['public.m']\n")
    run_sql(source, FILL, "UPDATE m SET k = k + 10, v = 'moved' WHERE id % 7 = 0 AND k < 20")
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    run_sql(source, "TRUNCATE m_a", "INSERT INTO m VALUES (1000, 5, 'after truncate')")
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    run_sql(source, "ALTER TABLE m DETACH PARTITION m_b", "INSERT INTO m_b VALUES (2000, 15, 'not replicated')")
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    run_sql(source, "CREATE TABLE m_d (id int, k int, v text, PRIMARY KEY (id, k))",
          "INSERT INTO m_d SELECT g, 30 + g % 10, 'd' || g FROM generate_series(1, 120) g",
          "ALTER TABLE m ATTACH PARTITION m_d FOR VALUES FROM (30) TO (40)",
          "UPDATE m SET v = 'changed after attach' WHERE k = 33")
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    # in one transaction with other changes: the repair sits at the DROP's position
    run_sql(source, "BEGIN", "INSERT INTO m VALUES (3000, 25, 'before drop')", "DROP TABLE m_c",
          "CREATE TABLE m_c PARTITION OF m FOR VALUES FROM (20) TO (30)",
          "INSERT INTO m VALUES (3000, 25, 'after drop')", "COMMIT")
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    time.sleep(2.5)  # the owner's looks (every second here) must not warn about what the stream repaired
    _assert_normal(cdc)


@pytest.mark.parametrize("sink_uri", targets_in_make_test("postgresql"), indirect=True)
def test_without_the_upstream_triggers_partition_divergence_is_warned(
    cdc_fast_watch: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str
) -> None:
    cdc = cdc_fast_watch
    cdc.create_changefeed("part", pg_server.uri(pg_database), sink_uri, config="[filter]\nrules = ['public.m']\n")
    # as for a user who may not create event triggers: the objects are not there
    slots = [s for (s,) in pg_server.execute("SELECT slot_name FROM pg_replication_slots WHERE database = "
                                             "current_database()", db=pg_database)]
    assert capture_objects.uninstall(source, *slots)
    run_sql(source, FILL, "UPDATE m SET k = k + 10, v = 'moved' WHERE id % 7 = 0 AND k < 20")  # rows change partition
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    run_sql(source, "TRUNCATE m", FILL)  # a truncate of the root is streamed
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    time.sleep(2.5)  # at least one look at the partitions (the baseline) before the DDL

    # DETACH: nothing in the stream; the warning names root, partition and bound
    b_keys = sorted(tuple(r) for r in pg_server.execute("SELECT id, k FROM m_b", db=pg_database))
    run_sql(source, "ALTER TABLE m DETACH PARTITION m_b")
    line = _wait_warning(cdc, "CDC:WarnPartitionDetached")
    assert "partition public.m_b (FOR VALUES FROM (10) TO (20)) of public.m was detached" in line
    _assert_extra_rows(cdc, source, sink_uri, b_keys)  # exactly the detached partition's rows
    _delete_downstream(sink_uri, "k >= 10 AND k < 20")  # what the warning says to do
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)

    # TRUNCATE of one partition: not streamed either; warned as truncated (new storage)
    a_keys = sorted(tuple(r) for r in pg_server.execute("SELECT id, k FROM m_a", db=pg_database))
    run_sql(source, "TRUNCATE m_a")
    line = _wait_warning(cdc, "CDC:WarnPartitionTruncated")
    assert "partition public.m_a (FOR VALUES FROM (0) TO (10)) of public.m was truncated or rewritten" in line
    _assert_extra_rows(cdc, source, sink_uri, a_keys)
    _delete_downstream(sink_uri, "k >= 0 AND k < 10")
    run_sql(source, "INSERT INTO m VALUES (1000, 5, 'after truncate')")
    assert_converged(cdc, "part", source, sink_uri, tables=TABLES)
    # the operator followed the warnings' advice: resume acknowledges them
    cdc.request("POST", "/api/v2/changefeeds/part/resume")
    # (only the standing notice that this changefeed, without the triggers, sees DDL through the stream only)
    info = wait_for(cdc, "part", lambda q: q["state"] == "normal" and [w["code"] for w in q["warnings"]] == [
        "CDC:NoticeDdlNotCaptured"], "normal without warnings")
    assert info["error"] is None, info
