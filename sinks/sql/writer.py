"""The SQL sink's writer: applies one ``write`` call's row changes on one connection (grouping rows into
multi-row statements, COPY on PostgreSQL, key moves)."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from cdc.errors import SinkError
from cdc.events import UNCHANGED, OpType, RowChange, TableSchema
from sinks.sql.binding import (
    K_DELETE,
    K_DELETE_ONE,
    K_INSERT,
    K_UPDATE_ONE,
    K_UPSERT,
    Binding,
    Plan,
    convert_params,
    convert_rows,
)
from sinks.sql.statements import Statements
from sinks.sql.values import mysql_literal_function

if TYPE_CHECKING:
    from sinks.sql.sink import SQLSink

log = logging.getLogger(__name__)

MYSQL_STATEMENT_BYTES = 1_000_000  # well below MariaDB's 16 MB max_allowed_packet (characters, not bytes)
# PostgreSQL: groups of at least this many rows that all came with their upstream text go through COPY
COPY_MIN_ROWS = 32


class Group:
    """The pending rows of one downstream table: what one statement will carry (same binding, kind, columns)."""

    __slots__ = ("b", "kind", "names", "extra", "rows", "texts", "seq")

    def __init__(self, b: Binding, kind: int, names: tuple[str, ...],
                 extra: tuple[tuple[str, ...], tuple[str, ...]] | None) -> None:
        self.b = b
        self.kind = kind
        self.names = names
        self.extra = extra
        self.rows: list[tuple[Any, ...]] = []
        self.texts: list[Any] | None = []  # RowChange.row_text of each row, while every row of the group has one
        self.seq = 0  # when its first pending row came, among the write's groups: the order of the final flush


class Writer:
    """Applies one ``write`` call on one connection.

    Keeps one pending group per downstream table and flushes a table's group only when that table's next
    change cannot join it (another kind, column set or schema version), when it reaches ``batch_rows``,
    before a TRUNCATE or key move of that table, when the rows pending over all tables reach
    ``max(batch_rows, txn_rows)`` (memory bound), or at the end. Each table's changes therefore reach the
    target in their order; statements of different tables may be reordered (all inside the one downstream
    transaction of the call).
    """

    def __init__(self, sink: SQLSink, conn: Connection, stmts: Statements) -> None:
        self.sink = sink
        self.conn = conn
        self.dialect = sink.dialect
        self.stmts = stmts
        self.batch = sink._batch
        self.cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        self.pipe = sink._pipe  # statements run there, in order; reads and the caller's commit drain it first
        self.current: str | None = None  # table being written (or whose statement failed), for error messages
        self._groups: dict[str, Group] = {}  # by downstream table (label); kept, emptied, when flushed
        self._last: Group | None = None  # the group the previous change joined (fast path)
        self._pending = 0  # rows pending over all groups
        self._max_pending = max(self.batch, sink._config.txn_rows)
        self._seq = 0
        self._delete_sql: dict[tuple[int, int], str] = {}
        self._staged: set[str] = set()  # staging tables made sure of in this write (PostgreSQL)
        # made now, while the connection is idle (it reads the connection's status)
        self._literal: Callable[[Any], str] | None = (
            mysql_literal_function(self.cur.connection) if self.dialect == "mysql" else None)
        if self.dialect == "postgresql":
            import psycopg2.extras

            self._execute_batch: Callable[..., Any] = psycopg2.extras.execute_batch

    # ---- intake --------------------------------------------------------------------------------------
    def run(self, changes: Iterable[RowChange]) -> int:
        """Apply ``changes``; returns their count once every statement has executed (the caller commits).
        On any error the pipeline is idle when this raises, and a failed statement's error wins over a
        later error of the caller's thread (it came first), with ``current`` naming its table."""
        try:
            count = self._run(changes)
            self._sync()
            return count
        except BaseException as exc:
            error = self.pipe.quiesce()  # nothing runs on the connection when the caller rolls back
            if error is not None and isinstance(exc, Exception):
                self.current = error[1]
                raise error[0]  # noqa: B904 - the earlier failure; the caller's error stays as its context
            raise
        finally:
            try:
                self.cur.close()
            except Exception:  # a lost connection: the caller maps the original error
                pass

    def _sync(self) -> None:
        """Wait until every submitted statement ran; raise the first failure, naming its table."""
        error = self.pipe.quiesce()
        if error is not None:
            self.current = error[1]
            raise error[0]

    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the connection after the statements before it (for table ``current``)."""
        if not self.pipe.submit(self.current, fn, *args):
            self._sync()

    def _run(self, changes: Iterable[RowChange]) -> int:
        count = 0
        last_schema: TableSchema | None = None
        b: Binding | None = None
        insert_kind = K_UPSERT
        push = self._push
        batch = self.batch
        INSERT, UPDATE, DELETE, TRUNCATE = OpType.INSERT, OpType.UPDATE, OpType.DELETE, OpType.TRUNCATE
        for ch in changes:
            count += 1
            schema = ch.schema
            if schema is not last_schema:
                self.current = str(schema.name)
                b = self.sink._bind(schema, self.conn, self._sync)
                insert_kind = K_UPSERT if b.keyed else K_INSERT
                last_schema = schema
            assert b is not None
            op = ch.op
            if op == INSERT:
                row = ch.row
                if row is not None:  # positional: every column, in schema order (see RowChange.row)
                    names = b.names
                    text = ch.row_text
                else:
                    vals = ch.values
                    assert vals is not None
                    names = tuple(vals)
                    row = tuple(vals.values())
                    text = None
                g = self._last
                # fast path: the same group as the previous change, not emptied since
                if g is not None and g.b is b and g.kind == insert_kind and g.extra is None and g.rows and (
                        g.names is names or g.names == names):
                    rows = g.rows
                    rows.append(row)
                    texts = g.texts
                    if texts is not None:
                        if text is None:
                            g.texts = None
                        else:
                            texts.append(text)
                    self._pending += 1
                    if len(rows) >= batch:
                        self._flush_group(g)
                    elif self._pending >= self._max_pending:
                        self.flush()
                else:
                    push(b, insert_kind, names, row, None, text)
            elif op == UPDATE:
                self._update(b, ch)
            elif op == DELETE:
                self._delete(b, ch)
            elif op == TRUNCATE:
                self._flush_table(b)
                self.current = b.label
                self._submit(self.cur.execute, self.stmts.truncate(b.table), ())
            else:
                raise SinkError(f"table {b.label}: unknown operation {op!r}")
        self.flush()
        return count

    def _update(self, b: Binding, ch: RowChange) -> None:
        row = ch.row
        if row is not None and ch.old_values is None and b.keyed:  # positional, nothing UNCHANGED
            self._push(b, K_UPSERT, b.names, row, None, ch.row_text)
            return
        vals = ch.values
        if vals is None:
            raise SinkError(f"table {b.label}: UPDATE without new values")
        names, row = tuple(vals), tuple(vals.values())
        partial = UNCHANGED in row
        if partial:
            names = tuple(k for k, v in vals.items() if v is not UNCHANGED)
            row = tuple(v for v in row if v is not UNCHANGED)
        old = ch.old_values
        if not b.keyed:
            if old is None:
                raise SinkError(f"table {b.label} has no key and an UPDATE came without its old row "
                                "(set REPLICA IDENTITY FULL upstream)")
            match, nulls, mrow = _match_parts(old)
            self._push(b, K_UPDATE_ONE, names, row + mrow, (match, nulls))
            return
        if old is not None:
            old_key = []
            new_key = []
            for k in b.key:
                ov = old.get(k, UNCHANGED)
                nv = vals.get(k, UNCHANGED)
                if ov is UNCHANGED or nv is UNCHANGED:
                    break
                old_key.append(ov)
                new_key.append(nv)
            else:
                if old_key != new_key:
                    if partial:
                        self._move(b, names, row, tuple(old_key))
                    else:
                        self._push(b, K_DELETE, b.key, tuple(old_key), None)
                        self._push(b, K_UPSERT, names, row, None)
                    return
        self._push(b, K_UPSERT, names, row, None)

    def _delete(self, b: Binding, ch: RowChange) -> None:
        old = ch.old_values if ch.old_values is not None else ch.values
        if old is None:
            raise SinkError(f"table {b.label}: DELETE without old values")
        if b.keyed:
            try:
                key = tuple(old[k] for k in b.key)
            except KeyError as exc:
                raise SinkError(f"table {b.label}: DELETE without key column {exc.args[0]!r}") from None
            if UNCHANGED in key:
                raise SinkError(f"table {b.label}: DELETE whose key value was not sent")
            self._push(b, K_DELETE, b.key, key, None)
        else:
            match, nulls, mrow = _match_parts(old)
            self._push(b, K_DELETE_ONE, match, mrow, ((), nulls))

    def _push(self, b: Binding, kind: int, names: tuple[str, ...], row: tuple[Any, ...],
              extra: tuple[tuple[str, ...], tuple[str, ...]] | None, text: Any = None) -> None:
        g = self._groups.get(b.label)
        if g is None:
            g = self._groups[b.label] = Group(b, kind, names, extra)
        elif g.b is not b or g.kind != kind or g.extra != extra or (g.names is not names and g.names != names):
            if g.rows:
                self._flush_group(g)
            g.b, g.kind, g.names, g.extra = b, kind, names, extra
        rows = g.rows
        if not rows:
            g.seq = self._seq
            self._seq += 1
        rows.append(row)
        texts = g.texts
        if texts is not None:
            if text is None:
                g.texts = None
            else:
                texts.append(text)
        self._last = g
        self._pending += 1
        if len(rows) >= self.batch:
            self._flush_group(g)
        elif self._pending >= self._max_pending:
            self.flush()

    # ---- output --------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Flush every pending group, in the order their first pending rows came."""
        pending = [g for g in self._groups.values() if g.rows]
        if len(pending) > 1:
            pending.sort(key=_group_seq)
        for g in pending:
            self._flush_group(g)

    def _flush_table(self, b: Binding) -> None:
        g = self._groups.get(b.label)
        if g is not None and g.rows:
            self._flush_group(g)

    def _flush_group(self, g: Group) -> None:
        rows = g.rows
        if not rows:
            return
        b, kind, names, extra = g.b, g.kind, g.names, g.extra
        texts = g.texts
        g.rows = []
        g.texts = []
        self._pending -= len(rows)
        self.current = b.label
        plan = b.plan(kind, names, extra)
        copy = plan.copy
        if copy is not None and texts is not None and len(texts) == len(rows) >= COPY_MIN_ROWS:
            if kind == K_UPSERT:
                texts = _last_per_key_texts(rows, texts, plan.key_idx)  # ON CONFLICT touches a row once
            self._copy_rows(copy, texts)
            return
        if kind == K_UPSERT:
            if self.dialect == "sqlite":
                _check_keys_not_null(rows, plan.key_idx, b.label)
            partial = len(names) < b.ncols
            if self.dialect == "postgresql" or partial:
                rows = _last_per_key(rows, plan.key_idx)  # ON CONFLICT cannot touch a row twice
            if partial and b.label not in self.sink._warned_missing:
                self._warn_missing(b, [tuple(r[i] for i in plan.key_idx) for r in rows])
            self._insert_rows(plan, convert_rows(plan, rows, texts))  # texts ignored if rows were dropped
        elif kind == K_INSERT:
            self._insert_rows(plan, convert_rows(plan, rows, texts))
        elif kind == K_DELETE:
            self._delete_keys(b, convert_params(_distinct(rows), plan.convert))
        else:
            params = convert_params(rows, plan.convert)
            if self.dialect == "postgresql":
                self._submit(self._execute_batch, self.cur, plan.sql, params, len(params))  # page_size
            else:
                self._submit(self.cur.executemany, plan.sql, params)

    def _copy_rows(self, copy: tuple[str, str | None, str | None], texts: list[Any]) -> None:
        """PostgreSQL: the rows' upstream texts through COPY, into the table (plain inserts) or into the
        session's staging table, merged into the table by one INSERT .. SELECT .. ON CONFLICT."""
        copy_sql, stage_sql, merge_sql = copy
        data = _copy_text(texts)
        if stage_sql is not None and stage_sql not in self._staged:  # once per write: a rollback drops it
            self._staged.add(stage_sql)
            self._submit(self.cur.execute, stage_sql)
        self._submit(self._copy_in, copy_sql, data)
        if merge_sql is not None:
            self._submit(self.cur.execute, merge_sql)

    def _copy_in(self, sql: str, data: str) -> None:
        self.cur.copy_expert(sql, io.StringIO(data), max(1, len(data)))  # encoded in the client encoding

    def _insert_rows(self, plan: Plan, params: list[Any]) -> None:
        if self.dialect == "postgresql":  # one multi-row statement, formatted by psycopg2 in one call
            self._submit(self.cur.execute, plan.many(len(params)), [v for r in params for v in r])
        elif self.dialect == "mysql":
            self._mysql_insert(plan, params)
        else:  # sqlite3 loops in C
            self._submit(self.cur.executemany, plan.sql, params)

    def _mysql_insert(self, plan: Plan, params: list[Any]) -> None:
        """Multi-row INSERTs of literal rows, at most ``MYSQL_STATEMENT_BYTES`` each (like PyMySQL's
        executemany, with a faster literal renderer)."""
        assert plan.parts is not None
        head, tail = plan.parts
        lit = self._literal
        assert lit is not None
        if not params:
            return
        # one renderer generated for the group's value types: the same text as joining literal() of each value
        render = lit.rows(tuple(map(type, params[0])))  # type: ignore[attr-defined]
        rows: list[str] = []
        size = len(head) + len(tail)
        for r in params:
            text = render(r)
            if rows and size + len(text) > MYSQL_STATEMENT_BYTES:
                self._submit(self.cur.execute, head + ",".join(rows) + tail)
                rows, size = [], len(head) + len(tail)
            rows.append(text)
            size += len(text) + 1
        if rows:
            self._submit(self.cur.execute, head + ",".join(rows) + tail)

    def _delete_keys(self, b: Binding, keys: list[Any]) -> None:
        if self.dialect == "sqlite":
            self._submit(self.cur.executemany, self.stmts.delete_key(b.table), keys)
            return
        n = len(keys)
        sql = self._delete_sql.get((id(b), n))
        if sql is None:
            sql = self.stmts.delete_keys(b.table, n)
            self._delete_sql[(id(b), n)] = sql
        self._submit(self.cur.execute, sql, [v for k in keys for v in k])

    def _count_existing(self, b: Binding, keys: list[Any]) -> int:
        self._sync()  # reads results: the statements before it first, then this one in this thread
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

    def _key_params(self, b: Binding, key: tuple[Any, ...]) -> list[Any]:
        return list(b.key_convert(key) if b.key_convert else key)

    def _warn_missing(self, b: Binding, raw_keys: list[tuple[Any, ...]]) -> None:
        keys = [self._key_params(b, k) for k in raw_keys]
        missing = len(keys) - self._count_existing(b, keys)
        if missing > 0:
            self.sink._warned_missing.add(b.label)
            log.warning("table %s: %d updated row(s) were missing downstream and are inserted without their "
                        "unsent (UNCHANGED) columns, which stay NULL; a previous loss? (warned once per table)",
                        b.label, missing)

    def _move(self, b: Binding, names: tuple[str, ...], row: tuple[Any, ...], old_key: tuple[Any, ...]) -> None:
        """Key change with UNCHANGED columns: move the old row (keeping the unsent values) when possible."""
        self._flush_table(b)
        self._sync()  # reads results (existence, rowcount): run synchronously from here
        self.current = b.label
        new_key = tuple(row[names.index(k)] for k in b.key)
        new_params = self._key_params(b, new_key)
        old_params = self._key_params(b, old_key)
        plan = b.plan(K_UPSERT, names, None)
        values = plan.convert(row) if plan.convert else row
        if not self._count_existing(b, [new_params]):
            sets = [b.colmap[n] for n in names]
            self.cur.execute(self.stmts.update_key(b.table, sets), list(values) + list(old_params))
            if self.cur.rowcount:
                return
            if b.label not in self.sink._warned_missing:
                self.sink._warned_missing.add(b.label)
                log.warning("table %s: a row whose key changed was missing downstream and is inserted without "
                            "its unsent (UNCHANGED) columns; a previous loss? (warned once per table)", b.label)
        else:
            self.cur.execute(self.stmts.delete_key(b.table), old_params)
        self._insert_rows(plan, [values])


