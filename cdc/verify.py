"""Vocabulary of ``cdc cli changefeed verify`` (docs/verify.md): a chunk's checksums, the rows that differ, the
verdict per table and the whole report. Frozen dataclasses that round-trip through ``cdc.serde`` JSON (the Spark
tasks return them, the report is written as JSON), no I/O.

Exit codes (:attr:`VerifyReport.exit_code`): :data:`EXIT_EQUAL` every table equal, :data:`EXIT_DIFFERS` some table
differs (or holds values that cannot be compared exactly: never called equal), :data:`EXIT_ERROR` the verification
could not run (``error`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_EQUAL = 0
EXIT_DIFFERS = 1
EXIT_ERROR = 2

MISSING = "missing"
"""A key (a row, for a key-less table) upstream that the target lacks."""
EXTRA = "extra"
"""A key (a row) in the target that the upstream lacks."""
DIFFERENT = "different"
"""A key on both sides whose values differ (``columns`` names them)."""
INEXACT = "inexact"
"""A key whose upstream values the target cannot hold exactly (``columns`` names them): not called equal."""

DEFAULT_CAP = 100
"""Differing keys listed per table; beyond it only counted (``TableVerdict.more``)."""


@dataclass(frozen=True, slots=True)
class ChunkSum:
    """One chunk's checksums: rows and the multiset sum of their 64-bit row hashes, on each side; ``inexact``:
    upstream values in the chunk that have no exact form downstream."""

    table: str
    index: int
    source_rows: int
    source_sum: int
    target_rows: int
    target_sum: int
    inexact: int = 0

    @property
    def equal(self) -> bool:
        return (self.source_rows == self.target_rows and self.source_sum == self.target_sum
                and self.inexact == 0)


@dataclass(frozen=True, slots=True)
class RowDiff:
    """One differing key (the key columns' text; for a key-less table the whole row's canonical values), its kind
    (:data:`MISSING`, :data:`EXTRA`, :data:`DIFFERENT`, :data:`INEXACT`) and, for the last two, the columns.
    ``row_hash``: the canonical row's hash (matches a missing row with an extra one found in another chunk)."""

    kind: str
    key: tuple[str | None, ...]
    columns: tuple[str, ...] = ()
    row_hash: int = 0


@dataclass(frozen=True, slots=True)
class TableVerdict:
    """The comparison of one table. ``chunks``: compared; ``chunks_differing``: whose checksums differed (compared
    row by row). ``missing``/``extra``/``different``/``inexact``: counts of every differing key; ``diffs`` the
    first ones (at most the cap), ``more`` how many were not listed. ``note``: why the table could not be compared
    completely (then it is not equal)."""

    table: str
    source_rows: int
    target_rows: int
    chunks: int
    chunks_differing: int
    missing: int = 0
    extra: int = 0
    different: int = 0
    inexact: int = 0
    diffs: tuple[RowDiff, ...] = ()
    more: int = 0
    note: str = ""

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different or self.inexact or self.note)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """A verification's outcome. ``ts``: the upstream position both sides were compared at (0: unknown);
    ``consistency``: how the target was made to match it (``hold``: the changefeed held at ``ts``; ``checkpoint``:
    a stopped/failed changefeed at its checkpoint; ``none``: the target was read as it was, e.g. no changefeed);
    ``error``: why it could not run (then ``tables`` may be partial)."""

    ts: int = 0
    consistency: str = "none"
    tables: tuple[TableVerdict, ...] = ()
    error: str = ""
    changefeed: str = ""
    seconds: float = 0.0
    hold_seconds: float = 0.0  # how long the changefeed's spans stood still (0: no hold)
    note: str = ""  # what the reader must know about the point compared (e.g. a stopped changefeed's checkpoint)

    @property
    def equal(self) -> bool:
        return not self.error and all(t.equal for t in self.tables)

    @property
    def exit_code(self) -> int:
        if self.error:
            return EXIT_ERROR
        return EXIT_EQUAL if self.equal else EXIT_DIFFERS
