"""The sink contract (see DESIGN.md sections 3.4 and 4).

Guarantees a sink gives its caller:
- ``write(changes)`` receives changes ordered by ``commit_ts`` that form *whole* upstream transactions
  (one or several). It applies them in order and returns only once they are durable downstream; for
  transactional targets all of them are applied in one downstream transaction. The caller advances its
  checkpoint to the last ``commit_ts`` only after ``write`` returned.
- Idempotence: applying the same changes again (a replay after a crash) converges to the same state:
  inserts and updates are upserts by key, deletes by key.
- An UPDATE column whose value is ``cdc.events.UNCHANGED`` keeps its downstream value.
- Errors: a transient failure (target unreachable) raises ``cdc.errors.SinkUnavailable``; a failure that
  retrying cannot fix raises ``cdc.errors.SinkError``. After an exception nothing from that call is
  assumed durable; the caller retries from its checkpoint.
- Fencing: ``fence`` (if given) is called immediately before the downstream commit; if it raises, the
  downstream transaction is rolled back and the exception propagates. A span uses it to refuse to
  commit once its capture may have lost the span (lease expired while the process was frozen).
- Threading: one caller thread at a time. ``close`` releases connections; no call after ``close``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from cdc.events import RowChange, TableName


class Sink(ABC):
    @abstractmethod
    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        """Apply whole transactions durably; return the number of row changes applied."""

    def check(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Connect and verify the target is usable; raise SinkUnavailable/SinkError naming the problem."""

    def target_name(self, table: TableName) -> str:
        """Where ``table`` lands downstream, as a display string (used to refuse name collisions)."""
        return str(table)

    @abstractmethod
    def close(self) -> None: ...
