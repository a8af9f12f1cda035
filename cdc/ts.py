"""Ts: the 64-bit commit order of one upstream, and the wall-clock time it stands for.

PostgreSQL: a Ts is the commit's end LSN. ``Watermark`` pairs a Ts with the upstream wall-clock time
(unix seconds) at which every commit ``<= ts`` had been made, so lag = ``now - time`` also when idle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def lsn_to_str(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def str_to_lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    if not lo:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass(frozen=True, slots=True)
class Watermark:
    ts: int
    time: float  # unix seconds of the upstream moment this Ts stands for

    def lag(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.time)

    def max(self, other: Watermark) -> Watermark:
        return other if other.ts > self.ts else self


ZERO = Watermark(0, 0.0)
