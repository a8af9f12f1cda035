"""owner.upstream_watch against a real PostgreSQL 18: slot reports, new tables, slot loss, release."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from cdc.events import TableName
from cdc.model import ChangefeedInfo, FeedState, SpanInfo
from cdc.spans import resource_name, span_of
from owner.upstream_watch import (
    CODE_DDL_NOT_CAPTURED,
    FailSlotLost,
    ReleaseAfterGcTtl,
    UpstreamWatcher,
    decide,
    release_slots,
)
from playground.servers import PostgresServer, free_port
from sinks.factory import SinkFactory
from upstream import open_upstream
from upstream.postgres import admin, pgoutput, pgoutput_messages
from upstream.postgres.conn import connect
from upstream.postgres.upstream import PostgresUpstream

SINKS = SinkFactory()  # what the capture hands to the owner

pytestmark = pytest.mark.integration

SPANS = 2


def _found(report: Any) -> list[Any]:
    """The report's warnings but the standing notice that these hand-built changefeeds have no DDL triggers."""
    return [w for w in report.warnings if w.code != CODE_DDL_NOT_CAPTURED]


def _exec(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for stmt in statements:
            cur.execute(stmt)


def _table_in_span(prefix: str, span: int) -> TableName:
    """A public table name with ``prefix`` that hashes to ``span``."""
    for i in range(1000):
        t = TableName("public", f"{prefix}{i}")
        if span_of(t, SPANS) == span:
            return t
    raise AssertionError("no name found")


def _streamed(conn: Any, slot: str, publication: str) -> bytes:
    """Everything the slot would stream through ``publication`` now (pgoutput bytes), without consuming."""
    with conn.cursor() as cur:
        cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                    "'publication_names', %s)", (slot, publication))
        return b"".join(bytes(r[0]) for r in cur.fetchall())


def _active(conn: Any, slot: str) -> bool:
    info = admin.slot_info(conn, slot)
    return info is not None and info.active


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    _exec(c, "SET synchronous_commit = on")  # the test server runs with it off; decoding reads flushed WAL only
    yield c
    c.close()


@pytest.fixture
def info(pg_server: PostgresServer, pg_database: str, conn: Any) -> Iterator[ChangefeedInfo]:
    """A running 2-span changefeed over public.* (one table per span), built by hand like create does."""
    cf_id = f"uw-{uuid.uuid4().hex[:10]}"
    tables = [_table_in_span("base", 0), _table_in_span("base", 1)]
    _exec(conn, "CREATE SCHEMA other", "CREATE TABLE other.ignored (id int PRIMARY KEY)",
          *(f"CREATE TABLE {t.table} (id int PRIMARY KEY, v text)" for t in tables))
    spans = []
    for i in range(SPANS):
        pub, slot = resource_name("pub", cf_id, i), resource_name("slot", cf_id, i)
        admin.create_publication(conn, pub, [t for t in tables if span_of(t, SPANS) == i])
        spans.append(SpanInfo(i, slot, pub, admin.create_slot(conn, slot)))
    now = time.time()
    yield ChangefeedInfo(id=cf_id, upstream_uri=pg_server.uri(pg_database), sink_uri="blackhole://",
                         config={"span_count": SPANS, "filter": {"rules": ["public.*", "!public.skip_*"]}},
                         start_ts=min(s.start_ts for s in spans), start_time=now, create_time=now,
                         spans=tuple(spans), state=FeedState.NORMAL, state_since=now - 1)
    for s in spans:  # slots are cluster-wide: never leave one behind
        admin.drop_slot(conn, s.slot)


