"""The span source's own binlog decoding (upstream.mysql.binlog, tablemap, rowdecode) against the reference client
(pymysqlreplication) on the same real binlog, of MariaDB and of MySQL 8 (v2 row events, MySQL's collations; MySQL's
binary JSON is compared with the server's own text in test_mysql8_json.py, not with the library's): every table map parses into the same column facts, and every
row of every supported type decodes into the same text as the library's value rendered by upstream.mysql.types.
Also: the table map cache parses a TABLE_MAP only when its bytes change, and hands back the same object otherwise."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import RotateEvent
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.events import TableName
from playground.servers import MariaDBServer, MySQLServer
from upstream.mysql import binlog, catalog, rowcodec, rowdecode, tablemap
from upstream.mysql.conn import connect, stream_settings

ALL_TYPES = """
CREATE TABLE {db}.everything (
  id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT,
  mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
  d65 DECIMAL(65,30), d10 DECIMAL(10,2), d5 DECIMAL(5,5), d18 DECIMAL(18,0), d9 DECIMAL(9,4), fl FLOAT, db DOUBLE,
  c CHAR(5), v VARCHAR(20), v300 VARCHAR(300), tt TINYTEXT, t TEXT, mt MEDIUMTEXT, lt LONGTEXT,
  l1 VARCHAR(20) CHARACTER SET latin1, c1 CHAR(3) CHARACTER SET latin1, b BLOB, tb TINYBLOB, mb MEDIUMBLOB,
  lb LONGBLOB, vb VARBINARY(10), bn BINARY(4), dd DATE, dt0 DATETIME, dt1 DATETIME(1), dt3 DATETIME(3),
  dt6 DATETIME(6), ts0 TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL, ts5 TIMESTAMP(5) NULL, ts6 TIMESTAMP(6) NULL,
  tm0 TIME, tm1 TIME(1), tm4 TIME(4), tm6 TIME(6), y YEAR, b1 BIT(1), b13 BIT(13), b64 BIT(64),
  e ENUM('small', 'it''s', 'large'), s SET('r', 'g', 'b'), s12 SET('a','b','c','d','e','f','g','h','i','j','k','l'),
  j JSON, gs INT AS (id * 2) STORED, gv VARCHAR(30) AS (CONCAT(e, '/', s)) VIRTUAL) DEFAULT CHARSET utf8mb4
