"""pgoutput decoder against a real PostgreSQL 18 walsender (protocol 4, streaming, messages)."""

from __future__ import annotations

import select
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest
from psycopg2.extras import LogicalReplicationConnection

from cdc.events import UNCHANGED
from upstream.postgres.pgoutput import decode, parse_change
from upstream.postgres.pgoutput_messages import (
    Begin,
    Change,
    Commit,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TypeMsg,
)

pytestmark = pytest.mark.integration

DEADLINE_S = 90.0
BIG_ROWS = 20_000


class Stream:
    """A pgoutput replication stream on its own slot, decoded with our decoder, tracking stream mode."""

    def __init__(
        self, pg_server: Any, db: str, publication: str, *, streaming: str = "on", binary: bool = False
    ):
        self.pg_server, self.db = pg_server, db
        self.slot = f"tw_pgout_{uuid.uuid4().hex[:10]}"
        self.abort_has_lsn = streaming == "parallel"
        pg_server.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", db=db, params=(self.slot,)
        )
        self.conn = psycopg2.connect(
            pg_server.dsn(db),
            connection_factory=LogicalReplicationConnection,
            options="-c logical_decoding_work_mem=64kB",  # the walsender's own setting decides streaming
        )
        self.cur = self.conn.cursor()
        options = {
            "proto_version": "4",
            "publication_names": publication,
            "streaming": streaming,
            "messages": "true",
        }
        if binary:
            options["binary"] = "true"
        self.cur.start_replication(slot_name=self.slot, decode=False, options=options)
        self.in_stream = False

    def read_until(self, done: Callable[[Message], bool], timeout: float = DEADLINE_S) -> list[Message]:
        """Decode messages until ``done(msg)`` is true for one of them; return all of them, that one last."""
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while True:
            raw = self.cur.read_message()
            if raw is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    kinds = [type(m).__name__ for m in out[-10:]]
                    raise AssertionError(f"no end message within {timeout}s; got {len(out)}, last {kinds}")
                select.select([self.cur], [], [], min(left, 0.5))
                continue
            msg = decode(raw.payload, self.in_stream, abort_has_lsn=self.abort_has_lsn)
            if type(msg) is StreamStart:
                assert not self.in_stream, "nested Stream Start"
                self.in_stream = True
            elif type(msg) is StreamStop:
                assert self.in_stream, "Stream Stop outside a stream"
                self.in_stream = False
            out.append(msg)
            if len(out) % 1000 == 0:
                self.cur.send_feedback(flush_lsn=raw.data_start)
            if done(msg):
                self.cur.send_feedback(flush_lsn=raw.data_start, force=True)
                return out

    def close(self) -> None:
        self.conn.close()
        for _ in range(100):  # the walsender may take a moment to release the slot
            try:
                self.pg_server.execute("SELECT pg_drop_replication_slot(%s)", db=self.db, params=(self.slot,))
                return
            except psycopg2.errors.ObjectInUse:
                time.sleep(0.05)
        raise AssertionError(f"slot {self.slot} still in use")


@pytest.fixture
def open_stream(pg_server: Any, pg_database: str) -> Iterator[Callable[..., Stream]]:
    streams: list[Stream] = []

    def opener(publication: str, **kw: Any) -> Stream:
        s = Stream(pg_server, pg_database, publication, **kw)
        streams.append(s)
        return s

    yield opener
    for s in streams:
        s.close()
    left = pg_server.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
        db=pg_database,
        params=(pg_database,),
    )
    assert left == [], f"slots left behind: {left}"


def _conn(pg_server: Any, db: str) -> Any:
    conn = pg_server.connect(db)
    return conn, conn.cursor()


def _text_rows(cur: Any, query: str) -> list[tuple[str | None, ...]]:
    """Rows of ``query`` exactly as the server's output functions render them (no Python conversion)."""
    cur.execute(query + " LIMIT 0")
    raw = psycopg2.extensions.new_type(tuple({d.type_code for d in cur.description}), "RAW", lambda v, c: v)
    psycopg2.extensions.register_type(raw, cur)
    cur.execute(query)
    return [tuple(r) for r in cur.fetchall()]


