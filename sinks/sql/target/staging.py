"""The tables of ``[consistency] mode = "snapshot"`` in an SQL target (docs/consistency.md): the staged transactions of
every span, and the barriers applied from them.

Both are Tidewater's own tables (:class:`sinks.sql.target.own_table.OwnTable`: schema ``tidewater`` on PostgreSQL, the
sink URI's database elsewhere). Readers of the target never read them.

``tidewater_stage``: one row per piece of a staged upstream transaction (a piece holds up to :data:`PIECE_CHANGES`
changes, so neither side ever holds a huge transaction in memory)

=============  ==================================================================================================
changefeed     changefeed id
commit_ts      the upstream transaction's commit Ts (primary key: changefeed, commit_ts, span, seq)
span           the span that staged it (one upstream transaction may touch tables of several spans)
seq            the piece's number in its (span, transaction), from 0
commit_time    the transaction's upstream commit time (seconds since the epoch)
payload        the piece's changes (:mod:`sinks.sql.target.stage_codec`)
=============  ==================================================================================================

``tidewater_syncpoint``: one row per applied barrier (``syncpoint = true``), or only the latest per changefeed

=============  ==================================================================================================
changefeed     changefeed id (primary key, with ``barrier_ts``)
barrier_ts     the barrier: every upstream transaction of the changefeed with a commit Ts at or below it is visible
               in the target, and none above it
upstream_time  the upstream commit time of the barrier (the changefeed checkpoint's time)
downstream_time the target's clock when the barrier's transaction ran (UTC)
=============  ==================================================================================================

Guarantees:
- :meth:`StageSQL.create` creates what is missing (``CREATE .. IF NOT EXISTS``, autocommit on MySQL/PostgreSQL; on
  SQLite ``create_tables`` runs inside the caller's transaction).
- :meth:`StageSQL.stage_changes` runs inside the caller's open transaction (the span's, which also moves its position,
  or a staging worker's, which records its transactions in the applied table): its pieces commit with the position
  (or the applied rows) or not at all. A piece whose key is there already (another writer staged that transaction)
  raises ``SinkUnavailable``: the caller's transaction is rolled back and the span restarts.
- :meth:`StageSQL.read` pages through the staged pieces at or below a barrier in commit order (then span, then piece)
  by key, one page of :data:`PAGE_PIECES` at a time, calling ``before_read`` before each page (the writer's pipeline
  must be idle before the connection reads).
- :meth:`StageSQL.finish` records the barrier and deletes the staged pieces at or below it, in the caller's open
  transaction (the coordinator's, whose rows it closes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.errors import SinkUnavailable
from cdc.events import RowChange
from sinks.sql.target import stage_codec
from sinks.sql.target.connection import Target
from sinks.sql.target.own_table import OwnTable

STAGE_TABLE = "tidewater_stage"
SYNCPOINT_TABLE = "tidewater_syncpoint"
PIECE_CHANGES = 1000
"""Changes per staged piece."""
PAGE_PIECES = 64
"""Pieces per page read by the coordinator."""
_INSERT_ROWS = 50  # pieces per multi-row INSERT of the staging write

_CLOCK = {"postgresql": "clock_timestamp()", "mysql": "UTC_TIMESTAMP(6)",
          "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')"}


class StageSQL:
    """The two tables on one dialect and their statements (module docstring)."""

    def __init__(self, dialect: str, preparer: sa.sql.compiler.IdentifierPreparer) -> None:
        q = preparer.quote
        self.dialect = dialect
        if dialect == "postgresql":
            t = {"id": "varchar(255)", "int": "integer", "ts": "bigint", "f": "double precision", "blob": "bytea",
                 "time": "timestamptz"}
        elif dialect == "mysql":
            t = {"id": "varchar(255)", "int": "int", "ts": "bigint", "f": "double", "blob": "longblob",
                 "time": "datetime(6)"}
        else:
            t = {"id": "TEXT", "int": "INTEGER", "ts": "INTEGER", "f": "REAL", "blob": "BLOB", "time": "TEXT"}
        cf, ts, sp, seq, ct, pl = (q(c) for c in ("changefeed", "commit_ts", "span", "seq", "commit_time", "payload"))
        self.stage = OwnTable(dialect, preparer, STAGE_TABLE,
                              f"{cf} {t['id']} NOT NULL, {ts} {t['ts']} NOT NULL, {sp} {t['int']} NOT NULL, "
                              f"{seq} {t['int']} NOT NULL, {ct} {t['f']} NOT NULL, {pl} {t['blob']} NOT NULL, "
                              f"PRIMARY KEY ({cf}, {ts}, {sp}, {seq})")
        bts, up, down = (q(c) for c in ("barrier_ts", "upstream_time", "downstream_time"))
        self.syncpoint = OwnTable(dialect, preparer, SYNCPOINT_TABLE,
                                  f"{cf} {t['id']} NOT NULL, {bts} {t['ts']} NOT NULL, {up} {t['time']} NULL, "
                                  f"{down} {t['time']} NOT NULL, PRIMARY KEY ({cf}, {bts})")
        p, stage, sync = self.stage.p, self.stage.name, self.syncpoint.name
        self.label = self.stage.label
        self.insert_head = f"INSERT INTO {stage} ({cf}, {ts}, {sp}, {seq}, {ct}, {pl}) VALUES "
        self.insert_row = f"({p}, {p}, {p}, {p}, {p}, {p})"
        self.page_first = (f"SELECT {ts}, {sp}, {seq}, {pl} FROM {stage} WHERE {cf} = {p} AND {ts} <= {p} "
                           f"ORDER BY {ts}, {sp}, {seq} LIMIT {PAGE_PIECES}")
        self.page_next = (f"SELECT {ts}, {sp}, {seq}, {pl} FROM {stage} WHERE {cf} = {p} AND {ts} <= {p} "
                          f"AND ({ts}, {sp}, {seq}) > ({p}, {p}, {p}) ORDER BY {ts}, {sp}, {seq} LIMIT {PAGE_PIECES}")
        self.drop_staged = f"DELETE FROM {stage} WHERE {cf} = {p} AND {ts} <= {p}"
        self.count_staged = f"SELECT count(*), min({ts}), max({ts}) FROM {stage} WHERE {cf} = {p}"
        self.span_pieces = (f"SELECT {pl} FROM {stage} WHERE {cf} = {p} AND {sp} = {p} AND {ts} = {p} "
                            f"ORDER BY {seq}")
        self.max_seq = f"SELECT max({seq}) FROM {stage} WHERE {cf} = {p} AND {sp} = {p} AND {ts} = {p}"
        self.clear_span = f"DELETE FROM {stage} WHERE {cf} = {p} AND {sp} = {p} AND {ts} > {p}"
        self._cols = (cf, sp, ts)
        self.forget_stage = f"DELETE FROM {stage} WHERE {cf} = {p}"
        at = {"postgresql": f"to_timestamp({p})", "mysql": f"FROM_UNIXTIME({p})",
              "sqlite": f"strftime('%Y-%m-%d %H:%M:%f', {p}, 'unixepoch')"}[dialect]
        self.record = (f"INSERT INTO {sync} ({cf}, {bts}, {up}, {down}) "
                       f"VALUES ({p}, {p}, {at}, {_CLOCK[dialect]})")
        self.prune = f"DELETE FROM {sync} WHERE {cf} = {p} AND {bts} < {p}"
        self.latest = f"SELECT max({bts}) FROM {sync} WHERE {cf} = {p}"
        self.forget_sync = f"DELETE FROM {sync} WHERE {cf} = {p}"

    def create(self, target: Target) -> None:
        """Create both tables if missing (module docstring)."""
        self.stage.create(target)
        self.syncpoint.create(target)

    @property
    def create_tables(self) -> tuple[str, str]:
        """Both ``CREATE TABLE IF NOT EXISTS`` statements (SQLite: run inside the caller's transaction)."""
        return self.stage.create_table, self.syncpoint.create_table

    # ---- the span's side ------------------------------------------------------------------------------------
    def stage_changes(self, conn: Connection, changefeed: str, span: int, changes: Iterable[RowChange], *,
                      resume: tuple[int, int] = (0, 0)) -> int:
        """Stage ``changes`` (ordered by commit Ts) in ``conn``'s open transaction; returns how many. ``resume``:
        (commit Ts, first piece number) of a transaction whose first part is staged already (split at a DDL)."""
        count = 0
        rows: list[Any] = []
        pending = 0
        piece: list[RowChange] = []
        ts, seq, when = 0, 0, 0.0
        for ch in changes:
            if ch.commit_ts != ts or len(piece) >= PIECE_CHANGES:
                if piece:
                    rows.extend((changefeed, ts, span, seq, when, stage_codec.encode(piece)))
                    pending += 1
                    count += len(piece)
                    if pending >= _INSERT_ROWS:
                        self._insert(conn, rows, pending)
                        rows, pending = [], 0
                if ch.commit_ts == ts:
                    seq += 1
                else:
                    seq = resume[1] if ch.commit_ts == resume[0] else 0
                ts, when, piece = ch.commit_ts, ch.commit_time, []
            piece.append(ch)
        if piece:
            rows.extend((changefeed, ts, span, seq, when, stage_codec.encode(piece)))
            pending += 1
            count += len(piece)
        if pending:
            self._insert(conn, rows, pending)
        return count

    def _insert(self, conn: Connection, params: list[Any], pieces: int) -> None:
        try:
            conn.exec_driver_sql(self.insert_head + ", ".join([self.insert_row] * pieces), tuple(params))
        except sa.exc.IntegrityError as exc:
            # a piece's key (changefeed, commit Ts, span, seq) is there: another writer of the span (a fenced-off
            # zombie, or its successor) staged that transaction; retryable: the span restarts and skips it
            raise SinkUnavailable(f"changefeed={params[0]} span={params[2]}: a transaction of commits "
                                  f"{params[1]}..{params[-5]} is staged in {self.label} already (another writer "
                                  "staged it); rolled back, the span restarts and skips what is there") from exc

    def next_piece(self, conn: Connection, changefeed: str, span: int, commit_ts: int) -> int:
        """The number of the next piece of the span's transaction ``commit_ts`` (0: none staged)."""
        row = conn.exec_driver_sql(self.max_seq, (changefeed, span, commit_ts)).first()
        return int(row[0]) + 1 if row is not None and row[0] is not None else 0

    def staged_at(self, conn: Connection, changefeed: str, span: int, commit_ts: int) -> Iterator[RowChange]:
        """The changes the span staged under ``commit_ts``, in order (decoded one piece at a time)."""
        for row in conn.exec_driver_sql(self.span_pieces, (changefeed, span, commit_ts)).fetchall():
            yield from stage_codec.decode(bytes(row[0]))

    def clear_above(self, conn: Connection, changefeed: str, span: int, ts: int, *, keep: str | None = None) -> int:
        """Delete the span's staged pieces above ``ts``, but those of the transactions listed in table ``keep`` (a
        quoted name with columns changefeed, span, commit_ts: the applied table of several staging workers, whose
        transactions are staged whole above the position); returns how many went."""
        if keep is None:
            return int(conn.exec_driver_sql(self.clear_span, (changefeed, span, ts)).rowcount)
        cf, sp, cts = self._cols
        stage = self.stage.name
        statement = (f"{self.clear_span} AND NOT EXISTS (SELECT 1 FROM {keep} a WHERE a.{cf} = {stage}.{cf} "
                     f"AND a.{sp} = {stage}.{sp} AND a.{cts} = {stage}.{cts})")
        return int(conn.exec_driver_sql(statement, (changefeed, span, ts)).rowcount)

    # ---- the coordinator's side ----------------------------------------------------------------------------
    def read(self, conn: Connection, changefeed: str, barrier: int, before_read: Callable[[], None]
             ) -> Iterator[RowChange]:
        """The staged changes at or below ``barrier``, in commit order (module docstring)."""
        last: tuple[int, int, int] | None = None
        while True:
            before_read()
            if last is None:
                page = conn.exec_driver_sql(self.page_first, (changefeed, barrier)).fetchall()
            else:
                page = conn.exec_driver_sql(self.page_next, (changefeed, barrier, *last)).fetchall()
            for row in page:
                yield from stage_codec.decode(bytes(row[3]))
            if len(page) < PAGE_PIECES:
                return
            last = (int(page[-1][0]), int(page[-1][1]), int(page[-1][2]))

    def finish(self, conn: Connection, changefeed: str, barrier: int, upstream_time: float, *,
               history: bool) -> int:
        """Record ``barrier`` and drop the pieces it applied (in ``conn``'s open transaction); the syncpoint rows of
        earlier barriers go unless ``history``. Returns the staged pieces dropped."""
        conn.exec_driver_sql(self.record, (changefeed, barrier, upstream_time or None))
        if not history:
            conn.exec_driver_sql(self.prune, (changefeed, barrier))
        return int(conn.exec_driver_sql(self.drop_staged, (changefeed, barrier)).rowcount)

    def latest_barrier(self, conn: Connection, changefeed: str) -> int:
        """The latest barrier recorded for ``changefeed`` (0: none)."""
        row = conn.exec_driver_sql(self.latest, (changefeed,)).first()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def forget(self, conn: Connection, changefeed: str) -> None:
        """Delete everything of ``changefeed`` (``remove``); the tables stay."""
        if self.stage.exists(conn):
            conn.exec_driver_sql(self.forget_stage, (changefeed,))
        if self.syncpoint.exists(conn):
            conn.exec_driver_sql(self.forget_sync, (changefeed,))
