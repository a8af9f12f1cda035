"""The replication stream drained in C (upstream/postgres/walread.c) against its Python reference (walread.PyReader:
psycopg2's read_message through walread.Router), on a real walsender: the same items in the same order, runs stored
with the prefix the caller holds at that point of the stream, and ReplicationStream's feedback and failures on top."""

from __future__ import annotations

import select
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from psycopg2.extras import LogicalReplicationConnection

from cdc.errors import UpstreamUnavailable
from upstream.base import encode_payload
from upstream.postgres import walread
from upstream.postgres.stream import Keepalive, ReplicationStream

pytestmark = pytest.mark.integration

OPTIONS = {"proto_version": "4", "publication_names": "pub", "streaming": "on", "messages": "true"}
RUN_ROWS = 7  # small: runs are cut inside transactions
LIMIT = 50  # small: drains end in the middle of everything


def _lsn(pg_server: Any, db: str) -> int:
    (text,), = pg_server.execute("SELECT pg_current_wal_insert_lsn()::text", db=db)
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _relid(pg_server: Any, db: str, table: str) -> int:
    (oid,), = pg_server.execute("SELECT %s::regclass::oid", db=db, params=(table,))
    return int(oid)


@pytest.fixture
def wal(pg_server: Any, pg_database: str) -> Iterator[tuple[list[str], int]]:
    """Two slots at the same point, then a stream holding every kind of message: plain changes of a carried table
    and of one that is not, a truncate, a schema change between rows, a logical message, a big streamed
    transaction with a rolled-back savepoint; yields the slots and the end LSN."""
    db = pg_database
    slots = [f"tw_walread_{uuid.uuid4().hex[:8]}_{i}" for i in range(2)]
    pg_server.execute("CREATE TABLE a (id int PRIMARY KEY, v text)", db=db)
    pg_server.execute("CREATE TABLE b (id int PRIMARY KEY, v text)", db=db)
    pg_server.execute("CREATE PUBLICATION pub FOR TABLE a, b", db=db)
    for s in slots:
        pg_server.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", db=db, params=(s,))
    conn = pg_server.connect(db)
    conn.autocommit = False
    cur = conn.cursor()
    for i in range(30):  # plain transactions, a and b interleaved, runs longer than RUN_ROWS
        cur.execute("INSERT INTO a SELECT g, 'a' || g FROM generate_series(%s, %s) g", (i * 20, i * 20 + 19))
        cur.execute("INSERT INTO b VALUES (%s, 'b')", (i,))
        cur.execute("UPDATE a SET v = 'u' WHERE id = %s", (i * 20,))
        cur.execute("DELETE FROM a WHERE id = %s", (i * 20 + 1,))
        conn.commit()
    cur.execute("TRUNCATE b")
    cur.execute("SELECT pg_logical_emit_message(true, 'tw-test', 'between')")
    conn.commit()
    cur.execute("INSERT INTO a VALUES (100000, 'before')")
    cur.execute("ALTER TABLE a ADD COLUMN w int")  # a new Relation message before the next row of a
    cur.execute("INSERT INTO a VALUES (100001, 'after', 1)")
    conn.commit()
    cur.execute("SET logical_decoding_work_mem = '64kB'")
    cur.execute("INSERT INTO a SELECT g, repeat('x', 50) FROM generate_series(200000, 203000) g")
    cur.execute("SAVEPOINT s")
    cur.execute("INSERT INTO b SELECT g, 'gone' FROM generate_series(1000, 1500) g")
    cur.execute("ROLLBACK TO SAVEPOINT s")
    cur.execute("INSERT INTO b VALUES (2000, 'kept')")
    conn.commit()
    cur.execute("INSERT INTO a VALUES (300000, 'last')")
    conn.commit()
    conn.close()
    end = _lsn(pg_server, db)
    yield slots, end


def _read_all(pg_server: Any, db: str, slot: str, end: int, native: bool) -> list[tuple[str, bytes]]:
    """Drain ``slot`` to ``end`` with the C reader or the Python one, as the span source would: a Relation message
    of table a gives it a new prefix before the next change is routed. Returns the items flat: ("run", stored change)
    and ("raw", payload)."""
    relid_a = _relid(pg_server, db, "a")
    conn = psycopg2.connect(pg_server.dsn(db), connection_factory=LogicalReplicationConnection,
                            options="-c logical_decoding_work_mem=64kB")
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False, start_lsn=0, options=OPTIONS)
        if native:
            mod = walread.native_module()
            assert mod is not None, "the C reader must build here"
            reader: walread.Reader = walread.reader(conn, cur)
            assert type(reader) is mod.Reader
        else:
            reader = walread.PyReader(cur)
        version = 1
        prefixes = {relid_a: encode_payload(version, b"")}
        items: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + 90
        while True:
            out: list[Any] = []
            status = reader.drain(out, prefixes, LIMIT, RUN_ROWS)
            for item in out:
                if type(item) is list:
                    assert 1 <= len(item) <= RUN_ROWS
                    assert all(p[:4] == prefixes[relid_a] for p in item), "routed with the prefix of its time"
                    items += [("run", p) for p in item]
                    continue
                items.append(("raw", item))
                if item[:1] == b"R" and int.from_bytes(item[1:5], "big") == relid_a:
                    version += 1  # (what PgSpanSource does at a Relation message)
                    prefixes[relid_a] = encode_payload(version, b"")
            assert status in (walread.IDLE, walread.MORE, walread.REPLY), status
            if status == walread.REPLY:
                cur.send_feedback(reply=False, force=True)
            if status == walread.IDLE:
                if reader.wal_end >= end and not reader.in_txn and not reader.in_stream:
                    return items
                assert time.monotonic() < deadline, f"only {len(items)} items within 90 s"
                cur.send_feedback(reply=True, force=True)  # (the keepalive answering it moves wal_end on)
                select.select([cur], [], [], 0.2)
    finally:
        conn.close()


