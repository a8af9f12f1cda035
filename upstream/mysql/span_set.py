"""Which span of a MySQL/MariaDB changefeed carries a table: a deterministic rule from the table's name.

MySQL keeps nothing per span on the server (no publication), so a span's table set is not stored anywhere: it is
the rule :func:`cdc.spans.span_of` (CRC-32 of ``schema.table`` modulo the span count), the same rule by which
``changefeed create`` plans the spans, the owner places a table created later and the processor reads an old
schema history. Every span reads the whole binlog and keeps only the rows of the tables the rule gives it
(:meth:`SpanShare.carries`, asked once per TABLE_MAP body, never per row), so each table the filter selects is
carried by exactly one span at any position of the stream: never by two, never by none. A table created later is
carried by the span its name gives; a renamed table by the span its *new* name gives (the span that carried the old
name and the one that carries the new name both refuse the rename at its position, so nothing after it is written
before the operator has renamed the table downstream, docs/upstream-mysql.md, "Several spans").

The span count is stored with each span in etcd, in the span's publication label (``SpanInfo.publication``, a
label only on MySQL): ``<name>/<count>`` for more than one span; a label without it is a one-span changefeed (every
changefeed made before several spans were accepted). Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.events import TableName
from cdc.model import SpanInfo
from cdc.spans import span_of

_SEP = "/"


def publication_label(publication: str, span_count: int) -> str:
    """The label a span of a changefeed of ``span_count`` spans stores as its publication (the count kept in it)."""
    return publication if span_count == 1 else f"{publication}{_SEP}{span_count}"


@dataclass(frozen=True, slots=True)
class SpanShare:
    """Span ``index`` of ``count``: the tables it carries are those :func:`cdc.spans.span_of` gives it."""

    index: int
    count: int

    @classmethod
    def of(cls, span: SpanInfo) -> SpanShare:
        """The share of ``span`` as stored (its count read from its publication label; none: one span)."""
        _, sep, count = span.publication.rpartition(_SEP)
        n = int(count) if sep and count.isdigit() and int(count) > 0 else 1
        if not 0 <= span.index < n:
            raise ValueError(f"span {span.index} of a changefeed of {n} span(s) (publication label "
                             f"{span.publication!r})")
        return cls(span.index, n)

    def carries(self, table: TableName) -> bool:
        """Whether this span carries ``table`` (whatever its filter says: the filter applies on top)."""
        return self.count == 1 or span_of(table, self.count) == self.index