def _is_commit_of(xid: int) -> Callable[[Message], bool]:
    return lambda m: (
        (type(m) is StreamCommit and m.xid == xid) or (type(m) is StreamAbort and m.xid == m.subxid == xid)
    )


def _relation_names(msgs: list[Message]) -> dict[int, Relation]:
    return {m.relid: m for m in msgs if type(m) is Relation}


def _without_resent_schema(msgs: list[Message]) -> list[Message]:
    """``msgs`` less each Type or Relation message identical to the last one sent for its oid.

    pgoutput sends them again whenever the walsender's relcache entry is invalidated, which another
    session can cause at any time (autovacuum's analyze updating pg_class, a shared-invalidation queue
    reset on a busy server: seen once in CI as a TypeMsg+Relation pair between two deletes). The protocol
    allows that and the decoder takes it; the test asserts the order of everything else."""
    last: dict[tuple[type, int], Message] = {}
    out: list[Message] = []
    for m in msgs:
        if type(m) is Relation or type(m) is TypeMsg:
            key = (type(m), m.relid if type(m) is Relation else m.oid)
            if last.get(key) == m:
                continue
            last[key] = m
        out.append(m)
    return out


# ---- an ordinary transaction ----------------------------------------------------------------------


def test_ordinary_transaction_all_messages_and_values(
    pg_server: Any, pg_database: str, open_stream: Any
) -> None:
    db = pg_database
    conn, cur = _conn(pg_server, db)
    cur.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    cur.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), seen timestamptz, "
        "blob bytea, tags text[], doc jsonb, m mood, flag bool, note varchar(20))"
    )
    cur.execute("CREATE TABLE hist (a int, b text) ")
    cur.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
    cur.execute("CREATE PUBLICATION pub FOR TABLE items, hist")
    s = open_stream("pub")

    cur.execute("BEGIN")
    cur.execute("SELECT pg_current_xact_id()::text::bigint & 4294967295")
    xid = cur.fetchone()[0]
    cur.execute(
        "INSERT INTO items VALUES (1, 'héllo ✓', 12.5, '2026-01-02 03:04:05.678+00', '\\x00ff10', "
        "'{a,\"b c\",NULL}', '{\"k\": [1, 2]}', 'happy', true, NULL), (2, '', -0.01, NULL, NULL, '{}', 'null', NULL, false, 'x')"
    )
    cur.execute("UPDATE items SET price = 13 WHERE id = 1")  # key unchanged: no old tuple
    cur.execute("UPDATE items SET id = 3 WHERE id = 2")  # key changed: old key
    cur.execute("INSERT INTO hist VALUES (1, 'one')")
    cur.execute("UPDATE hist SET b = 'uno'")  # REPLICA IDENTITY FULL: whole old row
    cur.execute("DELETE FROM hist")
    expected_rows = {int(r[0]): list(r) for r in _text_rows(cur, "SELECT * FROM items")}
    cur.execute("SELECT 'items'::regclass::oid, 'hist'::regclass::oid, 'mood'::regtype::oid")
    items_oid, hist_oid, mood_oid = cur.fetchone()
    cur.execute("DELETE FROM items WHERE id = 3")
    cur.execute("COMMIT")
    cur.execute("TRUNCATE items, hist RESTART IDENTITY")

    msgs = _without_resent_schema(s.read_until(lambda m: type(m) is Truncate))
    kinds = [type(m).__name__ if type(m) is not Change else m.kind for m in msgs]
    # one transaction, then the truncate in its own transaction (TRUNCATE makes the schema be re-sent)
    assert kinds[:13] == [
        "Begin", "TypeMsg", "Relation", "I", "I", "U", "U", "Relation", "I", "U", "D", "D", "Commit",
    ]  # fmt: skip
    assert [k for k in kinds[13:] if k not in ("TypeMsg", "Relation")] == ["Begin", "Truncate"]
    begin, commit = msgs[0], msgs[12]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.xid == xid
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
    assert commit.flags == 0
    assert abs(commit.commit_time - time.time()) < 120 and begin.commit_time == commit.commit_time
    assert msgs[1] == TypeMsg(None, mood_oid, "public", "mood")

    rels = _relation_names(msgs)
    items = rels[items_oid]
    assert (items.xid, items.namespace, items.name, items.replica_identity) == (None, "public", "items", "d")
    assert [c.name for c in items.columns] == [
        "id",
        "name",
        "price",
        "seen",
        "blob",
        "tags",
        "doc",
        "m",
        "flag",
        "note",
    ]
    assert [c.flags for c in items.columns] == [1] + [0] * 9
    assert items.columns[7].type_oid == mood_oid
    assert items.columns[2].type_modifier == (10 << 16 | 2) + 4  # numeric(10,2) typmod
    assert items.columns[9].type_modifier == 20 + 4  # varchar(20)
    hist = rels[hist_oid]
    assert hist.replica_identity == "f" and [c.flags for c in hist.columns] == [1, 1]

    changes = [m for m in msgs if type(m) is Change]
    assert all(c.xid is None for c in changes)
    p = [parse_change(c.raw) for c in changes]
    assert [x.relid for x in p] == [items_oid] * 4 + [hist_oid] * 3 + [items_oid]
    # items: insert 1 (before the price update), insert 2, update 1, update key 2 -> 3, ..., delete 3
    assert p[0].new == [*expected_rows[1][:2], "12.50", *expected_rows[1][3:]]
    assert p[1].new == ["2", *expected_rows[3][1:]]
    assert p[2].new == expected_rows[1] and p[2].old is None and p[2].old_kind is None
    assert p[3].new == expected_rows[3]
    assert p[3].old_kind == "K" and p[3].old == ["2"] + [None] * 9
    assert p[7].kind == "D" and p[7].old_kind == "K" and p[7].old == ["3"] + [None] * 9
    # hist (REPLICA IDENTITY FULL): old rows in full
    assert p[4].new == ["1", "one"]
    assert (p[5].old_kind, p[5].old, p[5].new) == ("O", ["1", "one"], ["1", "uno"])
    assert (p[6].old_kind, p[6].old, p[6].new) == ("O", ["1", "uno"], None)

    trunc = msgs[-1]
    assert isinstance(trunc, Truncate)
    assert trunc.xid is None and sorted(trunc.relids) == sorted([items_oid, hist_oid])
    assert trunc.options == 2  # RESTART IDENTITY
    conn.close()


