"""The etcd client's request metrics: bounded operation names, and a failed request counted by gRPC code
(against a port nobody listens on: connection refused, no server needed)."""

from __future__ import annotations

import pytest

from cdc.errors import MetaStoreError
from cdc.meta.etcd import EtcdClient, op_of
from playground.servers import free_port

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("what,op", [
    ("get /tidewater/default/captures/x", "range"), ("get prefix /tidewater/default/", "range_prefix"),
    ("put /k", "put"), ("delete /k", "delete"), ("delete prefix /k/", "delete_prefix"), ("txn", "txn"),
    ("lease grant", "lease_grant"), ("lease keepalive 7f3a", "lease_keepalive"), ("lease revoke 7f3a", "lease_revoke"),
])
def test_operation_names_drop_keys_and_ids(what: str, op: str) -> None:
    assert op_of(what) == op


def test_failed_request_is_timed_and_counted_by_code() -> None:
    client = EtcdClient([f"http://127.0.0.1:{free_port()}"], timeout=0.3)
    try:
        with pytest.raises(MetaStoreError):
            client.get("/some/key")
    finally:
        client.close()
    assert client.stats.errors == {("range", "UNAVAILABLE"): 1}
    h = client.stats.latency["range"]
    assert h.count == 1 and 0 < h.sum < 5
