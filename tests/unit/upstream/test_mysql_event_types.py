"""The MySQL/MariaDB span source's event loop on recorded binlog events (no server): the two single-row transactions
of a real MariaDB 10.11 binlog are stored and committed; every event type outside the explicit allow-list
(upstream.mysql.binlog.PASSED) stops the span with a DecodeError naming it, wherever it appears, since it could carry
rows or DDL the target would miss; the allow-listed ones are passed over; the resolved watermark and the GTID marks
are handed over per batch of events.

The events were recorded from MariaDB 10.11.19 (binlog_format=ROW, binlog_row_metadata=FULL, binlog_checksum=CRC32)
with ``upstream.mysql.wire.EventReader`` after ``CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(20))``:
``INSERT INTO t VALUES (1, 'one')`` then ``UPDATE t SET v = 'uno' WHERE id = 1`` (autocommit), each a GTID,
TABLE_MAP, rows and XID event; the first event is the dump's FORMAT_DESCRIPTION."""

from __future__ import annotations

import threading

import pytest

from cdc.errors import DecodeError
from cdc.events import TableName
from cdc.filter import TableFilter
from cdc.ts import Watermark
from tests.binlog_wire import event
from upstream.base import encode_payload
from upstream.mysql import binlog, catalog, payload, positions
from upstream.mysql.source import MySqlSpanSource

pytestmark = pytest.mark.unit

FILE = "mariadb-bin.000001"
RECORDED = [  # (type, log_pos, packet as hex)
    (15, 0, "004bde0b6b0f01000000fc000000000000000000040031302e31312e31392d4d6172696144422d302b64656231327531"
        "2d6c6f6700000000000000000000000000000000000000000000000013380d000800120004040404120000e400041a08"
        "000000080808020000000a0a0a0000000000000a0a0a0000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000041304"
        "000d0808080a0a0a01dad8db8f"),
    (162, 666, "004cde0b6ba2010000002a0000009a02000008000300000000000000000000000c00000000000040a815b2"),
    (19, 782, "004cde0b6b13010000003e0000000e03000000001200000000000100036170700001740002030f021400020101000201"
        "0804050269640176080100377ada3a"),
    (23, 824, "004cde0b6b17010000002a00000038030000000012000000000001000203fc01000000036f6e650da30df3"),
    (16, 855, "004cde0b6b10010000001f0000005703000000000f0000000000000046f1f5ee"),
    (162, 897, "004cde0b6ba2010000002a0000008103000008000400000000000000000000000c000000000000a644ff38"),
    (19, 1017, "004cde0b6b13010000003e000000f903000000001200000000000100036170700001740002030f021400020101000201"
        "08040502696401760801008adba95e"),
    (24, 1069, "004cde0b6b1801000000340000002d04000000001200000000000100020303fc01000000036f6e65fc0100000003756e"
        "6f81a0c5f7"),
    (16, 1100, "004cde0b6b10010000001f0000004c0400000000100000000000000018d3971f"),
]


def _events() -> list[tuple[int, bytes, int, int]]:
    out = []
    for etype, pos, hexed in RECORDED:
        data = bytes.fromhex(hexed)
        assert binlog.crc_ok(data, len(data) - 4) and data[5] == etype
        out.append((etype, data, len(data) - 4, pos))
    return out


def _event(etype: int, body: bytes, log_pos: int) -> tuple[int, bytes, int, int]:
    data = event(etype, body, log_pos=log_pos, timestamp=1764400000, server_id=1)
    return etype, data, len(data) - 4, log_pos


class _Buffer:
    def __init__(self) -> None:
        self.rows: list[tuple[int, bytes]] = []
        self.commits: list[tuple[int, int, float]] = []

    def add(self, xid: int, subxid: int, raw: bytes) -> None:
        self.rows.append((xid, raw))

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        self.rows.extend((xid, p) for p in payloads)

    def abort(self, xid: int, subxid: int) -> None:
        raise AssertionError("nothing to skip here")

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        self.commits.append((xid, commit_ts, commit_time))


def _source() -> MySqlSpanSource:
    src = MySqlSpanSource("mysql://root@127.0.0.1:1/app", "app", "127.0.0.1:1", 77, TableFilter(["app.*"]),
                          Watermark(positions.to_ts(FILE, 4), 0.0), "t/0", connect=lambda: None)
    col = catalog.ColumnFacts
    src._install(catalog.TableFacts(TableName("app", "t"), (  # noqa: SLF001 - the catalog's answer, without a server
        col("id", "int", "int(11)", False, "", None, 10, 0, None),
        col("v", "varchar", "varchar(20)", True, "", 20, None, None, None)), ("id",), ()))
    return src