def test_inspect_reports_slots_and_retained_wal_grows(info: ChangefeedInfo, conn: Any) -> None:
    w = UpstreamWatcher(open_upstream, SINKS)
    first = w.inspect(info)
    assert first.error == "" and [s.span for s in first.slots] == [0, 1]
    for s, span in zip(first.slots, info.spans, strict=True):
        assert (s.slot, s.exists, s.lost, s.active, s.publication_exists) == (span.slot, True, False, False, True)
        assert s.retained_bytes is not None and s.retained_bytes >= 0
        assert s.confirmed_flush_lsn == span.start_ts
    assert first.new_tables == () and first.ineligible == ()

    base = info.spans[0]
    _exec(conn, f"INSERT INTO {_table_in_span('base', 0).table} SELECT g, repeat('x', 200) "
                "FROM generate_series(1, 5000) g")
    second = w.inspect(info)
    for before, after in zip(first.slots, second.slots, strict=True):
        assert after.retained_bytes is not None and before.retained_bytes is not None
        assert after.retained_bytes - before.retained_bytes > 5000 * 200  # every slot retains all WAL
    assert w.latest(info.id) == second and second.retained_bytes()[base.index] == second.slots[0].retained_bytes
    assert decide(info, second, time.time(), 86400) is None


def test_new_matching_tables_join_the_publication_of_their_span(info: ChangefeedInfo, conn: Any) -> None:
    t0, t1 = _table_in_span("fresh", 0), _table_in_span("fresh", 1)
    _exec(conn, *(f"CREATE TABLE {t.table} (id int PRIMARY KEY, v text)" for t in (t0, t1)),
          "CREATE TABLE skip_me (id int PRIMARY KEY)", "CREATE TABLE other.later (id int PRIMARY KEY)")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert report.error == ""
    assert sorted(report.new_tables) == sorted([str(t0), str(t1)])
    assert report.unreplicated == () and report.ineligible == ()
    for span, t in ((info.spans[0], t0), (info.spans[1], t1)):
        published = admin.publication_tables(conn, span.publication)
        assert published is not None and t in published
        other = info.spans[1 - span.index]
        assert t not in (admin.publication_tables(conn, other.publication) or [])
    everything = {t for s in info.spans for t in admin.publication_tables(conn, s.publication) or []}
    assert TableName("public", "skip_me") not in everything and TableName("other", "later") not in everything

    # changes after the add are streamed by that span's slot
    _exec(conn, f"INSERT INTO {t0.table} VALUES (1, 'after-add-marker')")
    assert b"after-add-marker" in _streamed(conn, info.spans[0].slot, info.spans[0].publication)
    # a second inspection has nothing new to do
    again = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert again.new_tables == () and again.error == ""


def test_rows_written_before_the_pickup_are_reported_unreplicated(info: ChangefeedInfo, conn: Any) -> None:
    t = _table_in_span("early", 1)
    span = info.spans[1]
    _exec(conn, f"CREATE TABLE {t.table} (id int PRIMARY KEY, v text)",
          f"INSERT INTO {t.table} VALUES (1, 'before-add-marker')")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert report.new_tables == (str(t),) and report.unreplicated == (str(t),)
    assert decide(info, report, time.time(), 86400) is None  # a data warning, not a decision
    (w,) = _found(report)
    assert (w.code, w.table, w.count, w.severity) == ("CDC:WarnUnreplicatedRows", str(t), 1, "divergence")
    _exec(conn, f"INSERT INTO {t.table} VALUES (2, 'after-add-marker')")
    streamed = _streamed(conn, span.slot, span.publication)
    assert b"after-add-marker" in streamed and b"before-add-marker" not in streamed


def test_table_with_a_writer_in_flight_is_added_once_the_writer_commits(
        info: ChangefeedInfo, conn: Any, pg_server: PostgresServer, pg_database: str) -> None:
    t = _table_in_span("busy", 0)
    _exec(conn, f"CREATE TABLE {t.table} (id int PRIMARY KEY, v text)")
    writer = connect(pg_server.uri(pg_database))
    try:
        _exec(writer, "BEGIN", f"INSERT INTO {t.table} VALUES (1, 'in-flight-marker')")
        started = time.monotonic()
        blocked = UpstreamWatcher(open_upstream, SINKS).inspect(info)  # SHARE lock not granted within lock_timeout: retried later
        assert time.monotonic() - started < 10
        assert blocked.error == "" and blocked.new_tables == ()
        assert t not in (admin.publication_tables(conn, info.spans[0].publication) or [])
        _exec(writer, "COMMIT")
    finally:
        writer.close()
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert report.new_tables == (str(t),) and report.unreplicated == (str(t),)
    assert [(w.table, w.count) for w in _found(report)] == [(str(t), 1)]


