"""capture.incarnation: one process per data directory, and the lease its previous process recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture.incarnation import LEASE_FILE, DataDirInUse, Incarnation

pytestmark = pytest.mark.unit


def test_the_recorded_lease_is_given_back_only_for_the_same_cluster_and_etcd(tmp_path: Path) -> None:
    first = Incarnation(tmp_path)
    assert first.previous_lease("c1", ["http://e1:2379"]) is None  # a fresh directory
    first.record("c1", ["http://e2:2379", "http://e1:2379"], 0x1234)
    first.close()
    again = Incarnation(tmp_path)
    try:
        assert again.previous_lease("c1", ["http://e1:2379", "http://e2:2379"]) == 0x1234  # endpoints in any order
        assert again.previous_lease("c2", ["http://e1:2379", "http://e2:2379"]) is None  # another cluster id
        assert again.previous_lease("c1", ["http://e3:2379"]) is None  # another etcd: the id means nothing there
        (tmp_path / LEASE_FILE).write_text("{not json")
        assert again.previous_lease("c1", ["http://e1:2379", "http://e2:2379"]) is None
    finally:
        again.close()


def test_a_second_holder_of_a_directory_in_use_is_refused_until_the_first_lets_go(tmp_path: Path) -> None:
    first = Incarnation(tmp_path)
    try:
        with pytest.raises(DataDirInUse, match="in use by another cdc server"):
            Incarnation(tmp_path)
    finally:
        first.close()
    Incarnation(tmp_path).close()
    first.close()  # idempotent
