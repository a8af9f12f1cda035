"""What a capture's log says (issue 12, item 8), from a real run: healthy (registered, owner, changefeed
created, spans placed, one INFO line per state change) and unhealthy (the sink's database refuses
connections: the changefeed goes to warning, the span's repeated failure is logged once per interval, then
it recovers). The excerpts in docs/operations.md, "Logs", come from this test (run with -s to print them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_workload import server_config

from cdc.crypto import generate_key
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer

pytestmark = pytest.mark.e2e


def test_healthy_then_unhealthy_capture_log(etcd_server: EtcdServer, pg_server: PostgresServer, pg_database: str,
                                           cluster_id: str, tmp_path: Path) -> None:
    sink_db = pg_database[:50] + "_sink"
    pg_server.create_database(sink_db)
    pg_server.execute("CREATE TABLE orders (id int PRIMARY KEY, item text)", db=pg_database)
    (tmp_path / "secret.keys").write_text(generate_key() + "\n")
    (tmp_path / "secret.keys").chmod(0o600)  # as docs/operations.md says (else the capture warns, rightly)
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=["--secret-key-file", str(tmp_path / "secret.keys"),
                                   *server_config(tmp_path, "log-warn-interval = 5.0\n")]).start()
    conn = pg_server.connect(pg_database)
    sink = pg_server.uri(sink_db).replace("postgres@", "postgres:Sink-pw-123@", 1)
    try:
        server.create_changefeed("orders", pg_server.uri(pg_database), sink, snapshot="none")
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 100) g")
        server.wait_checkpoint("orders", current_lsn(conn))
        healthy_end = len(server.log_file.read_text().splitlines())

        # the sink's database refuses new connections, and the open ones are cut
        pg_server.execute(f'ALTER DATABASE "{sink_db}" ALLOW_CONNECTIONS false')
        pg_server.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                          params=(sink_db,))
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(101, 200) g")
        deadline = time.monotonic() + 60
        while server.changefeed("orders")["state"] != "warning" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert server.changefeed("orders")["state"] == "warning"
        time.sleep(8)  # several retries (backoff 1 s .. 5 s): logged once per log-warn-interval (5 s)
        pg_server.execute(f'ALTER DATABASE "{sink_db}" ALLOW_CONNECTIONS true')
        info = server.wait_checkpoint("orders", current_lsn(conn), timeout=90)
        deadline = time.monotonic() + 60
        while server.changefeed("orders")["state"] != "normal" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert server.changefeed("orders")["state"] == "normal", info
        (orders,) = compare_tables(conn, ["public.orders"], sink)
        assert orders.equal and orders.source_rows == 200, orders

        lines = server.log_file.read_text().splitlines()
        healthy, unhealthy = lines[:healthy_end], lines[healthy_end:]
        print("\n---- healthy ----\n" + "\n".join(healthy) + "\n---- unhealthy ----\n" + "\n".join(unhealthy))
        text = "\n".join(lines)
        assert "Sink-pw-123" not in text
        assert any("registered" in line for line in healthy) and any("is the owner" in line for line in healthy)
        assert any("changefeed=orders created" in line for line in healthy)
        assert not any(" WARNING " in line or " ERROR " in line for line in healthy), healthy
        states = [line.split("] ", 2)[-1] for line in lines if "changefeed=orders state " in line]
        assert [s.split(" (")[0] for s in states] == ["changefeed=orders state normal -> warning",
                                                      "changefeed=orders state warning -> normal"], states
        assert "CDC:ErrSinkUnavailable" in states[0]
        warnings = [line for line in unhealthy if " WARNING " in line]
        assert warnings, unhealthy
        # the same failure repeated is rate-limited: fewer lines than retries, with the count of the others
        assert any("similar suppressed" in line for line in warnings) or len(warnings) <= 6, warnings
    finally:
        conn.close()
        server.terminate()
        pg_server.execute(f'ALTER DATABASE "{sink_db}" ALLOW_CONNECTIONS true')
        pg_server.drop_database(sink_db)
