"""The HTTP API is safe to expose (issue 12, item 7): an in-process ``ApiServer`` over a real etcd.

Reproductions first (each failed before the fix): a 50 MB body was read whole; a request declaring a body
and sending nothing pinned a thread forever; malformed ids answered 500; the standard library's refusals
came as HTML. Then: limits (413/408/411), every malformed request a 4xx in the JSON error shape, bearer and
basic authentication on mutating routes (reads configurable), TLS and mutual TLS with a CA made here.
"""

from __future__ import annotations

import base64
import gc
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capture.api import ApiServer
from capture.changefeeds import ChangefeedService
from capture.httpguard import ApiLimits, AuthPolicy, client_tls_context, server_tls_context
from cdc.meta.etcd import EtcdClient
from cdc.meta.store import MetaStore
from playground.servers import EtcdServer, free_port
from tests.tls_material import TlsMaterial, make_tls_material

pytestmark = pytest.mark.integration

TOKEN = "t0ken-" + "x" * 26
LIMITS = ApiLimits(max_body=64 * 1024, request_timeout=1.0, idle_timeout=1.0, max_connections=16)


def start_api(etcd_server: EtcdServer, cluster_id: str, **kwargs: Any) -> ApiServer:
    client = EtcdClient([etcd_server.url], timeout=3.0)
    service = ChangefeedService(MetaStore(client, cluster_id))
    api = ApiServer(f"127.0.0.1:{free_port()}", service, lambda: {"id": "me"}, None, lambda: b"m 1\n",
                    healthy=lambda: True, limits=kwargs.pop("limits", LIMITS), **kwargs)
    api.start()
    return api


@pytest.fixture
def api(etcd_server: EtcdServer, cluster_id: str) -> Iterator[ApiServer]:
    server = start_api(etcd_server, cluster_id)
    yield server
    server.stop()


def port_of(api: ApiServer) -> int:
    return int(api.httpd.server_address[1])


