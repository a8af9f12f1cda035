"""The MySQL/MariaDB snapshot reader (upstream.mysql.snapshot_read) against a real MariaDB: each reader's transaction
sees exactly the commits at or below the binlog position it reports (checked against the binlog stream itself, under
concurrent writes), chunks cover every row exactly once, and a copied row equals the streamed row of the same data,
value by value and text by text."""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import InvalidArgument
from cdc.events import SNAPSHOT, TableName
from playground.servers import MariaDBServer
from tests.integration.test_mysql_source import (
    TYPES_TABLE,
    rows_of,
    start_source,
    start_ts,
    stop_source,
    wait_for,
)
from upstream import open_upstream
from upstream.base import decode_payload


def test_a_copied_row_equals_the_streamed_row_of_the_same_data(mysql_server: MariaDBServer,
                                                               mysql_database: str) -> None:
    db = mysql_database
    mysql_server.execute(TYPES_TABLE.format(db=db))
    ts0 = start_ts(mysql_server, db)
    mysql_server.execute(
        f"INSERT INTO {db}.types VALUES (18446744073709551615, -128, 255, -32768, 65535, -8388608, 4294967295, "
        f"-9223372036854775808, '-12345678901234567890123456789012345.123456789012345678901234567890', 1.50, 1.1, "
        f"0.1, 'ab', 'héllo 😀', 'long\ntext', 'café', x'00ff00', x'0001', x'6100', '2024-02-29', "
        f"'2024-01-02 03:04:05.123456', '9999-12-31 23:59:59', '2038-01-19 03:14:07.999', '23:59:59.99', 2155, "
        f"'{{\"a\": [1, 2]}}')")
    mysql_server.execute(f"INSERT INTO {db}.types (id, t, b, y) VALUES (0, '', x'', 0)")
    mysql_server.execute(f"INSERT INTO {db}.types (id, v, tl) VALUES (9223372036854775808, '', NULL)")
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: len(rec.commits) >= 3 or bool(errors))
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    streamed: dict[Any, tuple[dict[str, Any], list[Any]]] = {}
    dec = src.decoder()
    for _, _, payloads in rec.commits:
        [(_, new, _)] = rows_of(src, payloads)
        assert new is not None
        streamed[new["id"]] = (new, dec.parse_change(decode_payload(payloads[0])[1]).new)
    with open_upstream(mysql_server.uri(db)) as up, up.export_snapshot(label="t") as exp:
        assert exp.ts >= max(ts for ts, _, _ in rec.commits)
        with up.snapshot_reader(exp.name, label="t") as reader:
            schema = reader.table_schema(TableName(db, "types"))
            plan = reader.plan(schema, 1)  # one row per chunk: the bounds of BIGINT UNSIGNED above 2^63 too
            assert len(plan.chunks) == 3
            copied = []
            for chunk in plan.chunks:
                at = reader.read_ts()
                assert at is not None and at >= exp.ts
                copied += list(reader.read_chunk(schema, chunk, commit_ts=at))
                reader.release()
    assert [ch.values["id"] for ch in copied] == sorted(streamed)
    for ch in copied:
        assert ch.extra[SNAPSHOT] is True
        full, texts = streamed[ch.values["id"]]
        assert ch.values == full
        assert list(ch.row_text) == list(texts)  # the same text a sink renders from either path
    assert Decimal(18446744073709551615) in streamed


