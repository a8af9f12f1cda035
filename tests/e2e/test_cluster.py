"""Several captures: owner failover, capture kills, joins, drains, pause/resume under a continuous
write workload; fencing of a frozen capture. Every test ends with a row-by-row comparison."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from e2e_workload import (
    FAST_LEASE,
    SCHEMA,
    TABLES,
    BackgroundWriter,
    assert_converged,
    make_sink_uri,
    mixed_steps,
    mixed_workload,
    server_config,
)

from playground.chaos import captures, checkpoint_of, live, owner_of, wait_recovery
from playground.cluster import CdcServer
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e

FAST = FAST_LEASE + "drain-timeout = 30\n"
CONFIG = "span-count = 3\n[filter]\nrules = ['public.*']\n"


def Workload(pg: PostgresServer, db: str, start: int = 0) -> BackgroundWriter:
    """Continuous small transactions (two at a time) from a background thread until stopped."""
    return BackgroundWriter(pg.connect(db), mixed_steps(2), start=start, pause=0.02)


@pytest.fixture(params=[pytest.param("mariadb", marks=pytest.mark.slow), "postgresql"])  # the drill is the cluster's
def sink_uri(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def test_three_captures_survive_kills_joins_drains_and_pause(
        etcd_server: EtcdServer, cluster_id: str, tmp_path: Path, pg_server: PostgresServer, pg_database: str,
        sink_uri: str) -> None:
    drill(etcd_server, cluster_id, tmp_path, pg_server, pg_database, sink_uri, kills=(True, False, True))


@pytest.mark.slow
def test_soak_many_kills(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path, pg_server: PostgresServer,
                         pg_database: str) -> None:
    """The long multi-kill run (`pytest -m slow`): twelve kills, owner and non-owner alternating."""
    db = f"target_{uuid.uuid4().hex[:10]}"
    pg_server.create_database(db)
    drill(etcd_server, cluster_id, tmp_path, pg_server, pg_database, pg_server.uri(db),
          kills=tuple(i % 2 == 0 for i in range(12)))


def drill(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path, pg_server: PostgresServer, pg_database: str,
          sink_uri: str, kills: tuple[bool, ...]) -> None:
    """Three captures under continuous writes: SIGKILL the owner or a non-owner for each entry of
    ``kills`` (a replacement joins after each), drain one with SIGTERM, pause/resume, then converge."""
    pg_server.execute(SCHEMA, db=pg_database)
    args = server_config(tmp_path, FAST)
    servers = [CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=args).start()
               for _ in range(3)]
    source = pg_server.connect(pg_database)
    recoveries: list[float] = []
    try:
        servers[0].create_changefeed("ha", pg_server.uri(pg_database), sink_uri, CONFIG, snapshot="none")
        with Workload(pg_server, pg_database) as wl:
            time.sleep(3)
            for victim_is_owner in kills:
                owner = owner_of(servers)
                victim = owner if victim_is_owner else next(s for s in live(servers) if s is not owner)
                before = checkpoint_of(servers, "ha")
                killed_at = time.monotonic()
                victim.kill()
                recoveries.append(wait_recovery(servers, "ha", before, killed_at))
                # a replacement joins: it gets spans by rebalancing
                servers.append(CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                                         extra_args=args).start())
                time.sleep(2)
            # drain one capture with SIGTERM: its spans move away before it exits
            drained = next(s for s in live(servers) if s is not owner_of(servers))
            assert drained.terminate() == 0
            assert "drained" in drained.log_file.read_text() or "draining" not in drained.log_file.read_text()
            # pause / resume while writes continue
            live(servers)[0].request("POST", "/api/v2/changefeeds/ha/pause")
            time.sleep(2)
            live(servers)[0].request("POST", "/api/v2/changefeeds/ha/resume")
            time.sleep(2)
            wl.finish()
        survivors = live(servers)
        info = assert_converged(survivors[0], "ha", source, sink_uri, TABLES, timeout=180)
        assert info["state"] == "normal", info
        placed = {s["capture"] for s in info["spans"]}
        alive_ids = {c["id"] for c in captures(servers)}
        assert placed <= alive_ids, (placed, alive_ids)
        print(f"\nrecovery after kills (s): {[round(r, 2) for r in recoveries]}")
    finally:
        source.close()
        for s in servers:
            s.kill()


def test_frozen_capture_writes_nothing_after_its_span_is_reassigned(
        etcd_server: EtcdServer, cluster_id: str, tmp_path: Path, pg_server: PostgresServer,
        pg_database: str) -> None:
    """SIGSTOP the capture running the span past its lease; the span moves; SIGCONT: the old capture
    must not commit anything downstream after the reassignment."""
    pg_server.execute(SCHEMA, db=pg_database)
    target_db = f"target_{uuid.uuid4().hex[:10]}"
    pg_server.create_database(target_db)
    sink = pg_server.uri(target_db)
    # every downstream write is audited with the writing process's pid (the sink's application_name)
    pg_server.execute("CREATE TABLE audit (app text, at timestamptz DEFAULT clock_timestamp())", db=target_db)
    args = server_config(tmp_path, FAST)
    first = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=args).start()
    servers = [first]
    source = pg_server.connect(pg_database)
    try:
        first.create_changefeed("fence", pg_server.uri(pg_database), sink, "[filter]\nrules = ['public.accounts']\n", snapshot="none")
        mixed_workload(source, 3)
        first.wait_checkpoint("fence", 0)
        assert_converged(first, "fence", source, sink, ["public.accounts"])
        pg_server.execute(
            """CREATE FUNCTION audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO audit(app) VALUES (current_setting('application_name')); RETURN NULL; END $$;
               CREATE TRIGGER audit_t AFTER INSERT OR UPDATE OR DELETE ON public.accounts
               FOR EACH STATEMENT EXECUTE FUNCTION audit_fn();""", db=target_db)
        second = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=args).start()
        servers.append(second)
        assert first.proc is not None
        with Workload(pg_server, pg_database, start=3) as wl:
            time.sleep(1)
            os.kill(first.proc.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                # wait until the span runs on the second capture
                while time.monotonic() - frozen_at < 40:
                    spans = second.changefeed("fence")["spans"]
                    caps = {c["id"]: c for c in second.get("/api/v2/captures")}
                    holder = caps.get(spans[0]["capture"] or "")
                    if holder is not None and holder["address"] == f"127.0.0.1:{second.port}" and spans[0]["running"]:
                        break
                    time.sleep(0.2)
                else:
                    pytest.fail(f"span not reassigned while the holder was frozen\n{second.log_tail()}")
                reassigned = pg_server.execute("SELECT clock_timestamp()", db=target_db)[0][0]
                time.sleep(1)
            finally:
                os.kill(first.proc.pid, signal.SIGCONT)
            time.sleep(6)  # the woken capture notices its lost lease and must not commit anything
            wl.finish()
        late = pg_server.execute("SELECT count(*) FROM audit WHERE app = %s AND at > %s", db=target_db,
                                 params=(f"tidewater-sink-{first.proc.pid}", reassigned))[0][0]
        assert late == 0, "the frozen capture wrote downstream after its span was reassigned"
        assert pg_server.execute("SELECT count(*) FROM audit WHERE app = %s", db=target_db,
                                 params=(f"tidewater-sink-{second.proc.pid}",))[0][0] > 0
        info = assert_converged(second, "fence", source, sink, ["public.accounts"])
        assert info["state"] == "normal"
    finally:
        source.close()
        for s in servers:
            s.kill()