def test_the_c_reader_drains_the_same_items_as_the_python_reference(pg_server: Any, pg_database: str,
                                                                     wal: tuple[list[str], int]) -> None:
    slots, end = wal
    c_items = _read_all(pg_server, pg_database, slots[0], end, native=True)
    py_items = _read_all(pg_server, pg_database, slots[1], end, native=False)
    assert c_items == py_items
    relid_a, relid_b = _relid(pg_server, pg_database, "a"), _relid(pg_server, pg_database, "b")
    stored = [p for kind, p in c_items if kind == "run"]
    # every plain change of a, stored under the version its Relation message gave; none of b's
    assert len(stored) == 30 * 22 + 3
    assert all(int.from_bytes(p[5:9], "big") == relid_a for p in stored)
    assert {p[:4] for p in stored[:30 * 22 + 1]} == {encode_payload(2, b"")}  # (the first Relation makes 2)
    assert stored[30 * 22 + 1][:4] == encode_payload(3, b"")  # (the ALTER's Relation, before the next row)
    raw_plain = [p for kind, p in c_items if kind == "raw" and p[:1] in b"IUD"]
    assert all(int.from_bytes(p[5:9], "big") in (relid_a, relid_b) for p in raw_plain)
    assert len(raw_plain) >= 3001 + 1  # the streamed transaction's changes come raw (xid before relid)
    assert any(kind == "raw" and p[:1] == b"T" for kind, p in c_items)
    assert any(kind == "raw" and p[:1] == b"M" for kind, p in c_items)


def test_without_prefixes_every_change_comes_raw(pg_server: Any, pg_database: str,
                                                 wal: tuple[list[str], int]) -> None:
    slots, end = wal
    conn = psycopg2.connect(pg_server.dsn(pg_database), connection_factory=LogicalReplicationConnection)
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slots[0], decode=False, start_lsn=0, options=OPTIONS)
        reader = walread.reader(conn, cur)
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while not (reader.wal_end >= end and not reader.in_txn):
            if reader.drain(out, None, LIMIT, RUN_ROWS) == walread.IDLE:
                assert time.monotonic() < deadline
                cur.send_feedback(reply=True, force=True)
                select.select([cur], [], [], 0.2)
        assert not any(type(i) is list for i in out)
        assert sum(1 for i in out if i[:1] in b"IUD") == 30 * 23 + 2 + 3001 + 1 + 1  # (nothing streamed here)
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["c", "python"])
def test_stream_confirms_acked_position_and_reports_a_terminated_walsender(
        pg_server: Any, pg_database: str, wal: tuple[list[str], int], kind: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEWATER_WALREAD", kind)
    slots, end = wal
    stream = ReplicationStream(pg_server.uri(pg_database), slots[0], "pub", 0, label="t", feedback_interval=0.2,
                               sample_interval=0.2, holder="walread-test")
    stream.open()
    stop = threading.Event()
    seen: list[Any] = []
    try:
        marks = stream.messages(stop, {})
        for m in marks:
            seen.append(m)
            if type(m) is Keepalive and m.ts >= end:
                break
        assert not any(type(m) is list for m in seen), "nothing of a relation outside prefixes is routed"
        stream.ack(end)
        deadline = time.monotonic() + 30
        while True:  # the ack reaches the slot with the next feedback
            (flushed,), = pg_server.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                db=pg_database, params=(slots[0],))
            hi, lo = flushed.split("/")
            if (int(hi, 16) << 32) | int(lo, 16) >= end:
                break
            assert time.monotonic() < deadline, "the acked position never reached the slot"
            next(marks)
        pg_server.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
                          db=pg_database, params=(slots[0],))
        with pytest.raises(UpstreamUnavailable, match="terminat|closed"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                next(marks)
    finally:
        stop.set()
        stream.close()


def test_a_connection_closed_by_another_thread_is_never_read(pg_server: Any, pg_database: str,
                                                             wal: tuple[list[str], int]) -> None:
    """A span's stop closes the stream from another thread; the C reader takes the connection's libpq handle again at
    each drain, so a drain after the close reports it (the stream raises ``UpstreamUnavailable``) instead of reading
    the freed handle."""
    slots, _ = wal
    conn = psycopg2.connect(pg_server.dsn(pg_database), connection_factory=LogicalReplicationConnection)
    cur = conn.cursor()
    cur.start_replication(slot_name=slots[0], decode=False, start_lsn=0, options=OPTIONS)
    reader = walread.reader(conn, cur)
    assert type(reader) is walread.native_module().Reader
    out: list[Any] = []
    reader.drain(out, {}, LIMIT, RUN_ROWS)
    conn.close()
    assert reader.drain(out, {}, LIMIT, RUN_ROWS) == walread.CLOSED
