"""The SQL sink's statement output: sends groups of rows of one table as statements on one connection
(multi-row statements, COPY on PostgreSQL, literal rows on MySQL, ``executemany`` on SQLite), through the
target's statement pipeline. :class:`sinks.sql.ops.writer.Writer` decides *what* to send; this decides *how*."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy.engine import Connection

from cdc.errors import SinkError
from cdc.events import parsed_rows
from sinks.sql.dialect import rowtext
from sinks.sql.dialect.statements import Statements
from sinks.sql.dialect.values import mysql_literal_function
from sinks.sql.ops.fresh_load import FreshLoads
from sinks.sql.target.binding import (
    K_DELETE,
    K_INSERT,
    K_UPSERT,
    Binding,
    Plan,
    convert_params,
    convert_rows,
)
from sinks.sql.target.pipeline import Pipeline

MYSQL_STATEMENT_BYTES = 1_000_000  # well below MariaDB's 16 MB max_allowed_packet (characters, not bytes)
# PostgreSQL: groups of at least this many rows that all came with their upstream text go through COPY
COPY_MIN_ROWS = 32
# PostgreSQL, fresh rows (upstream INSERTs) of a keyed table: direct COPYs (each under a savepoint) per downstream
# transaction at most (a released savepoint that wrote keeps a subtransaction id: PostgreSQL caches 64 per backend,
# past that every snapshot of the server looks subtransactions up in pg_subtrans), and how many of a table's direct
# COPYs may meet an existing key before that table always merges through its staging table
FRESH_COPIES_PER_TXN = 32
FRESH_CONFLICTS_TO_STOP = 3
SAVEPOINT = "tidewater_fresh"


class Output:
    """Statements of one ``write`` call on one connection, in order, through ``pipe``.

    Statements are submitted to the pipeline (they run in its worker while the caller builds the next one);
    :meth:`exists`, :meth:`count_existing`, :meth:`delete_key` and :meth:`update_key` read results, so they run
    in the caller's thread once the pipeline is idle (the caller syncs first: :meth:`sync`). ``current`` names the
    table being written, or whose statement failed, for error messages. :meth:`close` closes the cursor."""

    def __init__(self, conn: Connection, stmts: Statements, pipe: Pipeline, batch: int,
                 text: rowtext.RowText | None = None, loads: FreshLoads | None = None) -> None:
        self.conn = conn
        self.text = text or rowtext.best()  # renders COPY data and MySQL literal rows (C where it builds)
        self.dialect = stmts.dialect
        self.stmts = stmts
        self.batch = batch  # rows per statement
        dbapi: Any = conn.connection.dbapi_connection
        self.cur = dbapi.cursor()
        self._utf8 = getattr(dbapi, "encoding", None) == "UTF8"  # PostgreSQL: COPY data sent as the UTF-8 it is
        self.pipe = pipe  # statements run there, in order; reads and the caller's commit drain it first
        self.current: str | None = None  # table being written (or whose statement failed), for error messages
        self._delete_sql: dict[tuple[int, int], str] = {}
        self._staged: set[str] = set()  # staging tables made sure of in this write (PostgreSQL)
        self._fresh_left = FRESH_COPIES_PER_TXN  # direct COPYs under a savepoint left in this transaction
        self.loads = loads  # MySQL: fresh rows by LOAD DATA (sinks.sql.ops.fresh_load); None: statements only
        # made now, while the connection is idle (it reads the connection's status)
        self._literal: Callable[[Any], str] | None = (
            mysql_literal_function(self.cur.connection) if self.dialect == "mysql" else None)
        if self.dialect == "postgresql":
            import psycopg2.errors
            import psycopg2.extras

            self._execute_batch: Callable[..., Any] = psycopg2.extras.execute_batch
            self._unique_violation: type[Exception] = psycopg2.errors.UniqueViolation

    def sync(self) -> None:
        """Wait until every submitted statement ran; raise the first failure, naming its table."""
        error = self.pipe.quiesce()
        if error is not None:
            self.current = error[1]
            raise error[0]

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the connection after the statements before it (for table ``current``)."""
        if not self.pipe.submit(self.current, fn, *args):
            self.sync()

    def exists(self, b: Binding, key: Sequence[Any]) -> bool:
        self.cur.execute(self.stmts.exists_key(b.table), self.key_params(b, tuple(key)))
        return self.cur.fetchone() is not None

    # ---- output --------------------------------------------------------------------------------------
    def apply(self, b: Binding, kind: int, names: tuple[str, ...],
              extra: tuple[tuple[str, ...], tuple[str, ...]] | None,
              rows: list[tuple[Any, ...]], texts: list[Any] | None, *, fresh: bool = False) -> None:
        """Send ``rows`` as statements of at most ``batch_rows`` rows each. ``fresh`` (upserts): every row is an
        upstream INSERT, so the target most likely lacks its key; on PostgreSQL such rows with their upstream text
        go by COPY straight into the table (:meth:`_copy_fresh`) instead of through the staging merge."""
        if not rows:
            return
        batch = self.batch
        if len(rows) <= batch:
            self._apply_chunk(b, kind, names, extra, rows, texts, fresh)
            return
        for i in range(0, len(rows), batch):
            part = texts[i:i + batch] if texts is not None and len(texts) == len(rows) else None
            self._apply_chunk(b, kind, names, extra, rows[i:i + batch], part, fresh)

    def _apply_chunk(self, b: Binding, kind: int, names: tuple[str, ...],
                     extra: tuple[tuple[str, ...], tuple[str, ...]] | None,
                     rows: list[tuple[Any, ...]], texts: list[Any] | None, fresh: bool = False) -> None:
        self.current = b.label
        plan = b.plan(kind, names, extra)
        copy = plan.copy
        if copy is not None and texts is not None and len(texts) == len(rows) >= COPY_MIN_ROWS:
            if kind == K_UPSERT:
                if (fresh and plan.copy_direct is not None and self._fresh_left > 0
                        and b.copy_conflicts < FRESH_CONFLICTS_TO_STOP):
                    self._fresh_left -= 1
                    self.submit(self._copy_fresh, b, plan, self.text.copy_text(texts), rows, texts)
                    return
                texts = last_per_key_texts(rows, texts, plan.key_idx)  # ON CONFLICT touches a row once
            self._copy_rows(copy, texts)
            return
        if kind == K_UPSERT and (fresh and self.loads is not None and texts is not None and names == b.names
                                 and b.copy_conflicts < FRESH_CONFLICTS_TO_STOP
                                 and self.loads.apply(self, b, plan, rows, texts)):
            return
        rows = parsed_rows(rows)  # (the statements convert the typed values)
        if kind == K_UPSERT:
            if self.dialect == "sqlite":
                _check_keys_not_null(rows, plan.key_idx, b.label)
            if self.dialect == "postgresql" or len(names) < b.ncols:
                rows = _last_per_key(rows, plan.key_idx)  # ON CONFLICT cannot touch a row twice
            self._insert_rows(plan, convert_rows(plan, rows, texts))  # texts ignored if rows were dropped
        elif kind == K_INSERT:
            self._insert_rows(plan, convert_rows(plan, rows, texts))
        elif kind == K_DELETE:
            self._delete_keys(b, convert_params(distinct_keys(rows), plan.convert))
        else:
            params = convert_params(rows, plan.convert)
            if self.dialect == "postgresql":
                self.submit(self._execute_batch, self.cur, plan.sql, params, len(params))  # page_size
            else:
                self.submit(self.cur.executemany, plan.sql, params)

    def _copy_rows(self, copy: tuple[str, str | None, str | None], texts: list[Any]) -> None:
        """PostgreSQL: the rows' upstream texts through COPY, into the table (plain inserts) or into the
        session's staging table, merged into the table by one INSERT .. SELECT .. ON CONFLICT."""
        copy_sql, stage_sql, merge_sql = copy
        data = self.text.copy_text(texts)
        if stage_sql is not None and stage_sql not in self._staged:  # once per write: a rollback drops it
            self._staged.add(stage_sql)
            self.submit(self.cur.execute, stage_sql)
        self.submit(self.copy_in, copy_sql, data)
        if merge_sql is not None:
            self.submit(self.cur.execute, merge_sql)

    def _copy_fresh(self, b: Binding, plan: Plan, data: bytes, rows: list[tuple[Any, ...]], texts: list[Any]) -> None:
        """Pipeline side of a fresh group: ``COPY`` straight into the table under a savepoint -- a plain insert, about
        half the server's work of the staging merge (``COPY`` into the staging table, ``INSERT .. SELECT .. ON
        CONFLICT``, ``TRUNCATE``). The table's unique index on the key (``Binding`` requires one) makes a row
        whose key the target holds already (a table copied while it streamed, a resync, rows that were there
        before the changefeed) fail the COPY with a unique violation; then nothing of the COPY stays (rolled back
        to the savepoint) and the same rows go through the merge, as every upsert did before. Any other error is
        raised as the COPY's."""
        cur = self.cur
        assert plan.copy is not None and plan.copy_direct is not None
        try:
            # one round trip: the savepoint rides with the COPY (a name used again nests a new savepoint, the one a
            # rollback returns to; none is released: the transaction's end releases them all)
            self.copy_in(f"SAVEPOINT {SAVEPOINT}; {plan.copy_direct}", data)
        except self._unique_violation:
            cur.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
            b.copy_conflicts += 1
            copy_sql, stage_sql, merge_sql = plan.copy
            assert stage_sql is not None and merge_sql is not None
            cur.execute(stage_sql)  # (IF NOT EXISTS: this thread does not see the caller's ``_staged``)
            # ON CONFLICT touches a row once: each key's last row, as the merge path sends them
            self.copy_in(copy_sql, self.text.copy_text(last_per_key_texts(rows, texts, plan.key_idx)))
            cur.execute(merge_sql)

    def copy_in(self, sql: str, data: bytes) -> None:
        """``COPY .. FROM STDIN`` of ``data`` (COPY text, UTF-8: :attr:`rowtext.RowText.copy_text`): sent as it is on a
        UTF-8 connection, else decoded for psycopg2 to encode in the client encoding."""
        if self._utf8:
            self.cur.copy_expert(sql, io.BytesIO(data), max(1, len(data)))
        else:
            self.cur.copy_expert(sql, io.StringIO(data.decode("utf-8")), max(1, len(data)))

    def _insert_rows(self, plan: Plan, params: list[Any]) -> None:
        if self.dialect == "postgresql":  # one multi-row statement, formatted by psycopg2 in one call
            self.submit(self.cur.execute, plan.many(len(params)), [v for r in params for v in r])
        elif self.dialect == "mysql":
            self._mysql_insert(plan, params)
        else:  # sqlite3 loops in C
            self.submit(self.cur.executemany, plan.sql, params)

    def _mysql_insert(self, plan: Plan, params: list[Any]) -> None:
        """Multi-row INSERTs of literal rows, at most ``MYSQL_STATEMENT_BYTES`` each (like PyMySQL's
        executemany, with a faster literal renderer: :mod:`sinks.sql.dialect.rowtext`)."""
        for sql in self._mysql_statements(plan, params):
            self.submit(self.cur.execute, sql)

    def _mysql_statements(self, plan: Plan, params: list[Any]) -> list[str]:
        assert plan.parts is not None and self._literal is not None
        head, tail = plan.parts
        return self.text.mysql_statements(params, head, tail, MYSQL_STATEMENT_BYTES, self._literal)

    def literal_statements(self, plan: Plan, rows: list[tuple[Any, ...]], texts: list[Any] | None) -> list[str]:
        """MySQL: the statements ``plan`` sends for ``rows`` (converted here: a refused value raises), to run in the
        caller's thread (the pipeline's, for a load rolled back: ``sinks.sql.ops.fresh_load``)."""
        return self._mysql_statements(plan, convert_rows(plan, parsed_rows(rows), texts))

    def _delete_keys(self, b: Binding, keys: list[Any]) -> None:
        if self.dialect == "sqlite":
            self.submit(self.cur.executemany, self.stmts.delete_key(b.table), keys)
            return
        n = len(keys)
        sql = self._delete_sql.get((id(b), n))
        if sql is None:
            sql = self.stmts.delete_keys(b.table, n)
            self._delete_sql[(id(b), n)] = sql
        self.submit(self.cur.execute, sql, [v for k in keys for v in k])

    def count_existing(self, b: Binding, keys: list[Any]) -> int:
        self.sync()  # reads results: the statements before it first, then this one in this thread
        self.current = b.label
        if self.dialect == "sqlite":
            sql = self.stmts.exists_key(b.table)
            found = 0
            for k in keys:
                self.cur.execute(sql, k)
                found += self.cur.fetchone() is not None
            return found
        self.cur.execute(self.stmts.select_keys(b.table, len(keys)), [v for k in keys for v in k])
        return len(self.cur.fetchall())

    def key_params(self, b: Binding, key: tuple[Any, ...]) -> list[Any]:
        return list(b.key_convert(key) if b.key_convert else key)

    def delete_key(self, b: Binding, key: tuple[Any, ...]) -> None:
        """Delete the row of ``key`` now, in the caller's thread (after :meth:`sync`)."""
        self.cur.execute(self.stmts.delete_key(b.table), self.key_params(b, key))

    def update_key(self, b: Binding, sets: list[str], values: Sequence[Any], old: tuple[Any, ...]) -> int:
        """``UPDATE .. SET sets = values WHERE key = old`` now, in the caller's thread (after :meth:`sync`); returns
        the row count."""
        self.cur.execute(self.stmts.update_key(b.table, sets), list(values) + self.key_params(b, old))
        return int(self.cur.rowcount)

    def truncate(self, bs: list[Binding], cascade: bool) -> None:
        """Empty the tables of ``bs`` (parents first): one ``TRUNCATE`` on PostgreSQL, else ``DELETE FROM`` each,
        children first."""
        if self.dialect == "postgresql":
            self.current = bs[0].label
            self.submit(self.cur.execute, self.stmts.truncate_many([b.table for b in bs], cascade), ())
            return
        for b in reversed(bs):
            self.current = b.label
            self.submit(self.cur.execute, self.stmts.truncate(b.table), ())

    def close(self) -> None:
        """Close the cursor (a lost connection: ignored, the caller maps the original error)."""
        try:
            self.cur.close()
        except Exception:  # a lost connection: the caller maps the original error
            pass


