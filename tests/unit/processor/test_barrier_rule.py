"""processor.barrier's wait rule: name-changing DDLs of one transaction in several spans pass their changefeed barrier
in the transaction's order, the least waiting position always proceeds, and a DDL without a position is refused
when it meets another span at its commit Ts."""

from __future__ import annotations

import random

import pytest

from cdc.events import DdlChange, DdlEvent, DdlKind, TableName
from processor.barrier import UNORDERED, OtherSpan, barrier_position, barrier_verdict

pytestmark = pytest.mark.unit

B = 1000


def test_another_span_that_wrote_all_of_the_commit_lets_it_pass() -> None:
    assert barrier_verdict(0, B, 0, [OtherSpan(1, B)]).proceed
    assert barrier_verdict(0, B, 3, [OtherSpan(1, B + 50)]).proceed


def test_another_span_just_below_the_commit_and_not_waiting_may_hold_an_earlier_ddl_of_it() -> None:
    """The old rule (checkpoint >= B - 1) let both spans of ``DROP dst; RENAME src TO dst`` pass at once."""
    v = barrier_verdict(0, B, 1, [OtherSpan(1, B - 1)])
    assert not v.proceed and v.behind == [1]


def test_two_spans_waiting_at_one_commit_go_in_the_transactions_order() -> None:
    # the DROP (seq 0) in span 1, the RENAME onto its name (seq 1) in span 0: the DROP first
    assert barrier_verdict(1, B, 0, [OtherSpan(0, B - 1, B, 1)]).proceed
    assert barrier_verdict(0, B, 1, [OtherSpan(1, B - 1, B, 0)]).behind == [1]


def test_equal_positions_are_ordered_by_span_index() -> None:
    assert barrier_verdict(0, B, 2, [OtherSpan(1, B - 1, B, 2)]).proceed
    assert not barrier_verdict(1, B, 2, [OtherSpan(0, B - 1, B, 2)]).proceed


def test_a_span_waiting_at_an_earlier_commit_is_waited_for_and_one_at_a_later_commit_is_past_this_one() -> None:
    assert barrier_verdict(0, B, 0, [OtherSpan(1, B - 11, B - 10, 5)]).behind == [1]
    assert barrier_verdict(0, B, 0, [OtherSpan(1, B + 9, B + 10, 0)]).proceed


def test_a_ddl_without_a_position_meeting_another_span_at_its_commit_is_refused_and_the_other_waits() -> None:
    v = barrier_verdict(0, B, UNORDERED, [OtherSpan(1, B - 1, B, 4), OtherSpan(2, B)])
    assert v.unordered == [1] and not v.proceed
    assert barrier_verdict(1, B, 4, [OtherSpan(0, B - 1, B, UNORDERED)]).behind == [0]  # (it never guesses either)
    assert barrier_verdict(0, B, UNORDERED, [OtherSpan(1, B - 1)]).behind == [1]
    assert barrier_verdict(0, B, UNORDERED, [OtherSpan(1, B)]).proceed


def test_the_position_of_an_event() -> None:
    ev = DdlEvent(B, 0.0, TableName("public", "t"), (DdlChange(DdlKind.DROP_TABLE),), None, None, "DROP TABLE t", 3)
    assert barrier_position(ev) == (B, 3)
    local = DdlEvent(B, 0.0, ev.table, ev.changes, None, None, "", 3, seq_local=True)
    assert barrier_position(local) == (B, UNORDERED)


class Span:
    """A span of the model: its name-changing DDLs at commit ``B`` (seqs), and what it would store in etcd."""

    def __init__(self, index: int, ddls: list[tuple[int, int]]) -> None:
        self.index = index
        ddls = sorted(ddls)  # its stream order
        self.todo = [seq for _, seq in ddls]
        self.commits = [ts for ts, _ in ddls]  # commit Ts of its DDLs, parallel to todo (B, or a later commit)
        self.checkpoint = B - 5
        self.waiting: tuple[int, int] | None = None

    def status(self) -> OtherSpan:
        ts, seq = self.waiting or (0, 0)
        return OtherSpan(self.index, self.checkpoint, ts, seq)


def simulate(rnd: random.Random, assignment: dict[int, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """Spans apply their name-changing DDLs ((commit, seq) each) in stream order, each one after a barrier that reads
    the others' statuses each as stored some steps ago (etcd lags, each span's status read on its own); returns the
    order in which the DDLs were applied. Fails on a deadlock: no span moves for many steps."""
    spans = [Span(i, ddls) for i, ddls in assignment.items()]
    history: list[list[OtherSpan]] = [[s.status() for s in spans]]
    applied: list[tuple[int, int]] = []
    idle = 0
    while any(s.todo or s.checkpoint < B + 100 for s in spans):
        s = rnd.choice(spans)
        stored = [history[max(0, len(history) - 1 - rnd.randrange(4))][o.index] for o in spans]  # up to 3 steps old
        moved = False
        if s.waiting is None:
            if s.todo:  # stream up to the next DDL: checkpoint just below its commit, publish where it waits
                s.checkpoint = max(s.checkpoint, s.commits[0] - 1)
                s.waiting = (s.commits[0], s.todo[0])
                moved = True
            elif s.checkpoint < B + 100:
                s.checkpoint = B + 100  # nothing left: streams past every commit
                moved = True
        else:
            ts, seq = s.waiting
            if barrier_verdict(s.index, ts, seq, [o for o in stored if o.index != s.index]).proceed:
                applied.append(s.waiting)
                s.todo.pop(0)
                s.commits.pop(0)
                s.waiting = None
                if not s.todo or s.commits[0] > ts:
                    s.checkpoint = ts  # wrote the rest of that transaction
                moved = True
        history.append([x.status() for x in spans])
        idle = 0 if moved else idle + 1
        assert idle < 2000, f"deadlock: {[(x.index, x.checkpoint, x.waiting, x.todo) for x in spans]}"
    return applied


@pytest.mark.parametrize("seed", range(60))
def test_model_every_ddl_of_a_transaction_is_applied_in_its_order_and_nothing_deadlocks(seed: int) -> None:
    rnd = random.Random(seed)
    n_spans = rnd.randint(2, 4)
    n_ddls = rnd.randint(2, 8)
    assignment: dict[int, list[tuple[int, int]]] = {i: [] for i in range(n_spans)}
    for seq in range(n_ddls):  # the transaction's name-changing DDLs, spread over the spans
        assignment[rnd.randrange(n_spans)].append((B, seq))
    for i in range(n_spans):  # and some at a later commit
        if rnd.random() < 0.3:
            assignment[i].append((B + 10, rnd.randrange(3)))
    applied = simulate(rnd, assignment)
    assert [seq for ts, seq in applied if ts == B] == list(range(n_ddls))
    assert applied == sorted(applied)  # (later commits after every DDL of B, in their own order)