def _run(batches: list[list[tuple[int, bytes, int, int]]], pending: list[bool] | None = None,
         backlog: list[bool] | None = None, seconds_per_batch: float = 1.0
         ) -> tuple[_Buffer, list[Watermark], MySqlSpanSource]:
    """The loop over ``batches``; ``pending`` / ``backlog``: what the stream answers, in turn, when asked whether
    more of it has arrived / whether a read found a backlog (wire.EventReader.pending / backlog; None: never); the
    loop's clock moves ``seconds_per_batch`` each time it is read."""
    src, buf, resolved, stop = _source(), _Buffer(), [], threading.Event()
    feed = iter(batches)
    answers, backlogs = iter(pending or []), iter(backlog or [])
    now = [0.0]

    def clock() -> float:  # (each read of the clock: seconds_per_batch later)
        now[0] += seconds_per_batch
        return now[0]

    def next_events() -> list[tuple[int, bytes, int, int]]:
        try:
            return next(feed)
        except StopIteration:
            stop.set()
            return [_event(binlog.HEARTBEAT, b"", 0)]

    src._loop(next_events, FILE, "mariadb", buf, stop, resolved.append,  # noqa: SLF001 - the loop on recorded events
              lambda: next(answers, False), lambda: next(backlogs, False), clock)
    return buf, resolved, src


@pytest.mark.parametrize(("pending", "backlog", "caught_up"), [
    ([True, False], [True, False], 1100),  # a backlog read in two batches: caught up where the second one ends
    ([False, False], [False, False], 855),  # the run's first batch was all there was; the second came alone: steady
    ([True, True], [True, False], 0),  # more waiting after each: still behind
    ([False, False], [False, True], 1100),  # a burst (a read found a backlog) that ends with the second batch
    ([False, True], [False, False], 855),  # a steady stream whose next transaction is already there: not behind
])
def test_the_source_says_where_it_caught_up_with_its_stream(pending: list[bool], backlog: list[bool],
                                                            caught_up: int) -> None:
    # the end of a backlog is where the processor stores the checkpoint at once (upstream.base.caught_up_ts)
    evs = _events()
    _buf, resolved, src = _run([evs[:5], evs[5:]], pending, backlog)
    assert [w.ts for w in resolved] == [positions.to_ts(FILE, 855), positions.to_ts(FILE, 1100)]
    assert src.caught_up_ts() == (positions.to_ts(FILE, caught_up) if caught_up else 0)


def test_a_backlog_read_faster_than_backlog_seconds_is_no_caught_up_point() -> None:
    # a steady stream that fell a few transactions behind for a moment: no extra status write
    evs = _events()
    _buf, _resolved, src = _run([evs[:5], evs[5:]], [False, False], [False, True], seconds_per_batch=0.001)
    assert src.caught_up_ts() == 0
    _buf, _resolved, src = _run([evs[:5], evs[5:]], [False, False], [False, True], seconds_per_batch=0.06)
    assert src.caught_up_ts() == positions.to_ts(FILE, 1100)


def test_recorded_transactions_are_stored_and_committed_with_resolved_and_marks_per_batch() -> None:
    evs = _events()
    buf, resolved, src = _run([evs[:4], evs[4:]])  # (the first batch ends mid-transaction)
    assert [x for x, _ in buf.rows] == [1, 2] and [(x, ts) for x, ts, _ in buf.commits] == [
        (1, positions.to_ts(FILE, 855)), (2, positions.to_ts(FILE, 1100))]
    prefix = len(encode_payload(1, b""))
    ins, upd = (payload.parse(raw[prefix:]) for _, raw in buf.rows)
    assert (ins.kind, ins.new, upd.kind, upd.new, upd.old) == ("I", ["1", "one"], "U", ["1", "uno"], ["1", "one"])
    # one announcement (the first batch committed nothing), after the marks: the GTIDs 0-1-3 and 0-1-4
    assert resolved == [Watermark(positions.to_ts(FILE, 1100), float(binlog.timestamp(evs[-1][1])))]
    assert list(src._mark_seq) == [3, 4] and list(src._mark_dom) == [0, 0]  # noqa: SLF001


@pytest.mark.parametrize("etype", [0, 6, 8, 9, 17, 18, 20, 21, 22, 26, 42, 99, 172, 200])
@pytest.mark.parametrize("at", [1, 3, 5])
def test_an_event_type_outside_the_allow_list_stops_the_span(etype: int, at: int) -> None:
    evs = _events()
    evs.insert(at, _event(etype, b"\x01" * 12, evs[at - 1][3] + 35))
    with pytest.raises(DecodeError, match=f"type {etype}|incident") as exc:
        _run([evs])
    assert f"{FILE}:{evs[at - 1][3] + 35}" in str(exc.value)


@pytest.mark.parametrize("etype", sorted(binlog.PASSED))
def test_allow_listed_types_are_passed_over(etype: int) -> None:
    evs = _events()
    evs.insert(3, _event(etype, b"\x00" * 12, 800))
    buf, _resolved, _src = _run([evs])
    assert len(buf.rows) == 2 and len(buf.commits) == 2
