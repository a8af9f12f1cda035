"""Spill files: the changes of one open transaction that outgrew its memory buffer, on disk.

A spill file is append-only: the puller appends chunks of (subxid, payload) records while the
transaction is open (``append`` opens, writes and closes the file, so no descriptor stays open however
many transactions spill). After the commit, the sink reads it sequentially (``read``), skipping the
records of rolled-back subtransactions, and the file is deleted when the transaction is checkpointed.

Why files and not LevelDB: a streamed transaction is already in replay order (PostgreSQL sends its
changes in order), so it needs no index; plain ``read()`` calls copy the data into the process, while
LevelDB maps its table files and every page read stays resident (counted in RSS) until the files are
deleted. A 1 GB transaction therefore costs the capture a few MB of memory, not 1 GB (docs/benchmarks.md).

Durability: none (no fsync); the sorter deletes every spill file when a capture starts.
Thread-safety: one writer (the puller) while open; after the commit, readers only.
Errors: ``OSError`` from the file system, and ``ValueError`` for a truncated or malformed file; the
sorter translates both (``DiskFull`` for a full disk).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from sorter.encoding import COUNTS, pack_spill_chunk, spill_chunk_sizes, unpack_spill_chunk

_READ_BUFFER = 1 << 20


class SpillFile:
    """One transaction's spilled changes. ``records`` and ``nbytes`` count what was appended."""

    __slots__ = ("path", "records", "nbytes")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        self.nbytes = 0

    def append(self, subxids: Sequence[int], payloads: Sequence[bytes]) -> None:
        """Append one chunk; the records get indexes ``records .. records + len(payloads) - 1``."""
        if not payloads:
            return
        chunk = pack_spill_chunk(subxids, payloads)
        with open(self.path, "ab") as f:
            f.write(chunk)
        self.records += len(payloads)
        self.nbytes += len(chunk)

    def read(self, aborted: dict[int, int] | None = None) -> Iterator[bytes]:
        """The payloads in append order, without those of a subxid in ``aborted`` whose record index is
        below its watermark (the records that subtransaction had when it was rolled back)."""
        index = 0
        with open(self.path, "rb", buffering=_READ_BUFFER) as f:
            while True:
                header = f.read(COUNTS.size)
                if not header:
                    break
                if len(header) != COUNTS.size:
                    raise ValueError(f"spill file {self.path} truncated (chunk header)")
                nrows, size = spill_chunk_sizes(header)
                body = f.read(size)
                if len(body) != size:
                    raise ValueError(f"spill file {self.path} truncated ({len(body)} of {size} bytes)")
                subs, payloads = unpack_spill_chunk(nrows, body)
                del body
                if aborted:
                    get = aborted.get
                    first = index
                    payloads = [p for i, (s, p) in enumerate(zip(subs, payloads, strict=True), first)
                                if (w := get(s)) is None or i >= w]
                index += nrows
                yield from payloads

    def unlink(self) -> None:
        """Delete the file (missing is fine: it may never have been written)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