def test_ineligible_new_table_is_reported_not_added(info: ChangefeedInfo, conn: Any) -> None:
    _exec(conn, "CREATE TABLE nokey (a int, b text)")
    watcher = UpstreamWatcher(open_upstream, SINKS)
    report = watcher.inspect(info)
    assert report.new_tables == () and len(report.ineligible) == 1
    assert report.published is not None and "public.nokey" not in report.published
    assert '"public"."nokey"' in report.ineligible[0] and "PRIMARY KEY" in report.ineligible[0]
    assert all(TableName("public", "nokey") not in (admin.publication_tables(conn, s.publication) or [])
               for s in info.spans)
    assert decide(info, report, time.time(), 86400) is None
    (w,) = _found(report)
    assert (w.code, w.table, w.severity) == ("CDC:WarnTableIneligible", "public.nokey", "divergence")
    assert "PRIMARY KEY" in w.message
    # once fixed, the next inspection picks it up
    _exec(conn, "ALTER TABLE nokey REPLICA IDENTITY FULL")
    fixed = watcher.inspect(info)
    assert fixed.new_tables == ("public.nokey",) and fixed.ineligible == ()
    # published now: its warning has ended (the owner drops the stored one by the same rule)
    assert fixed.published is not None and "public.nokey" in fixed.published
    assert [x.code for x in watcher.found_warnings(info) if x.code != CODE_DDL_NOT_CAPTURED] == []


def test_stopped_changefeed_does_not_pick_up_tables(info: ChangefeedInfo, conn: Any) -> None:
    stopped = info.with_state(FeedState.STOPPED, now=time.time() - 1)
    _exec(conn, "CREATE TABLE later (id int PRIMARY KEY)")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(stopped)
    assert report.error == "" and report.new_tables == () and all(s.exists for s in report.slots)
    assert all(TableName("public", "later") not in (admin.publication_tables(conn, s.publication) or [])
               for s in info.spans)


def test_dropped_slot_and_publication_are_reported_and_fail_the_changefeed(info: ChangefeedInfo, conn: Any) -> None:
    admin.drop_slot(conn, info.spans[1].slot)
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert [(s.exists, s.retained_bytes is None) for s in report.slots] == [(True, False), (False, True)]
    d = decide(info, report, time.time(), 86400)
    assert isinstance(d, FailSlotLost) and info.spans[1].slot in d.reason and info.spans[0].slot not in d.reason

    admin.drop_publication(conn, info.spans[0].publication)
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert [s.publication_exists for s in report.slots] == [False, True]
    d = decide(info, report, time.time(), 86400)
    assert isinstance(d, FailSlotLost) and info.spans[0].publication in d.reason


def test_release_slots_drops_everything(info: ChangefeedInfo, conn: Any) -> None:
    stopped = info.with_state(FeedState.STOPPED, now=time.time() - 100)
    w = UpstreamWatcher(open_upstream, SINKS, gc_ttl=50)
    d = decide(stopped, w.inspect(stopped), time.time(), w.gc_ttl)
    assert isinstance(d, ReleaseAfterGcTtl)
    release_slots(stopped, open_upstream)
    for s in info.spans:
        assert admin.slot_info(conn, s.slot) is None
        assert admin.publication_tables(conn, s.publication) is None
    release_slots(stopped, open_upstream)  # idempotent
    assert w.decide(stopped, time.time()) is not None  # the old report still shows the slots ...
    assert all(not s.exists for s in w.inspect(stopped).slots)
    assert w.decide(stopped, time.time()) is None  # ... a fresh one has nothing left to release


def test_release_slots_terminates_an_active_consumer(info: ChangefeedInfo, pg_server: PostgresServer,
                                                    pg_database: str, conn: Any) -> None:
    span = info.spans[0]
    repl = connect(pg_server.uri(pg_database), replication=True)
    cur = repl.cursor()
    cur.start_replication(slot_name=span.slot, decode=False,
                          options={"proto_version": "1", "publication_names": span.publication})
    stop = threading.Event()

    def consume() -> None:
        try:
            while not stop.is_set():
                cur.read_message()
                time.sleep(0.05)
        except Exception:  # noqa: BLE001 - the walsender is terminated by the drop
            pass

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not _active(conn, span.slot) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert UpstreamWatcher(open_upstream, SINKS).inspect(info).slots[0].active
        release_slots(info, open_upstream)
        assert admin.slot_info(conn, span.slot) is None
    finally:
        stop.set()
        t.join(5)
        repl.close()


