"""Fixtures for end-to-end tests: real `cdc server` processes against real etcd and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, SCHEMA, TARGETS, make_sink_uri, server_config

from playground.cluster import CdcServer
from playground.servers import EtcdServer, PostgresServer


@pytest.fixture
def cdc_server(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path,
               request: pytest.FixtureRequest) -> Iterator[CdcServer]:
    """A `cdc server`; a test marked ``kills`` (it SIGKILLs and restarts it) gets a short etcd session
    (``FAST_LEASE``), so the restarted capture does not wait 10 s for the dead one's lease."""
    extra = FAST_LEASE if request.node.get_closest_marker("kills") else ""
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path, extra)).start()
    yield server
    server.terminate()


@pytest.fixture
def source_schema() -> str:
    """DDL run in the fresh upstream database before a test (modules override this fixture)."""
    return SCHEMA


@pytest.fixture
def source(pg_server: PostgresServer, pg_database: str, source_schema: str) -> Iterator[Any]:
    """An autocommit connection to a fresh upstream database holding ``source_schema``."""
    pg_server.execute(source_schema, db=pg_database)
    conn = pg_server.connect(pg_database)
    yield conn
    conn.close()


@pytest.fixture(params=TARGETS)
def sink_uri(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    return make_sink_uri(request.param, request, tmp_path, pg_server)
