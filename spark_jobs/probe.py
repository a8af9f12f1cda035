"""Is a Spark master there? A SparkContext-free probe of a ``spark://host:port`` address (``changefeed create``).

A TCP connection alone proves nothing: any server (a PostgreSQL, a master's web UI on 8080, a web server) accepts
one. :func:`probe_rpc` speaks the first message of Spark's RPC transport (``org.apache.spark.network.protocol``,
the same framing since Spark 1.6): a frame ``[frame length: int64, itself included][type: int8][payload]``, here
an ``RpcRequest`` (type 3: request id int64, body length int32, body) whose body is not a valid Spark message.
Every Spark RPC server answers such a request with an ``RpcFailure`` frame (type 5) carrying the same request id
and the server's error text, on the same connection; no other kind of server does. Nothing is started, registered
or changed on the master (it logs the refused request once).

What it does not tell: a standalone master from another Spark RPC endpoint (a worker's port answers the same), and
whether the master has workers. A master without executors is caught when the job runs
(``spark_jobs.snapshot``: no executor within ``SnapshotJob.executor_timeout`` is a retryable error the changefeed
shows as a warning).
"""

from __future__ import annotations

import os
import socket
import struct
import time

from cdc.errors import SparkUnavailable

RPC_REQUEST = 3
RPC_RESPONSE = 4
RPC_FAILURE = 5
_HEADER = struct.Struct(">qbqi")  # frame length, type, request id, body length (RpcRequest)
_REPLY = struct.Struct(">qbq")  # frame length, type, request id (RpcResponse / RpcFailure)
_BODY = b"tidewater: is this a Spark master?"


def _recv_exactly(sock: socket.socket, n: int, timeout: float) -> bytes:
    """Up to ``n`` bytes (fewer when the peer closes), within ``timeout`` seconds in all (``TimeoutError``)."""
    deadline = time.monotonic() + timeout
    out = b""
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        got = sock.recv(n - len(out))
        if not got:
            break
        out += got
    return out


def probe_rpc(host: str, port: int, timeout: float = 3.0) -> None:
    """Return when a Spark RPC server answers at ``host:port``; raise :class:`SparkUnavailable` naming what was
    found there (nothing listening, no answer, another protocol) and the fix."""
    where = f"{host}:{port}"
    fix = ("start the master (spark-class org.apache.spark.deploy.master.Master; its port is 7077 by default, its "
           "web UI's 8080 is not it) or correct [snapshot] spark-master, or use local[*]")
    request_id = int.from_bytes(os.urandom(8), "big") >> 1
    frame = _HEADER.pack(_HEADER.size + len(_BODY), RPC_REQUEST, request_id, len(_BODY)) + _BODY
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except (OSError, ValueError) as exc:
        raise SparkUnavailable(f"the Spark master {where} of snapshot.spark-master does not answer ({exc}): "
                               f"{fix}") from None
    try:
        sock.settimeout(timeout)
        sock.sendall(frame)
        head = _recv_exactly(sock, _REPLY.size, timeout)
    except OSError as exc:  # a reset, a timeout: no Spark RPC server answers that way
        raise SparkUnavailable(f"{where} of snapshot.spark-master is not a Spark master: it did not answer Spark's "
                               f"RPC protocol ({exc}); {fix}") from None
    finally:
        sock.close()
    if len(head) == _REPLY.size:
        length, kind, rid = _REPLY.unpack(head)
        if kind in (RPC_FAILURE, RPC_RESPONSE) and rid == request_id and length >= _REPLY.size:
            return
    seen = head[:16].hex(" ") if head else "the connection closed without a reply"
    raise SparkUnavailable(f"{where} of snapshot.spark-master is not a Spark master: it does not speak Spark's RPC "
                           f"protocol (answered: {seen}); {fix}")