def test_binary_values(pg_server: Any, pg_database: str, open_stream: Any) -> None:
    pg_server.execute("CREATE TABLE b (id int PRIMARY KEY, big bigint, t text, f float8)", db=pg_database)
    pg_server.execute("CREATE PUBLICATION pub FOR TABLE b", db=pg_database)
    s = open_stream("pub", binary=True)
    pg_server.execute("INSERT INTO b VALUES (7, -5000000000, 'tëxt', NULL)", db=pg_database)
    msgs = s.read_until(lambda m: type(m) is Commit)
    (change,) = [m for m in msgs if type(m) is Change]
    new = parse_change(change.raw).new
    assert new == [struct.pack(">i", 7), struct.pack(">q", -5000000000), "tëxt".encode(), None]


def test_replication_origin(pg_server: Any, pg_database: str, open_stream: Any) -> None:
    name = f"tw_origin_{uuid.uuid4().hex[:8]}"
    conn, cur = _conn(pg_server, pg_database)
    cur.execute("CREATE TABLE o (id int PRIMARY KEY)")
    cur.execute("CREATE PUBLICATION pub FOR TABLE o")
    cur.execute("SELECT pg_replication_origin_create(%s)", (name,))
    try:
        s = open_stream("pub")
        cur.execute("SELECT pg_replication_origin_session_setup(%s)", (name,))
        cur.execute("BEGIN")
        cur.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
        cur.execute("INSERT INTO o VALUES (1)")
        cur.execute("COMMIT")
        cur.execute("SELECT pg_replication_origin_session_reset()")
        msgs = s.read_until(lambda m: type(m) is Commit)
        assert [type(m) for m in msgs][:2] == [Begin, Origin]
        assert msgs[1] == Origin(0xABCDEF, name)
    finally:
        conn.close()
        pg_server.execute("SELECT pg_replication_origin_drop(%s)", db=pg_database, params=(name,))


