"""The capture's side of the initial copy: ``changefeed create`` fails up front when the copy could not run (a
master URL Spark would refuse, a standalone master that does not answer)."""

from __future__ import annotations

import socket

import pytest

from capture.snapshot_launcher import check_copy_possible
from cdc.errors import InvalidArgument, InvalidConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local[4,2]", "yarn", "k8s://https://h:6443"])
def test_master_urls_spark_takes_pass_the_syntax_check(master: str) -> None:
    check_copy_possible(master)  # (Java 17 and pyspark are installed by the bootstrap)


@pytest.mark.parametrize("master", ["", "local[0]", "local[x]", "spark:/h:7077", "http://h:8080", "local[*] "])
def test_a_master_url_spark_would_refuse_is_named(master: str) -> None:
    with pytest.raises(InvalidConfig, match="is not a Spark master URL"):
        check_copy_possible(master)


def test_a_standalone_master_that_does_not_answer_fails_create() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(InvalidArgument, match=f"127.0.0.1:{port} .* does not answer"):
        check_copy_possible(f"spark://127.0.0.1:{port}")
