"""Helpers of the snapshot-copy tests: a real exported snapshot, a reader of the upstream at it, a job plan."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extras
import pytest

from cdc.events import TableSchema
from cdc.snapshot import CopyText, SnapshotChunk
from tests.sql_targets import SqlTarget, make_target
from upstream.postgres.snapshot_read import PgSnapshotReader


@dataclass
class Exported:
    """A logical slot created with ``(SNAPSHOT 'export')`` whose replication connection stays idle."""

    slot: str
    snapshot: str
    consistent_point: str
    conn: Any  # the replication connection: the snapshot lives while it is open and idle

    @property
    def commit_ts(self) -> int:
        hi, lo = self.consistent_point.split("/")
        return (int(hi, 16) << 32) | int(lo, 16)

    def expire(self) -> None:
        """End the exporting connection: the snapshot name stops existing (the slot stays)."""
        self.conn.close()


@contextlib.contextmanager
def exported_snapshot(pg_server: Any, db: str) -> Iterator[Exported]:
    """Create a pgoutput slot with an exported snapshot on ``db``; drop it afterwards."""
    slot = f"tw_snap_{uuid.uuid4().hex[:10]}"
    conn = psycopg2.connect(pg_server.dsn(db), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    cur.execute(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'export')")
    name, point, snapshot, _plugin = cur.fetchone()
    assert name == slot and snapshot
    try:
        yield Exported(slot, snapshot, point, conn)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        with contextlib.suppress(Exception):
            pg_server.execute("SELECT pg_drop_replication_slot(%s)", db=db, params=(slot,))


@contextlib.contextmanager
def at_snapshot(pg_server: Any, db: str, snapshot: str) -> Iterator[Any]:
    """A connection whose one transaction sees the database as of the exported ``snapshot`` (for
    ``playground.compare.compare_tables``: it reads through ``conn.cursor()``)."""
    conn = psycopg2.connect(pg_server.dsn(db))
    conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
        yield conn
    finally:
        conn.rollback()
        conn.close()


def execute(pg_server: Any, db: str, *statements: str) -> None:
    conn = pg_server.connect(db)
    try:
        with conn.cursor() as cur:
            for s in statements:
                cur.execute(s)
    finally:
        conn.close()


def text_killed_after_first_block(pg_server: Any, reader: PgSnapshotReader, schema: TableSchema,
                                  chunk: SnapshotChunk, sent: list[int]) -> Callable[[], CopyText]:
    """An ``open_text`` for a sink's chunk write: ``chunk``'s COPY text from ``reader`` whose upstream session is
    terminated (``pg_terminate_backend``) as soon as its first block was handed on; ``sent`` gets each block's size."""

    def open_text() -> CopyText:
        text = reader.read_chunk_text(schema, chunk)
        assert text is not None

        def blocks() -> Iterator[bytes]:
            for block in text.blocks:
                sent.append(len(block))
                yield block
                if len(sent) == 1:
                    pg_server.execute("SELECT pg_terminate_backend(%s)", params=(reader.backend_pid,))

        return dataclasses.replace(text, blocks=blocks())

    return open_text


def copy_target(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlTarget]:
    """The body of a copy test's target fixture parametrized over ``tests.sql_targets.KINDS``: a PostgreSQL target is a
    database of its own (``pg_database`` is the upstream)."""
    if request.param != "postgresql":
        yield make_target(SqlTarget, request, tmp_path)
        return
    yield from pg_target(request)


def pg_target(request: pytest.FixtureRequest) -> Iterator[SqlTarget]:
    """A PostgreSQL target database of its own on the session's server (dropped afterwards)."""
    server = request.getfixturevalue("pg_server")
    name = f"tgt_{uuid.uuid4().hex[:12]}"
    server.create_database(name)
    try:
        yield SqlTarget("postgresql", server, name)
    finally:
        if server.running:
            server.drop_database(name)


@contextlib.contextmanager
def spark_standalone(work: Any, cores: int = 2, workers: int = 1, ui_port: int | None = None) -> Iterator[str]:
    """A Spark standalone cluster from the pyspark distribution on 127.0.0.1: one master (web UI on ``ui_port``,
    default a free port) and ``workers`` (0 or 1) worker with ``cores`` cores. Yields the master URL; the processes
    (own process groups) are stopped afterwards."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pyspark

    from playground.servers import free_port

    home = os.path.dirname(pyspark.__file__)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(work), "SPARK_WORKER_DIR": str(work / "worker")}
    port = free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [f"{home}/bin/spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui_port or free_port())],
            env=env, stdout=open(work / "master.log", "wb"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT, start_new_session=True))
        if not workers:
            deadline = time.monotonic() + 90
            while b"I have been elected leader" not in (work / "master.log").read_bytes():
                assert all(p.poll() is None for p in procs), (work / "master.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the Spark master did not start within 90 s"
                time.sleep(0.2)
            yield f"spark://127.0.0.1:{port}"
            return
        procs.append(subprocess.Popen(
            [f"{home}/bin/spark-class", "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
             "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
             "--cores", str(cores), "--memory", "1g", "--work-dir", str(work / "worker")],
            env=env, stdout=open(work / "worker.log", "wb"),  # noqa: SIM115 - the child keeps it
            stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 90
        while b"Registering worker" not in (work / "master.log").read_bytes():
            assert all(p.poll() is None for p in procs), (work / "master.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the Spark worker did not register within 90 s"
            time.sleep(0.2)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
