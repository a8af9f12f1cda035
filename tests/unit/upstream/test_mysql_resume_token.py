"""The MySQL/MariaDB resume vocabulary (upstream.mysql.resume, upstream.mysql.positions): the Ts epoch keeps a moved
changefeed's Ts above every Ts of its old server and leaves old Ts as they were; GTID states parse, compare and name
what a server lacks; tokens round-trip and refuse what is not one; a SpanStatus stored before tokens decodes."""

from __future__ import annotations

import pytest

from cdc import serde
from cdc.errors import DecodeError
from cdc.model import SpanStatus
from upstream.mysql.positions import MAX_EPOCH, epoch_of, split_ts, to_ts
from upstream.mysql.resume import GtidState, ResumePoint

pytestmark = pytest.mark.unit


def test_epoch_zero_is_the_encoding_checkpoints_were_stored_with() -> None:
    assert to_ts("mariadb-bin.000042", 4000) == (42 << 32) | 4000 == to_ts("mariadb-bin.000042", 4000, 0)
    assert split_ts(to_ts("mariadb-bin.000042", 4000, 3)) == (42, 4000)
    assert epoch_of((42 << 32) | 4000) == 0 and epoch_of(to_ts("x.000001", 4, 3)) == 3


def test_every_ts_of_a_later_epoch_is_above_every_ts_of_an_earlier_one() -> None:
    old_highest = to_ts(f"mariadb-bin.{(1 << 24) - 1:06d}", (1 << 32) - 1, 0)
    new_lowest = to_ts("mariadb-bin.000001", 4, 1)
    assert new_lowest > old_highest
    assert to_ts("b.000001", 4, MAX_EPOCH) < 1 << 64  # the sorter's u64
    with pytest.raises(DecodeError):
        to_ts("b.000001", 4, MAX_EPOCH + 1)
    with pytest.raises(DecodeError, match="24 bits"):
        to_ts(f"b.{1 << 24}", 4)


def test_gtid_states_name_what_a_server_lacks_and_what_its_binlog_no_longer_holds() -> None:
    wanted = GtidState.parse("0-1-42,1-5-7")
    assert str(wanted) == "0-1-42,1-5-7" and str(GtidState.parse("")) == ""
    assert wanted.missing_in(GtidState.parse("0-2-50,1-5-7")) == []
    assert wanted.missing_in(GtidState.parse("0-1-40")) == [
        "domain 0: 0-?-41 .. 0-1-42 (the server is at 0-1-40)",
        "domain 1: every GTID up to 1-5-7 (the server has none of domain 1)"]
    assert wanted.after(GtidState.parse("0-1-42")) == []  # the oldest binlog starts right after it: held
    assert wanted.after(GtidState.parse("")) == []
    assert wanted.after(GtidState.parse("0-1-43")) == [
        "domain 0: the oldest binlog starts after 0-1-43, past 0-1-42"]
    for bad in ("0-1", "a-1-2", "0-1-2,0-1-3"):
        with pytest.raises(DecodeError):
            GtidState.parse(bad)


def test_tokens_round_trip_and_refuse_what_is_not_one() -> None:
    p = ResumePoint(1, 2, "mariadb-bin.000003", 1234, "0-1-42")
    assert ResumePoint.decode(p.encode()) == p
    for bad in ("", "{}", "[1]", '{"epoch":0,"server_id":1,"file":"f","pos":4,"gtid":"x"}', "0/ABC"):
        with pytest.raises(DecodeError):
            ResumePoint.decode(bad)


def test_a_span_status_stored_before_tokens_decodes_without_one() -> None:
    old = '{"capture_id": "c", "epoch": 3, "checkpoint_ts": 77, "checkpoint_time": 1.5, "running": false}'
    st = serde.from_json(SpanStatus, old)
    assert st.checkpoint_ts == 77 and st.resume_token is None
    new = SpanStatus("c", 3, 78, resume_token='{"gtid":"0-1-1"}')
    assert serde.from_json(SpanStatus, serde.to_json(new)) == new
