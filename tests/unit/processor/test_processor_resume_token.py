"""The span's resume token (upstream.base.SpanSource.resume_token) is stored in SpanStatus with exactly the checkpoint
it belongs to (processor.processor._status), over fake runners and a recording store."""

from __future__ import annotations

import pytest
from test_processor_report import Clock, FakeRunner, FakeStore, make

pytestmark = pytest.mark.unit


class TokenRunner(FakeRunner):
    """A runner whose source knows the token of each Ts it passed (None for those it does not know)."""

    def __init__(self, ts: int) -> None:
        super().__init__(ts)
        self.tokens: dict[int, str] = {}
        self.asked: list[int] = []

    def resume_token(self, ts: int) -> str | None:
        self.asked.append(ts)
        return self.tokens.get(ts)


def test_the_token_is_stored_with_its_own_checkpoint_and_kept_while_the_checkpoint_stays() -> None:
    clock, store = Clock(), FakeStore()
    p, _ = make(1, clock, store)
    r = TokenRunner(100)
    p.slots[("cf", 0)].runner = r  # type: ignore[assignment]
    r.tokens = {100: "t100", 150: "t150"}
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 100 and store.stored[("cf", 0)].resume_token == "t100"
    clock.now += 5
    r.advance(150)
    p.report()
    stored = store.stored[("cf", 0)]
    assert (stored.checkpoint_ts, stored.resume_token) == (150, "t150") and r.asked[-1] == 150
    # the same checkpoint, a source that no longer knows its token (e.g. restarted): the stored one stays with it
    clock.now += 5
    r.tokens = {}
    r.advance(150, 2000.0)
    p.report()
    stored = store.stored[("cf", 0)]
    assert (stored.checkpoint_ts, stored.checkpoint_time, stored.resume_token) == (150, 2000.0, "t150")
    # a runner behind the stored checkpoint never stores its own older token under the newer checkpoint
    clock.now += 5
    r.tokens = {120: "t120"}
    r.advance(120)
    p.report()
    stored = store.stored[("cf", 0)]
    assert (stored.checkpoint_ts, stored.resume_token) == (150, "t150")
    p.close()