def test_unreachable_upstream_gives_an_error_report(info: ChangefeedInfo) -> None:
    dead = dataclasses.replace(info, upstream_uri=f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    w = UpstreamWatcher(open_upstream, SINKS)
    report = w.inspect(dead)
    assert report.error and "127.0.0.1" in report.error and report.slots == ()
    assert decide(dead, report, time.time(), 0) is None


# ---- issue 8: refusals, target-name collisions and partitions on pick-up ---------------------------------
def _sqlite_info(info: ChangefeedInfo, tmp_path: Any) -> ChangefeedInfo:
    """``info`` with a SQLite sink (which drops the upstream schema from target names) and filter *.*."""
    return dataclasses.replace(info, sink_uri=f"sqlite:///{tmp_path}/t.db",
                               config={**info.config, "filter": {"rules": ["public.*", "other.*"]}})


def _published(conn: Any, info: ChangefeedInfo) -> set[TableName]:
    return {t for s in info.spans for t in admin.publication_tables(conn, s.publication) or []}


def test_deferrable_key_table_is_not_picked_up(info: ChangefeedInfo, conn: Any) -> None:
    _exec(conn, "CREATE TABLE dpk (id int PRIMARY KEY DEFERRABLE, v int)", "INSERT INTO dpk VALUES (1, 1)")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert report.new_tables == ()
    assert report.ineligible == (
        'table "public"."dpk" has a DEFERRABLE primary key, which PostgreSQL cannot use as replica identity: once '
        'published, every UPDATE and DELETE of "public"."dpk" would fail; fix with ALTER TABLE "public"."dpk" '
        'REPLICA IDENTITY USING INDEX <a non-deferrable unique index on NOT NULL columns> or ALTER TABLE '
        '"public"."dpk" REPLICA IDENTITY FULL',)
    assert TableName("public", "dpk") not in _published(conn, info)
    _exec(conn, "UPDATE dpk SET v = 2", "DELETE FROM dpk")  # the application's writes still work
    assert [(w.code, w.table) for w in _found(report)] == [("CDC:WarnTableIneligible", "public.dpk")]


def test_keyless_table_is_not_picked_up_by_an_at_least_once_changefeed(info: ChangefeedInfo, conn: Any,
                                                                       tmp_path: Any) -> None:
    cf = _sqlite_info(info, tmp_path)
    cf = dataclasses.replace(cf, config={**cf.config, "sink": {"delivery": "at-least-once"}})
    _exec(conn, "CREATE TABLE fullrow (a int, b text)", "ALTER TABLE fullrow REPLICA IDENTITY FULL",
          "CREATE TABLE keyed (id int PRIMARY KEY)", "DROP TABLE other.ignored")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(cf)
    assert report.new_tables == ("public.keyed",)
    assert [(w.code, w.table) for w in _found(report)] == [("CDC:WarnTableIneligible", "public.fullrow")]
    assert "a replay after a fault would duplicate its rows" in _found(report)[0].message
    # with the default exactly-once delivery the same table is picked up
    assert UpstreamWatcher(open_upstream, SINKS).inspect(_sqlite_info(info, tmp_path)).new_tables == ("public.fullrow",)


def test_table_with_a_taken_target_name_is_not_picked_up(info: ChangefeedInfo, conn: Any, tmp_path: Any) -> None:
    base = _table_in_span("base", 0)
    cf = _sqlite_info(info, tmp_path)
    _exec(conn, f"CREATE TABLE other.{base.table} (id int PRIMARY KEY)", "CREATE TABLE other.solo (id int PRIMARY KEY)",
          "CREATE TABLE public.twin (id int PRIMARY KEY)", "CREATE TABLE other.twin (id int PRIMARY KEY)",
          "DROP TABLE other.ignored")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(cf)
    # other.solo and the first of the twins (other.twin sorts before public.twin) are added
    assert sorted(report.new_tables) == ["other.solo", "other.twin"]
    msg_base = (f"other.{base.table} would land on {base.table!r} in the sink, where public.{base.table} already "
                f"lands as {base.table!r} (the rows of two tables would mix); it is not added: exclude one of them "
                "with the changefeed's filter")
    msg_twin = ("public.twin would land on 'twin' in the sink, where other.twin already lands as 'twin' (the rows "
                "of two tables would mix); it is not added: exclude one of them with the changefeed's filter")
    assert report.ineligible == (msg_base, msg_twin)
    assert [(w.code, w.table, w.message) for w in _found(report)] == [
        ("CDC:WarnTargetNameConflict", f"other.{base.table}", msg_base),
        ("CDC:WarnTargetNameConflict", "public.twin", msg_twin)]
    published = _published(conn, cf)
    assert TableName("other", base.table) not in published and TableName("public", "twin") not in published
    assert decide(cf, report, time.time(), 86400) is None  # a warning, not a failure
    # a sink that keeps the schema (blackhole: schema.table) has no collision: both are added
    report2 = UpstreamWatcher(open_upstream, SINKS).inspect(dataclasses.replace(cf, sink_uri="blackhole://"))
    assert sorted(report2.new_tables) == [f"other.{base.table}", "public.twin"] and report2.ineligible == ()


def test_generated_columns_of_picked_up_tables_are_streamed(info: ChangefeedInfo, conn: Any) -> None:
    t = _table_in_span("gen", 0)
    span = info.spans[0]
    _exec(conn, f"CREATE TABLE {t.table} (id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 7) STORED)")
    assert UpstreamWatcher(open_upstream, SINKS).inspect(info).new_tables == (str(t),)
    _exec(conn, f"INSERT INTO {t.table} (id, a) VALUES (1, 6)")  # s = 42
    streamed = _streamed(conn, span.slot, span.publication)
    assert b"\x00s\x00\x00\x00\x00\x17" in streamed and b"t\x00\x00\x00\x0242" in streamed  # column s in Relation, value 42


def test_picked_up_table_with_generated_columns_into_an_old_publication_is_refused(
        info: ChangefeedInfo, conn: Any) -> None:
    span = info.spans[1]
    _exec(conn, f"ALTER PUBLICATION {span.publication} SET (publish_generated_columns = none)")
    t = _table_in_span("oldgen", 1)
    _exec(conn, f"CREATE TABLE {t.table} (a int, id int GENERATED ALWAYS AS (a * 2) STORED PRIMARY KEY)")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(info)
    assert report.new_tables == () and len(report.ineligible) == 1
    assert "its publication was created without publish_generated_columns = stored" in report.ineligible[0]
    _exec(conn, f"INSERT INTO {t.table} (a) VALUES (1)", f"UPDATE {t.table} SET a = 2")  # writes keep working


def test_partition_changes_are_reported_between_looks(info: ChangefeedInfo, conn: Any) -> None:
    root = _table_in_span("proot", 0)
    r = root.table
    _exec(conn, f"CREATE TABLE {r} (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
          f"CREATE TABLE {r}_a PARTITION OF {r} FOR VALUES FROM (0) TO (10)",
          f"CREATE TABLE {r}_b PARTITION OF {r} FOR VALUES FROM (10) TO (20)",
          f"CREATE TABLE {r}_c PARTITION OF {r} FOR VALUES FROM (20) TO (30)",
          f"CREATE TABLE {r}_d PARTITION OF {r} FOR VALUES FROM (30) TO (40)",
          f"INSERT INTO {r} SELECT g, g % 40, 'x' FROM generate_series(1, 80) g")
    w = UpstreamWatcher(open_upstream, SINKS)
    first = w.inspect(info)
    assert first.new_tables == (str(root),)
    # picked up with rows: those 80 are not replicated (said once); the partitions are the baseline
    assert [(x.code, x.count) for x in _found(first)] == [("CDC:WarnUnreplicatedRows", 80)]
    assert _found(w.inspect(info)) == []  # nothing changed: nothing to say
    _exec(conn, f"INSERT INTO {r} VALUES (1000, 1, 'after-add')")
    _exec(conn, f"TRUNCATE {r}_a", f"ALTER TABLE {r} DETACH PARTITION {r}_b", f"DROP TABLE {r}_c",
          f"CREATE TABLE {r}_e (id int NOT NULL, k int NOT NULL, v text, PRIMARY KEY (id, k))",
          f"INSERT INTO {r}_e VALUES (500, 45, 'pre-attach')",
          f"ALTER TABLE {r} ATTACH PARTITION {r}_e FOR VALUES FROM (40) TO (50)",
          f"CREATE TABLE {r}_f PARTITION OF {r} FOR VALUES FROM (50) TO (60)")  # empty: nothing to report
    warnings = _found(w.inspect(info))
    # the detached partition is a table of its own now, matching the filter: picked up, its rows said so
    assert [(x.code, x.table) for x in warnings if not x.code.startswith("CDC:WarnPartition")] == [
        ("CDC:WarnUnreplicatedRows", f"public.{r}_b")]
    got = {w_.code: w_ for w_ in warnings if w_.code.startswith("CDC:WarnPartition")}
    assert sorted(got) == ["CDC:WarnPartitionAttachedRows", "CDC:WarnPartitionDetached", "CDC:WarnPartitionDropped",
                           "CDC:WarnPartitionTruncated"]
    assert all(x.table == str(root) for x in got.values())
    assert got["CDC:WarnPartitionDetached"].message.startswith(
        f"partition public.{r}_b (FOR VALUES FROM (10) TO (20)) of {root} was detached from it (DETACH PARTITION) "
        f"upstream; the replication stream carries no change for that, so its rows are still in the downstream "
        f"table of {root}: delete them there")
    assert f"partition public.{r}_c (FOR VALUES FROM (20) TO (30)) of {root} was dropped upstream" in \
        got["CDC:WarnPartitionDropped"].message
    assert got["CDC:WarnPartitionTruncated"].message.startswith(
        f"partition public.{r}_a (FOR VALUES FROM (0) TO (10)) of {root} was truncated or rewritten upstream (new "
        "storage; it is now empty)")
    assert got["CDC:WarnPartitionAttachedRows"].message.startswith(
        f"partition public.{r}_e (FOR VALUES FROM (40) TO (50)) appeared under {root} and holds rows")
    # reported once, when first seen
    assert _found(w.inspect(info)) == []
    # and measured: none of it reached the slot (a truncate of one partition is not streamed via the root,
    # the attached rows were never written through a published table)
    span = info.spans[0]
    assert b"pre-attach" not in _streamed(conn, span.slot, span.publication)
    with conn.cursor() as cur:
        cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                    "'publication_names', %s)", (span.slot, span.publication))
        messages = [pgoutput.decode(bytes(row[0]), False) for row in cur.fetchall()]
    assert any(isinstance(m, pgoutput_messages.Change) for m in messages)  # the row written after the add
    assert not any(isinstance(m, pgoutput_messages.Truncate) for m in messages)


