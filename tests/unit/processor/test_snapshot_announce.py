"""A span announces its tables' complete copies (processor.snapshot.InitialCopy ``announce``,
``CopyAnnouncer.announce_copy``) before its snapshot is ``done`` - before it streams, so before any watermark covering
the copy - listing every chunk as etcd records it: the run (Ts) each was written under and its rows (docs/sinks.md,
"Copy markers"). Fakes for etcd, the upstream and the job."""

from __future__ import annotations

import threading

import pytest

from cdc.snapshot import CopiedChunk
from processor.snapshot import CopyIncomplete, CopyRequest
from tests.snapshot_copy_fakes import (
    BAG,
    KEYED,
    Job,
    Progress,
    Upstream,
    bag_plan,
    initial_copy,
    keyed_plan,
    table_schema,
)

pytestmark = pytest.mark.unit


def test_the_copy_is_announced_with_each_chunks_run_before_the_span_is_done() -> None:
    """Run 1 (export A at 100) copies the keyed table and is killed; run 2 (B at 200) copies the key-less one. One
    announcement, after run 2, naming the keyed chunks at 100 and the key-less one at 200."""
    progress = Progress()
    up = Upstream([BAG, KEYED], [("A", 100), ("B", 200)])
    up.plans = {KEYED: keyed_plan(), BAG: bag_plan()}
    up.schemas = {KEYED: table_schema(KEYED, True), BAG: table_schema(BAG, False)}
    said: list[tuple[list[CopiedChunk], str]] = []
    first, stored = initial_copy(progress, None, up, Job(progress, copy={KEYED}),
                                 announce=lambda chunks: said.append((list(chunks), stored[-1].phase)))
    with pytest.raises(RuntimeError, match="killed"):
        first(threading.Event())
    assert said == []  # not complete: nothing announced
    second, stored = initial_copy(progress, first.state, up, Job(progress),
                                  announce=lambda chunks: said.append((list(chunks), stored[-1].phase)))
    second(threading.Event())
    ((chunks, phase),) = said
    assert phase == "copying" and stored[-1].phase == "done"  # announced before the done state was stored
    keyed = progress.chunks[KEYED]
    assert sorted(chunks, key=lambda c: (str(c.table), c.index)) == [
        CopiedChunk(BAG, 0, 200, progress.chunks[BAG][0].rows, 1),
        *(CopiedChunk(KEYED, i, 100, keyed[i].rows, 3) for i in sorted(keyed))]


class SkippingJob(Job):
    """A job that ends without error having left a chunk out (what the span must never stream over)."""

    def __call__(self, request: CopyRequest, stop: threading.Event) -> None:
        super().__call__(request, stop)
        del self.progress.chunks[KEYED][1]


def test_a_job_that_ends_without_copying_a_chunk_is_refused_before_anything_is_announced() -> None:
    progress = Progress()
    up = Upstream([KEYED], [("A", 100), ("B", 200)])
    up.plans = {KEYED: keyed_plan()}
    up.schemas = {KEYED: table_schema(KEYED, True)}
    said: list[object] = []
    copy, stored = initial_copy(progress, None, up, SkippingJob(progress), announce=said.append)
    with pytest.raises(CopyIncomplete, match=r"1 of the 3 chunks of table public\.big are not recorded as copied "
                                             r"\(chunk 1\)") as err:
        copy(threading.Event())
    assert err.value.retryable and said == [] and stored[-1].phase == "copying"
    again, stored = initial_copy(progress, copy.state, up, Job(progress), announce=said.append)
    again(threading.Event())  # the next run copies what was left
    assert stored[-1].phase == "done" and len(said) == 1
