"""MySQL 8's binary JSON in the row binlog against a real MySQL 8 server: the span source decodes every JSON value
(objects and arrays small and large, every scalar type, strings that need escaping, DECIMAL/DATE/TIME/DATETIME opaque
values) into exactly the text MySQL's own SELECT prints; a partial JSON update (``binlog_row_value_options =
PARTIAL_JSON``, a PARTIAL_UPDATE_ROWS event) fails the span loudly, naming the table, instead of being applied as a
whole value, and so does a compressed transaction (``binlog_transaction_compression``) instead of being skipped;
``changefeed create`` names both global settings. Also: the double formatting of
:func:`upstream.mysql.json_binary.mysql_double` against the server's for many doubles."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from test_mysql_source import rows_of, start_source, start_ts, stop_source, wait_for

from cdc.errors import DecodeError, UpstreamNotReady
from playground.servers import MySQLServer
from upstream import open_upstream
from upstream.mysql.json_binary import mysql_double

pytestmark = pytest.mark.integration


def _scalar(rnd: random.Random) -> Any:
    kind = rnd.randrange(9)
    if kind == 0:
        return rnd.choice([None, True, False])
    if kind == 1:
        return rnd.randrange(-(2**15), 2**15)
    if kind == 2:
        return rnd.randrange(-(2**31), 2**31)
    if kind == 3:
        return rnd.choice([rnd.randrange(-(2**63), 2**63), 2**64 - 1, 2**63, -(2**63)])
    if kind == 4:
        return rnd.choice([0.5, -0.0001, 1e300, 3.0, 1e15, 123456789012345.0, 1e-7, 2.5e-5, 0.1 + 0.2,
                           rnd.uniform(-1e6, 1e6), rnd.uniform(-1, 1) * 10 ** rnd.randrange(-30, 30)])
    if kind == 5:
        return "".join(rnd.choice("aé😀 \"\\/\n\t\b\f\r\x01\x1f'z") for _ in range(rnd.randrange(12)))
    return rnd.choice(["", "plain", "ünïcödé", "a\u2028b"])


def _doc(rnd: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rnd.random() < 0.3:
        return _scalar(rnd)
    if rnd.random() < 0.5:
        return [_doc(rnd, depth + 1) for _ in range(rnd.randrange(6))]
    return {"".join(rnd.choice("abcxyzé\"") for _ in range(rnd.randrange(1, 6))): _doc(rnd, depth + 1)
            for _ in range(rnd.randrange(6))}


def test_binary_json_decodes_to_the_text_mysql_prints(mysql8_server: MySQLServer, mysql8_database: str) -> None:
    db = mysql8_database
    mysql8_server.execute(f"CREATE TABLE {db}.docs (id INT PRIMARY KEY, j JSON, n INT)")
    ts0 = start_ts(mysql8_server, db)
    rnd = random.Random(8)
    conn = mysql8_server.connect(db)
    with conn.cursor() as cur:
        for i in range(1, 201):
            cur.execute("INSERT INTO docs VALUES (%s, CAST(%s AS JSON), %s)", (i, json.dumps(_doc(rnd)), i))
        big = {f"k{i:05d}": [i, str(i) * 20, {"x": i * 1.5}] for i in range(3000)}  # > 64 KiB: the large format
        cur.execute("INSERT INTO docs VALUES (1000, CAST(%s AS JSON), 0)", (json.dumps(big),))
        cur.execute("INSERT INTO docs VALUES (1001, CAST(%s AS JSON), 0)", (json.dumps(list(range(40000))),))
        # opaque values: DECIMAL (a literal with a scale), DATE, TIME, DATETIME, TIMESTAMP, and a binary string
        cur.execute("INSERT INTO docs VALUES (1002, JSON_OBJECT('d', 1.50, 'neg', -12345678901234567890.123, "
                    "'dt', CAST('2024-02-29 23:59:58.123456' AS DATETIME(6)), 'da', CAST('1999-12-31' AS DATE), "
                    "'t', CAST('-838:59:59' AS TIME), 't2', CAST('12:34:56.5' AS TIME(1)), "
                    "'ts', TIMESTAMP'2020-01-02 03:04:05', 'bin', CAST(x'00ff10' AS BINARY), 'z', 0.000), 0)")
        cur.execute("INSERT INTO docs VALUES (1003, NULL, 0), (1004, 'null', 0), (1005, '\"just a string\"', 0), "
                    "(1006, '-0.0', 0), (1007, '[]', 0), (1008, '{}', 0), (1009, '18446744073709551615', 0)")
        for i in range(1, 201, 4):  # updates: the after images are the final values
            cur.execute("UPDATE docs SET j = CAST(%s AS JSON) WHERE id = %s", (json.dumps(_doc(rnd)), i))
    conn.close()
    want = {int(i): j for i, j in mysql8_server.execute(f"SELECT id, j FROM {db}.docs") or []}
    src, rec, _, th, stop, errors = start_source(mysql8_server.uri(db), ts0)
    try:
        wait_for(lambda: sum(len(c[2]) for c in rec.commits) >= len(want) + 50 or bool(errors), timeout=60)
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    got: dict[int, Any] = {}
    for commit in rec.commits:
        for kind, new, _old in rows_of(src, commit[2]):
            assert kind in ("I", "U")
            assert new is not None
            got[new["id"]] = new["j"]
    assert len(got) == len(want) == 210
    for i in sorted(want):  # row by row, MySQL's own text
        assert got[i] == want[i], f"id {i}: decoded {got[i]!r}, SELECT {want[i]!r}"
    assert got[1002].startswith('{"d": 1.50, "t": "-')  # (MySQL itself prints a TIME past 512 h wrapped)
    assert '"da": "1999-12-31", "dt": "2024-02-29 23:59:58.123456", "t2": "12:34:56.500000"' in got[1002]
    assert '"bin": "base64:type' in got[1002]
    assert got[1003] is None and got[1004] == "null"


def test_doubles_print_as_mysql_prints_them(mysql8_server: MySQLServer) -> None:
    rnd = random.Random(80)
    values = [0.0, 1.0, -1.0, 0.1, 1e15, 1e16, 123456789012345.0, 1234567890123456.0, 1e-4, 1e-5, 1.5e-14, 1e-15,
              1e-16, 2.5e300, -2.5e-300, 5e-324, 1.7976931348623157e308, 0.30000000000000004, 100.0, 1e21, 12e20]
    values += [rnd.uniform(-1, 1) * 10 ** rnd.randrange(-40, 40) for _ in range(300)]
    sql = "SELECT " + ", ".join("CAST(CAST(%s AS DOUBLE) AS JSON)" for _ in values)
    [row] = mysql8_server.execute(sql, params=[repr(v) for v in values]) or []
    for v, text in zip(values, row, strict=True):
        assert mysql_double(v) == text, (v, text)


def test_a_partial_json_update_fails_the_span_loudly(mysql8_server: MySQLServer, mysql8_database: str) -> None:
    db = mysql8_database
    mysql8_server.execute(f"CREATE TABLE {db}.pj (id INT PRIMARY KEY, j JSON)")
    mysql8_server.execute(f"INSERT INTO {db}.pj VALUES (1, '{{\"a\": 1, \"b\": \"long enough to patch\"}}')")
    ts0 = start_ts(mysql8_server, db)
    conn = mysql8_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
        cur.execute("SET SESSION binlog_row_value_options = 'PARTIAL_JSON'")
        cur.execute("UPDATE pj SET j = JSON_SET(j, '$.a', 2) WHERE id = 1")
    conn.close()
    src, rec, _, th, stop, errors = start_source(mysql8_server.uri(db), ts0)
    try:
        wait_for(lambda: bool(errors) or bool(rec.commits), timeout=30)
    finally:
        stop_source(src, th, stop)
    assert not rec.commits
    [err] = errors
    assert isinstance(err, DecodeError)
    assert f"table {db}.pj" in str(err) and "partial JSON update" in str(err)
    assert "binlog_row_value_options" in str(err)


def test_create_names_the_global_partial_json_and_compression_settings(mysql8_server: MySQLServer,
                                                                        mysql8_database: str) -> None:
    mysql8_server.execute("SET GLOBAL binlog_row_value_options = 'PARTIAL_JSON'")
    mysql8_server.execute("SET GLOBAL binlog_transaction_compression = ON")
    try:
        with open_upstream(mysql8_server.uri(mysql8_database)) as up, pytest.raises(UpstreamNotReady) as exc:
            up.check_ready()
    finally:
        mysql8_server.execute("SET GLOBAL binlog_row_value_options = ''")
        mysql8_server.execute("SET GLOBAL binlog_transaction_compression = OFF")
    assert "binlog_row_value_options is PARTIAL_JSON: SET GLOBAL binlog_row_value_options = ''" in str(exc.value)
    assert "binlog_transaction_compression is ON: SET GLOBAL binlog_transaction_compression = OFF" in str(exc.value)


def test_a_compressed_transaction_fails_the_span_loudly(mysql8_server: MySQLServer, mysql8_database: str) -> None:
    """A session's ``binlog_transaction_compression = ON`` writes its transactions as one TRANSACTION_PAYLOAD event
    (rows and commit inside): the span fails naming it, never skipping the payload and its rows."""
    db = mysql8_database
    mysql8_server.execute(f"CREATE TABLE {db}.z (id INT PRIMARY KEY, v TEXT)")
    ts0 = start_ts(mysql8_server, db)
    conn = mysql8_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO z VALUES (1, 'plain')")
        cur.execute("SET SESSION binlog_transaction_compression = ON")
        cur.execute("INSERT INTO z VALUES (2, REPEAT('x', 1000))")
    conn.close()
    src, rec, _, th, stop, errors = start_source(mysql8_server.uri(db), ts0)
    try:
        wait_for(lambda: bool(errors), timeout=30)
    finally:
        stop_source(src, th, stop)
    assert [rows_of(src, c[2]) for c in rec.commits] == [[("I", {"id": 1, "v": "plain"}, None)]]
    [err] = errors
    assert isinstance(err, DecodeError) and "binlog_transaction_compression" in str(err), err
