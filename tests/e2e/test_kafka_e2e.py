"""End to end: PostgreSQL -> `cdc server` -> Kafka (tansu) -> the consumer library -> SQLite, compared row by row.

- Each protocol (and canal-json with kafka-transactional) under concurrent writes and capture SIGKILLs, after an
  initial copy of the rows that existed at create: the etcd checkpoint lags by 2 s, so every kill replays messages
  the topic already holds; the consumer must apply each change once (a key-less table makes a duplicate or a loss
  visible as an extra or missing row).
- The broker frozen mid-run (SIGSTOP: tansu keeps its data only in memory, so a restart would lose the topic):
  the changefeed goes to `warning`, then recovers; nothing is lost (rebuilt by `cdc cli kafka-consumer`).
- Bad input: an unknown protocol, a bad dispatcher rule, a missing topic with auto-create off and an unreachable
  broker fail `changefeed create` with the reason; an oversized row fails the changefeed naming table and key.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import (
    FAST_LEASE,
    SCHEMA,
    TABLES,
    BackgroundWriter,
    kafka_consumer,
    mixed_workload,
    server_config,
    wait_for,
    wait_state,
)
from kafka_history import canal_changes, dump_topics, open_history, read_history, read_topic

from cli.kafka_consumer import upstream_lookups
from playground.chaos import wait_recovery
from playground.cluster import ApiError, CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, KafkaServer, PostgresServer
from sinks.kafka.applier import SinkApplier
from sinks.kafka.consumer import rebuild

pytestmark = pytest.mark.e2e

KEYLESS = "CREATE TABLE log (a int, b text, c int);\nALTER TABLE log REPLICA IDENTITY FULL;\n"
ALL_TABLES = [*TABLES, "public.log"]
KEYS = {"public.accounts": ("id",), "public.Ledger Entries": ("EntryId",), "public.events": ("id",), "public.log": ()}
# a slow etcd checkpoint: a killed capture always leaves messages in the topic that its successor sends again
FAST = (FAST_LEASE + "checkpoint-min-interval = 2.0\ncheckpoint-interval = 2.0\n")
DISPATCH = "[[sink.dispatchers]]\nmatcher = ['public.*']\npartition = 'index-value'\n"


@pytest.fixture
def source_schema() -> str:
    return SCHEMA + KEYLESS


def step(conn: Any, n: int) -> int:
    """One mixed transaction over the keyed tables and one on the key-less table (identical rows included)."""
    mixed_workload(conn, 1, seed=n, start=n)
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute("INSERT INTO log SELECT %s, 'r' || (g %% 3), 0 FROM generate_series(1, %s) g",
                    (n, 60 if n % 7 == 6 else 4))
        cur.execute("INSERT INTO log VALUES (%s, 'dup', 0), (%s, 'dup', 0)", (n, n))
        if n >= 3:
            cur.execute("UPDATE log SET c = c + 1 WHERE a = %s AND b = 'dup'", (n - 3,))
        if n >= 5:
            cur.execute("DELETE FROM log WHERE a = %s AND b = 'r1'", (n - 5,))
    conn.commit()
    conn.autocommit = True
    return 1


class Cluster:
    """A private etcd and capture (killing them touches no other test)."""

    def __init__(self, tmp_path: Path, extra: str = FAST) -> None:
        self.tmp_path = tmp_path
        self.cluster_id = f"kafka-{uuid.uuid4().hex[:8]}"
        self.etcd = EtcdServer(tmp_path, "etcd").start()
        self.args = server_config(tmp_path, extra)
        self.servers: list[CdcServer] = []
        self.cdc = self.new_capture()

    def new_capture(self) -> CdcServer:
        self.cdc = CdcServer(self.etcd.url, self.tmp_path / "cdc", cluster_id=self.cluster_id,
                             extra_args=self.args).start()
        self.servers.append(self.cdc)
        return self.cdc

    def kill_capture(self, cf: str) -> None:
        before = self.cdc.changefeed(cf)["checkpoint_ts"]
        self.cdc.kill()
        killed = time.monotonic()
        self.new_capture()
        wait_recovery([self.cdc], cf, before, killed, timeout=90)

    def close(self) -> None:
        for s in self.servers:
            s.kill()
        self.etcd.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def consume(server: KafkaServer, topic: str, protocol: str, target: str, upstream: str, until: int) -> Any:
    """The consumer library with the upstream's schemas (exact types), up to ``until``; returns its core."""
    closers, schemas, fetch = upstream_lookups(upstream)
    applier = SinkApplier(target, position=f"kafka:{topic}", schemas=schemas, fetch_row=fetch)
    try:
        return rebuild([server.bootstrap], [topic], protocol, applier, until=until, timeout=90, schemas=schemas)
    finally:
        applier.close()
        for c in closers:
            c.close()