# ---- logical decoding messages --------------------------------------------------------------------


def test_logical_messages(pg_server: Any, pg_database: str, open_stream: Any) -> None:
    conn, cur = _conn(pg_server, pg_database)
    cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    cur.execute("CREATE PUBLICATION pub FOR TABLE t")
    s = open_stream("pub")
    cur.execute("SELECT pg_logical_emit_message(false, 'tw-nontx', 'outside')")
    (lsn_nontx,) = cur.fetchone()
    cur.execute("BEGIN")
    cur.execute("SELECT pg_logical_emit_message(true, 'tw-tx', '\\x00ff00'::bytea)")
    (lsn_tx,) = cur.fetchone()
    cur.execute("INSERT INTO t VALUES (1)")
    cur.execute("COMMIT")
    msgs = _without_resent_schema(s.read_until(lambda m: type(m) is Commit))
    assert [type(m) for m in msgs] == [LogicalMessage, Begin, LogicalMessage, Relation, Change, Commit]
    lsn_of = lambda text: int(text.split("/")[0], 16) << 32 | int(text.split("/")[1], 16)  # noqa: E731
    assert msgs[0] == LogicalMessage(None, 0, lsn_of(lsn_nontx), "tw-nontx", b"outside")
    assert msgs[2] == LogicalMessage(None, 1, lsn_of(lsn_tx), "tw-tx", b"\x00\xff\x00")
    conn.close()


# ---- streaming of large transactions --------------------------------------------------------------


def _setup_big(pg_server: Any, db: str) -> tuple[Any, Any, int]:
    conn, cur = _conn(pg_server, db)
    cur.execute("CREATE TABLE big (id int PRIMARY KEY, payload text)")
    cur.execute("CREATE PUBLICATION pub FOR TABLE big")
    cur.execute("SELECT 'big'::regclass::oid")
    return conn, cur, cur.fetchone()[0]


def _blocks(msgs: list[Message]) -> list[list[Message]]:
    """Split the messages of stream blocks (Stream Start .. Stream Stop, both included)."""
    blocks: list[list[Message]] = []
    for m in msgs:
        if type(m) is StreamStart:
            blocks.append([m])
        elif blocks and type(blocks[-1][-1]) is not StreamStop:
            blocks[-1].append(m)
    return blocks


def _stop_after_change_of(xid: int) -> Callable[[Message], bool]:
    """True at the first Stream Stop after a streamed change of ``xid``: its changes reached the client.

    Waiting for that before ending a transaction makes streaming deterministic: PostgreSQL (16+) does
    not stream a transaction that is already aborted when the walsender decodes it.
    """
    seen = False

    def done(m: Message) -> bool:
        nonlocal seen
        seen = seen or (type(m) is Change and m.xid == xid)
        return seen and type(m) is StreamStop

    return done


