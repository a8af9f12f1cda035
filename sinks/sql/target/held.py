"""An apply worker's own connection to the target, kept from one write to the next for the sink's life.

With ``[sink] worker-count`` > 1 (``sinks.sql.ops.parallel``) every worker used to check a connection out of the
engine's pool for each write: a pre-ping (``SELECT 1``) per checkout, session resets, one more round trip each time
on a serial chain that the target server shares its cores with. :class:`HeldConnection` checks one out once and keeps
it; only a connection that failed goes back, and the next transaction checks out a new one (pinged then if it sat
idle in the pool: ``sinks.sql.target.connection.ping_when_idle``).

Guarantees:

- :meth:`HeldConnection.transaction` is :meth:`Target.transaction` (begin, fence, commit; abandon and classified
  errors on failure) on the held connection: the same outcome for the same statements.
- A transaction that fails for any reason drops the connection (returned to the pool, or discarded when the error
  said it is broken): the next transaction never runs on a connection whose state a failure left unknown.
- A connection broken while held idle (the server restarted, an administrator or an idle timeout ended the session)
  is no longer noticed by a pre-ping: its next transaction fails on its first statement with a connection-lost error
  (:func:`sinks.sql.dialect.errors.is_connection_lost`), and :attr:`HeldConnection.reused` tells the caller it was a
  held one, so that it may run the transaction again once on a new connection (the server rolled the broken
  session's transaction back; parallel apply's applied rows refuse a transaction committed twice anyway).

Threading: one thread at a time (a worker's); ``close`` once that thread is done.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy.engine import Connection

from sinks.sql.dialect.errors import is_connection_lost
from sinks.sql.target.connection import Target

log = logging.getLogger(__name__)
T = TypeVar("T")


class HeldConnection:
    """One worker's connection to ``target`` (module docstring). ``connects`` counts checkouts (for tests and
    stats); ``reused`` says whether the last :meth:`transaction` ran on a connection held from an earlier one."""

    def __init__(self, target: Target, name: str) -> None:
        self._target = target
        self.name = name  # for logs: the worker's name
        self._conn: Connection | None = None
        self.connects = 0
        self.reused = False

    @contextlib.contextmanager
    def transaction(self, label: str | Callable[[], str | None] | None = None, *,
                    fence: Callable[[], None] | None = None) -> Iterator[Connection]:
        """One transaction on the held connection (checked out first if none is held): yields it with the
        transaction begun; commits after ``fence()`` when the body returns; on any failure the connection is dropped
        and the error raised as :meth:`Target.transaction` raises it."""
        target = self._target
        target.check_open()
        conn = self._conn
        self.reused = conn is not None
        if conn is None:
            conn = target.guarded(target.engine.connect, None)
            self._conn = conn
            self.connects += 1
        ok = False
        try:
            with target.frame(conn, label, fence=fence):
                yield conn
            ok = True
        finally:
            if not ok:
                self.drop()

    def run(self, body: Callable[[Connection], T], label: str | Callable[[], str | None] | None = None, *,
            fence: Callable[[], None] | None = None) -> T:
        """``body(conn)`` in one :meth:`transaction`, whose result it returns; run once more, on a new connection,
        when it failed because the connection held from an earlier transaction was broken (module docstring). Any
        other failure, or a second one, is raised as it is."""
        while True:
            try:
                with self.transaction(label, fence=fence) as conn:
                    return body(conn)
            except Exception as exc:
                if not self.reused or not is_connection_lost(self._target.dialect, exc):
                    raise
                log.info("%s: %s: the connection held since an earlier transaction was broken (%s); running the "
                         "transaction again on a new connection", self._target.where, self.name,
                         " ".join(str(exc).split())[:300])

    def drop(self) -> None:
        """Give the connection back (the pool discards it if it was invalidated); the next transaction checks out
        another."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # noqa: BLE001 - a broken connection: its server rolls back
                log.info("%s: %s: closing a failed connection: %s", self._target.where, self.name, exc)
                with contextlib.suppress(Exception):
                    conn.invalidate()

    def close(self) -> None:
        self.drop()