def test_table_is_not_added_while_target_names_cannot_be_checked(info: ChangefeedInfo, conn: Any) -> None:
    from cdc.errors import InvalidURI

    def broken(_uri: str) -> Any:
        raise InvalidURI("sink URI scheme 'nope' is not supported")

    _exec(conn, "CREATE TABLE unchecked (id int PRIMARY KEY)")
    report = UpstreamWatcher(open_upstream, SINKS, target_names=broken).inspect(info)
    assert report.error == "" and report.new_tables == () and all(s.exists for s in report.slots)
    assert report.ineligible == ("public.unchecked is not added: its target name in the sink cannot be checked "
                                 "(sink URI scheme 'nope' is not supported)",)
    assert TableName("public", "unchecked") not in _published(conn, info)


def test_new_partition_without_identity_is_warned_with_the_fix(info: ChangefeedInfo, conn: Any) -> None:
    root = _table_in_span("pfull", 1)
    r = root.table
    _exec(conn, f"CREATE TABLE {r} (a int, k int) PARTITION BY RANGE (k)", f"ALTER TABLE {r} REPLICA IDENTITY FULL",
          f"CREATE TABLE {r}_1 PARTITION OF {r} FOR VALUES FROM (0) TO (10)", f"ALTER TABLE {r}_1 REPLICA IDENTITY FULL")
    w = UpstreamWatcher(open_upstream, SINKS)
    assert w.inspect(info).new_tables == (str(root),)
    assert _found(w.inspect(info)) == []
    _exec(conn, f"CREATE TABLE {r}_2 PARTITION OF {r} FOR VALUES FROM (10) TO (20)", f"INSERT INTO {r} VALUES (1, 12)")
    with pytest.raises(psycopg2.Error, match="does not have a replica identity"):  # the user's DDL broke it
        _exec(conn, f"UPDATE {r} SET a = 2")
    report = w.inspect(info)
    # created and filled between two looks, it also looks attached-with-rows (documented limit)
    assert sorted(x.code for x in _found(report)) == ["CDC:WarnPartitionAttachedRows",
                                                              "CDC:WarnPartitionNoIdentity"]
    (warning,) = [x for x in _found(report) if x.code == "CDC:WarnPartitionNoIdentity"]
    assert (warning.code, warning.table) == ("CDC:WarnPartitionNoIdentity", str(root))
    assert warning.message == (
        f"partition public.{r}_2 of {root} has no usable replica identity, and as part of the published {root} its "
        f'UPDATEs and DELETEs fail upstream: table "public"."{r}_2" has no primary key and REPLICA IDENTITY DEFAULT; '
        f'fix with ALTER TABLE "public"."{r}_2" ADD PRIMARY KEY (<key columns>) or ALTER TABLE "public"."{r}_2" '
        "REPLICA IDENTITY FULL")
    _exec(conn, f"ALTER TABLE {r}_2 REPLICA IDENTITY FULL", f"UPDATE {r} SET a = 2")  # the fix works


