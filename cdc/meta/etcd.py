"""The only module that talks to etcd: a small, typed, thread-safe client with endpoint failover.

It uses the gRPC stubs and protobuf messages of the ``etcd3`` module (package ``etcd3-fc``) directly,
not ``etcd3.Etcd3Client``'s convenience methods, because those (a) mark an endpoint as failed for 300 s
after one error and refuse to use it again, (b) drop the response header (the revision) from prefix
reads, (c) cannot compare a key's lease in a transaction, and (d) multiplex every watch on one stream
whose error handling cannot re-establish a watch. Everything here is our own small vocabulary
(:class:`KV`, :class:`Compare`, :class:`Op`, :class:`WatchEvent`); nothing from ``etcd3`` or ``grpc``
leaks out, and every failure surfaces as :class:`cdc.errors.MetaStoreError` naming the endpoint.

Failover: calls go to the current endpoint; when it is unreachable (``UNAVAILABLE``) the same call is
tried on the next endpoint, and the first endpoint that answers becomes current. Reads, puts, deletes
and lease calls are also retried elsewhere after a timeout; a transaction is not (it may have been
applied), so an ambiguous transaction failure is reported to the caller, who must re-read.

Thread-safety: one ``EtcdClient`` may be shared by all threads of a process. Reads are linearizable.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import etcd3.etcdrpc as rpc
import grpc

from cdc.errors import InvalidURI, MetaStoreError
from cdc.meta.kv import KV, Compare, Op, TxnResult, WatchEvent, WatchResponse, prefix_range_end
from cdc.stats import EtcdStats

log = logging.getLogger(__name__)

_PAGE = 2000  # keys per Range page in get_prefix (all pages at one revision)
_GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),  # etcd's --grpc-keepalive-min-time is 5 s
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


def _kv(m: Any) -> KV:
    return KV(m.key.decode(), bytes(m.value), m.create_revision, m.mod_revision, m.lease, m.version)


def _parse_endpoint(ep: str) -> str:
    text = ep.strip()
    if "://" not in text:
        text = "http://" + text
    u = urlsplit(text)
    if u.scheme != "http":
        raise InvalidURI(f"etcd endpoint {ep!r}: only http:// is supported")
    if not u.hostname or u.path not in ("", "/"):
        raise InvalidURI(f"etcd endpoint {ep!r}: expected host:port")
    try:
        port = u.port or 2379
    except ValueError as e:
        raise InvalidURI(f"etcd endpoint {ep!r}: {e}") from None
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{host}:{port}"


def _describe(e: grpc.RpcError) -> str:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    return f"{code.name if code else 'ERROR'}: {details}"


def _code(e: BaseException | None) -> grpc.StatusCode | None:
    return e.code() if isinstance(e, grpc.RpcError) and hasattr(e, "code") else None


def is_not_found(e: MetaStoreError) -> bool:
    """True if etcd answered NOT_FOUND (e.g. "requested lease not found" on a put under a dead lease)."""
    return _code(e.__cause__) == grpc.StatusCode.NOT_FOUND


# ---- the client ------------------------------------------------------------------------------------------
def op_of(what: str) -> str:
    """The operation of a ``_call`` description without its key: ``get prefix /a`` -> ``range_prefix``,
    ``lease keepalive 1f`` -> ``lease_keepalive``, ``txn`` -> ``txn`` (a bounded label value)."""
    words = what.split(" ")
    if words[0] == "get":
        return "range_prefix" if len(words) > 1 and words[1] == "prefix" else "range"
    if words[0] == "delete":
        return "delete_prefix" if len(words) > 1 and words[1] == "prefix" else "delete"
    if words[0] == "lease" and len(words) > 1:
        return f"lease_{words[1]}"
    return words[0]


class EtcdClient:
    """Thread-safe etcd v3 client over ``endpoints`` (``http://host:port`` or ``host:port``).

    ``timeout`` bounds every unary call (seconds). Every failure raises ``MetaStoreError``.
    """

    def __init__(self, endpoints: Sequence[str], timeout: float = 3.0) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise InvalidURI("no etcd endpoints given")
        self.endpoints: list[str] = [_parse_endpoint(e) for e in endpoints]
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channels: dict[int, grpc.Channel] = {}
        self._current = 0
        self._closed = False
        self._watches: set[Watch] = set()
        self.stats = EtcdStats()  # request latency and failures by operation (capture.metrics)

    @property
    def endpoint(self) -> str:
        """The endpoint (``host:port``) the client calls first now: the last one that answered."""
        return self.endpoints[self._current]

    # -- plumbing
    def _channel(self, idx: int) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise MetaStoreError("etcd client is closed")
            ch = self._channels.get(idx)
            if ch is None:
                ch = self._channels[idx] = grpc.insecure_channel(self.endpoints[idx], options=_GRPC_OPTIONS)
            return ch

    def _mark_failed(self, idx: int) -> None:
        with self._lock:
            if self._current == idx and len(self.endpoints) > 1:
                self._current = (idx + 1) % len(self.endpoints)

    def _call(self, what: str, fn: Callable[[grpc.Channel, float], Any], *, retry_timeout: bool = True,
              timeout: float | None = None) -> Any:
        """``_call_endpoints``, timed into ``stats`` under the operation's name (``op_of``), failures by the
        gRPC code of the last attempt."""
        began = time.monotonic()
        try:
            result = self._call_endpoints(what, fn, retry_timeout=retry_timeout, timeout=timeout)
        except MetaStoreError as exc:
            code = _code(exc.__cause__)
            self.stats.observe(op_of(what), time.monotonic() - began, code.name if code is not None else "UNKNOWN")
            raise
        self.stats.observe(op_of(what), time.monotonic() - began)
        return result

    def _call_endpoints(self, what: str, fn: Callable[[grpc.Channel, float], Any], *, retry_timeout: bool = True,
                        timeout: float | None = None) -> Any:
        """Run ``fn(channel, timeout)`` on the current endpoint, failing over to the next ones.

        Unreachable endpoints (and, if ``retry_timeout``, timed-out calls) are skipped; when every
        endpoint failed that way, rounds are repeated (short backoff) until ``timeout`` has passed since
        the start, which rides out an etcd restart or a gRPC reconnect. So a call takes at most about
        ``(len(endpoints) + 1) * timeout``, or ``timeout`` when endpoints refuse connections at once.
        """
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        with self._lock:
            start = self._current
        n = len(self.endpoints)
        failures: dict[str, str] = {}
        attempt = 0
        pause = 0.05
        while True:
            idx = (start + attempt) % n
            ep = self.endpoints[idx]
            attempt += 1
            per_call = budget if attempt <= n else max(deadline - time.monotonic(), 0.05)
            try:
                result = fn(self._channel(idx), per_call)
            except grpc.RpcError as e:
                code = _code(e)
                failures[ep] = _describe(e)
                failover = code == grpc.StatusCode.UNAVAILABLE or (
                    retry_timeout and code == grpc.StatusCode.DEADLINE_EXCEEDED)
                if failover:
                    self._mark_failed(idx)
                    if attempt % n == 0:  # a full round failed: back off a little, then go round again
                        left = deadline - time.monotonic()
                        if left > pause:
                            time.sleep(pause)
                            pause = min(pause * 2, 0.5)
                            continue
                    else:
                        log.warning("etcd %s failed on %s (%s), trying the next endpoint", what, ep, failures[ep])
                        continue
                detail = "; ".join(f"{k}: {v}" for k, v in failures.items())
                raise MetaStoreError(f"etcd {what} failed: {detail}", cause=e)  # noqa: B904
            else:
                if idx != start:
                    with self._lock:
                        self._current = idx
                return result

    # -- reads
    def get(self, key: str) -> KV | None:
        """The current value of ``key`` (linearizable read), or None."""
        req = rpc.RangeRequest(key=key.encode())
        resp = self._call(f"get {key}", lambda ch, t: rpc.KVStub(ch).Range(req, t))
        return _kv(resp.kvs[0]) if resp.kvs else None

    def get_prefix(self, prefix: str, *, below: str | None = None) -> tuple[int, list[KV]]:
        """Every key under ``prefix`` (and, with ``below``, lower than it) in key order, all read at one
        revision, which is returned.

        Large ranges are read in pages pinned to the first page's revision (a consistent snapshot).
        """
        if not prefix:
            raise ValueError("empty prefix")
        start = prefix.encode()
        end = prefix_range_end(start) if below is None else min(prefix_range_end(start), below.encode())
        for _ in range(3):
            revision = 0
            out: list[KV] = []
            key = start
            try:
                while True:
                    req = rpc.RangeRequest(key=key, range_end=end, limit=_PAGE, revision=revision)
                    resp = self._call(f"get prefix {prefix}",
                                      lambda ch, t, req=req: rpc.KVStub(ch).Range(req, t))
                    if revision == 0:
                        revision = resp.header.revision
                    out.extend(_kv(m) for m in resp.kvs)
                    if not resp.more or not resp.kvs:
                        return revision, out
                    key = resp.kvs[-1].key + b"\0"
            except MetaStoreError as e:
                # Compaction between two pages: start over at a newer revision.
                if revision and _code(e.__cause__) == grpc.StatusCode.OUT_OF_RANGE:
                    continue
                raise
        raise MetaStoreError(f"etcd get prefix {prefix}: revision compacted repeatedly while paging")

    # -- writes
    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Store ``value`` at ``key`` (attached to ``lease`` unless 0). Returns the new revision."""
        req = rpc.PutRequest(key=key.encode(), value=value, lease=lease)
        resp = self._call(f"put {key}", lambda ch, t: rpc.KVStub(ch).Put(req, t))
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        req = rpc.DeleteRangeRequest(key=key.encode())
        resp = self._call(f"delete {key}", lambda ch, t: rpc.KVStub(ch).DeleteRange(req, t))
        return resp.deleted > 0

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` atomically; returns how many were deleted."""
        if not prefix:
            raise ValueError("empty prefix")
        req = rpc.DeleteRangeRequest(key=prefix.encode(), range_end=prefix_range_end(prefix.encode()))
        resp = self._call(f"delete prefix {prefix}", lambda ch, t: rpc.KVStub(ch).DeleteRange(req, t))
        return int(resp.deleted)

    def commit(self, compares: Sequence[Compare], success: Sequence[Op],
               failure: Sequence[Op] = ()) -> TxnResult:
        """Atomically: if every compare holds, apply ``success``, else ``failure``.

        Not retried on another endpoint after a timeout (it may have been applied): the caller gets a
        ``MetaStoreError`` and must re-read before deciding what to do. etcd rejects (``MetaStoreError``)
        a transaction whose operations touch one key twice, including a put inside a deleted prefix.
        """
        req = rpc.TxnRequest(compare=[c.to_rpc() for c in compares],
                             success=[o.to_rpc() for o in success],
                             failure=[o.to_rpc() for o in failure])
        resp = self._call("txn", lambda ch, t: rpc.KVStub(ch).Txn(req, t), retry_timeout=False)
        return TxnResult(bool(resp.succeeded), int(resp.header.revision))

    def txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> bool:
        """Like :meth:`commit`; returns whether the compares held (and ``success`` was applied)."""
        return self.commit(compares, success, failure).succeeded

    # -- leases
    def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds (etcd may round small TTLs up). Returns its id."""
        req = rpc.LeaseGrantRequest(TTL=int(ttl))
        resp = self._call("lease grant", lambda ch, t: rpc.LeaseStub(ch).LeaseGrant(req, t))
        if resp.error:
            raise MetaStoreError(f"etcd lease grant failed: {resp.error}")
        return int(resp.ID)

    def refresh_lease(self, lease_id: int, timeout: float | None = None) -> int:
        """Keep a lease alive once. Returns the TTL it was reset to; <= 0 means the lease is gone."""
        def keepalive(ch: grpc.Channel, t: float) -> int:
            call = rpc.LeaseStub(ch).LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), t)
            try:
                for resp in call:
                    return int(resp.TTL)
                return 0
            finally:
                call.cancel()

        return int(self._call(f"lease keepalive {lease_id:x}", keepalive, timeout=timeout))

    def lease_ttl(self, lease_id: int) -> int:
        """Remaining TTL of a lease in seconds; -1 if it does not exist (any more)."""
        req = rpc.LeaseTimeToLiveRequest(ID=lease_id)
        resp = self._call(f"lease ttl {lease_id:x}", lambda ch, t: rpc.LeaseStub(ch).LeaseTimeToLive(req, t))
        return int(resp.TTL)

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease, deleting its keys. Revoking a lease that no longer exists is not an error."""
        req = rpc.LeaseRevokeRequest(ID=lease_id)
        try:
            self._call(f"lease revoke {lease_id:x}", lambda ch, t: rpc.LeaseStub(ch).LeaseRevoke(req, t))
        except MetaStoreError as e:
            if not is_not_found(e):
                raise

    # -- watch
    def watch_prefix(self, prefix: str, start_revision: int | None,
                     callback: Callable[[WatchResponse], None],
                     on_error: Callable[[MetaStoreError], None] | None = None) -> Watch:
        """Deliver every change under ``prefix`` from ``start_revision`` (None: from now) to ``callback``.

        Guarantees: events arrive in revision order, each exactly once, on one dedicated thread (the
        callback must not block for long and must not cancel-and-join its own watch). When the stream
        breaks, the watch is re-established (on the next endpoint if needed) from the revision after the
        last delivered one, so nothing is lost or repeated. If that is impossible because etcd has
        compacted the history, ``on_error`` is called once and the watch ends: re-read and re-watch.
        Returns once the watch is registered (every change committed after the return is delivered);
        raises ``MetaStoreError`` if it cannot be registered within the client timeout.
        """
        if not prefix:
            raise ValueError("empty prefix")
        w = Watch(self, prefix, start_revision, callback, on_error)
        with self._lock:
            if self._closed:
                raise MetaStoreError("etcd client is closed")
            self._watches.add(w)
        w._start()
        if not w._established.wait(self.timeout):
            w.cancel()
            raise MetaStoreError(f"etcd watch {prefix} could not be established on {self.endpoints}: "
                                 f"{w._last_error or 'timeout'}")
        return w

    def close(self) -> None:
        """Cancel all watches and close the connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            watches = list(self._watches)
        for w in watches:
            w.cancel()
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for ch in channels:
            ch.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Watch:
    """Handle of a running watch (see :meth:`EtcdClient.watch_prefix`). ``cancel()`` is idempotent."""

    def __init__(self, client: EtcdClient, prefix: str, start_revision: int | None,
                 callback: Callable[[WatchResponse], None],
                 on_error: Callable[[MetaStoreError], None] | None) -> None:
        self._client = client
        self.prefix = prefix
        self._next_rev = start_revision if start_revision and start_revision > 0 else None
        self._callback = callback
        self._on_error = on_error
        self._cancelled = threading.Event()
        self._established = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch {prefix}", daemon=True)

    @property
    def next_revision(self) -> int | None:
        """The revision the watch would resume from (last delivered + 1)."""
        return self._next_rev

    def _start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._client._lock:
            self._client._watches.discard(self)

    def _run(self) -> None:
        backoff = 0.1
        n = len(self._client.endpoints)
        while not self._cancelled.is_set():
            with self._client._lock:
                idx = self._client._current
            ep = self._client.endpoints[idx]
            requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
            key = self.prefix.encode()
            create = rpc.WatchCreateRequest(key=key, range_end=prefix_range_end(key),
                                            start_revision=self._next_rev or 0, progress_notify=True)
            requests.put(rpc.WatchRequest(create_request=create))

            def request_iter(q: queue.SimpleQueue[Any] = requests) -> Iterator[Any]:
                while True:
                    r = q.get()
                    if r is None:
                        return
                    yield r

            try:
                call = rpc.WatchStub(self._client._channel(idx)).Watch(request_iter())
                with self._lock:
                    self._call = call
                if self._cancelled.is_set():
                    call.cancel()
                    return
                for resp in call:
                    if self._handle(resp, ep):
                        return
                    backoff = 0.1
                self._last_error = f"{ep}: watch stream closed by the server"
            except grpc.RpcError as e:
                if self._cancelled.is_set():
                    return
                self._last_error = f"{ep}: {_describe(e)}"
                if _code(e) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and n > 1:
                    self._client._mark_failed(idx)
            except MetaStoreError as e:  # client closed
                self._last_error = str(e)
                return
            except _Restart as e:
                self._last_error = f"{ep}: {e}"
            finally:
                requests.put(None)
                with self._lock:
                    self._call = None
            if self._cancelled.is_set():
                return
            log.warning("etcd watch %s broke (%s); re-establishing from revision %s",
                        self.prefix, self._last_error, self._next_rev)
            self._cancelled.wait(backoff)
            backoff = min(backoff * 2, 2.0)

    def _handle(self, resp: Any, ep: str) -> bool:
        """Process one watch response; True when the watch has ended for good."""
        if resp.compact_revision:
            err = MetaStoreError(f"etcd watch {self.prefix} on {ep}: revision {self._next_rev} compacted "
                                 f"(compact revision {resp.compact_revision}); re-read and watch again")
            log.error("%s", err)
            self._cancelled.set()
            if self._on_error is not None:
                try:
                    self._on_error(err)
                except Exception:
                    log.exception("etcd watch %s: on_error callback failed", self.prefix)
            return True
        if resp.created:
            if self._next_rev is None:
                self._next_rev = int(resp.header.revision) + 1
            self._established.set()
            return False
        if resp.canceled:
            raise _Restart(f"watch canceled by the server: {resp.cancel_reason or 'no reason given'}")
        events = [WatchEvent("put" if ev.type == 0 else "delete", _kv(ev.kv)) for ev in resp.events]
        if events:
            self._next_rev = events[-1].kv.mod_revision + 1
        else:  # progress notification: nothing up to header.revision is pending
            self._next_rev = max(self._next_rev or 0, int(resp.header.revision) + 1)
        if self._cancelled.is_set():
            return True
        try:
            self._callback(WatchResponse(int(resp.header.revision), events))
        except Exception:
            log.exception("etcd watch %s: callback failed", self.prefix)
        return False


class _Restart(Exception):
    pass