def exchange(port: int, data: bytes, *, wait: float = 5.0, pause_after: float = 0.0,
             wrap: ssl.SSLContext | None = None) -> tuple[int, dict[str, Any], float]:
    """Send ``data`` on a fresh connection, read the whole answer: (status, JSON body, seconds taken)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as raw:
        sock = wrap.wrap_socket(raw, server_hostname="localhost") if wrap else raw
        sock.sendall(data)
        if pause_after:
            time.sleep(pause_after)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if _complete(b"".join(chunks)):
                    break
        except ConnectionResetError:
            pass
    answer = b"".join(chunks)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), answer[:200]
    return int(head.split()[1]), json.loads(body or b"null"), time.monotonic() - t0


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def assert_json_error(status: int, body: Any, expected: int, code: str | None = None) -> None:
    assert status == expected, (status, body)
    assert set(body) == {"error_code", "error_msg"}, body
    if code:
        assert body["error_code"] == code, body


def request(port: int, method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}\r\n").encode() + body


# ---- reproductions ------------------------------------------------------------------------------------
def test_a_50mb_body_is_refused_unread(api: ApiServer) -> None:
    head = b"POST /api/v2/changefeeds HTTP/1.1\r\nHost: x\r\nContent-Length: 52428800\r\n\r\n"
    status, body, took = exchange(port_of(api), head + b"{" + b" " * 1_000_000)
    assert_json_error(status, body, 413, "CDC:ErrRequestTooLarge")
    assert "52428800" in body["error_msg"] and took < 3
    # Expect: 100-continue is refused before the client sends anything
    head = b"PUT /api/v2/changefeeds/a HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\nExpect: 100-continue\r\n\r\n"
    status, body, _ = exchange(port_of(api), head)
    assert_json_error(status, body, 413, "CDC:ErrRequestTooLarge")


def test_a_promised_body_that_never_comes_does_not_pin_a_thread(api: ApiServer) -> None:
    before = threading.active_count()
    head = b"POST /api/v2/changefeeds HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n{"
    status, body, took = exchange(port_of(api), head)
    assert_json_error(status, body, 408, "CDC:ErrRequestTimeout")
    assert took < LIMITS.request_timeout + 2, took
    # headers that trickle in (slowloris): 408 at the request deadline, not one idle timeout per byte
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /api/v2/health HTTP/1.1\r\n")
        answer = b""
        for _ in range(20):
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
            time.sleep(0.3)
            sock.setblocking(False)
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
            sock.setblocking(True)
            if answer:
                break
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert time.monotonic() - t0 < LIMITS.request_timeout + 1.5
    # an idle connection that sends nothing at all is closed too
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as sock:
        sock.recv(65536)  # 408 or EOF, within the deadline (the socket timeout is 5 s)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= before, threading.enumerate()


@pytest.mark.parametrize("method,path", [
    ("GET", "/api/v2/changefeeds/a_b"),
    ("GET", "/api/v2/changefeeds/%20"),
    ("POST", "/api/v2/changefeeds/a%2Fb/pause"),
    ("POST", "/api/v2/changefeeds/-x/resume"),
    ("DELETE", "/api/v2/changefeeds/" + "a" * 65),
    ("PUT", "/api/v2/changefeeds/%00"),
    ("GET", "/api/v2/processors/x_y/some-capture"),
    ("GET", "/api/v2/processors/ok/%2E%2E"),
    ("POST", "/api/v2/captures/%E2%9C%93/drain"),
])
def test_malformed_ids_answer_400_not_500(api: ApiServer, method: str, path: str) -> None:
    body = b'{"target_ts": 1}' if method == "PUT" else b""
    status, answer, _ = exchange(port_of(api), request(port_of(api), method, path, body))
    assert_json_error(status, answer, 400, "CDC:ErrInvalidArgument")


@pytest.mark.parametrize("data,expected", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET / HTTP/9.9\r\n\r\n", 505),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /api/v2/health HTTP/1.1\r\nX: " + b"y" * 70000 + b"\r\n\r\n", 431),
    (b"PATCH /api/v2/changefeeds HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    (b"BREW /api/v2/captures HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    (b"HEAD /api/v2/nothing HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 404),
    (b"POST /api/v2/changefeeds HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411),
    (b"POST /api/v2/changefeeds HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST /api/v2/changefeeds HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
])
def test_malformed_requests_answer_json_4xx(api: ApiServer, data: bytes, expected: int) -> None:
    if data.startswith(b"HEAD"):
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as sock:
            sock.sendall(data)
            assert sock.recv(65536).startswith(b"HTTP/1.1 404")
        return
    status, body, _ = exchange(port_of(api), data)
    assert_json_error(status, body, expected)


@pytest.mark.parametrize("body,fragment", [
    (b"[" * 30_000 + b"]" * 30_000, "not JSON"),
    (b'{"changefeed_id": "x", "target_ts": ' + b"9" * 5000 + b"}", "not JSON"),
    (b'{"changefeed_id": "x", "upstream_uri": "postgresql://u@h/d", "sink_uri": "blackhole://", '
     b'"target_ts": 1e400}', "target_ts"),
    (b'{"changefeed_id": "x", "upstream_uri": "postgresql://u@h/d", "sink_uri": "blackhole://", '
     b'"target_ts": 1.5}', "target_ts"),
    (b'{"changefeed_id": {"a": 1}, "upstream_uri": "postgresql://u@h/d", "sink_uri": "blackhole://"}',
     "changefeed_id"),
    (b'{"changefeed_id": "x", "upstream_uri": ["a"], "sink_uri": "blackhole://"}', "upstream_uri"),
    (b'{"changefeed_id": "x", "upstream_uri": "postgresql://u@h/d", "sink_uri": "blackhole://", '
     b'"config": 5}', "config"),
    (b'{"changefeed_id": "x", "upstream_uri": "postgresql://u@h/d", "sink_uri": "blackhole://", '
     b'"target_ts": ' + str(1 << 70).encode() + b"}", "target_ts"),
    (b"\xff\xfe", "not JSON"),
])
def test_malformed_bodies_answer_400(api: ApiServer, body: bytes, fragment: str) -> None:
    status, answer, _ = exchange(port_of(api), request(port_of(api), "POST", "/api/v2/changefeeds", body),
                                 wait=10)
    assert_json_error(status, answer, 400)
    assert fragment in answer["error_msg"], answer


def test_keep_alive_still_works(api: ApiServer) -> None:
    data = request(port_of(api), "GET", "/api/v2/health") * 3
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as sock:
        sock.sendall(data)
        got = b""
        while got.count(b"HTTP/1.1 200") < 3:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk


def test_every_connection_sends_without_waiting_for_acks(api: ApiServer) -> None:
    """An answer is two writes (headers, body). With Nagle's algorithm the body waited for the client's delayed ACK of
    the headers: ~40 ms on every request of a kept-alive connection (the API fuzz test's 300 requests spent 12 s on
    it). The server's end of a connection has TCP_NODELAY (found among this process's sockets by its peer address)."""
    with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as sock:
        sock.sendall(request(port_of(api), "GET", "/api/v2/health"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        mine = sock.getsockname()

        def peer(s: socket.socket) -> Any:
            try:
                return s.getpeername()
            except OSError:
                return None
        served = [s for s in gc.get_objects() if isinstance(s, socket.socket) and s.fileno() >= 0 and peer(s) == mine]
        assert served, "the server's end of the connection was not found"
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in served)


# ---- authentication -------------------------------------------------------------------------------------
def call(url: str, method: str, path: str, headers: dict[str, str] | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=b"{}" if method != "GET" else None, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_token_required_for_mutations_reads_configurable(etcd_server: EtcdServer, cluster_id: str) -> None:
    api = start_api(etcd_server, cluster_id, auth=AuthPolicy(tokens=("old-" + TOKEN, TOKEN)))
    url = f"http://127.0.0.1:{port_of(api)}"
    try:
        for method, path in [("POST", "/api/v2/changefeeds/nope/pause"), ("DELETE", "/api/v2/changefeeds/nope"),
                             ("PUT", "/api/v2/changefeeds/nope"), ("POST", "/api/v2/owner/resign"),
                             ("POST", "/api/v2/captures/c1/drain"), ("POST", "/api/v2/changefeeds")]:
            status, body = call(url, method, path)
            assert_json_error(status, body, 401, "CDC:ErrUnauthorized")
            status, body = call(url, method, path, {"Authorization": "Bearer wrong-" + TOKEN})
            assert_json_error(status, body, 401, "CDC:ErrUnauthorized")
        ok_bearer = {"Authorization": f"Bearer {TOKEN}"}
        status, body = call(url, "POST", "/api/v2/changefeeds/nope/pause", ok_bearer)
        assert_json_error(status, body, 404, "CDC:ErrChangefeedNotFound")  # authenticated: reached the handler
        basic = base64.b64encode(f"admin:old-{TOKEN}".encode()).decode()
        status, body = call(url, "DELETE", "/api/v2/changefeeds/nope", {"Authorization": f"Basic {basic}"})
        assert_json_error(status, body, 404, "CDC:ErrChangefeedNotFound")
        # reads stay open by default
        assert call(url, "GET", "/api/v2/changefeeds") == (200, {"total": 0, "items": []})
        # the unauthenticated body is not read: a huge one is refused at once
        status, body, took = exchange(port_of(api), b"POST /api/v2/changefeeds HTTP/1.1\r\nContent-Length: 999\r\n\r\n")
        assert status == 401 and took < 1
    finally:
        api.stop()
    api = start_api(etcd_server, cluster_id, auth=AuthPolicy(tokens=(TOKEN,), protect_reads=True))
    url = f"http://127.0.0.1:{port_of(api)}"
    try:
        for path in ("/api/v2/changefeeds", "/api/v2/status", "/metrics", "/api/v2/captures"):
            status, body = call(url, "GET", path)
            assert_json_error(status, body, 401, "CDC:ErrUnauthorized")
        assert call(url, "GET", "/api/v2/changefeeds", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert call(url, "GET", "/api/v2/health") == (200, {"status": "ok"})  # probes stay open
    finally:
        api.stop()


# ---- TLS --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(Path(tmp_path_factory.mktemp("tls")))


def test_tls_and_mutual_tls(etcd_server: EtcdServer, cluster_id: str, tls: TlsMaterial) -> None:
    ctx = server_tls_context(str(tls.server_cert), str(tls.server_key), str(tls.ca_cert), require_client_cert=True)
    api = start_api(etcd_server, cluster_id, tls=ctx)
    url = f"https://localhost:{port_of(api)}"
    try:
        with_cert = client_tls_context(str(tls.ca_cert), str(tls.client_cert), str(tls.client_key))
        assert call(url, "GET", "/api/v2/health", context=with_cert) == (200, {"status": "ok"})
        # no client certificate: refused in the handshake
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            call(url, "GET", "/api/v2/health", context=client_tls_context(str(tls.ca_cert)))
        # a server certificate from another CA is refused by the client
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            call(url, "GET", "/api/v2/health", context=client_tls_context(str(tls.other_ca_cert),
                                                                           str(tls.client_cert),
                                                                           str(tls.client_key)))
        # a client that connects and never handshakes blocks nobody and is dropped at the deadline
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as idle:
            t0 = time.monotonic()
            assert call(url, "GET", "/api/v2/health", context=with_cert)[0] == 200
            assert idle.recv(100) == b"" and time.monotonic() - t0 < LIMITS.request_timeout + 2
        # plain HTTP to the TLS port: closed, not hung
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as plain:
            plain.sendall(b"GET /api/v2/health HTTP/1.1\r\n\r\n")
            plain.recv(100)  # a TLS alert or EOF at once; a hang would raise socket.timeout
    finally:
        api.stop()


def test_connections_beyond_the_limit_are_closed_and_slots_come_back(etcd_server: EtcdServer,
                                                                      cluster_id: str) -> None:
    limits = ApiLimits(max_body=4096, request_timeout=3.0, idle_timeout=3.0, max_connections=2)
    api = start_api(etcd_server, cluster_id, limits=limits)
    port = port_of(api)
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        time.sleep(0.2)  # both accepted and holding a slot
        with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
            third.sendall(request(port, "GET", "/api/v2/health"))
            assert third.recv(100) == b""
        # closed at once, not queued until a slot freed: the idle ones still hold theirs (no 408 yet). By order, not
        # by a clock: a queued third would have been served only after an idle one was dropped with its 408.
        for sock in idle:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(100)
            sock.setblocking(True)
        for sock in idle:  # the idle ones are dropped at their deadline, freeing the slots
            assert sock.recv(65536).startswith(b"HTTP/1.1 408")
            sock.close()
        time.sleep(0.2)
        status, body, _ = exchange(port, request(port, "GET", "/api/v2/health"))
        assert (status, body) == (200, {"status": "ok"})
    finally:
        api.stop()


def test_an_unread_body_never_becomes_the_next_request(api: ApiServer) -> None:
    smuggled = b"GET /api/v2/health HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    for head in (b"POST /api/v2/changefeeds HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                 b"POST /api/v2/changefeeds HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                 b"POST /api/v2/changefeeds HTTP/1.1\r\nContent-Length: 999999\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port_of(api)), timeout=5) as sock:
            sock.sendall(head + smuggled)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        assert got.count(b"HTTP/1.1 ") == 1 and not got.startswith(b"HTTP/1.1 200"), got
