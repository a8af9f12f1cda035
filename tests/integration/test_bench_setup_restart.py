"""An untimed setup leaves every bench consumer's slot restarting decoding past the setup (``bench.consumers.
catch_up_untimed``), against real servers: a slot paused as soon as its consumer had read the setup kept the restart
point it had before it, and its walsender decoded the whole setup again (spilling its large transactions) at the start
of the next timed catch-up; the bench charged that to Tidewater and native but never to pg_recvlogical, whose slot is
created for each timed phase (issue 22: 2-3x the walsender CPU on pgbench's small transactions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.consumers import NativeSubscription, catch_up_untimed, slots_restarting_before
from playground.cluster import current_lsn
from playground.servers import PostgresServer

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE setup_rows (id bigint PRIMARY KEY, v text NOT NULL)"


@pytest.fixture
def subscriber(tmp_path: Path) -> Iterator[PostgresServer]:
    """A second server: a subscription to its own cluster cannot create its slot in the same command."""
    server = PostgresServer(tmp_path / "subscriber").start()
    try:
        yield server
    finally:
        server.stop()


def _lsn(server: PostgresServer, db: str) -> int:
    conn = server.connect(db)
    try:
        return current_lsn(conn)
    finally:
        conn.close()


def test_after_a_setup_the_native_slot_restarts_decoding_past_it(
        pg_server: PostgresServer, pg_database: str, subscriber: PostgresServer) -> None:
    pg_server.execute(TABLE, db=pg_database)
    pg_server.execute("CREATE PUBLICATION bench_setup_pub FOR TABLE setup_rows", db=pg_database)
    subscriber.execute(TABLE, db="postgres")
    sub = NativeSubscription(pg_server, pg_database, subscriber, "postgres", "bench_setup_sub", "bench_setup_pub")
    sub.create()
    try:
        sub.enable()  # the consumer is up and has confirmed everything before the setup, as the bench's are
        sub.wait(_lsn(pg_server, pg_database), 60)
        sub.disable()
        pg_server.execute("INSERT INTO setup_rows SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g",
                          db=pg_database)
        setup_end = _lsn(pg_server, pg_database)
        assert slots_restarting_before(pg_server, pg_database, [sub.name], setup_end) == [sub.name]

        behind = catch_up_untimed(pg_server, pg_database, [], sub, setup_end, timeout=60)

        assert behind == []
        assert slots_restarting_before(pg_server, pg_database, [sub.name], setup_end) == []
        assert sub.walsender_pids() == []  # paused again
        assert subscriber.execute("SELECT count(*) FROM setup_rows", db="postgres") == [(20000,)]
    finally:
        sub.drop()