def test_target_names_differing_only_in_case_collide_in_sqlite(info: ChangefeedInfo, conn: Any, tmp_path: Any) -> None:
    cf = _sqlite_info(info, tmp_path)
    _exec(conn, 'CREATE TABLE other."Mixed" (id int PRIMARY KEY)', "CREATE TABLE public.mixed (id int PRIMARY KEY)",
          'CREATE TABLE other."Ä" (id int PRIMARY KEY)', 'CREATE TABLE public."ä" (id int PRIMARY KEY)',
          "DROP TABLE other.ignored")
    report = UpstreamWatcher(open_upstream, SINKS).inspect(cf)
    # SQLite folds ASCII letters only (measured): "Mixed"/"mixed" are one table there, "Ä"/"ä" are two
    assert sorted(report.new_tables) == ["other.Mixed", "other.Ä", "public.ä"]
    assert report.ineligible == (
        "public.mixed would land on 'mixed' in the sink, where other.Mixed already lands as 'Mixed' (the rows of "
        "two tables would mix); it is not added: exclude one of them with the changefeed's filter",)
    # into PostgreSQL (schema kept, exact names) nothing collides
    pg = dataclasses.replace(cf, sink_uri="postgresql://u@127.0.0.1:1/x")
    assert UpstreamWatcher(open_upstream, SINKS).inspect(pg).new_tables == ("public.mixed",)


