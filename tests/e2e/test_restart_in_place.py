"""A capture restarted on its own data directory (systemd, a pod on its volume, SIGKILL and start) does not wait for
its previous process's session lease to expire (``capture.incarnation``): the previous lease is revoked as the new
process starts, so the dead capture's registration, election key and spans are gone before the new one registers.
Without that, a restart mid-copy stalled for ``session-ttl`` (10 s by default) before the copy resumed. The initial
copy resumed after such a restart, ending equal row by row, is in ``test_snapshot_runs.py`` and ``test_snapshot.py``;
these tests check the mechanism, with a long ``session-ttl`` so that the old behaviour cannot pass by chance."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_workload import server_config

from playground.cluster import ApiError, CdcServer
from playground.servers import EtcdServer

pytestmark = pytest.mark.e2e

LONG_TTL = "session-ttl = 60\n"


def _registered(cdc: CdcServer, not_id: str = "", timeout: float = 60.0) -> str:
    """The capture id the server registered (other than ``not_id``), once it has."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cid = str(cdc.get("/api/v2/status").get("id") or "")
        except (ApiError, OSError):
            cid = ""
        if cid and cid != not_id:
            return cid
        time.sleep(0.05)
    raise AssertionError(f"no capture registered within {timeout}s:\n{cdc.log_tail()}")


def test_a_capture_killed_and_started_again_on_its_data_dir_releases_the_dead_one_at_once(
        etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> None:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, LONG_TTL)).start()
    try:
        first = _registered(cdc)
        assert [c["id"] for c in cdc.get("/api/v2/captures")] == [first]
        cdc.kill()  # SIGKILL: its lease would live for another 60 s
        t0 = time.monotonic()
        cdc.start()  # same port, so the same data directory
        second = _registered(cdc, not_id=first)
        # the dead capture's registration went with its revoked lease, before the new one registered
        assert [c["id"] for c in cdc.get("/api/v2/captures")] == [second]
        while not cdc.get("/api/v2/status").get("is_owner"):  # the dead owner's election key is gone too
            assert time.monotonic() - t0 < 50, f"no owner after the restart:\n{cdc.log_tail()}"
            time.sleep(0.1)
        print(f"restarted capture registered and owner after {time.monotonic() - t0:.1f} s (session-ttl 60 s)")
        assert "revoked lease" in cdc.log_file.read_text()
    finally:
        cdc.terminate()


def test_a_second_server_on_the_same_data_dir_is_refused_and_the_first_keeps_its_lease(
        etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> None:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, LONG_TTL)).start()
    other = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                      extra_args=[*server_config(tmp_path, LONG_TTL), "--data-dir", str(tmp_path / "cdc" /
                                                                                         f"data-{cdc.port}")])
    try:
        first = _registered(cdc)
        with pytest.raises(RuntimeError, match="in use by another cdc server"):
            other.start()
        assert [c["id"] for c in cdc.get("/api/v2/captures")] == [first]
        assert cdc.get("/api/v2/status")["id"] == first
    finally:
        other.kill()
        cdc.terminate()
