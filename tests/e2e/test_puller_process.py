"""End to end with ``puller-process = true``: each span's source runs in a process of its own
(processor/source_process.py), real PostgreSQL, etcd and `cdc server`. Every test ends in a row-by-row compare or
checks the child processes by PID."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import (
    FAST_LEASE,
    aborted_big_transaction,
    assert_converged,
    big_transaction,
    mixed_workload,
    server_config,
    streamed_with_rolled_back_savepoint,
    targets_in_make_test,
    wait_for,
)

from cdc.procs import descendants
from playground.cluster import CdcServer
from playground.servers import PostgresServer

pytestmark = pytest.mark.e2e

PROCESS = "puller-process = true\n"


def source_processes(capture: CdcServer) -> list[int]:
    """PIDs of the capture's live source processes (``python -m processor.source_process``): the spans' and the
    spare one started for the next span."""
    assert capture.proc is not None
    out = []
    for pid in descendants(capture.proc.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"processor.source_process" in cmd and alive(pid):
            out.append(pid)
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def span_child(capture: CdcServer, cf: str, other_than: int = 0, timeout: float = 60.0) -> int:
    """The PID of the source process the capture logged last for span 0 of ``cf`` (other than ``other_than``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.findall(rf"span={re.escape(cf)}/0 source runs in process (\d+)",
                           capture.log_file.read_text(errors="replace"))
        if found and int(found[-1]) != other_than and alive(int(found[-1])):
            pid = int(found[-1])
            assert pid in source_processes(capture)
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no source process (other than {other_than}) for {cf} within {timeout}s\n"
                         f"{capture.log_tail()}")


def wait_rows(capture: CdcServer, cf: str, above: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if capture.changefeed(cf)["spans"][0]["rows"] > above:
            return
        time.sleep(0.05)
    raise AssertionError(f"span of {cf} did not pass {above} rows within {timeout}s")


@pytest.mark.parametrize("sink_uri", targets_in_make_test("postgresql"), indirect=True)
def test_process_mode_replicates_big_streamed_and_aborted_transactions(
    etcd_server: Any, cluster_id: str, tmp_path: Path, pg_server: PostgresServer, pg_database: str, source: Any,
    sink_uri: str,
) -> None:
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, PROCESS)).start()
    try:
        cdc.create_changefeed("pp", pg_server.uri(pg_database), sink_uri, snapshot="none")
        mixed_workload(source, 40)
        big_transaction(source, 30_000)
        aborted_big_transaction(source, 10_000)
        streamed_with_rolled_back_savepoint(source, 5_000)
        with source.cursor() as cur:  # a schema change travels through the child's state to the parent's decoder
            cur.execute("ALTER TABLE accounts ADD COLUMN extra int")
        mixed_workload(source, 20, start=40)
        info = assert_converged(cdc, "pp", source, sink_uri)
        assert info["state"] == "normal"
        child = span_child(cdc, "pp")
        kids = source_processes(cdc)
        assert child in kids and len(kids) <= 2  # the span's, and the spare one for the next span
    finally:
        cdc.terminate()
    # a capture that stops in order leaves none of them running
    deadline = time.monotonic() + 10
    while any(alive(p) for p in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in kids if alive(p)]


def test_sigkill_of_the_source_process_restarts_the_span_from_its_checkpoint(
    etcd_server: Any, cluster_id: str, tmp_path: Path, pg_server: PostgresServer, pg_database: str, source: Any,
) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, PROCESS)).start()
    try:
        cdc.create_changefeed("kc", pg_server.uri(pg_database), sink, snapshot="none")
        mixed_workload(source, 20)
        first = span_child(cdc, "kc")
        writer = threading.Thread(target=mixed_workload, args=(pg_server.connect(pg_database), 60, 3, 20))
        writer.start()
        wait_rows(cdc, "kc", 100)
        os.kill(first, signal.SIGKILL)
        # the span fails with a retryable error (the source process ended without a reason) and restarts
        second = span_child(cdc, "kc", other_than=first)
        assert not alive(first)
        writer.join()
        assert_converged(cdc, "kc", source, sink)
        # the retryable error (shown as warning meanwhile) clears once the restarted span makes progress
        wait_for(cdc, "kc", lambda q: q["state"] == "normal", "the warning to clear")
        assert "ended without a reason (killed by signal 9)" in cdc.log_file.read_text(errors="replace")
        assert alive(second)
    finally:
        cdc.terminate()


def test_sigkill_of_the_capture_leaves_no_source_process(
    etcd_server: Any, cluster_id: str, tmp_path: Path, pg_server: PostgresServer, pg_database: str, source: Any,
) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    config = server_config(tmp_path, PROCESS + FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        cdc.create_changefeed("kp", pg_server.uri(pg_database), sink, snapshot="none")
        mixed_workload(source, 10)
        span_child(cdc, "kp")
        children = source_processes(cdc)  # the span's and the spare
        writer = threading.Thread(target=big_transaction, args=(pg_server.connect(pg_database), 100_000))
        writer.start()
        wait_rows(cdc, "kp", 0)
        cdc.kill()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in children if alive(p)], f"source processes {children} outlived their capture"
        writer.join()
        # the slot is free again (the child's walsender is gone) and a new capture converges
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        mixed_workload(source, 10, start=10)
        info = assert_converged(cdc, "kp", source, sink)
        assert info["state"] == "normal"
    finally:
        cdc.terminate()


def test_pause_mid_stream_stops_the_source_process_and_resume_converges(
    etcd_server: Any, cluster_id: str, tmp_path: Path, pg_server: PostgresServer, pg_database: str, source: Any,
) -> None:
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, PROCESS)).start()
    try:
        cdc.create_changefeed("ps", pg_server.uri(pg_database), sink, snapshot="none")
        mixed_workload(source, 10)
        assert_converged(cdc, "ps", source, sink)
        child = span_child(cdc, "ps")
        done = cdc.changefeed("ps")["spans"][0]["rows"]
        writer = threading.Thread(target=mixed_workload, args=(pg_server.connect(pg_database), 150, 5, 10))
        writer.start()
        wait_rows(cdc, "ps", done + 50)  # small transactions flow through the child while it is stopped
        assert cdc.request("POST", "/api/v2/changefeeds/ps/pause")["state"] == "stopped"
        wait_for(cdc, "ps", lambda q: all(s["capture"] is None for s in q["spans"]), "the span stopped")
        assert not alive(child), "the source process must be gone once the span confirmed its stop"
        assert len(source_processes(cdc)) <= 1  # (the spare, waiting for the next span)
        writer.join()
        assert cdc.request("POST", "/api/v2/changefeeds/ps/resume")["state"] == "normal"
        info = assert_converged(cdc, "ps", source, sink)
        assert info["state"] == "normal"
    finally:
        cdc.terminate()
