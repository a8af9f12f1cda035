"""Fixtures of the processor's unit tests."""

from __future__ import annotations

from typing import Any

import pytest

from processor.source_process import ChildSpanSource
from processor.span import SpanRunner


@pytest.fixture(params=["thread", "process"])
def source_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A span test marked ``usefixtures("source_mode")`` runs twice: its runners' sources in a thread, then each
    (one that ``runs_in_child``) in a process of its own behind ``processor.source_process.ChildSpanSource``, as
    the processor wraps it with ``puller-process = true``."""
    if request.param == "process":
        init = SpanRunner.__init__

        def wrapped(self: SpanRunner, label: str, start: Any, source: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(source, "runs_in_child", False):
                source = ChildSpanSource(source, label)
            init(self, label, start, source, *args, **kwargs)

        monkeypatch.setattr(SpanRunner, "__init__", wrapped)
    return str(request.param)