def _group_seq(g: Group) -> int:
    return g.seq


def _match_parts(old: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]:
    """Split an old row into (non-NULL column names, NULL column names, non-NULL values); skips UNCHANGED."""
    names, nulls, values = [], [], []
    for k, v in old.items():
        if v is UNCHANGED:
            continue
        if v is None:
            nulls.append(k)
        else:
            names.append(k)
            values.append(v)
    return tuple(names), tuple(nulls), tuple(values)



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
        else:
            last = {tuple(r[j] for j in key_idx): r for r in rows}
    except TypeError:  # array keys
        last = {tuple(_hashable(r[j]) for j in key_idx): r for r in rows}
    return rows if len(last) == len(rows) else list(last.values())


def _copy_value(v: str | None) -> str:
    """One value in COPY's text format: NULL as ``\\N``; backslash, tab, newline and CR escaped."""
    if v is None:
        return "\\N"
    return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _copy_text(texts: Sequence[Sequence[str | None]]) -> str:
    """Rows of upstream text as COPY text-format data (one line per row, tab-separated, NULL as ``\\N``)."""
    lines = []
    append = lines.append
    for t in texts:
        if None not in t:
            line = "\t".join(t)
            # nothing to escape: no backslash, newline, CR, and no tab other than the separators
            if "\\" not in line and "\n" not in line and "\r" not in line and line.count("\t") == len(t) - 1:
                append(line)
                continue
        append("\t".join(map(_copy_value, t)))
    lines.append("")
    return "\n".join(lines)


def _last_per_key_texts(rows: list[tuple[Any, ...]], texts: list[Any], key_idx: tuple[int, ...]) -> list[Any]:
    """``texts`` of the last row per key (as :func:`_last_per_key`, for texts parallel to ``rows``)."""
    if not key_idx:
        return texts
    try:
        if len(key_idx) == 1:
            i = key_idx[0]
            last = {r[i]: j for j, r in enumerate(rows)}
        else:
            last = {tuple(r[k] for k in key_idx): j for j, r in enumerate(rows)}
    except TypeError:  # array keys
        last = {tuple(_hashable(r[k]) for k in key_idx): j for j, r in enumerate(rows)}
    if len(last) == len(rows):
        return texts
    return [texts[j] for j in sorted(last.values())]


def _distinct(keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    try:
        return list(dict.fromkeys(keys))
    except TypeError:  # array keys
        return list({_hashable(list(k)): k for k in keys}.values())