def test_a_failed_look_does_not_swallow_a_partition_change(info: ChangefeedInfo, conn: Any) -> None:
    root = _table_in_span("pfail", 0)
    r = root.table
    _exec(conn, f"CREATE TABLE {r} (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
          f"CREATE TABLE {r}_1 PARTITION OF {r} FOR VALUES FROM (0) TO (10)",
          f"CREATE TABLE {r}_2 PARTITION OF {r} FOR VALUES FROM (10) TO (20)")
    broken = threading.Event()

    def names(uri: str) -> Any:
        if broken.is_set():
            raise RuntimeError("watcher bug")
        return str

    w = UpstreamWatcher(open_upstream, SINKS, target_names=names)
    assert w.inspect(info).new_tables == (str(root),)
    assert _found(w.inspect(info)) == []  # baseline
    _exec(conn, f"ALTER TABLE {r} DETACH PARTITION {r}_2", "CREATE TABLE later_one (id int PRIMARY KEY)")
    broken.set()
    assert "watcher bug" in w.inspect(info).error  # the look that saw the detach failed
    broken.clear()
    assert [x.code for x in _found(w.inspect(info))] == ["CDC:WarnPartitionDetached"]


class _RenameBetweenReads(PostgresUpstream):
    """The real upstream, with ``DROP TABLE b; ALTER TABLE a RENAME TO b`` run by another session right after the
    inspection read span 0's tables: the interleaving of an application's DDL with one look that made the owner add
    ``a`` (under its new name ``b``) to the publication of ``b``'s span as a new table holding rows (seen as a
    ``CDC:WarnUnreplicatedRows`` warning in tests/e2e/test_ddl_barrier.py under load)."""

    ddl: tuple[str, ...] = ()
    conn: Any = None

    def span_tables(self, span: SpanInfo) -> list[TableName] | None:
        tables = super().span_tables(span)
        if span.index == 0 and self.ddl:
            _exec(self.conn, *self.ddl)
            self.ddl = ()
        return tables


