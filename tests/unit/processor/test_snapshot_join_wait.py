"""A table copy of a table that is not in its span's publication yet (processor.snapshot.InitialCopy._joined).

The owner asks for a joining table's copy just before it adds the table to the span's publication, and the add waits
for the table's writers (or is deferred to the owner's next look): a span that takes the copy up meanwhile waits for
the table quietly, up to ``join_wait``, then fails with the retryable ``CDC:ErrTableCopyWaiting`` (the changefeed
shows it). Before, it failed at the first look: the changefeed went ``warning`` for a condition that ends by itself
(tests/e2e/test_table_copy.py has the same on real servers). A table dropped meanwhile is not waited for. Fakes for
etcd, the upstream and the job; the clock advances by the copy's own waits (nothing sleeps)."""

from __future__ import annotations

import threading

import pytest

from cdc.events import TableName
from cdc.model import SpanInfo, SpanSnapshot
from cdc.snapshot import plan_from_bounds
from processor.snapshot import CopyStopped, TableCopyWaiting, join_wait
from tests.snapshot_copy_fakes import KEYED, NAME, Progress, Upstream, initial_copy, table_schema

pytestmark = pytest.mark.unit

LATE = TableName("public", "late")
LATE_COPY = SpanSnapshot("copying", (), {}, ("public.late",), 7)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stop(threading.Event):
    """The copy's stop event: each wait on it advances ``clock`` instead of sleeping; set after ``stop_after`` waits."""

    def __init__(self, clock: Clock, stop_after: int | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.stop_after = stop_after
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.clock.now += timeout or 0.0
        if self.stop_after is not None and self.waits >= self.stop_after:
            self.set()
        return self.is_set()


class Joining(Upstream):
    """The span publishes ``big``, and ``late`` too from its ``joins_at``-th look on (never: None)."""

    def __init__(self, joins_at: int | None) -> None:
        super().__init__([KEYED], [(NAME, 300)])
        self.joins_at = joins_at
        self.looks = 0
        self.schemas[KEYED] = table_schema(KEYED, True)
        self.schemas[LATE] = table_schema(LATE, True)
        self.plans[LATE] = plan_from_bounds(LATE, 50, 100, ("id",), [])

    def span_tables(self, span: SpanInfo) -> list[TableName]:
        self.looks += 1
        joined = self.joins_at is not None and self.looks >= self.joins_at
        return [KEYED, LATE] if joined else [KEYED]


def test_a_table_copy_waits_for_its_table_to_join_the_publication_then_copies_it() -> None:
    progress, up, clock = Progress(), Joining(joins_at=4), Clock()
    copy, stored = initial_copy(progress, LATE_COPY, up, join_wait=30.0, clock=clock)
    floors = copy(Stop(clock))
    assert up.looks == 4  # looked again until it was there: no error meanwhile
    assert floors == {"public.late": 300} and stored[-1].phase == "done"
    assert set(progress.chunks) == {LATE}  # copied (only the table asked for)


def test_a_table_that_does_not_join_within_the_wait_fails_the_span_retryably_before_any_export() -> None:
    progress, up, clock = Progress(), Joining(joins_at=None), Clock()
    copy, stored = initial_copy(progress, LATE_COPY, up, join_wait=5.0, clock=clock)
    with pytest.raises(TableCopyWaiting) as err:
        copy(Stop(clock))
    assert err.value.retryable and "public.late" in err.value.message and "pub0" in err.value.message
    assert 1005.0 <= clock.now < 1006.0  # it waited join_wait, then said so
    assert up.exports == [(NAME, 300)] and stored == [] and not progress.plans  # nothing exported, stored or planned


def test_a_table_copy_without_a_wait_fails_at_once() -> None:
    progress, up, clock = Progress(), Joining(joins_at=2), Clock()
    copy, _ = initial_copy(progress, LATE_COPY, up, join_wait=0.0, clock=clock)
    with pytest.raises(TableCopyWaiting):
        copy(Stop(clock))
    assert up.looks == 1


def test_a_stop_ends_the_wait() -> None:
    progress, up, clock = Progress(), Joining(joins_at=None), Clock()
    copy, stored = initial_copy(progress, LATE_COPY, up, join_wait=30.0, clock=clock)
    with pytest.raises(CopyStopped):
        copy(Stop(clock, stop_after=2))
    assert up.looks == 2 and stored == []


def test_a_table_dropped_before_its_copy_is_not_waited_for() -> None:
    progress, up, clock = Progress(), Joining(joins_at=None), Clock()
    del up.schemas[LATE]  # gone upstream: the stream replays the DROP, nothing to copy
    copy, stored = initial_copy(progress, LATE_COPY, up, join_wait=30.0, clock=clock)
    assert copy(Stop(clock)) == {}
    assert up.looks == 1 and clock.now == 1000.0 and stored[-1].phase == "done"


def test_the_wait_covers_two_of_the_owners_looks_and_a_slow_host() -> None:
    assert join_wait(10.0) == 30.0 and join_wait(0.5) == 11.0
