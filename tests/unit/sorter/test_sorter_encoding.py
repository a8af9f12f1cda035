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


@pytest.mark.parametrize("ts", [0, 1, 2**32, 123456789, enc.U64_MAX])
def test_segment_key_round_trip(ts: int) -> None:
    key = enc.segment_key(UID, ts)
    assert len(key) == enc.KEY_LEN
    assert key.startswith(enc.committed_prefix(UID))
    assert enc.decode_segment_key(key) == (UID, ts)


def test_byte_order_is_replay_order_and_spans_do_not_overlap() -> None:
    rnd = random.Random(7)
    tss = {rnd.choice([0, 1, 255, 256, 2**32, 2**63, rnd.getrandbits(64)]) for _ in range(500)}
    keys = [enc.segment_key(UID, ts) for ts in tss]
    assert [enc.decode_segment_key(k)[1] for k in sorted(keys)] == sorted(tss)
    end = enc.prefix_end(enc.committed_prefix(UID))
    assert end is not None
    other = enc.segment_key(enc.span_uid("cf-1/4"), 5)
    assert not (enc.committed_prefix(UID) <= other < end)


def test_prefix_end() -> None:
    assert enc.prefix_end(b"ab") == b"ac"
    assert enc.prefix_end(b"a\xff") == b"b"
    assert enc.prefix_end(b"\xff\xff") is None
    assert enc.prefix_end(b"") is None


def test_check_range() -> None:
    assert enc.check_range(-1, 0)
    assert enc.check_range(10, 2**70)
    assert not enc.check_range(20, 20)
    assert not enc.check_range(30, 20)
    assert not enc.check_range(enc.U64_MAX, 2**70)
    for bad in ((-2, 5), (0, -1)):
        with pytest.raises(ValueError):
            enc.check_range(*bad)


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_out_of_range_integers_are_rejected(bad: int) -> None:
    with pytest.raises(ValueError):
        enc.segment_key(UID, bad)
    with pytest.raises(ValueError):
        enc.check_u64("x", bad)
    with pytest.raises(ValueError):
        enc.pack_spill_chunk([bad], [b"x"])


def test_decode_rejects_foreign_keys() -> None:
    with pytest.raises(ValueError):
        enc.decode_segment_key(enc.segment_key(UID, 1) + b"x")
    with pytest.raises(ValueError):
        enc.decode_segment_key(b"U" + enc.segment_key(UID, 1)[1:])


def test_segment_round_trip() -> None:
    rnd = random.Random(3)
    txns = [
        (rnd.getrandbits(64), rnd.random() * 2e9, [rnd.randbytes(rnd.randrange(0, 300)) for _ in range(rnd.randrange(1, 9))])
        for _ in range(50)
    ]
    txns.append((5, -1.5, [b""]))
    assert enc.unpack_segment(enc.pack_segment(txns)) == txns
    assert enc.unpack_segment(enc.pack_segment([])) == []


def test_malformed_segments_are_rejected() -> None:
    value = enc.pack_segment([(1, 1.0, [b"abc", b"de"]), (2, 2.0, [b"f"])])
    for bad in (b"", value[:3], value[:20], value[:-1]):
        with pytest.raises(ValueError):
            enc.unpack_segment(bad)


def test_spill_chunk_round_trip() -> None:
    subs = [1, 2**40, enc.U64_MAX, 0]
    payloads = [b"row", b"", b"x" * 1000, b"\x00\xff"]
    chunk = enc.pack_spill_chunk(subs, payloads)
    nrows, size = enc.spill_chunk_sizes(chunk[: enc.COUNTS.size])
    assert nrows == 4 and size == len(chunk) - enc.COUNTS.size
    got_subs, got_payloads = enc.unpack_spill_chunk(nrows, chunk[enc.COUNTS.size :])
    assert list(got_subs) == subs and got_payloads == payloads
    with pytest.raises(ValueError):
        enc.unpack_spill_chunk(nrows, chunk[enc.COUNTS.size : -1])
