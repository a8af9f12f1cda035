"""Row-level vocabulary shared by upstream, sorter, mounter and sinks.

``TableSchema`` describes one upstream table at one schema version. ``RowChange`` is the typed,
mounted change a sink receives. ``UNCHANGED`` marks a column whose value the upstream did not send
(PostgreSQL's unchanged TOAST datum): it is *not* NULL and a sink must leave that column as it is.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class _Unchanged:
    """Singleton for 'value not sent by the upstream, keep the downstream value'."""

    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()


class OpType(enum.IntEnum):
    INSERT = 1
    UPDATE = 2
    DELETE = 3
    TRUNCATE = 4


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableName:
        schema, dot, table = text.partition(".")
        if not dot:
            return cls("public", text)
        return cls(schema, table)


@dataclass(frozen=True, slots=True)
class ColumnSchema:
    """One upstream column.

    ``base_type`` is the canonical PostgreSQL type name of the element (``int4``, ``numeric``,
    ``timestamptz``, ``text``...; see ``upstream.postgres.types``), ``is_array`` says whether the
    column is a one-dimensional array of it, ``type_name`` is ``format_type()`` output for humans
    and DDL, ``type_modifier`` the atttypmod (-1 when none).
    """

    name: str
    type_oid: int
    base_type: str
    is_array: bool = False
    type_name: str = ""
    type_modifier: int = -1
    nullable: bool = True
    is_key: bool = False
    default: str | None = None
    """The upstream's default expression (PostgreSQL syntax, ``pg_get_expr`` of the column default), None
    when the column has none or it is unknown (a schema read from a Relation message only)."""


@dataclass(frozen=True, slots=True)
class TableSchema:
    """An upstream table at one schema version (immutable; a DDL makes a new version).

    ``key`` names the columns that identify a row downstream (the primary key, else the replica
    identity index, else all columns for REPLICA IDENTITY FULL without a key: then ``has_key`` is
    False). ``replica_identity`` is PostgreSQL's relreplident: ``d``efault, ``f``ull, ``i``ndex,
    ``n``othing.
    """

    name: TableName
    columns: tuple[ColumnSchema, ...]
    key: tuple[str, ...]
    replica_identity: str = "d"
    relation_id: int = 0
    version: int = 0
    has_key: bool = True
    column_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """The columns' names in order (derived once: ``RowChange.values`` and the sinks read it per change)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "column_names", tuple(c.name for c in self.columns))

    def column(self, name: str) -> ColumnSchema:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


SNAPSHOT = "snapshot"
"""Key of ``RowChange.extra`` that marks a row of the initial copy (value ``True``). Set by the upstream's snapshot
reader; protocols with a marker for snapshot reads show it (Debezium ``op: "r"``), the others write such a row as
an insert."""


@dataclass(slots=True)
class RowChange:
    """A typed row change, as delivered to sinks.

    - INSERT: ``values`` is the full new row.
    - UPDATE: ``values`` is the new row; a column may be ``UNCHANGED``. ``old_values`` is the old
      key (replica identity DEFAULT/INDEX, only when the key changed) or the full old row (FULL), or
      None.
    - DELETE: ``old_values`` holds at least the key columns.
    - TRUNCATE: no values.
    ``commit_ts`` orders transactions; ``commit_time`` is the upstream commit wall-clock time.
    ``extra`` carries optional facts about the change: ``extra[SNAPSHOT] is True`` marks a row read by the
    initial copy (an INSERT of a row that existed when the changefeed was created, not a streamed insert;
    see :func:`is_snapshot`), ``extra["truncate_options"]`` the option bits of a TRUNCATE.
    """

    op: OpType
    schema: TableSchema
    commit_ts: int
    commit_time: float = 0.0
    values: dict[str, Any] | None = None
    old_values: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    row: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)
    """Optional positional form of the new row: one value per ``schema.columns`` entry, in that order,
    never ``UNCHANGED`` (PostgreSQL sends unchanged TOAST values only in UPDATEs, which then get no
    ``row``). Set by the mounter for INSERTs (and UPDATEs without an old tuple, and MySQL UPDATEs whose images are
    whole: those also carry their whole ``old_values``) so that sinks can skip the dict. When ``row`` is set and ``values`` was not given, ``values`` is built from it on
    first access. Assigning ``values`` drops ``row`` (and ``row_text``); change a mounted row by assigning
    ``values``, never by mutating the dict in place. For a sink that writes rows by their text (``sinks.base.TextRows``,
    whose rows are mounted with ``processor.mounter.Mounter(..., defer=True)``) an insert's ``row`` may instead be a
    *deferred row*: a sequence of the same values (length, items, slices, iteration, equality and hash are the tuple's)
    that parses ``row_text`` on its first use, and a callable returning the tuple (:func:`parsed_rows`); no other sink
    ever sees one. (``row`` stays a plain slot: a property would cost every reader of every sink a Python call.)"""
    row_text: Sequence[str | None] | None = field(default=None, compare=False, repr=False)
    """Optional, only together with ``row``: the upstream's text for each value of ``row`` (PostgreSQL's
    output functions with DateStyle ISO and TimeZone UTC; None for NULL). A sink that stores text may use
    it instead of formatting the parsed value, but only where the result is exactly the same."""

    @property
    def table(self) -> TableName:
        return self.schema.name

    def key_values(self) -> tuple[Any, ...]:
        """The identifying key of the row this change touches (old key for deletes and key changes)."""
        src = self.old_values if self.old_values is not None else self.values
        assert src is not None
        return tuple(src[k] for k in self.schema.key)