def test_each_reader_sees_exactly_the_commits_up_to_its_binlog_position_under_writes(
        mysql_server: MariaDBServer, mysql_database: str) -> None:
    db = mysql_database
    mysql_server.execute(f"CREATE TABLE {db}.t (a INT, b VARCHAR(10), v INT, PRIMARY KEY (a, b))")
    mysql_server.execute(f"INSERT INTO {db}.t VALUES " + ", ".join(f"({i % 10}, 'k{i}', 0)" for i in range(100)))
    ts0 = start_ts(mysql_server, db)
    done = threading.Event()
    commits = [0]  # the writer's autocommitted statements so far

    def write() -> None:
        conn = mysql_server.connect(db)
        try:
            i = 100
            while not done.is_set():
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO t VALUES (%s, %s, 0)", (i % 10, f"k{i}"))
                    cur.execute("UPDATE t SET v = v + 1 WHERE a = %s", (i % 10,))
                commits[0] += 2
                i += 1
        finally:
            conn.close()

    def writer_moved_on() -> None:
        """Wait for two more commits of the writer (on a loaded host the reader's transactions can otherwise all
        fall between two of its commits, at one position)."""
        base = commits[0]
        deadline = time.monotonic() + 60
        while commits[0] < base + 2 and time.monotonic() < deadline:
            time.sleep(0.01)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    seen: list[tuple[int, int, dict[tuple[int, str], int]]] = []  # (read ts, rows planned, rows read)
    try:
        with open_upstream(mysql_server.uri(db)) as up, up.export_snapshot(label="t") as exp:
            reader = up.snapshot_reader(exp.name, label="t")
            try:
                for _ in range(3):
                    schema = reader.table_schema(TableName(db, "t"))
                    at = reader.read_ts()
                    plan = reader.plan(schema, 7)
                    rows: dict[tuple[int, str], int] = {}
                    for chunk in plan.chunks:  # all in one transaction: one snapshot
                        for ch in reader.read_chunk(schema, chunk):
                            r = ch.values
                            assert (r["a"], r["b"]) not in rows, "a row in two chunks"
                            rows[(r["a"], r["b"])] = r["v"]
                    assert reader.read_ts() == at
                    reader.release()
                    assert at >= exp.ts
                    seen.append((at, plan.rows, rows))
                    writer_moved_on()
            finally:
                reader.close()
    finally:
        done.set()
        writer.join(10)
    assert len({at for at, _, _ in seen}) > 1, "the writer did not move the position between the transactions"
    # the truth: the binlog stream's commits, applied up to each reader's position
    end = max(at for at, _, _ in seen)
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: bool(errors) or (bool(rec.commits) and rec.commits[-1][0] >= end), timeout=60)
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    base = {(i % 10, f"k{i}"): 0 for i in range(100)}
    for at, planned, rows in seen:
        state = dict(base)
        for ts, _, payloads in rec.commits:
            if ts > at:
                break
            for kind, new, _ in rows_of(src, payloads):
                assert kind in ("I", "U") and new is not None
                state[(new["a"], new["b"])] = new["v"]
        assert rows == state, f"reader at Ts {at} differs from the binlog up to it"
        assert planned == len(state)


def test_a_name_that_is_not_a_binlog_position_is_refused(mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    with open_upstream(mariadb_server.uri(mariadb_database)) as up, pytest.raises(InvalidArgument):
        up.snapshot_reader("00000003-00000002-1", label="t")


def test_verify_refuses_an_upstream_whose_readers_cannot_share_a_snapshot(
        mariadb_server: MariaDBServer, mariadb_database: str, tmp_path: Any) -> None:
    """``cdc verify`` compares the upstream at the held snapshot's Ts: a MySQL reader stands at its own (later)
    position, so a chunk compare is refused loudly instead of reporting rows changed meanwhile as differences."""
    from cdc import serde
    from spark_jobs.verify_chunk import VerifyTask, checksum_chunk

    db = mariadb_database
    mariadb_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)")
    mariadb_server.execute(f"INSERT INTO {db}.t VALUES (1, 1)")
    with open_upstream(mariadb_server.uri(db)) as up, up.export_snapshot(label="t") as exp:
        with up.snapshot_reader(exp.name) as reader:
            schema = reader.table_schema(TableName(db, "t"))
            [chunk] = reader.plan(schema, 10).chunks
        task = VerifyTask(mariadb_server.uri(db), f"sqlite:///{tmp_path / 'x.db'}", exp.name, None,
                          serde.to_json(schema).decode(), serde.to_json(chunk).decode())
        with pytest.raises(InvalidArgument, match="cannot share one exported snapshot"):
            checksum_chunk(task)


def test_the_export_and_its_readers_are_numbered_in_the_stream_epoch_of_the_resume_token(
        mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    """After a failover the stream's Ts carry epoch + 1 (upstream.mysql.positions): a copy exported for that span
    (its resume token read from another server, or already from this one) and its readers are in that epoch."""
    from upstream.mysql.positions import epoch_of, split_ts
    from upstream.mysql.resume import ResumePoint

    db = mariadb_database
    mariadb_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    [(sid,)] = mariadb_server.execute("SELECT @@server_id") or []
    other = ResumePoint(2, int(sid) + 100, "mariadb-bin.000007", 4, "0-9-5").encode()  # read from another server
    same = ResumePoint(3, int(sid), "mariadb-bin.000001", 4, "").encode()  # already read from this one
    with open_upstream(mariadb_server.uri(db)) as up:
        with up.export_snapshot(label="t") as plain:
            assert epoch_of(plain.ts) == 0
        for token, epoch in ((other, 3), (same, 3), (None, 0)):
            with up.export_snapshot(label="t", resume=token) as exp:
                assert epoch_of(exp.ts) == epoch and split_ts(exp.ts) == split_ts(plain.ts), (token, exp)
                with up.snapshot_reader(exp.name, label="t") as reader:
                    assert epoch_of(reader.read_ts()) == epoch and reader.read_ts() >= exp.ts
