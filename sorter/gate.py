"""A shared/exclusive gate around the capture's LevelDB handle.

plyvel releases the GIL inside LevelDB calls, so closing the database while another thread is inside a
call on it is a use-after-free. Span threads therefore make every LevelDB call inside ``shared()`` (many
at once), and the sorter closes or reopens the handle inside ``exclusive()``, which waits until no call
is in progress and holds new ones back meanwhile. Calls are per segment (~1 MB) or per range, never
per row, so the gate costs nothing measurable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Gate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._users:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