REPLAYED = "replayed"
"""Key of ``RowChange.extra`` that marks a change of a table whose copy was read under a later snapshot than the
change (value ``True``: its commit Ts is between the table's floor and ceiling, ``cdc.model.SpanSnapshot``): the
target may already hold newer rows than the change was made on. Set by the span's batcher, which hands such changes
to the sink one upstream transaction per write (a net effect over several transactions would assume the rows were as
the first found them); applied in order by key, they converge (docs/snapshot.md)."""


def is_snapshot(change: RowChange) -> bool:
    """True when ``change`` is a row read by the initial copy (``extra[SNAPSHOT]``), not a streamed change."""
    return change.extra.get(SNAPSHOT) is True


# ``values`` is a slot; route it through a property so that a positional ``row`` turns into the dict
# only when someone asks for it (the dataclass __init__, __eq__, __repr__ and pickling all use attribute
# access, so they see the same dict).
_values_slot: Any = RowChange.__dict__["values"]
_row_slot: Any = RowChange.__dict__["row"]
_row_text_slot: Any = RowChange.__dict__["row_text"]


def parsed_rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    """``rows`` (``RowChange.row`` values, None excluded) with every deferred row parsed into its tuple: the list itself
    when it holds tuples only."""
    if set(map(type, rows)) <= _TUPLE:
        return rows
    return [r if type(r) is tuple else r() for r in rows]


_TUPLE = frozenset((tuple,))


def _get_values(self: RowChange) -> dict[str, Any] | None:
    values: dict[str, Any] | None = _values_slot.__get__(self, RowChange)
    if values is None:
        row = _row_slot.__get__(self, RowChange)
        if row is not None:  # (a deferred row iterates as its tuple)
            values = dict(zip(self.schema.column_names, row, strict=True))
            _values_slot.__set__(self, values)
    return values


def _set_values(self: RowChange, values: dict[str, Any] | None) -> None:
    _values_slot.__set__(self, values)
    if values is not None:  # the dict is authoritative from now on
        _row_slot.__set__(self, None)
        _row_text_slot.__set__(self, None)


RowChange.values = property(_get_values, _set_values, doc="The new row by column name (see ``row``).")  # type: ignore[assignment,method-assign]


@dataclass(frozen=True, slots=True)
class Transaction:
    """A committed upstream transaction's identity (the rows themselves are streamed separately)."""

    commit_ts: int
    commit_time: float
    xid: int = 0


