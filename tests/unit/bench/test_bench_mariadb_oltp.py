"""The MariaDB bench's (o): its count of single-row transactions is its own (``--o-txns``), by default ``--rows``
up to 100,000, so that a default run (1,000,000 rows for (a) and (b)) does not spend ~20 minutes writing (o)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bench.mariadb_run import MariaDBRunner

pytestmark = pytest.mark.unit


def _runner(rows: int, o_txns: int | None) -> MariaDBRunner:
    env: Any = SimpleNamespace(up=object(), mariadb=object())
    return MariaDBRunner(env, ["blackhole"], ["o"], rows, 60.0, print, o_txns=o_txns)


@pytest.mark.parametrize("rows, o_txns, expected", [(1_000_000, None, 100_000), (2000, None, 2000),
                                                     (1_000_000, 5000, 5000), (100, 300_000, 300_000)])
def test_o_writes_its_own_count_of_transactions(rows: int, o_txns: int | None, expected: int) -> None:
    assert _runner(rows, o_txns).o_txns == expected
