"""The native references' waits poll their servers over one connection each (bench.consumers.NativeSubscription,
bench.mariadb_refs.NativeReplica), against real servers: a new connection per poll is a new PostgreSQL backend (or
MariaDB connection thread) per poll, whose start-up CPU the bench counted as the reference's own server CPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.consumers import NativeSubscription
from bench.mariadb_refs import NativeReplica, binlog_end
from playground.servers import MariaDBServer, PostgresServer

pytestmark = pytest.mark.integration


def _count_connections(server: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the real connections made through ``server.connect`` (which ``execute`` uses too)."""
    made = [0]
    real = server.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(server, "connect", connect)
    return made


def test_a_native_subscriptions_polls_go_over_one_connection_per_server(
        pg_server: PostgresServer, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = NativeSubscription(pg_server, pg_database, pg_server, pg_database, "bench_no_such_sub", "bench_no_pub")
    made = _count_connections(pg_server, monkeypatch)
    with sub.polling():
        for _ in range(5):  # what one round of measure_native's wait asks
            assert sub.applied_lsn() == 0 and sub.confirmed_lsn() == 0
            assert sub.worker_pids() == [] and sub.walsender_pids() == []
    assert made[0] == 2  # the subscriber's and the upstream's (here the same server), not one per query
    sub.applied_lsn()  # outside polling(): a connection of its own, as before
    assert made[0] == 3


@pytest.fixture
def stopped_replica(mariadb_server: MariaDBServer) -> Iterator[NativeReplica]:
    """``mariadb_server`` as a stopped replica of itself at its binlog end (never started); reset afterwards."""
    replica = NativeReplica(mariadb_server, mariadb_server)
    replica.point_at(binlog_end(mariadb_server))
    try:
        yield replica
    finally:
        mariadb_server.execute("RESET SLAVE ALL")


def test_a_native_replicas_wait_polls_over_one_connection(stopped_replica: NativeReplica,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    beyond = stopped_replica.applied() + 1  # never reached: the replica is stopped
    made = _count_connections(stopped_replica.replica, monkeypatch)
    with pytest.raises(TimeoutError):
        stopped_replica.wait(beyond, timeout=0.2, poll=0.01)  # at least two polls (the timeout's message asks again)
    assert made[0] == 1