def _check_keys_not_null(rows: list[tuple[Any, ...]], key_idx: tuple[int, ...], label: str) -> None:
    """SQLite turns a NULL INTEGER PRIMARY KEY into a new rowid instead of refusing it: refuse it here."""
    for i in key_idx:
        for r in rows:
            if r[i] is None:
                raise SinkError(f"table {label}: key column value is NULL")


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def _last_per_key(rows: list[tuple[Any, ...]], key_idx: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Keep the last row per key (upserts with the same columns: the last one wins anyway)."""
    if not key_idx:
        return rows
    try:
        if len(key_idx) == 1:
            i = key_idx[0]
            last = {r[i]: r for r in rows}
        else:  # (itemgetter of several indexes: the tuple, without a generator per row)
            last = dict(zip(map(itemgetter(*key_idx), rows), rows, strict=True))
    except TypeError:  # array keys
        last = {tuple(_hashable(r[j]) for j in key_idx): r for r in rows}
    return rows if len(last) == len(rows) else list(last.values())


def last_per_key_texts(rows: list[tuple[Any, ...]], texts: list[Any], key_idx: tuple[int, ...]) -> list[Any]:
    """``texts`` of the last row per key (as :func:`_last_per_key`, for texts parallel to ``rows``)."""
    if not key_idx:
        return texts
    try:
        if len(key_idx) == 1:
            i = key_idx[0]
            last = {r[i]: j for j, r in enumerate(rows)}
        else:
            last = dict(zip(map(itemgetter(*key_idx), rows), range(len(rows)), strict=True))
    except TypeError:  # array keys
        last = {tuple(_hashable(r[k]) for k in key_idx): j for j, r in enumerate(rows)}
    if len(last) == len(rows):
        return texts
    return [texts[j] for j in sorted(last.values())]


def distinct_keys(keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    try:
        return list(dict.fromkeys(keys))
    except TypeError:  # array keys
        return list({_hashable(list(k)): k for k in keys}.values())
