import random

import pytest

from sorter import encoding as enc

pytestmark = pytest.mark.unit

UID = enc.span_uid("cf-1/3")


def test_span_uid_is_stable_eight_bytes_and_distinct() -> None:
    assert len(UID) == 8
    assert enc.span_uid("cf-1/3") == UID
    assert enc.span_uid("cf-1/4") != UID
    assert enc.span_uid("cf-2/3") != UID


@pytest.mark.parametrize(
    ("ts", "seq"), [(0, 0), (1, 1), (2**32, 7), (enc.U64_MAX, enc.U64_MAX), (123456789, 2**40)]
)
def test_committed_key_round_trip(ts: int, seq: int) -> None:
    key = enc.committed_key(UID, ts, seq)
    assert len(key) == enc.KEY_LEN
    assert key.startswith(enc.committed_prefix(UID))
    assert enc.decode_committed_key(key) == (UID, ts, seq)


@pytest.mark.parametrize(
    ("serial", "seq"), [(0, 0), (4_000_000_000, 3), (2**63 + 5, 2**33), (enc.U64_MAX, 1)]
)
def test_spill_key_round_trip(serial: int, seq: int) -> None:
    key = enc.spill_key(UID, serial, seq)
    assert len(key) == enc.KEY_LEN
    assert key.startswith(enc.spill_range_prefix(UID, serial))
    assert enc.decode_spill_key(key) == (UID, serial, seq)


@pytest.mark.parametrize("ts", [0, 77, enc.U64_MAX])
def test_spill_ref_key_round_trip(ts: int) -> None:
    key = enc.spill_ref_key(UID, ts)
    assert key.startswith(enc.spill_refs_prefix(UID))
    assert enc.decode_spill_ref_key(key) == (UID, ts)


def test_values_round_trip() -> None:
    assert enc.decode_header_value(enc.header_value(1700000000.125, 42)) == (1700000000.125, 42, None, {})
    spilled = enc.header_value(-1.5, enc.U64_MAX, 9, {3: 100, 2**40: 0})
    assert enc.decode_header_value(spilled) == (-1.5, enc.U64_MAX, 9, {3: 100, 2**40: 0})
    assert enc.decode_header_value(enc.header_value(2.0, 1, 0)) == (2.0, 1, 0, {})
    assert len(enc.header_value(2.0, 1)) < len(enc.header_value(2.0, 1, 0))  # the reader tells them apart
    with pytest.raises(ValueError):
        enc.header_value(1.0, 1, None, {2: 3})
    with pytest.raises(ValueError):
        enc.decode_header_value(spilled[:-1])
    assert enc.decode_spill_value(enc.spill_value(2**40, b"row")) == (2**40, b"row")
    assert enc.decode_spill_value(enc.spill_value(5, b"")) == (5, b"")
    with pytest.raises(ValueError):
        enc.decode_spill_value(b"short")


def test_byte_order_is_replay_order() -> None:
    rnd = random.Random(7)
    tuples = {
        (rnd.choice([0, 1, 255, 256, 2**32, 2**63, rnd.getrandbits(64)]), rnd.getrandbits(20))
        for _ in range(500)
    }
    keys = [enc.committed_key(UID, ts, seq) for ts, seq in tuples]
    assert [enc.decode_committed_key(k)[1:] for k in sorted(keys)] == sorted(tuples)
    # the header (seq 0) sorts before the changes of its transaction and after the previous one
    assert (
        enc.committed_key(UID, 9, enc.U64_MAX) < enc.committed_key(UID, 10, 0) < enc.committed_key(UID, 10, 1)
    )


def test_areas_and_spans_do_not_overlap() -> None:
    other = enc.span_uid("cf-1/4")
    c_end = enc.prefix_end(enc.committed_prefix(UID))
    assert c_end is not None
    for key in (
        enc.committed_key(other, 5, 1),
        enc.spill_key(UID, 5, 1),
        enc.spill_key(other, 5, 1),
        enc.spill_ref_key(UID, 5),
    ):
        assert not (enc.committed_prefix(UID) <= key < c_end)


def test_prefix_end() -> None:
    assert enc.prefix_end(b"ab") == b"ac"
    assert enc.prefix_end(b"a\xff") == b"b"
    assert enc.prefix_end(b"\xff\xff") is None
    assert enc.prefix_end(b"") is None


def test_committed_range_bounds() -> None:
    def inside(rng: tuple[bytes, bytes], ts: int) -> bool:
        return all(rng[0] <= enc.committed_key(UID, ts, seq) < rng[1] for seq in (0, 1, enc.U64_MAX))

    rng = enc.committed_range(UID, 10, 20)
    assert rng is not None
    assert [ts for ts in (9, 10, 11, 19, 20, 21) if inside(rng, ts)] == [11, 19, 20]
    full = enc.committed_range(UID, -1, enc.U64_MAX)
    assert full is not None
    assert inside(full, 0) and inside(full, enc.U64_MAX)
    assert not (full[0] <= enc.committed_key(enc.span_uid("cf-9/0"), 5, 1) < full[1])
    assert enc.committed_range(UID, 20, 20) is None
    assert enc.committed_range(UID, 30, 20) is None
    with pytest.raises(ValueError):
        enc.committed_range(UID, -2, 5)


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_out_of_range_integers_are_rejected(bad: int) -> None:
    with pytest.raises(ValueError):
        enc.committed_key(UID, bad, 1)
    with pytest.raises(ValueError):
        enc.spill_key(UID, bad, 1)
    with pytest.raises(ValueError):
        enc.spill_value(bad, b"")
    with pytest.raises(ValueError):
        enc.header_value(1.0, bad)
    with pytest.raises(ValueError):
        enc.header_value(1.0, 1, bad)
    with pytest.raises(ValueError):
        enc.header_value(1.0, 1, 1, {bad: 1})


def test_decode_rejects_foreign_keys() -> None:
    with pytest.raises(ValueError):
        enc.decode_committed_key(enc.spill_key(UID, 1, 1))
    with pytest.raises(ValueError):
        enc.decode_spill_key(enc.committed_key(UID, 1, 1))
    with pytest.raises(ValueError):
        enc.decode_spill_ref_key(enc.committed_key(UID, 1, 1))
    with pytest.raises(ValueError):
        enc.decode_committed_key(enc.committed_key(UID, 1, 1) + b"x")
    with pytest.raises(ValueError):
        enc.decode_header_value(b"\x00" * 3)
