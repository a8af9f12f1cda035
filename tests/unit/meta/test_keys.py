from __future__ import annotations

import pytest

from cdc.meta import keys
from cdc.meta.keys import EtcdKey, KeyKind, parse_key

pytestmark = pytest.mark.unit

C = "prod-1"

SAMPLES = [
    (
        EtcdKey(KeyKind.CAPTURE, C, capture="0b7f-4c1e.host:8300"),
        "/tidewater/prod-1/__cdc_meta__/capture/0b7f-4c1e.host:8300",
    ),
    (
        EtcdKey(KeyKind.OWNER, C, owner_lease=0x694D8B2F7A1C0001),
        "/tidewater/prod-1/__cdc_meta__/owner/694d8b2f7a1c0001",
    ),
    (
        EtcdKey(KeyKind.CHANGEFEED_INFO, C, changefeed="orders-to-kafka"),
        "/tidewater/prod-1/changefeed/info/orders-to-kafka",
    ),
    (EtcdKey(KeyKind.CHANGEFEED_STATUS, C, changefeed="cf1"), "/tidewater/prod-1/changefeed/status/cf1"),
    (
        EtcdKey(KeyKind.SPAN_ASSIGNMENT, C, changefeed="cf1", span=0),
        "/tidewater/prod-1/changefeed/assign/cf1/0",
    ),
    (EtcdKey(KeyKind.SPAN_STATUS, C, changefeed="cf1", span=12), "/tidewater/prod-1/changefeed/span/cf1/12"),
    (EtcdKey(KeyKind.SCHEMA_HISTORY, C, changefeed="cf1", relid=16384), "/tidewater/prod-1/schema/cf1/16384"),
]


@pytest.mark.parametrize(("key", "raw"), SAMPLES, ids=[k.kind.value for k, _ in SAMPLES])
def test_encode_and_parse_round_trip(key: EtcdKey, raw: str) -> None:
    assert key.encode() == raw
    assert parse_key(raw) == key
    assert parse_key(key.encode()).encode() == raw


def test_helpers_agree_with_codec() -> None:
    assert keys.capture_key(C, "a1") == EtcdKey(KeyKind.CAPTURE, C, capture="a1").encode()
    assert keys.owner_key(C, 255).endswith("/owner/ff")
    assert keys.owner_key(C, 255).startswith(keys.owner_prefix(C))
    assert keys.capture_key(C, "a1").startswith(keys.capture_prefix(C))
    assert keys.changefeed_info_key(C, "cf").startswith(keys.changefeed_info_prefix(C))
    assert keys.assignment_key(C, "cf", 3).startswith(keys.assignment_prefix(C, "cf"))
    assert keys.span_status_key(C, "cf", 3).startswith(keys.span_status_prefix(C, "cf"))
    assert keys.changefeed_status_key(C, "cf") == "/tidewater/prod-1/changefeed/status/cf"
    # Every key of the cluster is under the cluster prefix; prefixes end with '/' so ids never overlap.
    for _, raw in SAMPLES:
        assert raw.startswith(keys.cluster_prefix(C))
        assert not raw.startswith(keys.cluster_prefix("prod"))
    assert not keys.assignment_key(C, "cf10", 1).startswith(keys.assignment_prefix(C, "cf1"))


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "/tidb/cdc/default/__cdc_meta__/capture/x",  # foreign root
        "/tidewater",
        "/tidewater/",
        "/tidewater/prod-1",
        "/tidewater/prod-1/",
        "/tidewater/prod_1/changefeed/info/cf",  # bad cluster id
        "/tidewater/prod-1/__cdc_meta__/capture/",  # empty capture id
        "/tidewater/prod-1/__cdc_meta__/capture/a/b",  # extra segment
        "/tidewater/prod-1/__cdc_meta__/owner/",
        "/tidewater/prod-1/__cdc_meta__/owner/0",  # zero lease
        "/tidewater/prod-1/__cdc_meta__/owner/00ff",  # not canonical hex
        "/tidewater/prod-1/__cdc_meta__/owner/FF",  # upper case is not what encode writes
        "/tidewater/prod-1/__cdc_meta__/owner/xyz",
        "/tidewater/prod-1/__cdc_meta__/other/x",
        "/tidewater/prod-1/changefeed/info/",
        "/tidewater/prod-1/changefeed/info/cf/1",  # info takes no span
        "/tidewater/prod-1/changefeed/info/-cf",  # bad changefeed id
        "/tidewater/prod-1/changefeed/info/cf--x",
        "/tidewater/prod-1/changefeed/status/cf/",
        "/tidewater/prod-1/changefeed/assign/cf",  # span missing
        "/tidewater/prod-1/changefeed/assign/cf/",
        "/tidewater/prod-1/changefeed/assign/cf/01",  # not canonical
        "/tidewater/prod-1/changefeed/assign/cf/-1",
        "/tidewater/prod-1/changefeed/assign/cf/+1",
        "/tidewater/prod-1/changefeed/span/cf/1/2",
        "/tidewater/prod-1/changefeed/span/cf/x",
        "/tidewater/prod-1/changefeed/job/cf",  # unknown kind
        "/tidewater/prod-1/schema/cf/0",  # no table has oid 0
        "/tidewater/prod-1/schema/cf/01",
        "/tidewater/prod-1/schema/cf/1/2",
        "/tidewater/prod-1/changefeed/info/cf ",
    ],
)
def test_parse_rejects_foreign_and_malformed_keys(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_key(raw)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": KeyKind.CAPTURE, "cluster": C},  # no capture id
        {"kind": KeyKind.CAPTURE, "cluster": C, "capture": "a/b"},
        {"kind": KeyKind.CAPTURE, "cluster": C, "capture": "a", "changefeed": "cf"},
        {"kind": KeyKind.OWNER, "cluster": C},  # no lease
        {"kind": KeyKind.OWNER, "cluster": C, "owner_lease": -5},
        {"kind": KeyKind.CHANGEFEED_INFO, "cluster": C, "changefeed": "a/b"},
        {"kind": KeyKind.CHANGEFEED_INFO, "cluster": C, "changefeed": "cf", "span": 1},
        {"kind": KeyKind.SPAN_STATUS, "cluster": C, "changefeed": "cf"},  # no span
        {"kind": KeyKind.SPAN_ASSIGNMENT, "cluster": C, "changefeed": "cf", "span": 0, "owner_lease": 1},
        {"kind": KeyKind.CHANGEFEED_STATUS, "cluster": "a/b", "changefeed": "cf"},
        {"kind": KeyKind.CHANGEFEED_STATUS, "cluster": "", "changefeed": "cf"},
        {"kind": KeyKind.SCHEMA_HISTORY, "cluster": C, "changefeed": "cf"},  # no table oid
        {"kind": KeyKind.SPAN_STATUS, "cluster": C, "changefeed": "cf", "span": 1, "relid": 5},
    ],
)
def test_invalid_keys_cannot_be_built(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EtcdKey(**kwargs)  # type: ignore[arg-type]


def test_prefix_helpers_validate_ids() -> None:
    with pytest.raises(ValueError):
        keys.cluster_prefix("a/b")
    with pytest.raises(ValueError):
        keys.assignment_prefix(C, "")
