"""Fuzzing the HTTP API with schemathesis (issue 12, item 7): cases generated from the ``openapi.json`` a
real `cdc server` serves (valid and invalid ones, every operation) are sent to it; every answer must come
(a request unanswered after ``HANG`` seconds fails as a hang), never be a 500, and every error be in the JSON
error shape. Bounded by count: a fixed number of examples per operation, derandomized (the same cases every
run). No assertion on elapsed time (how fast the answers are depends on the host's load); the run prints its
duration and slowest answer. Owner resign is fuzzed too (one capture: it wins again)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from e2e_workload import server_config
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from playground.cluster import CdcServer
from playground.servers import EtcdServer

pytestmark = pytest.mark.e2e

TOKEN = "fuzz-token-" + "f" * 24
EXAMPLES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 12}
HANG = 120.0  # seconds without an answer: the server hangs (the slowest request, a create that tries to reach a
# generated host, answers within its own connect timeouts of a few seconds)


def check(response: Any, seen: dict[int, int], method: str, path: str) -> None:
    status = response.status_code
    seen[status] = seen.get(status, 0) + 1
    assert status != 500, (method, path, response.text[:500])
    assert status < 500 or status in (501, 502, 503), (method, path, status, response.text[:500])
    if status >= 400:
        body = response.json()
        assert set(body) == {"error_code", "error_msg"}, (method, path, body)
        assert body["error_code"].startswith("CDC:"), body


def fuzz(op: Any, mode: GenerationMode, n: int, url: str, session: requests.Session, seen: dict[int, int],
         slowest: list[Any]) -> int:
    """Send ``n`` generated cases of ``op``; returns how many were sent. ``slowest``: [seconds, method path]."""
    sent = 0

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=n, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        nonlocal sent
        start = time.monotonic()
        response = case.call(base_url=url, session=session, timeout=HANG,
                             headers={"Authorization": f"Bearer {TOKEN}"})
        sent += 1
        took = time.monotonic() - start
        if took > slowest[0]:
            slowest[:] = [took, f"{op.method.upper()} {op.path}"]
        check(response, seen, op.method.upper(), op.path)

    run()
    return sent


def test_api_fuzz(etcd_server: EtcdServer, cluster_id: str, tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(TOKEN + "\n")
    server = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, token=TOKEN,
                       extra_args=["--auth-token-file", str(tmp_path / "tokens"), *server_config(tmp_path)]).start()
    t0 = time.monotonic()
    seen: dict[int, int] = {}
    calls = 0
    slowest: list[Any] = [0.0, ""]
    try:
        schema = schemathesis.openapi.from_url(f"{server.url}/api/v2/openapi.json")
        session = requests.Session()
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 14
        for op in operations:
            for mode, n in EXAMPLES.items():
                try:
                    calls += fuzz(op, mode, n, server.url, session, seen, slowest)
                except Unsatisfiable:  # nothing to make invalid (no parameter or body with constraints)
                    assert mode is GenerationMode.NEGATIVE, op.path
        # the server is still healthy and nothing is left half-open
        assert server.get("/api/v2/health") == {"status": "ok"}
        assert calls > 100 and any(400 <= s < 500 for s in seen), seen
        assert "Traceback" not in server.log_tail(2000), server.log_tail(60)
    finally:
        server.terminate()
    print(f"fuzzed {calls} requests in {time.monotonic() - t0:.1f}s (slowest answer {slowest[0]:.2f}s: {slowest[1]}): "
          f"statuses {dict(sorted(seen.items()))}")