class DdlKind(enum.StrEnum):
    """One elementary schema change (see docs/ddl.md for what each sink does with it)."""

    CREATE_TABLE = "create table"
    DROP_TABLE = "drop table"
    RENAME_TABLE = "rename table"
    TRUNCATE_TABLE = "truncate table"
    ADD_COLUMN = "add column"
    DROP_COLUMN = "drop column"
    RENAME_COLUMN = "rename column"
    ALTER_COLUMN_TYPE = "alter column type"
    SET_DEFAULT = "set default"
    DROP_DEFAULT = "drop default"
    SET_NOT_NULL = "set not null"
    DROP_NOT_NULL = "drop not null"
    ADD_PRIMARY_KEY = "add primary key"
    DROP_PRIMARY_KEY = "drop primary key"
    CREATE_INDEX = "create index"
    DROP_INDEX = "drop index"
    OTHER = "other"
    """A command that changes nothing a sink replicates (a comment, a statistics target, a trigger) or one
    Tidewater cannot classify: ``DdlEvent.query`` says which."""


@dataclass(frozen=True, slots=True)
class IndexSpec:
    """A secondary index (``[ddl] replicate-indexes``): its name, columns in order, uniqueness."""

    name: str
    columns: tuple[str, ...]
    unique: bool = False


@dataclass(frozen=True, slots=True)
class DdlChange:
    """One elementary change of a :class:`DdlEvent`. ``column`` names the column it touches (its *old*
    name for a rename); ``new_name`` is the new column name of RENAME_COLUMN or the new table name of
    RENAME_TABLE (as ``schema.table``); ``index`` the index of CREATE_INDEX / DROP_INDEX."""

    kind: DdlKind
    column: str | None = None
    new_name: str | None = None
    index: IndexSpec | None = None


@dataclass(frozen=True, slots=True)
class ColumnFill:
    """What the rows that existed before an ADD COLUMN hold upstream in the new column (``DdlEvent.fills``).

    - ``per_row`` False: every such row got ``value`` (the mounter's Python value for the column's type; None is
      NULL): a constant default, or a STABLE one (``now()``, ``current_user``) that PostgreSQL evaluated once and
      stored as the column's missing value.
    - ``per_row`` True: each row got its own value (a VOLATILE default such as ``clock_timestamp()``,
      ``gen_random_uuid()``, ``nextval()``: the table was rewritten, and a rewrite is not in the stream): a sink
      reads the values back from the upstream by key (``sinks.base.RowSource``).
    A column of an event without a fill for it: unknown (the sink falls back to the default expression)."""

    column: str
    value: Any = None
    per_row: bool = False


@dataclass(frozen=True, slots=True)
class DdlEvent:
    """A schema change of one upstream table at an exact position in the stream.

    ``commit_ts`` is the commit Ts of the upstream transaction that ran the DDL and ``seq`` the DDL's
    position in that transaction as the upstream ran it (0, 1, ...), counted over *all* its DDL statements, also
    those of tables other spans carry: every span of a changefeed gives a DDL the same ``seq``, so
    ``(commit_ts, seq)`` is unique across the changefeed (what a sink records to apply a DDL at most once in
    effect) and orders the DDLs of one transaction across spans (the changefeed barrier, docs/ddl.md). Several
    events of one statement share its ``seq`` (they are of one table, so of one span). ``seq_local``: the event
    has no such position (a schema change the span derived from the stream alone, without a DDL message, or any
    later one of its transaction in that span): its ``seq`` is unique only within the span and orders nothing
    across spans. Rows of the same transaction that were written before the DDL come before it in the stream;
    rows after it, after it.

    ``before`` is the table's schema just before the DDL (None for CREATE_TABLE), ``after`` just after it
    (None for DROP_TABLE); both carry ``ColumnSchema.default`` where the upstream has one. ``changes``
    lists what changed, in the order a sink should apply it; ``query`` is the upstream statement text (for
    messages and for sinks that forward DDL text, never for execution on another dialect). ``fills`` says, for
    the ADD_COLUMN changes whose values the upstream told, what the rows that existed hold in the new column
    (:class:`ColumnFill`).
    """

    commit_ts: int
    commit_time: float
    table: TableName
    changes: tuple[DdlChange, ...]
    before: TableSchema | None
    after: TableSchema | None
    query: str = ""
    seq: int = 0
    new_table: TableName | None = None
    fills: tuple[ColumnFill, ...] = ()
    seq_local: bool = False

    def fill(self, column: str) -> ColumnFill | None:
        """The fill of added column ``column``, None when the event does not say."""
        for f in self.fills:
            if f.column == column:
                return f
        return None

    @property
    def kinds(self) -> tuple[DdlKind, ...]:
        return tuple(c.kind for c in self.changes)
