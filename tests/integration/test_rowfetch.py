"""upstream.postgres.rowfetch against a real PostgreSQL 18: re-read rows equal the mounter's rows."""

from __future__ import annotations

import datetime as dt
import random
import string
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import TidewaterError
from cdc.events import TableName, TableSchema
from processor.mounter import Mounter
from upstream.base import encode_payload
from upstream.postgres import catalog
from upstream.postgres.conn import connect
from upstream.postgres.rowfetch import RowFetcher
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.integration

# a text value that cannot be compressed below the TOAST threshold: stored out of line
BIG = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=300_000))
ODD_KEY = 'a\tb\nc\\d"e\r,{x}'  # COPY escapes (tab, newline, backslash, CR) and array/quote characters


def _r(row: dict[str, Any] | None) -> dict[str, str] | None:
    """A row compared by the repr of each value: NaN equals NaN, and 1.50 differs from 1.5 (scale kept)."""
    return None if row is None else {k: repr(v) for k, v in row.items()}


def _exec(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for stmt in statements:
            cur.execute(stmt)


def _mounted_inserts(conn: Any, slot: str, publication: str, schema: TableSchema,
                     n: int) -> list[dict[str, Any]]:
    """The rows of the ``n`` INSERTs the slot holds, mounted exactly as a span would (same session settings).
    Polls: the server commits asynchronously, so the WAL the slot may read lags the commit briefly."""
    deadline = time.monotonic() + 10
    while True:
        with conn.cursor() as cur:
            cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
                        "'1', 'publication_names', %s)", (slot, publication))
            raws = [bytes(r[0]) for r in cur.fetchall() if bytes(r[0])[:1] == b"I"]
        if len(raws) >= n or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    mounter = Mounter(PgChangeDecoder(lambda v: schema))
    return [dict(mounter.mount(encode_payload(0, raw), 1, 0.0).values or {}) for raw in raws]


@pytest.fixture
def upstream(pg_server: Any, pg_database: str) -> Any:
    conn = connect(pg_server.uri(pg_database))
    yield pg_server.uri(pg_database), conn
    conn.close()


def test_rows_read_back_equal_the_streamed_rows(upstream: Any) -> None:
    uri, conn = upstream
    slot = f"tw_rf_{uuid.uuid4().hex[:8]}"
    _exec(conn,
          "CREATE TABLE t (id int, k text, n numeric(14,4), ts timestamptz, arr int[], tarr text[], big text, "
          "nul text, f float8, b bool, bt bytea, ch char(4), PRIMARY KEY (id, k))",
          "CREATE PUBLICATION p_rf FOR TABLE t")
    with conn.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1, 'plain', 1.5, '2024-01-02 03:04:05.123456+05', '{1,NULL,3}', "
                    "%s, %s, NULL, -0.0, true, '\\x00ff10', 'ab')", (["a b", None, 'x"y'], BIG))
        cur.execute("INSERT INTO t VALUES (2, %s, 'NaN', 'infinity', '{}', '{}', 'small', 'x', 1e-7, false, "
                    "'', 'abcd')", (ODD_KEY,))
        cur.execute("INSERT INTO t (id, k) VALUES (3, 'nulls')")
        cur.execute("INSERT INTO t VALUES (4, 'gone', -0.0001, '0044-03-15 12:00:00+00 BC', '{{1,2},{3,4}}', "
                    "NULL, NULL, NULL, 'NaN', NULL, NULL, NULL)")
    schema = catalog.table_schema(conn, TableName("public", "t"))
    expected = {(r["id"], r["k"]): r for r in _mounted_inserts(conn, slot, "p_rf", schema, 4)}
    assert len(expected) == 4
    _exec(conn, "DELETE FROM t WHERE id = 4")

    fetch = RowFetcher(uri, batch=2)
    try:
        keys = [(2, ODD_KEY), (1, "plain"), (4, "gone"), (3, "nulls"), (9, "never")]
        rows = fetch(schema, keys)
        assert fetch.queries == 3  # batches of 2 keys
        assert _r(rows[0]) == _r(expected[(2, ODD_KEY)])
        assert _r(rows[1]) == _r(expected[(1, "plain")])
        assert rows[1]["big"] == BIG and rows[1]["n"] == Decimal("1.5000") and str(rows[1]["n"]) == "1.5000"
        assert rows[1]["ts"] == dt.datetime(2024, 1, 1, 22, 4, 5, 123456, tzinfo=dt.UTC)
        assert rows[1]["arr"] == [1, None, 3] and rows[1]["tarr"] == ["a b", None, 'x"y']
        assert rows[1]["bt"] == b"\x00\xff\x10" and rows[1]["ch"] == "ab  "
        assert rows[2] is None and rows[4] is None  # deleted since, never existed
        assert _r(rows[3]) == _r(expected[(3, "nulls")]) and rows[3]["nul"] is None and rows[3]["big"] is None
        # the current row, not the streamed one: an update after the change is what a re-read returns
        _exec(conn, "UPDATE t SET nul = 'later' WHERE id = 1")
        assert _r(fetch(schema, [(1, "plain")])[0]) == _r({**expected[(1, "plain")], "nul": "later"})
    finally:
        fetch.close()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_keys_of_numeric_timestamptz_uuid_and_text_forms(upstream: Any) -> None:
    uri, conn = upstream
    _exec(conn,
          "CREATE TABLE k2 (ts timestamptz, n numeric(10,2), u uuid, v text, PRIMARY KEY (ts, n, u))",
          "INSERT INTO k2 VALUES ('2024-05-06 07:08:09.5+00', 12.30, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'one')")
    schema = catalog.table_schema(conn, TableName("public", "k2"))
    ts = dt.datetime(2024, 5, 6, 9, 8, 9, 500000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    u = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    with RowFetcher(uri) as fetch:
        typed, text, other = fetch(schema, [(ts, Decimal("12.3"), u),
                                            ("2024-05-06 07:08:09.5+00", "12.30", str(u)),
                                            (ts, Decimal("12.31"), u)])
    assert typed == text == {"ts": dt.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=dt.UTC),
                             "n": Decimal("12.30"), "u": u, "v": "one"}
    assert other is None


def test_a_missing_column_or_table_is_an_error_and_the_fetcher_recovers(upstream: Any) -> None:
    uri, conn = upstream
    _exec(conn, "CREATE TABLE r (id int PRIMARY KEY, a text)", "INSERT INTO r VALUES (1, 'x')")
    schema = catalog.table_schema(conn, TableName("public", "r"))
    _exec(conn, "ALTER TABLE r RENAME COLUMN a TO b")
    with RowFetcher(uri) as fetch:
        with pytest.raises(TidewaterError, match="re-reading 1 row"):
            fetch(schema, [(1,)])
        _exec(conn, "ALTER TABLE r RENAME COLUMN b TO a")
        assert fetch(schema, [(1,)]) == [{"id": 1, "a": "x"}]
        assert fetch(schema, []) == []