def assert_same(source: Any, target: str, context: str = "") -> None:
    diffs = compare_tables(source, ALL_TABLES, target)
    bad = [d for d in diffs if not d.equal or d.surplus or d.losses]
    assert not bad, f"the rebuilt tables differ from the upstream: {bad}{context}"
    assert all(d.source_rows > 0 for d in diffs), diffs


@pytest.mark.parametrize("protocol,extra", [pytest.param("canal-json", "", marks=pytest.mark.slow),
                                            pytest.param("open-protocol", "", marks=pytest.mark.slow),
                                            ("debezium", "kafka-producer=confluent-kafka"),
                                            ("canal-json", "kafka-transactional=true")],
                         ids=["canal-json", "open-protocol", "debezium-confluent", "canal-json-transactional"])
def test_capture_kills_under_writes_then_the_consumer_rebuilds_the_tables(
        cluster: Cluster, kafka_server: KafkaServer, kafka_topic: str, pg_server: PostgresServer, pg_database: str,
        source: Any, tmp_path: Path, protocol: str, extra: str) -> None:
    params = {"protocol": protocol, "partition_num": "3", **dict(p.split("=") for p in extra.split("&") if p)}
    sink = kafka_server.uri(kafka_topic, **{k.replace("-", "_"): v for k, v in params.items()})
    for n in range(3):  # rows that exist at create: the initial copy writes them (Debezium: op "r")
        step(source, n)
    exact = "kafka-transactional" in extra
    if exact:  # the upstream's own record of every change from here on (PostgreSQL's test_decoding)
        open_history(source, "hist_" + kafka_topic[-8:])
    cluster.cdc.create_changefeed("kf", pg_server.uri(pg_database), sink, DISPATCH)
    with BackgroundWriter(pg_server.connect(pg_database), step, start=3, pause=0.02) as wl:
        # the first kill once the span streams (a kill during the copy replays nothing: a loaded host copies slowly)
        wait_for(cluster.cdc, "kf", lambda q: q["phase"] == "streaming", "the initial copy", timeout=120)
        time.sleep(1)
        cluster.kill_capture("kf")
        time.sleep(1.5)
        cluster.kill_capture("kf")
        time.sleep(1)
        wl.finish()
    assert wl.txns > 20, wl.txns
    checkpoint = cluster.cdc.wait_checkpoint("kf", current_lsn(source), timeout=120)["checkpoint_ts"]
    target = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    try:
        core = consume(kafka_server, kafka_topic, protocol, target, pg_server.uri(pg_database), checkpoint)
    except Exception:  # keep what the topics held for the post-mortem (tansu keeps nothing after the session)
        dump_topics(kafka_server.bootstrap, kafka_topic, tmp_path / "topics.txt")
        raise
    records, committed = read_topic(kafka_server.bootstrap, kafka_topic)
    duplicates: Counter[Any] = Counter()
    losses: Counter[Any] = Counter()
    counted = f"; consumer library: {core.stats}"
    if exact:
        # a plain read_committed consumer, blind to Tidewater's headers, against PostgreSQL's own record of the
        # changes after the copy: (commit Ts, table, op, key) counted on both sides. tansu lets aborted records
        # through (tests/integration/test_kafka_broker_isolation.py): the count that must be exact is the one
        # without the records the log's own transaction markers abort (what Kafka's read_committed returns); what
        # tansu shows on top is reported
        want = read_history(source, "hist_" + kafka_topic[-8:], KEYS)
        seen = canal_changes(committed, KEYS)
        copy_ts = min(ts for ts, *_ in seen)  # the copy's rows carry its snapshot's Ts; streamed ones come after
        want = Counter({c: n for c, n in want.items() if c[0] > copy_ts})
        assert want, "no upstream change after the copy"
        got = Counter(c for c in seen if c[0] > copy_ts)
        duplicates, losses = got - want, want - got
        shown = Counter(c for c in canal_changes(records, KEYS) if c[0] > copy_ts) - want
        counted = (f"; plain read_committed count: {sum(duplicates.values())} duplicate(s) {list(duplicates)[:5]}, "
                   f"{sum(losses.values())} loss(es) {list(losses)[:5]} among {sum(want.values())} changes "
                   f"(the raw read_committed surplus: {sum(shown.values())}, aborted records tansu shows included); "
                   f"consumer library: {core.stats}")
    assert_same(source, target, counted)
    assert core.stats.checkpoints > 0, f"no changefeed checkpoint reached the topic (owner publisher): {core.stats}"
    # every chunk of the initial copy was checked against its marker (a chunk short or missing stops the consumer)
    assert core.stats.chunks_verified > 0 and core.stats.copied_rows > 0, core.stats
    if protocol == "debezium":  # the initial copy's rows reach the topic as Debezium reads (op "r")
        reads = [v["payload"] for r in records if r.value and (v := json.loads(r.value)).get("payload")
                 and v["payload"].get("op") == "r"]
        assert reads and all(p["source"]["snapshot"] == "true" for p in reads), f"{len(reads)} op r records"
    if exact:
        # the sink itself skipped the replays (its position, read back from the metadata topic) ...
        skipped = sum(s.log_file.read_text(errors="replace").count("the replay skips it") for s in cluster.servers
                      if s.log_file.exists())
        assert skipped > 0, f"no kill replayed anything: {core.stats}"
        # ... and the plain consumer found every upstream change once
        assert not duplicates and not losses, counted
    else:
        assert core.stats.duplicates + core.stats.replayed > 0, f"no kill replayed anything: {core.stats}"


