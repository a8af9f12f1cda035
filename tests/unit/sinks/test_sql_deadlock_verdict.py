"""sinks.sql.dialect.errors.is_deadlock: the server's deadlock verdict through every wrapper, nothing else."""

import pymysql
import pytest
import sqlalchemy as sa

from cdc.errors import SinkUnavailable
from sinks.sql.dialect.errors import is_deadlock

pytestmark = pytest.mark.unit


class PgError(Exception):
    def __init__(self, pgcode: str) -> None:
        super().__init__(pgcode)
        self.pgcode = pgcode


def _ours(orig: BaseException) -> SinkUnavailable:
    """As the SQL sink raises it: our error, caused by SQLAlchemy's wrapper of the driver's."""
    wrapped = sa.exc.OperationalError("INSERT ...", {}, orig)
    try:
        raise SinkUnavailable("target unavailable") from wrapped
    except SinkUnavailable as exc:
        return exc


def test_mysql_1213_and_postgresql_40p01_are_deadlocks_through_every_wrapper() -> None:
    dead = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")
    assert is_deadlock(dead)
    assert is_deadlock(sa.exc.OperationalError("x", {}, dead))
    assert is_deadlock(_ours(dead))
    assert is_deadlock(_ours(PgError("40P01")))


def test_other_retryable_errors_are_not() -> None:
    assert not is_deadlock(_ours(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded")))
    assert not is_deadlock(_ours(pymysql.err.OperationalError(2013, "Lost connection")))
    assert not is_deadlock(_ours(PgError("40001")))  # serialization failure
    assert not is_deadlock(SinkUnavailable("another writer advanced the span"))  # the applied table's duplicate