@pytest.mark.parametrize("initial_copy", [False, True])
def test_a_table_renamed_during_a_look_onto_another_spans_name_stays_in_its_span(
        info: ChangefeedInfo, conn: Any, initial_copy: bool) -> None:
    a, b = _table_in_span("base", 0), _table_in_span("base", 1)  # (the fixture's tables: one per span)
    _exec(conn, f"INSERT INTO {a.table} VALUES (1, 'a row')")
    cf = dataclasses.replace(info, initial_copy=initial_copy)
    up = _RenameBetweenReads(cf.upstream_uri)
    up.conn, up.ddl = conn, (f"DROP TABLE {b.table}", f"ALTER TABLE {a.table} RENAME TO {b.table}")
    requested: list[tuple[TableName, int]] = []

    def request_copy(info: ChangefeedInfo, table: TableName, span: int, oid: int) -> Any:
        requested.append((table, span))
        return lambda: None

    report = UpstreamWatcher(open_upstream, SINKS, opener=lambda uri: up, request_copy=request_copy).inspect(cf)
    assert up.ddl == () and report.error == ""  # the rename did run between the reads
    assert report.new_tables == () and report.unreplicated == () and _found(report) == [], report
    assert requested == []  # no table copy of a table its own span streams
    assert admin.publication_tables(conn, cf.spans[0].publication) == [b]  # the renamed table, still in span 0
    assert admin.publication_tables(conn, cf.spans[1].publication) == []  # not in span 1 as well
    again = UpstreamWatcher(open_upstream, SINKS, request_copy=request_copy).inspect(cf)
    assert again.new_tables == () and _found(again) == [] and requested == []


def test_a_table_renamed_away_during_a_look_is_no_target_name_conflict(
        info: ChangefeedInfo, conn: Any, tmp_path: Any) -> None:
    """The publications are read before the tables are listed: ``ALTER TABLE a RENAME TO a_old; CREATE TABLE "A"``
    between the two made the new ``"A"`` look like it would land on the target of ``a`` (SQLite folds case), a
    ``CDC:WarnTargetNameConflict`` that no table caused. It is decided again at the next look instead."""
    a = _table_in_span("base", 0)
    cf = _sqlite_info(info, tmp_path)
    up = _RenameBetweenReads(cf.upstream_uri)
    up.conn = conn
    up.ddl = (f"ALTER TABLE {a.table} RENAME TO {a.table}_old", f'CREATE TABLE public."{a.table.upper()}" (id int '
              "PRIMARY KEY)")
    report = UpstreamWatcher(open_upstream, SINKS, opener=lambda uri: up).inspect(cf)
    assert up.ddl == () and report.error == ""  # the DDL did run between the reads
    assert report.ineligible == () and _found(report) == [], report
    again = UpstreamWatcher(open_upstream, SINKS).inspect(cf)
    assert f"public.{a.table.upper()}" in again.new_tables and again.ineligible == (), again
    assert TableName("public", f"{a.table}_old") in _published(conn, cf)  # still carried, under its new name