def test_broker_frozen_mid_run_warns_then_recovers_and_loses_nothing(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, tmp_path: Path) -> None:
    broker = KafkaServer(tmp_path / "broker").start()
    try:
        topic = "outage"
        sink = broker.uri(topic, protocol="open-protocol", partition_num="2", delivery_timeout="3s",
                          read_timeout="2s", write_timeout="2s", dial_timeout="2s")
        cdc_server.create_changefeed("ko", pg_server.uri(pg_database), sink, snapshot="none")
        for n in range(5):
            step(source, n)
        cdc_server.wait_checkpoint("ko", current_lsn(source), timeout=60)
        pid = broker.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            for n in range(5, 10):
                step(source, n)
            q = wait_state(cdc_server, "ko", "warning", timeout=60)
            assert q["error"]["code"] == "CDC:ErrSinkUnavailable", q["error"]
            assert f"127.0.0.1:{broker.port}" in q["error"]["message"], q["error"]
            frozen_at = q["checkpoint_ts"]
            time.sleep(2)
            assert cdc_server.changefeed("ko")["checkpoint_ts"] == frozen_at, "checkpoint moved while frozen"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_state(cdc_server, "ko", "normal", timeout=120)
        for n in range(10, 15):
            step(source, n)
        checkpoint = cdc_server.wait_checkpoint("ko", current_lsn(source), timeout=90)["checkpoint_ts"]
        target = f"sqlite:///{tmp_path / 'rebuilt.db'}"
        summary, _ = kafka_consumer(sink, target, pg_server.uri(pg_database), checkpoint)  # the changefeed's URI
        assert summary["checkpoints"] > 0, summary  # the owner published the changefeed checkpoint too
        assert_same(source, target)
    finally:
        broker.stop()


def test_bad_input_fails_create_or_the_changefeed_with_the_reason(
        cdc_server: CdcServer, kafka_server: KafkaServer, kafka_topic: str, pg_server: PostgresServer,
        pg_database: str, source: Any) -> None:
    up = pg_server.uri(pg_database)

    def refused(sink: str, config: str = "") -> str:
        with pytest.raises(ApiError) as err:
            cdc_server.create_changefeed("bad", up, sink, config)
        return json.dumps(err.value.body)

    assert "protocol 'avro' is not supported" in refused(kafka_server.uri(kafka_topic, protocol="avro"))
    assert "partition 'hash' is not a dispatcher" in refused(
        kafka_server.uri(kafka_topic, protocol="canal-json"),
        "[[sink.dispatchers]]\nmatcher = ['public.*']\npartition = 'hash'\n")
    assert f"topic '{kafka_topic}' does not exist" in refused(
        kafka_server.uri(kafka_topic, protocol="canal-json", auto_create_topic="false"))
    unreachable = refused(f"kafka://127.0.0.1:1/{kafka_topic}?protocol=canal-json&dial-timeout=2s")
    assert "CDC:ErrSinkUnavailable" in unreachable and "127.0.0.1:1" in unreachable, unreachable

    # an oversized row: the changefeed fails naming the table and the key; nothing of it is sent
    sink = kafka_server.uri(kafka_topic, protocol="canal-json", max_message_bytes="4096")
    cdc_server.create_changefeed("big", up, sink, snapshot="none")
    with source.cursor() as cur:
        cur.execute("INSERT INTO accounts (id, owner, note) VALUES (4242, %s, 'big')", ("x" * 10_000,))
    q = wait_for(cdc_server, "big", lambda q: q["state"] in ("failed", "warning") and q.get("error"),
                 "an error", timeout=60)
    message = q["error"]["message"]
    assert q["error"]["code"] == "CDC:ErrMessageTooLarge", q["error"]
    assert "public.accounts" in message and "id=4242" in message and "large-message-handle-option" in message
