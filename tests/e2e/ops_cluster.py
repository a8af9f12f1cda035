"""A small replicating cluster for the operations tests (metrics, Prometheus, dashboard): two `cdc server`
processes, one changefeed with two spans from the test's PostgreSQL database into a PostgreSQL target
database, and helpers to scrape ``/metrics``."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e_workload import TEST_SERVER_CONFIG, mixed_workload, server_config

from playground.cluster import CdcServer, current_lsn
from playground.servers import PostgresServer

OPS_SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(14,2), active boolean,
                       opened timestamptz, note varchar(200), data jsonb, tags int[]);
CREATE TABLE "Ledger Entries" ("EntryId" bigint PRIMARY KEY, account int, amount numeric, memo text, "Ünïcode" text);
CREATE TABLE events (id bigserial PRIMARY KEY, kind text, payload bytea, at timestamp, day date, t time,
                     uid uuid, f4 real, f8 double precision, small smallint);
"""
CHANGEFEED = "ops"
# two spans so that both captures run one; short upstream checks so slot series appear within seconds
OPS_SERVER_CONFIG = TEST_SERVER_CONFIG + "upstream-check-interval = 1.0\n"


@dataclass
class OpsCluster:
    captures: list[CdcServer]
    upstream_db: str
    target_db: str
    sink_uri: str

    def stop(self) -> None:
        for c in self.captures:
            c.terminate()


def start_ops_cluster(etcd_url: str, cluster_id: str, tmp_path: Path, pg_server: PostgresServer,
                      pg_database: str, source: Any, n: int = 2) -> OpsCluster:
    target_db = f"{pg_database[:50]}_tgt"
    pg_server.create_database(target_db)
    sink = pg_server.uri(target_db)
    args = server_config(tmp_path, base=OPS_SERVER_CONFIG, name="ops.toml")
    captures: list[CdcServer] = []
    try:
        for _ in range(n):
            captures.append(CdcServer(etcd_url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=args).start())
        captures[0].create_changefeed(CHANGEFEED, pg_server.uri(pg_database), sink, config="span-count = 2\n[snapshot]\nmode = \"none\"\n")
        mixed_workload(source, 10)
        captures[0].wait_checkpoint(CHANGEFEED, current_lsn(source), timeout=60)
    except BaseException:
        for c in captures:
            c.terminate()
        raise
    return OpsCluster(captures, pg_database, target_db, sink)


def scrape(capture: CdcServer) -> str:
    with urllib.request.urlopen(capture.url + "/metrics", timeout=10) as resp:
        return resp.read().decode()