def test_big_transaction_is_streamed(pg_server: Any, pg_database: str, open_stream: Any) -> None:
    conn, cur, relid = _setup_big(pg_server, pg_database)
    s = open_stream("pub")
    cur.execute("BEGIN")
    cur.execute("SELECT pg_current_xact_id()::text::bigint & 4294967295")
    xid = cur.fetchone()[0]
    cur.execute("INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, %s) g", (BIG_ROWS // 2,))
    msgs = s.read_until(_stop_after_change_of(xid))  # streamed while still in progress
    cur.execute("SELECT pg_logical_emit_message(true, 'tw-mid', 'in the middle')")
    cur.execute(
        "INSERT INTO big SELECT g, 'row ' || g FROM generate_series(%s, %s) g", (BIG_ROWS // 2 + 1, BIG_ROWS)
    )
    cur.execute("COMMIT")
    msgs += s.read_until(_is_commit_of(xid))

    assert not any(type(m) in (Begin, Commit) for m in msgs)
    blocks = _blocks(msgs)
    assert len(blocks) >= 2, "20k rows with 64kB decoding memory must arrive in several stream blocks"
    assert all(type(b[-1]) is StreamStop for b in blocks)
    assert [b[0] for b in blocks] == [StreamStart(xid, i == 0) for i in range(len(blocks))]
    in_blocks = [m for b in blocks for m in b[1:-1]]
    assert len(in_blocks) + 2 * len(blocks) + 1 == len(msgs)  # nothing outside blocks but the commit
    rel = in_blocks[0]
    assert type(rel) is Relation and rel.xid == xid and rel.relid == relid and rel.name == "big"
    (mid,) = [m for m in in_blocks if type(m) is LogicalMessage]
    assert mid.xid == xid and mid.prefix == "tw-mid" and mid.content == b"in the middle" and mid.flags == 1

    changes = [m for m in in_blocks if type(m) is Change]
    assert len(changes) == BIG_ROWS
    assert all(c.kind == "I" and c.xid == xid and c.relid == relid for c in changes)
    parsed = [parse_change(c.raw) for c in changes]
    assert [p.new for p in parsed] == [[str(i), f"row {i}"] for i in range(1, BIG_ROWS + 1)]

    commit = msgs[-1]
    assert isinstance(commit, StreamCommit)
    assert commit.flags == 0 and commit.commit_lsn < commit.end_lsn
    assert abs(commit.commit_time - time.time()) < 120
    conn.close()


def test_savepoint_rollback_in_streamed_transaction(
    pg_server: Any, pg_database: str, open_stream: Any
) -> None:
    conn, cur, relid = _setup_big(pg_server, pg_database)
    s = open_stream("pub")
    n = BIG_ROWS // 4
    cur.execute("BEGIN")
    cur.execute("SELECT pg_current_xact_id()::text::bigint & 4294967295")
    xid = cur.fetchone()[0]
    cur.execute("INSERT INTO big SELECT g, 'kept' FROM generate_series(1, %s) g", (n,))
    cur.execute("SAVEPOINT s")
    cur.execute("INSERT INTO big SELECT g, 'rolled back' FROM generate_series(%s, %s) g", (n + 1, 3 * n))
    cur.execute("SELECT xmin::text::bigint FROM big WHERE id = %s", (n + 1,))
    subxid = cur.fetchone()[0]
    msgs = s.read_until(_stop_after_change_of(subxid))
    cur.execute("ROLLBACK TO SAVEPOINT s")  # savepoint s stays: what follows is another subtransaction
    cur.execute("INSERT INTO big SELECT g, 'kept too' FROM generate_series(%s, %s) g", (3 * n + 1, 4 * n))
    cur.execute("COMMIT")
    msgs += s.read_until(_is_commit_of(xid))
    assert subxid != xid

    aborts = [m for m in msgs if type(m) is StreamAbort]
    assert aborts == [StreamAbort(xid, subxid, None, None)]
    changes = [m for m in msgs if type(m) is Change]
    by_xid: dict[int, list[int]] = {}
    for c in changes:
        assert c.xid is not None
        by_xid.setdefault(c.xid, []).append(int(parse_change(c.raw).new[0]))  # type: ignore[index]
    assert xid in by_xid and set(by_xid[subxid]) <= set(range(n + 1, 3 * n + 1))
    # applying the protocol (drop what an abort names) yields exactly the committed table
    kept = sorted(i for x, ids in by_xid.items() if x not in {a.subxid for a in aborts} for i in ids)
    cur.execute("SELECT id FROM big ORDER BY id")
    assert kept == [r[0] for r in cur.fetchall()] == list(range(1, n + 1)) + list(range(3 * n + 1, 4 * n + 1))
    assert type(msgs[-1]) is StreamCommit
    conn.close()


@pytest.mark.parametrize("streaming", ["on", "parallel"])
def test_rolled_back_streamed_transaction(
    pg_server: Any, pg_database: str, open_stream: Any, streaming: str
) -> None:
    conn, cur, relid = _setup_big(pg_server, pg_database)
    s = open_stream("pub", streaming=streaming)
    cur.execute("BEGIN")
    cur.execute("SELECT pg_current_xact_id()::text::bigint & 4294967295")
    xid = cur.fetchone()[0]
    cur.execute("INSERT INTO big SELECT g, 'doomed' FROM generate_series(1, %s) g", (BIG_ROWS,))
    msgs = s.read_until(_stop_after_change_of(xid))
    cur.execute("ROLLBACK")
    cur.execute("INSERT INTO big VALUES (-1, 'after')")
    msgs += s.read_until(lambda m: type(m) is Commit)

    abort_at = next(i for i, m in enumerate(msgs) if type(m) is StreamAbort)
    abort = msgs[abort_at]
    assert isinstance(abort, StreamAbort)
    assert abort.xid == abort.subxid == xid
    if streaming == "parallel":
        assert abort.abort_lsn is not None and abort.abort_lsn > 0
        assert abort.abort_time is not None and abs(abort.abort_time - time.time()) < 120
    else:
        assert abort.abort_lsn is None and abort.abort_time is None
    streamed = [m for m in msgs[:abort_at] if type(m) is Change]
    assert streamed and all(c.xid == xid for c in streamed)
    # the next transaction is an ordinary one
    after = msgs[abort_at + 1 :]
    assert [type(m) for m in after if type(m) is not Relation] == [Begin, Change, Commit]
    last = [m for m in after if type(m) is Change][0]
    assert last.xid is None and parse_change(last.raw).new == ["-1", "after"]
    conn.close()


# ---- unchanged TOAST values -----------------------------------------------------------------------


def test_unchanged_toasted_value_arrives_as_unchanged(
    pg_server: Any, pg_database: str, open_stream: Any
) -> None:
    conn, cur = _conn(pg_server, pg_database)
    cur.execute("CREATE TABLE doc (id int PRIMARY KEY, body text, n int)")
    cur.execute("ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL")  # out of line, uncompressed
    cur.execute("CREATE PUBLICATION pub FOR TABLE doc")
    s = open_stream("pub")
    cur.execute("INSERT INTO doc SELECT 1, string_agg(md5(g::text), '') , 0 FROM generate_series(1, 400) g")
    cur.execute("SELECT body FROM doc WHERE id = 1")
    (body,) = cur.fetchone()
    assert len(body) > 8192
    cur.execute("UPDATE doc SET n = 1 WHERE id = 1")
    cur.execute("UPDATE doc SET body = body || 'x', n = 2 WHERE id = 1")
    msgs: list[Message] = []
    for _ in range(3):  # three transactions, streamed or not
        msgs += s.read_until(lambda m: type(m) in (Commit, StreamCommit))
    parsed = [parse_change(m.raw) for m in msgs if type(m) is Change]
    assert [p.kind for p in parsed] == ["I", "U", "U"]
    assert parsed[0].new == ["1", body, "0"]
    assert parsed[1].new == ["1", UNCHANGED, "1"] and parsed[1].new[1] is UNCHANGED
    assert parsed[2].new == ["1", body + "x", "2"]
    conn.close()
