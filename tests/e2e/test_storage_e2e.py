"""End to end: PostgreSQL -> `cdc server` -> the storage sink (``file://``), each protocol, with rows copied at
create, concurrent writers and a capture SIGKILL mid-stream; then a consumer rebuilds every table from the files up
to the published ``metadata`` checkpoint (sinks.storage.reader) and it equals the upstream row by row."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, TABLES, BackgroundWriter, mixed_steps, mixed_workload, server_config

from cdc.events import TableName
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_rows
from playground.servers import PostgresServer
from sinks.storage.reader import StorageReader, rebuild

pytestmark = pytest.mark.e2e


def wait_metadata(sink: str, lsn: int, cdc: CdcServer, timeout: float = 60.0) -> int:
    reader = StorageReader(sink)
    deadline = time.monotonic() + timeout
    ckpt = None
    while time.monotonic() < deadline:
        ckpt = reader.checkpoint()
        if ckpt is not None and ckpt >= lsn:
            return ckpt
        time.sleep(0.2)
    raise AssertionError(f"metadata checkpoint {ckpt} did not reach {lsn} in {timeout}s\n{cdc.log_tail()}")


def assert_lake_equals_upstream(sink: str, conn: Any) -> None:
    _, states = rebuild(sink)
    for qualified in TABLES:
        state = states[TableName.parse(qualified)]
        assert not state.problems, state.problems[:5]
        diff = compare_rows(conn, qualified, state.rows())
        assert diff.equal, f"{qualified} rebuilt from the files differs from the upstream: {diff}"
        assert diff.source_rows > 0


def assert_files_sane(lake: Path) -> None:
    """Indexes are dense from 1 in every data directory; no temporary file is left visible."""
    for d, _, names in os.walk(lake):
        data = sorted(int(n[3:].split(".")[0]) for n in names if n.startswith("CDC") and n != "CDC.index")
        if data:
            assert data == list(range(1, len(data) + 1)), (d, data)


@pytest.mark.parametrize("protocol", ["csv", pytest.param("canal-json", marks=pytest.mark.slow),
                                      pytest.param("parquet", marks=pytest.mark.slow)])
def test_storage_sink_rebuilds_the_upstream_after_a_sigkill(etcd_server: Any, cluster_id: str, tmp_path: Path,
                                                            pg_server: PostgresServer, pg_database: str, source: Any,
                                                            protocol: str) -> None:
    lake = tmp_path / "lake"
    sink = f"file://{lake}?protocol={protocol}&flush-interval=300ms&file-size=32768"
    mixed_workload(source, 8)  # rows that exist at create: the initial copy writes them into the files
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE))
    cdc.start()
    try:
        created = cdc.create_changefeed("lake", pg_server.uri(pg_database), sink, "span-count = 2\n")
        with pg_server.connect(pg_database) as c, c.cursor() as cur:  # tables whose old images are partial: said
            cur.execute("SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                        "c.relnamespace WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public' AND c.relreplident <> 'f'")
            partial = sorted(r[0] for r in cur.fetchall())
        notices = [n for n in created.get("notices", []) if n.startswith("CDC:NoticePartialOldImage")]
        assert bool(notices) == bool(partial) and all(t in notices[0] for t in partial), (partial, created)
        with BackgroundWriter(pg_server.connect(pg_database), mixed_steps(2), start=8, pause=0.01) as writer:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # stream for a while, then kill the capture mid-stream
                spans = cdc.changefeed("lake").get("spans") or []
                if sum(s.get("rows", 0) for s in spans) > 150:
                    break
                time.sleep(0.1)
            cdc.kill()
            time.sleep(0.5)
            cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                            extra_args=server_config(tmp_path, FAST_LEASE)).start()
            time.sleep(2.0)
            writer.finish()
        lsn = current_lsn(source)
        info = cdc.wait_checkpoint("lake", lsn, timeout=120)
        assert info["state"] == "normal", info
        wait_metadata(sink, lsn, cdc)
        assert_lake_equals_upstream(sink, source)
        assert_files_sane(lake)
    finally:
        cdc.terminate()


def test_create_refuses_a_bad_storage_uri_or_an_unusable_directory(cdc_server: CdcServer, pg_server: PostgresServer,
                                                                   pg_database: str, source: Any,
                                                                   tmp_path: Path) -> None:
    from playground.cluster import ApiError

    (tmp_path / "a-file").write_text("not a directory")
    upstream = pg_server.uri(pg_database)
    for sink, words in ((f"file://{tmp_path}/lake?protocol=avro", "use protocol=csv"),
                        (f"file://{tmp_path}/lake", "add ?protocol=csv"),
                        (f"file://{tmp_path}/lake?protocol=csv&flush-interval=5", "flush-interval"),
                        (f"file://{tmp_path}/a-file/lake?protocol=csv", str(tmp_path / "a-file"))):
        with pytest.raises(ApiError) as info:
            cdc_server.create_changefeed("bad", upstream, sink)
        assert words in info.value.body.get("error_msg", ""), info.value.body
    assert not (tmp_path / "lake").exists()