"""

c_payloads = [0]  # rows events whose payloads the C decoder produced (and compared) in the last _ours
OLD_TEMPORAL = "CREATE TABLE {db}.old_temporal (id INT PRIMARY KEY, dt DATETIME, tm TIME, ts TIMESTAMP NULL)"


def _value(rnd: random.Random, col: str) -> Any:  # noqa: PLR0911, PLR0912 - one branch per column
    """A random valid value of the column named ``col`` (NULL one time in eight)."""
    if col != "id" and rnd.random() < 0.125:
        return None
    if col in ("ti", "tu", "si", "su", "mi", "mu", "i", "iu", "bi", "bu"):
        bits = {"t": 8, "s": 16, "m": 24, "i": 32, "b": 64}[col[0]]
        if col.endswith("u"):
            return rnd.choice([0, 1, 2**bits - 1, rnd.randrange(2**bits)])
        return rnd.choice([0, -1, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, rnd.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1))])
    if col.startswith("d") and col[1:].isdigit():
        p, s = {"d65": (65, 30), "d10": (10, 2), "d5": (5, 5), "d18": (18, 0), "d9": (9, 4)}[col]
        digits = "".join(rnd.choice("0123456789") for _ in range(p))
        text = (digits[:p - s] or "0") + ("." + digits[p - s:] if s else "")
        return Decimal(rnd.choice(["", "-"]) + text)
    if col == "fl":
        return rnd.choice([0.0, 1.1, -3.25e-10, 3.4e38, rnd.uniform(-1e6, 1e6)])
    if col == "db":
        return rnd.choice([0.0, 0.1, -1e-300, 1.7976931348623157e308, rnd.uniform(-1e12, 1e12)])
    if col in ("c", "v", "v300", "tt", "t", "mt", "lt"):
        n = {"c": 5, "v": 20, "v300": 300, "tt": 60, "t": 400, "mt": 70, "lt": 90}[col]
        return "".join(rnd.choice("aé😀 z\n'\\") for _ in range(rnd.randrange(n + 1))).rstrip(" ")
    if col in ("l1", "c1"):
        return "".join(rnd.choice("abcéüß") for _ in range(rnd.randrange(4))).rstrip(" ")
    if col in ("b", "tb", "mb", "lb", "vb", "bn"):
        n = {"b": 300, "tb": 40, "mb": 70, "lb": 80, "vb": 10, "bn": 4}[col]
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(n + 1)))
    if col == "dd":
        return date(rnd.randrange(1, 10000), rnd.randrange(1, 13), rnd.randrange(1, 29))
    if col.startswith("dt"):
        fsp = int(col[2:])
        us = rnd.randrange(10**6) // 10 ** (6 - fsp) * 10 ** (6 - fsp)
        return datetime(rnd.randrange(1000, 10000), rnd.randrange(1, 13), rnd.randrange(1, 29), rnd.randrange(24),
                        rnd.randrange(60), rnd.randrange(60), us)
    if col.startswith("ts"):
        fsp = int(col[2:])
        us = rnd.randrange(10**6) // 10 ** (6 - fsp) * 10 ** (6 - fsp)
        return datetime(rnd.randrange(1971, 2038), rnd.randrange(1, 13), rnd.randrange(1, 29), rnd.randrange(24),
                        rnd.randrange(60), rnd.randrange(60), us)
    if col.startswith("tm"):
        fsp = int(col[2:])
        us = rnd.randrange(10**6) // 10 ** (6 - fsp) * 10 ** (6 - fsp)
        return timedelta(seconds=rnd.randrange(86400), microseconds=us)
    if col == "y":
        return rnd.choice([0, 1901, 2155, rnd.randrange(1901, 2156)])
    if col in ("b1", "b13", "b64"):
        return rnd.randrange(2 ** int(col[1:]))
    if col == "e":
        return rnd.choice(["small", "it's", "large"])
    if col == "s":
        return ",".join(m for m in "rgb" if rnd.random() < 0.5)
    if col == "s12":
        return ",".join(m for m in "abcdefghijkl" if rnd.random() < 0.5)
    if col == "j":
        return rnd.choice(['{"a": [1, 2]}', "[]", "null", '"x"'])
    raise AssertionError(col)


COLUMNS = ["id", "ti", "tu", "si", "su", "mi", "mu", "i", "iu", "bi", "bu", "d65", "d10", "d5", "d18", "d9", "fl", "db",
           "c", "v", "v300", "tt", "t", "mt", "lt", "l1", "c1", "b", "tb", "mb", "lb", "vb", "bn", "dd", "dt0", "dt1",
           "dt3", "dt6", "ts0", "ts2", "ts5", "ts6", "tm0", "tm1", "tm4", "tm6", "y", "b1", "b13", "b64", "e", "s", "s12",
           "j"]


def _library_text(facts: catalog.TableFacts, row: dict[str, Any], none_sources: dict[str, str]) -> list[Any]:
    """The reference client's row rendered as the span source rendered it before it had its own decoder."""
    out: list[Any] = []
    for col, render in zip(facts.columns, facts.renderers(), strict=True):
        v = row[col.name]
        if v is None:
            why = none_sources.get(col.name, "null")
            out.append("" if why == "empty set" and col.data_type == "set" else None if why == "null" else
                       f"REFUSED {why}")
            continue
        try:
            out.append(render(v))
        except ValueError as exc:
            out.append(f"REFUSED {exc}")
    return out


