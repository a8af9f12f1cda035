"""Fixtures for end-to-end tests: real `cdc server` processes against real etcd and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_workload import server_config

from playground.cluster import CdcServer
from playground.servers import EtcdServer


@pytest.fixture
def cdc_server(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> Iterator[CdcServer]:
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                       extra_args=server_config(tmp_path)).start()
    yield server
    server.terminate()
