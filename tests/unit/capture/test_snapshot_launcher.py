"""The capture's side of the initial copy: ``changefeed create`` fails up front when the copy could not run (a
master URL Spark would refuse, a standalone master that does not answer, an address where something else than a
Spark master answers, no Java)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from capture import snapshot_launcher
from capture.snapshot_launcher import check_copy_possible
from cdc.errors import InvalidConfig, SparkUnavailable

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local[4,2]", "yarn", "k8s://https://h:6443"])
def test_master_urls_spark_takes_pass_the_syntax_check(master: str) -> None:
    check_copy_possible(master)  # (Java 17 and pyspark are installed by the bootstrap)


@pytest.mark.parametrize("master", ["", "local[0]", "local[x]", "spark:/h:7077", "http://h:8080", "local[*] ",
                                    "mesos://h:5050"])  # (Spark 4 has no Mesos scheduler)
def test_a_master_url_spark_would_refuse_is_named(master: str) -> None:
    with pytest.raises(InvalidConfig, match="is not a Spark master URL"):
        check_copy_possible(master)


def test_a_standalone_master_that_does_not_answer_fails_create() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(SparkUnavailable, match=f"127.0.0.1:{port} .* does not answer.*start the master"):
        check_copy_possible(f"spark://127.0.0.1:{port}")


def _server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A one-connection-at-a-time TCP server on 127.0.0.1 that reads the probe and calls ``answer``."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    answer(conn)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        srv.close()
        t.join(5)


def _spark_rpc(conn: socket.socket) -> None:
    """What a Spark RPC server does with a request it cannot decode: an RpcFailure frame with the request's id."""
    head = conn.recv(21, socket.MSG_WAITALL)
    length, kind, rid, body = struct.unpack(">qbqi", head)
    assert kind == 3 and length == 21 + body
    conn.recv(body, socket.MSG_WAITALL)
    err = b"java.io.StreamCorruptedException: invalid stream header"
    conn.sendall(struct.pack(">qbqi", 8 + 1 + 8 + 4 + len(err), 5, rid, len(err)) + err)


@pytest.fixture
def spark_rpc_port() -> Iterator[int]:
    yield from _server(_spark_rpc)


def test_an_address_where_spark_rpc_answers_passes(spark_rpc_port: int) -> None:
    check_copy_possible(f"spark://127.0.0.1:{spark_rpc_port}")
    check_copy_possible(f"spark://127.0.0.1:{spark_rpc_port},localhost:{spark_rpc_port}")  # HA: every master


@pytest.mark.parametrize(("answer", "said"), [
    (lambda c: c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"), "48 54 54 50"),  # a web UI
    (lambda c: c.recv(100), "closed without a reply"),  # a server that hangs up
    (lambda c: (c.recv(100), c.sendall(b"N")), "answered: 4e"),  # PostgreSQL refusing an unknown startup packet
    (lambda c: c.sendall(struct.pack(">qbq", 17, 5, 42)), "00 00 00 00 00 00 00 11 05"),  # a reply to someone else
])
def test_a_tcp_port_that_is_not_a_spark_master_is_refused(answer: Callable[[socket.socket], None], said: str) -> None:
    for port in _server(answer):
        with pytest.raises(SparkUnavailable) as refused:
            check_copy_possible(f"spark://127.0.0.1:{port}")
        msg = refused.value.message
        assert f"127.0.0.1:{port} of snapshot.spark-master is not a Spark master" in msg, msg
        assert said in msg and "port is 7077 by default" in msg, msg


def test_a_port_that_accepts_and_stays_silent_is_refused_within_the_timeout() -> None:
    hold = threading.Event()
    for port in _server(lambda c: hold.wait(10)):
        with pytest.raises(SparkUnavailable, match="is not a Spark master: it did not answer Spark's RPC protocol"):
            check_copy_possible(f"spark://127.0.0.1:{port}")
        hold.set()


def test_one_master_of_several_that_is_not_there_is_named(spark_rpc_port: int) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()[1]
    s.close()
    with pytest.raises(SparkUnavailable, match=f"127.0.0.1:{dead} of snapshot.spark-master does not answer"):
        check_copy_possible(f"spark://127.0.0.1:{spark_rpc_port},127.0.0.1:{dead}")
    with pytest.raises(InvalidConfig, match="is not host:port"):
        check_copy_possible("spark://127.0.0.1")


@pytest.fixture
def no_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No java for the check: an empty PATH directory and nothing remembered from an earlier check."""
    monkeypatch.setattr(snapshot_launcher, "_checked", set())
    monkeypatch.setattr(snapshot_launcher, "_spark_found", [False])
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path


def test_java_home_pointing_nowhere_is_refused_with_the_fix(no_java: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(no_java / "jdk-gone"))
    with pytest.raises(SparkUnavailable) as refused:
        check_copy_possible("local[*]")
    msg = refused.value.message
    assert f"JAVA_HOME={no_java / 'jdk-gone'} has no bin/java" in msg and "Java 17" in msg, msg
    assert "openjdk-17-jre-headless" in msg and refused.value.code == "CDC:ErrSparkUnavailable"


def test_no_java_at_all_is_refused_with_the_fix(no_java: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(SparkUnavailable, match=r"no Java found for Spark .*install Java 17 .*or set JAVA_HOME"):
        check_copy_possible("local[*]")


def test_a_java_too_old_is_refused_with_the_fix(no_java: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = no_java / "jdk8"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text('#!/bin/sh\necho \'openjdk version "1.8.0_402"\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(home))
    with pytest.raises(SparkUnavailable, match="Spark needs Java 17 or newer, found Java 8"):
        check_copy_possible("local[*]")