def _library(server: MariaDBServer, log_file: str, log_pos: int, end: int, facts: dict[str, catalog.TableFacts]
             ) -> tuple[list[tuple[str, str, list[Any]]], dict[str, list[dict[str, Any]]]]:
    reader = BinLogStreamReader(stream_settings(server.uri("mysql")), server_id=0x7100_0001, log_file=log_file,
                                log_pos=log_pos, resume_stream=True, blocking=False, is_mariadb=False,
                                only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
                                             RotateEvent])
    rows: list[tuple[str, str, list[Any]]] = []
    maps: dict[str, list[dict[str, Any]]] = {}
    try:
        for ev in reader:
            if ev.packet.log_pos > end and reader.log_file == log_file:
                break
            if isinstance(ev, TableMapEvent):
                if ev.table in facts:
                    maps.setdefault(ev.table, []).append(
                        {"schema": ev.schema, "table": ev.table, "columns": [_column_facts(c) for c in ev.columns]})
                continue
            if isinstance(ev, RotateEvent) or ev.table not in facts:
                continue
            f = facts[ev.table]
            for r in ev.rows:
                if isinstance(ev, UpdateRowsEvent):
                    rows.append(("U", ev.table, [_library_text(f, r["before_values"], r["before_none_sources"]),
                                                 _library_text(f, r["after_values"], r["after_none_sources"])]))
                else:
                    rows.append(("I" if isinstance(ev, WriteRowsEvent) else "D", ev.table,
                                 [_library_text(f, r["values"], r["none_sources"])]))
    finally:
        reader.close()
    return rows, maps


def _column_facts(c: Any) -> dict[str, Any]:
    keys = ("type", "name", "unsigned", "character_set_name", "max_length", "size", "length_size", "precision",
            "decimals", "fsp", "bits", "bytes", "enum_values", "set_values")
    return {k: getattr(c, k, None) for k in keys if getattr(c, k, None) not in (None, 0, False)}


def _dbms(server: MariaDBServer) -> str:
    return "mysql" if isinstance(server, MySQLServer) else "mariadb"


def _ours(server: MariaDBServer, log_file: str, log_pos: int, end: int, facts: dict[str, catalog.TableFacts]
          ) -> tuple[list[tuple[str, str, list[Any]]], dict[str, list[dict[str, Any]]], int]:
    """The same range framed and decoded by the span source's own modules; also how many TABLE_MAPs were parsed."""
    reader = BinLogStreamReader(stream_settings(server.uri("mysql")), server_id=0x7100_0002, log_file=log_file,
                                log_pos=log_pos, resume_stream=True, blocking=False, is_mariadb=False,
                                only_events=[RotateEvent])
    rows: list[tuple[str, str, list[Any]]] = []
    maps: dict[str, list[dict[str, Any]]] = {}
    cache = tablemap.TableMapCache(_dbms(server))
    parsed = 0
    decoders: dict[int, tuple[rowdecode.RowDecoder, rowdecode.RowDecoder]] = {}
    c_payloads[0] = 0
    try:
        assert reader.fetchone() is not None
        conn = reader._stream_connection  # noqa: SLF001 - as the span source reads it
        checksum = bool(reader._BinLogStreamReader__use_checksum)  # type: ignore[attr-defined]  # noqa: SLF001
        cur_file = reader.log_file
        while True:
            pkt = conn._read_packet()  # noqa: SLF001
            if pkt.is_eof_packet():
                break
            data = pkt.get_all_data()
            _ts, etype, _sid, size, pos = binlog.HEADER.unpack_from(data)
            if pos > end and cur_file == log_file:
                break
            stop = binlog.body_end(data, size, checksum and etype != binlog.HEARTBEAT)
            if stop != 1 + size:
                binlog.check_crc(data, stop)
            if etype == binlog.ROTATE:
                cur_file, _ = binlog.rotate(data, stop)
                cache.clear()
            elif etype == binlog.TABLE_MAP:
                before = cache.get(int.from_bytes(data[20:26], "little"))
                tm = cache.put(data, stop)
                parsed += tm is not before
                if tm.table in facts:
                    maps.setdefault(tm.table, []).append(
                        {"schema": tm.schema, "table": tm.table, "columns": [_column_facts(c) for c in tm.columns]})
            elif etype in binlog.ROWS_V1 | binlog.ROWS_V2:
                table_id, _n, present, present_after, off = rowdecode.rows_header(data, etype)
                tm = cache.get(table_id)
                assert tm is not None
                if tm.table not in facts:
                    continue
                pair = decoders.get(id(tm))
                if pair is None or pair[0].columns is not tm.columns:
                    pair = decoders[id(tm)] = (rowdecode.RowDecoder(tm.columns, facts[tm.table].renderers()),
                                               rowdecode.RowDecoder(tm.columns, facts[tm.table].renderers(),
                                                                    rowcodec.native()))
                dec, with_c = pair
                kind_b = b"U" if etype in binlog.UPDATES else b"I" if etype in binlog.WRITES else b"D"
                # the C decoder's payloads are the Python decoder's, byte for byte (C or its fallback)
                assert with_c.payloads(data, off, stop, kind_b, b"v", 7) == dec.payloads(data, off, stop, kind_b, b"v", 7)
                c_payloads[0] += 1
                if etype in binlog.UPDATES:
                    assert present_after is not None
                    rows.extend(("U", tm.table, [b, a]) for b, a in dec.pairs(data, off, stop, present, present_after))
                else:
                    kind = "I" if etype in binlog.WRITES else "D"
                    rows.extend((kind, tm.table, [r]) for r in dec.images(data, off, stop, present))
    finally:
        reader.close()
    return rows, maps, parsed


