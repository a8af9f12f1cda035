"""ReplicationStream against a real PostgreSQL 18: the slot held by a stale walsender (a frozen capture's)
is taken over by the new holder, the refusal without takeover names the capture holding it, and the
dependency probe reports the upstream's reachability."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from cdc.errors import UpstreamUnavailable
from playground.servers import PostgresServer
from upstream.postgres import admin
from upstream.postgres.stream import Keepalive, ReplicationStream

pytestmark = pytest.mark.integration


@pytest.fixture
def slot(pg_server: PostgresServer, pg_database: str) -> Iterator[tuple[str, str]]:
    name = f"tw_take_{uuid.uuid4().hex[:8]}"
    pg_server.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub_t FOR TABLE t",
                      db=pg_database)
    conn = pg_server.connect(pg_database)
    admin.create_slot(conn, name)
    yield name, "pub_t"
    admin.drop_slot(conn, name)
    conn.close()


def read_until_keepalive(stream: ReplicationStream, timeout: float = 15.0) -> Keepalive:
    stop = threading.Event()
    deadline = time.monotonic() + timeout
    for m in stream.messages(stop):
        if isinstance(m, Keepalive) and m.ts:
            return m
        assert time.monotonic() < deadline, "no keepalive"
    raise AssertionError("stream ended")


def holder_app(pg_server: PostgresServer, db: str, slot: str) -> tuple[int | None, str | None]:
    rows = pg_server.execute(
        "SELECT s.active_pid, a.application_name FROM pg_replication_slots s "
        "LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE slot_name = %s", db=db, params=(slot,))
    return rows[0][0], rows[0][1]


def test_new_holder_terminates_the_stale_walsender_and_takes_the_slot(
        pg_server: PostgresServer, pg_database: str, slot: tuple[str, str]) -> None:
    name, pub = slot
    uri = pg_server.uri(pg_database)
    frozen = ReplicationStream(uri, name, pub, 0, holder="capture-frozen", label="cf/0")
    frozen.open()  # then never read again: like a capture stopped with SIGSTOP
    try:
        pid, app = holder_app(pg_server, pg_database, name)
        assert pid is not None and app == "tidewater:capture-frozen"

        polite = ReplicationStream(uri, name, pub, 0, holder="capture-new", label="cf/0")
        with pytest.raises(UpstreamUnavailable, match="in use by capture capture-frozen"):
            polite.open()
        polite.close()

        started = time.monotonic()
        taker = ReplicationStream(uri, name, pub, 0, holder="capture-new", label="cf/0", takeover=True)
        taker.open()
        try:
            took = time.monotonic() - started
            new_pid, new_app = holder_app(pg_server, pg_database, name)
            assert new_pid is not None and new_pid != pid and new_app == "tidewater:capture-new"
            assert not pg_server.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", db=pg_database,
                                         params=(pid,)), "the stale walsender is still there"
            pg_server.execute("INSERT INTO t VALUES (1, 'x')", db=pg_database)
            assert read_until_keepalive(taker).ts > 0
            print(f"\nslot taken over in {took:.2f}s")
            assert took < 5.0
        finally:
            taker.close()
        # the old holder's connection is dead: reading fails, nothing more reaches it. Keepalives the
        # walsender sent before it was terminated may still sit in the socket's buffer: they are read
        # first, but no change of the INSERT made after the takeover can arrive before the error.
        got: list[object] = []
        with pytest.raises(UpstreamUnavailable):
            deadline = time.monotonic() + 5
            for m in frozen.messages(threading.Event()):
                got.append(m)
                assert m is None or isinstance(m, Keepalive), f"the stale holder received a change: {m!r}"
                assert time.monotonic() < deadline, f"no error after {len(got)} buffered keepalives"
    finally:
        frozen.close()


def test_takeover_works_for_an_unprivileged_replication_role(
        pg_server: PostgresServer, pg_database: str, slot: tuple[str, str]) -> None:
    """Our walsenders run as the changefeed's own role, which may always terminate its own backends:
    no superuser or pg_signal_backend membership is needed."""
    name, pub = slot
    role = f"tw_repl_{uuid.uuid4().hex[:6]}"
    pg_server.execute(f"CREATE ROLE {role} LOGIN REPLICATION", db=pg_database)
    try:
        uri = pg_server.uri(pg_database, user=role)
        frozen = ReplicationStream(uri, name, pub, 0, holder="a")
        frozen.open()
        taker = ReplicationStream(uri, name, pub, 0, holder="b", takeover=True)
        try:
            taker.open()
            assert holder_app(pg_server, pg_database, name)[1] == "tidewater:b"
        finally:
            taker.close()
            frozen.close()
    finally:
        pg_server.execute(f"DROP ROLE {role}", db=pg_database)


def test_probe(pg_server: PostgresServer, pg_database: str) -> None:
    ReplicationStream(pg_server.uri(pg_database), "s", "p", 0).probe()
    with pytest.raises(UpstreamUnavailable):
        ReplicationStream("postgresql://postgres@127.0.0.1:1/x", "s", "p", 0).probe(timeout=1)




def test_a_slot_taken_between_the_look_and_the_start_names_its_holder(
        pg_server: PostgresServer, pg_database: str, slot: tuple[str, str]) -> None:
    name, pub = slot
    uri = pg_server.uri(pg_database)

    class Racing(ReplicationStream):
        def _take_slot(self) -> None:  # the look found the slot free; another holder then got it
            pass

    holder = ReplicationStream(uri, name, pub, 0, holder="capture-racer")
    holder.open()
    late = Racing(uri, name, pub, 0, holder="capture-late")
    try:
        with pytest.raises(UpstreamUnavailable, match="held by capture capture-racer"):
            late.open()
    finally:
        late.close()
        holder.close()
