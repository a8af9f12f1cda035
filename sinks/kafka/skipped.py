"""What a Debezium topic leaves out for stock consumers, on request (docs/sinks.md, "Debezium for stock consumers").

Debezium's PostgreSQL connector writes no DDL records and, by default, no truncates (``skipped.operations=t``); a
stock consumer (Flink's ``debezium-json`` format, Kafka Connect sink connectors) may fail on records it does not
know. The Kafka sink's options mirror Debezium's names:

- ``skipped-operations`` (Debezium: ``skipped.operations``; ``c``, ``u``, ``d``, ``t`` or ``none``): changes of
  those kinds are not written while streaming (rows of a copy, Debezium's ``r``, always are). **Default ``none``**
  (Debezium's is ``t``): a skipped change makes every consumer's table differ from the upstream, so it happens only
  when asked for, and each table it happens to is shown as the notice ``CDC:NoticeOperationSkipped`` (table, count)
  in the changefeed's warnings. A resync, which must empty the table for the consumers first, is refused while
  ``t`` is skipped.
- ``include-schema-changes`` (Debezium's relational connectors: ``include.schema.changes``; default true): false
  writes no schema-change records; each DDL left out is the notice ``CDC:NoticeDdlNotWritten``.
- ``debezium-watermarks`` (``sinks.codec``): false writes no heartbeat-shaped watermark records (consumers then
  have no consistent cut point from the topic).

Only for ``protocol=debezium`` (refused for the others: TiCDC's consumers expect their DDL and watermarks). The
check per row is one set lookup, only when something is skipped.
"""

from __future__ import annotations

import time

from cdc.errors import InvalidURI
from cdc.events import OpType
from cdc.model import DataWarning, WarningSeverity
from sinks.codec import EncoderConfig

OPS = {"c": OpType.INSERT, "u": OpType.UPDATE, "d": OpType.DELETE, "t": OpType.TRUNCATE}
NAMES = {OpType.INSERT: "INSERT", OpType.UPDATE: "UPDATE", OpType.DELETE: "DELETE", OpType.TRUNCATE: "TRUNCATE"}
SKIPPED_CODE = "CDC:NoticeOperationSkipped"
DDL_CODE = "CDC:NoticeDdlNotWritten"


class Skips:
    """The sink's skipped operations and the notices they raise (see the module docstring)."""

    def __init__(self, protocol: str, codec: EncoderConfig, params: dict[str, str], uri: str) -> None:
        asked = [p for p in ("skipped-operations", "include-schema-changes") if p in params]
        if asked and protocol != "debezium":
            raise InvalidURI(f"sink URI {uri!r}: {', '.join(asked)} is a Debezium option (protocol=debezium); "
                             f"protocol={protocol} keeps TiCDC's messages")
        self.ops = frozenset(OPS[o] for o in codec.skipped)
        self.option = codec.skipped_operations
        self.ddl = codec.include_schema_changes or protocol != "debezium"
        self._counts: dict[tuple[str, str], int] = {}
        self._first: dict[tuple[str, str], float] = {}

    def skipped(self, table: str, op: OpType) -> None:
        """A change of ``table`` not written (its kind is in ``skipped-operations``)."""
        self._note((SKIPPED_CODE, table, NAMES.get(op, str(op))))

    def ddl_left_out(self, table: str, query: str) -> None:
        self._note((DDL_CODE, table, query[:200]))

    def _note(self, what: tuple[str, str, str]) -> None:
        key = (what[0], what[1])
        self._counts[key] = self._counts.get(key, 0) + 1
        self._first.setdefault(key, time.time())

    def take_warnings(self) -> list[DataWarning]:
        if not self._counts:
            return []
        now = time.time()
        out = []
        for (code, table), n in sorted(self._counts.items()):
            if code == SKIPPED_CODE:
                msg = (f"{n} change(s) not written to the topic (skipped-operations={self.option}): consumers' "
                       f"copies of {table} differ from the upstream from there on")
            else:
                msg = (f"{n} schema change(s) not written to the topic (include-schema-changes=false): consumers see "
                       f"the new columns only in the change records of {table}")
            out.append(DataWarning(code, table, msg, WarningSeverity.NOTICE, count=n,
                                   first_time=self._first[(code, table)], last_time=now))
        self._counts.clear()
        self._first.clear()
        return out