@pytest.fixture
def db(mysql_server: MariaDBServer, mysql_database: str) -> Iterator[str]:
    yield mysql_database


def _position(server: MariaDBServer) -> tuple[str, int]:
    conn = connect(server.uri("mysql"))
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            name, pos = cur.fetchone()[:2]
            return name, int(pos)
    finally:
        conn.close()


def test_own_decoder_decodes_every_type_as_the_reference_client(mysql_server: MariaDBServer, db: str) -> None:
    mariadb_server = mysql_server
    mysql8 = isinstance(mysql_server, MySQLServer)
    mariadb_server.execute(ALL_TYPES.format(db=db))
    if mysql8:  # (MySQL 8 cannot create the pre-5.6 temporal formats any more)
        mariadb_server.execute(OLD_TEMPORAL.format(db=db))
    else:
        try:  # the pre-5.6 temporal formats (binlog types DATETIME, TIME, TIMESTAMP) of tables created that way
            mariadb_server.execute("SET GLOBAL mysql56_temporal_format = OFF")
            conn = mariadb_server.connect(db)
            with conn.cursor() as cur:
                cur.execute(OLD_TEMPORAL.format(db=db))
            conn.close()
        finally:
            mariadb_server.execute("SET GLOBAL mysql56_temporal_format = ON")
    start_file, start_pos = _position(mariadb_server)
    rnd = random.Random(23)
    conn = mariadb_server.connect(db)
    placeholders = ", ".join(["%s"] * len(COLUMNS))
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            for i in range(1, 301):
                cur.execute(f"INSERT INTO everything ({', '.join(COLUMNS)}) VALUES ({placeholders})",
                            [i] + [_value(rnd, c) for c in COLUMNS[1:]])
                if i % 50 == 0:
                    conn.commit()
            cur.execute("INSERT INTO everything (id, s, s12, e) VALUES (1000, '', '', 'small')")  # empty sets
            cur.execute("INSERT INTO everything (id) VALUES (1001)")  # all NULL but the generated column
            conn.commit()
            for i in range(1, 301, 3):
                col = rnd.choice(COLUMNS[1:])
                cur.execute(f"UPDATE everything SET {col} = %s WHERE id = %s", (_value(rnd, col), i))
            cur.execute("UPDATE everything SET ti = ti WHERE id < 100")  # one event of many row pairs
            cur.execute("DELETE FROM everything WHERE id % 7 = 0")
            conn.commit()
            cur.execute("FLUSH BINARY LOGS")  # a rotation in the range: the cache is cleared, the maps parsed again
            cur.execute("INSERT INTO old_temporal VALUES (1, '2024-01-02 03:04:05', '12:34:56', '2020-02-29 23:59:59'),"
                        " (2, '1000-01-01 00:00:00', '00:00:00', NULL), (3, NULL, '23:59:59', '2038-01-19 03:14:07')")
            cur.execute("UPDATE everything SET v = 'after rotate' WHERE id = 1")
            conn.commit()
    finally:
        conn.close()
    end_file, end_pos = _position(mariadb_server)
    ctl = connect(mariadb_server.uri(db))
    try:
        facts = {t: catalog.table_facts(ctl, "test", TableName(db, t)) for t in ("everything", "old_temporal")}
    finally:
        ctl.close()

    lib_rows, lib_maps = _library(mariadb_server, start_file, start_pos, 1 << 62, facts)
    our_rows, our_maps, parsed = _ours(mariadb_server, start_file, start_pos, 1 << 62, facts)
    if mysql8:  # the library's JSON is a Python object (JSON null as None, like SQL NULL), ours MySQL's text:
        j = [c.name for c in facts["everything"].columns].index("j")  # compared with SELECT in test_mysql8_json
        for rows in (lib_rows, our_rows):
            for _, t, imgs in rows:
                for img in imgs:
                    if t == "everything":
                        img[j] = "JSON"
    assert len(lib_rows) > 400
    assert {k for k, _, _ in lib_rows} == {"I", "U", "D"}
    assert any(t == "old_temporal" for _, t, _ in lib_rows)
    for i, (lib, ours) in enumerate(zip(lib_rows, our_rows, strict=True)):  # row by row, every column
        assert lib == ours, f"row change {i}: library {lib} ours {ours}"
    assert not any(isinstance(v, str) and v.startswith("REFUSED") for _, _, imgs in lib_rows for img in imgs
                   for v in img)
    assert our_maps == lib_maps
    # every table map of the range was parsed only where its bytes changed: one per table and binlog file
    assert parsed == 3, parsed
    if rowcodec.native() is not None:
        assert c_payloads[0] > 300
    assert end_file != start_file


