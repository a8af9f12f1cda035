"""owner.table_pickup.collision_key: when two target names are one table in the sink."""

from __future__ import annotations

import pytest

from owner.table_pickup import collision_key


@pytest.mark.parametrize(("uri", "a", "b", "same"), [
    ("sqlite:////tmp/x.db", "Mixed", "mixed", True),
    ("sqlite:////tmp/x.db", "Ä", "ä", False),  # SQLite folds ASCII letters only
    ("SQLite:////tmp/x.db", "T", "t", True),
    ("mysql://u@h/db", "Straße", "STRASSE", True),
    ("mariadb://u@h/db", "T", "t", True),
    ("postgresql://u@h/db", "public.T", "public.t", False),
    ("blackhole://", "a.T", "a.t", False),
])
def test_collision_key(uri: str, a: str, b: str, same: bool) -> None:
    assert (collision_key(uri, a) == collision_key(uri, b)) is same
