"""``blackhole://``: a sink that counts row changes and discards them (benchmarks, tests).

Guarantees: ``write`` consumes the whole iterable and returns how many changes it held; nothing is
stored, so every write is trivially "durable"; it stores no positions (``open_position`` returns 0; not a
``PositionStore``); schema changes are counted and discarded like rows (``DdlSink``); no other role. Not thread-safe (one caller, as the contract says).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cdc.config import SinkConfig
from cdc.errors import SinkError
from cdc.events import DdlEvent, RowChange
from cdc.model import DataWarning
from cdc.uri import parse_sink_uri
from sinks.base import DdlSink, TxnSink


class BlackholeSink(TxnSink, DdlSink):
    def __init__(self, uri: str = "blackhole://", config: SinkConfig | None = None) -> None:
        parse_sink_uri(uri)
        self.rows = 0  # row changes written since construction
        self.writes = 0  # write calls
        self.ddls = 0  # schema changes "applied" (discarded, like the rows)
        self._closed = False

    def check(self) -> None:
        """Nothing to connect to."""

    def take_warnings(self) -> list[DataWarning]:
        return []  # nothing is stored, so nothing can differ

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        if self._closed:
            raise SinkError("blackhole sink is closed")
        n = 0
        for _ in changes:
            n += 1
        if fence is not None:
            fence()
        self.rows += n
        self.writes += 1
        return n

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        if fence is not None:
            fence()
        self.ddls += 1
        return True

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        return 0  # nothing is stored, so nothing is ever downstream already

    def close(self) -> None:
        self._closed = True