def test_table_map_cache_parses_only_changed_bytes(mysql_server: MariaDBServer, db: str) -> None:
    mariadb_server = mysql_server
    mariadb_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10))")
    start_file, start_pos = _position(mariadb_server)
    for i in range(5):
        mariadb_server.execute(f"INSERT INTO {db}.t VALUES ({i}, 'x')")
    mariadb_server.execute(f"ALTER TABLE {db}.t ADD COLUMN w INT")
    for i in range(5, 8):
        mariadb_server.execute(f"INSERT INTO {db}.t VALUES ({i}, 'y', {i})")
    reader = BinLogStreamReader(stream_settings(mariadb_server.uri("mysql")), server_id=0x7100_0003, log_file=start_file,
                                log_pos=start_pos, resume_stream=True, blocking=False, is_mariadb=False,
                                only_events=[RotateEvent])
    cache = tablemap.TableMapCache(_dbms(mysql_server))
    seen: list[tablemap.TableMap] = []
    try:
        assert reader.fetchone() is not None
        checksum = bool(reader._BinLogStreamReader__use_checksum)  # type: ignore[attr-defined]  # noqa: SLF001
        while True:
            pkt = reader._stream_connection._read_packet()  # noqa: SLF001
            if pkt.is_eof_packet():
                break
            data = pkt.get_all_data()
            _ts, etype, _sid, size, _pos = binlog.HEADER.unpack_from(data)
            if etype == binlog.TABLE_MAP:
                tm = cache.put(data, binlog.body_end(data, size, checksum))
                if tm.table == "t":
                    seen.append(tm)
    finally:
        reader.close()
    assert len(seen) == 8
    assert all(tm is seen[0] for tm in seen[:5])  # the same bytes: the same object, not parsed again
    assert seen[5] is not seen[0] and all(tm is seen[5] for tm in seen[5:])
    assert [c.name for c in seen[5].columns] == ["id", "v", "w"]
