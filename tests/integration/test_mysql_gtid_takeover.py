"""A MariaDB span's resume token (upstream.mysql.resume) against a real primary and a real GTID replica: a restart
from a checkpoint's token gets exactly the later transactions with the same Ts; a promoted replica continues from
the token's GTID state with Ts above the old server's; a replica missing GTIDs is refused, naming them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_mysql_source import Recorder, rows_of, start_ts, stop_source, wait_for

from cdc.errors import InvalidArgument, SlotLost
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.ts import Watermark
from playground.servers import MariaDBServer
from upstream import open_upstream
from upstream.mysql.positions import epoch_of
from upstream.mysql.resume import GtidState, ResumePoint

pytestmark = pytest.mark.integration

DB = "shop"


def primary_and_replica(kind: type[MariaDBServer], tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """A fresh ``kind`` primary (server_id 1) and a GTID replica of it (server_id 2), database ``shop`` with table
    ``acct``; both stopped at the end (a fixture body: ``yield from``)."""
    primary = kind(tmp_path / "primary").start()
    replica: MariaDBServer | None = None
    try:
        primary.create_database(DB)
        primary.execute(f"CREATE TABLE {DB}.acct (id INT PRIMARY KEY, bal INT, note VARCHAR(20))")
        replica = kind.replica_of(primary, tmp_path / "replica")
        yield primary, replica
    finally:
        if replica is not None:
            replica.kill()
        primary.kill()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """A fresh MariaDB primary and a GTID replica of it (log-slave-updates), database ``shop``."""
    yield from primary_and_replica(MariaDBServer, tmp_path)


def source(uri: str, start: int, token: str | None) -> tuple[Any, Recorder, list[Watermark], Any, Any, list[Any]]:
    import threading

    up = open_upstream(uri)
    src = up.span_source(SpanInfo(0, "slot_gtid", "pub", start), Watermark(start, 0.0), TableFilter(("*.*",)),
                         label="test", holder="test", resume=token)
    src.open()
    rec = Recorder()
    resolved: list[Watermark] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            src.run(rec, stop, resolved.append)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return src, rec, resolved, th, stop, errors


def write(server: MariaDBServer, ids: range, bal: int) -> None:
    conn = server.connect(DB)
    try:
        with conn.cursor() as cur:
            for i in ids:  # one transaction each
                cur.execute("INSERT INTO acct VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE bal = VALUES(bal)",
                            (i, bal, f"n{i}"))
    finally:
        conn.close()


def ids_of(src: Any, rec: Recorder) -> list[list[int]]:
    return [[(n or o)["id"] for _, n, o in rows_of(src, payloads)] for _, _, payloads in rec.commits]


def test_a_token_resumes_on_the_same_server_and_a_promoted_replica_continues_from_its_gtid(
        pair: tuple[MariaDBServer, MariaDBServer]) -> None:
    primary, replica = pair
    ts0 = start_ts(primary, DB)
    write(primary, range(0, 6), 1)
    src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
    try:
        wait_for(lambda: len(rec.commits) >= 6)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[5][0])
        tss = [c[0] for c in rec.commits]
        token = src.resume_token(tss[2])  # a checkpoint after the third transaction
        start_token = src.resume_token(ts0)
        before_start = src.resume_token(ts0 - 1)
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    assert ids_of(src, rec) == [[i] for i in range(6)]
    assert before_start is None
    point = ResumePoint.decode(token or "")
    assert point.server_id == 1 and point.epoch == 0
    [(gtid_after_3,)] = primary.execute(f"SELECT BINLOG_GTID_POS('{point.file}', {point.pos})") or []
    assert point.gtid == gtid_after_3 and point.gtid.startswith("0-1-")
    assert ResumePoint.decode(start_token or "").pos < point.pos

    # same server, from the token: exactly the later transactions, under the same Ts
    src2, rec2, _, th2, stop2, errors2 = source(primary.uri(DB), tss[2], token)
    try:
        wait_for(lambda: len(rec2.commits) >= 3)
    finally:
        stop_source(src2, th2, stop2)
    assert not errors2, errors2
    assert [c[0] for c in rec2.commits] == tss[3:]
    assert ids_of(src2, rec2) == [[3], [4], [5]]

    # the replica is promoted (the primary stopped), then takes writes of its own
    replica.catch_up(primary)
    primary.kill()
    replica.promote()
    write(replica, range(6, 9), 2)
    with open_upstream(replica.uri(DB)) as up:
        up.check_takeover([SpanInfo(0, "slot_gtid", "pub", ts0)], {0: token})  # it holds the token's GTIDs
    src3, rec3, resolved3, th3, stop3, errors3 = source(replica.uri(DB), tss[2], token)
    try:
        wait_for(lambda: len(rec3.commits) >= 6)
        assert src3.resume_token(tss[2]) == token  # nothing committed yet under the new epoch: the old token
        wait_for(lambda: bool(resolved3) and resolved3[-1].ts >= rec3.commits[5][0])
        new_token = src3.resume_token(rec3.commits[-1][0])
    finally:
        stop_source(src3, th3, stop3)
    assert not errors3, errors3
    assert ids_of(src3, rec3) == [[3], [4], [5], [6], [7], [8]]  # nothing re-read, nothing skipped
    new_ts = [c[0] for c in rec3.commits]
    assert new_ts == sorted(new_ts) and len(set(new_ts)) == 6
    assert new_ts[0] > max(tss) and all(epoch_of(t) == 1 for t in new_ts)  # above every Ts of the old server
    moved = ResumePoint.decode(new_token or "")
    assert moved.server_id == 2 and moved.epoch == 1
    assert json.loads(new_token or "")["gtid"] == replica.execute("SELECT @@gtid_binlog_pos")[0][0]  # type: ignore[index]

    # a restart on the new server from its own token: file/position, same epoch, nothing more
    write(replica, range(9, 10), 3)
    src4, rec4, _, th4, stop4, errors4 = source(replica.uri(DB), new_ts[-1], new_token)
    try:
        wait_for(lambda: len(rec4.commits) >= 1)
    finally:
        stop_source(src4, th4, stop4)
    assert not errors4, errors4
    assert ids_of(src4, rec4) == [[9]] and epoch_of(rec4.commits[0][0]) == 1 and rec4.commits[0][0] > new_ts[-1]


def test_a_replica_missing_gtids_is_refused_naming_them(pair: tuple[MariaDBServer, MariaDBServer]) -> None:
    primary, replica = pair
    ts0 = start_ts(primary, DB)
    replica.execute("STOP SLAVE")  # it falls behind
    write(primary, range(0, 3), 1)
    src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
    try:
        wait_for(lambda: len(rec.commits) >= 3)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[2][0])
        token = src.resume_token(rec.commits[-1][0])
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    wanted = ResumePoint.decode(token or "").gtid
    [(have,)] = replica.execute("SELECT @@gtid_binlog_pos") or []
    span = SpanInfo(0, "slot_gtid", "pub", ts0)
    with open_upstream(replica.uri(DB)) as up, pytest.raises(InvalidArgument) as refused:
        up.check_takeover([span], {0: token})
    msg = str(refused.value)
    assert f"lacks domain 0: 0-?-{int(have.split('-')[2]) + 1} .. {wanted}" in msg, msg
    with open_upstream(replica.uri(DB)) as up, pytest.raises(InvalidArgument, match="no GTID position stored"):
        up.check_takeover([span], {0: None})
    # the source refuses the same way (a changefeed whose URI now reaches the replica without an update)
    up = open_upstream(replica.uri(DB))
    src2 = up.span_source(span, Watermark(rec.commits[-1][0], 0.0), TableFilter(("*.*",)), label="test",
                          holder="test", resume=token)
    with pytest.raises(SlotLost, match="lacks domain 0"):
        src2.open()
    src2.close()
    # once it has caught up it is accepted
    replica.execute("START SLAVE")
    replica.catch_up(primary)
    with open_upstream(replica.uri(DB)) as up:
        up.check_takeover([span], {0: token})


def test_a_replica_whose_binlog_was_purged_past_the_token_is_refused(
        pair: tuple[MariaDBServer, MariaDBServer]) -> None:
    primary, replica = pair
    ts0 = start_ts(primary, DB)
    write(primary, range(0, 2), 1)
    src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
    try:
        wait_for(lambda: len(rec.commits) >= 2)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[1][0])
        token = src.resume_token(rec.commits[0][0])
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    write(primary, range(2, 4), 1)
    replica.catch_up(primary)
    replica.execute("FLUSH BINARY LOGS")
    [(last,)] = [r[:1] for r in replica.execute("SHOW BINARY LOGS") or []][-1:]

    def purged() -> bool:  # (a file stays until InnoDB's binlog checkpoint has passed it)
        replica.execute(f"PURGE BINARY LOGS TO '{last}'")
        return len(replica.execute("SHOW BINARY LOGS") or []) == 1

    wait_for(purged)
    with open_upstream(replica.uri(DB)) as up, pytest.raises(InvalidArgument, match="no longer holds what follows"):
        up.check_takeover([SpanInfo(0, "slot_gtid", "pub", ts0)], {0: token})


def test_a_server_of_another_topology_with_higher_sequence_numbers_is_refused(
        pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path) -> None:
    """Its domain 0 is further along than the token's, but the token's GTID is not in its binlog: the server's own
    answer to a strict GTID dump decides."""
    primary, _ = pair
    other = MariaDBServer(tmp_path / "other", settings={"server-id": "3"}).start()
    try:
        other.create_database(DB)
        other.execute(f"CREATE TABLE {DB}.acct (id INT PRIMARY KEY, bal INT, note VARCHAR(20))")
        write(other, range(0, 20), 1)
        ts0 = start_ts(primary, DB)
        write(primary, range(0, 2), 1)
        src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
        try:
            wait_for(lambda: len(rec.commits) >= 2)
            token = src.resume_token(rec.commits[-1][0])
        finally:
            stop_source(src, th, stop)
        assert not errors, errors
        span = SpanInfo(0, "slot_gtid", "pub", ts0)
        with open_upstream(other.uri(DB)) as up, pytest.raises(InvalidArgument, match="not in the master's binlog"):
            up.check_takeover([span], {0: token})
    finally:
        other.kill()


def test_every_commits_token_is_the_servers_own_gtid_position_there_across_domains_and_acks(
        pair: tuple[MariaDBServer, MariaDBServer]) -> None:
    """Transactions in two GTID domains, interleaved: the token of each commit Ts names the GTID state MariaDB itself
    gives for that binlog position (BINLOG_GTID_POS), before and after the source was told checkpoints are stored."""
    primary, _ = pair
    ts0 = start_ts(primary, DB)
    conn = primary.connect(DB)
    try:
        with conn.cursor() as cur:
            for i in range(12):
                cur.execute("SET SESSION gtid_domain_id = %s", (5 if i % 3 == 1 else 0,))
                cur.execute("INSERT INTO acct VALUES (%s, 1, 'x')", (i,))
    finally:
        conn.close()
    src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
    try:
        wait_for(lambda: len(rec.commits) >= 12)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[11][0])
        tss = [c[0] for c in rec.commits]

        def check(ts: int) -> None:
            point = ResumePoint.decode(src.resume_token(ts) or "")
            assert point.epoch == 0 and point.server_id == 1
            [(truth,)] = primary.execute(f"SELECT BINLOG_GTID_POS('{point.file}', {point.pos})") or []
            assert GtidState.parse(point.gtid) == GtidState.parse(truth), (ts, point, truth)

        for ts in tss:
            check(ts)
        assert "5-1-" in ResumePoint.decode(src.resume_token(tss[-1]) or "").gtid
        src.ack(tss[4])  # stored checkpoints: the marks up to them are folded into the base
        src.ack(tss[7])
        for ts in tss[7:]:
            check(ts)
        assert src.resume_token(tss[7] - 1) is None  # below a stored checkpoint: never asked, not known
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
