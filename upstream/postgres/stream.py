"""One logical replication stream (one slot, one publication) read with psycopg2 and pgoutput.

``ReplicationStream`` yields decoded pgoutput messages in WAL order plus ``Keepalive`` watermarks. It
keeps no data: the caller owns ordering and buffering.

Guarantees:
- Messages are yielded exactly in the order the walsender sent them (and ``None`` whenever nothing more has been
  received yet); transactions arrive in commit
  order (streamed chunks of in-progress transactions interleave between them).
- ``Keepalive(ts, time)`` is yielded only outside a non-streamed transaction and means: every
  transaction with commit end LSN <= ts has already been yielded. ``time`` is a wall-clock moment at
  which the upstream's WAL flush position was <= ts (sampled on a side connection), i.e. the upstream
  time this watermark stands for; it never goes backwards.
- The slot's flush position is only moved by ``ack(lsn)``; the caller acks only its durable checkpoint.
  (Without the C reader, psycopg2 answers keepalives itself and may also move it to a keepalive's wal_end
  when everything received has been acked, which confirms no transaction that was not already acked.)
- Reading: the connection is drained in batches by :mod:`upstream.postgres.walread` (in C: libpq's
  messages without a psycopg2 object or Python call each; keepalives asking for an answer are answered
  here), feedback with the acked position at least every ``feedback_interval``, busy or idle. While it
  catches up it is woken per 64 KiB received or every 2 ms (:class:`StreamWaits`): a message may wait up to
  2 ms longer then, never longer than that.
- Threading: iterate from one thread; ``ack`` may be called from any thread.
- Slot takeover: ``open()`` with ``takeover=True`` (what a span's runner uses) ends a walsender that
  still holds the slot (``pg_terminate_backend`` of its ``active_pid``) and then takes the slot. The
  caller may ask for that only when the previous holder can no longer commit downstream: the processor
  opens a span only once it is assigned to its capture, i.e. after the previous holder confirmed its
  stop or its etcd lease expired (its sink's fence then refuses every commit). Without this, a holder
  frozen by SIGSTOP keeps its walsender, and PostgreSQL refuses the slot to everybody else until
  ``wal_sender_timeout`` (60 s by default) ends it. Our walsenders carry ``application_name``
  ``tidewater:<capture id>`` so that a refusal names the capture holding the slot.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2

from cdc.errors import SlotLost, UpstreamUnavailable
from cdc.ts import lsn_to_str
from upstream.postgres import pgoutput, pgoutput_messages, walread
from upstream.postgres.conn import classify_error, connect, describe_conn, probe

APPLICATION_PREFIX = "tidewater:"  # + capture id: the application_name of a span's walsender connection

log = logging.getLogger(__name__)

_DRAIN_LIMIT = 4096  # messages per drain of the connection at most (then the stop flag and feedback are looked at)
_RUN_ROWS = 1024  # stored plain changes per run at most (the span source hands a run to the sorter in one call)


@dataclass(frozen=True, slots=True)
class Keepalive:
    ts: int
    time: float


# the same fix the owner's upstream watcher names, whichever of the two notices the loss first
_SLOT_LOST_FIX = "Remove the changefeed and create it again (re-synchronising the downstream)"


class StreamWaits:
    """How the stream waits for the walsender between drains. A stream that read ``BUSY_MESSAGES`` or more since its
    last wait is catching up: the walsender sends each message as it decodes it, and a reader woken by every few of
    them pays a wake-up (select, the GIL taken back, a drain) per handful of rows. So while busy, the socket is asked
    to wake the reader only once ``BUSY_BYTES`` are queued (``SO_RCVLOWAT``, which ``select`` honours on TCP), or
    after ``BUSY_WAIT`` seconds at most: a row waits that much longer at worst, about the sink thread's own pass gap.
    Otherwise it waits as before: for the first byte, or 0.2 s. Where the option cannot be set (a Unix socket ignores
    it), waits are as before."""

    BUSY_MESSAGES = 16
    BUSY_BYTES = 64 * 1024
    BUSY_WAIT = 0.002

    def __init__(self, conn: Any) -> None:
        self._sock: socket.socket | None = None
        self._busy = False
        try:
            sock = socket.socket(fileno=os.dup(conn.fileno()))  # (a descriptor of its own for the same socket)
        except (OSError, AttributeError, ValueError):
            return
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            self._sock = sock
        else:
            sock.close()

    def wait(self, cur: Any, got: int) -> None:
        busy = got >= self.BUSY_MESSAGES and self._sock is not None
        if busy != self._busy:
            self._set_lowat(self.BUSY_BYTES if busy else 1)
        select.select([cur], [], [], self.BUSY_WAIT if self._busy else 0.2)

    def _set_lowat(self, n: int) -> None:
        assert self._sock is not None
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
            self._busy = n > 1
        except OSError:
            self._busy = False

    def close(self) -> None:
        if self._sock is not None:
            try:
                if self._busy:
                    self._set_lowat(1)
                self._sock.close()  # (the dup only: the connection keeps its own descriptor)
            except OSError:
                pass
            self._sock = None


class ReplicationStream:
    def __init__(
        self,
        uri: str,
        slot: str,
        publication: str,
        start_lsn: int,
        *,
        proto_version: int = 4,
        feedback_interval: float = 1.0,
        sample_interval: float = 1.0,
        label: str = "",
        holder: str = "",
        takeover: bool = False,
        takeover_wait: float = 5.0,
    ) -> None:
        self.uri = uri
        self.slot = slot
        self.publication = publication
        self.start_lsn = start_lsn
        self.proto_version = proto_version
        self.feedback_interval = feedback_interval
        self.sample_interval = sample_interval
        self.label = label or slot
        self.holder = holder  # capture id, shown as application_name of the walsender
        self.takeover = takeover
        self.takeover_wait = takeover_wait
        self._acked = start_lsn
        self._ack_lock = threading.Lock()
        self._conn: Any = None
        self._cur: Any = None
        self._side: Any = None
        self._samples: collections.deque[tuple[int, float]] = collections.deque()
        self._last_sample = 0.0
        self._last_time = 0.0

    def __getstate__(self) -> dict[str, Any]:
        """Picklable before ``open()`` (the span source may run in a process of its own): no connection or lock."""
        state = self.__dict__.copy()
        del state["_ack_lock"]
        state["_conn"] = state["_cur"] = state["_side"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ack_lock = threading.Lock()

    # ---- control ---------------------------------------------------------------------------------
    def ack(self, lsn: int) -> None:
        """Allow the upstream to forget commits <= lsn (sent with the next feedback)."""
        with self._ack_lock:
            if lsn > self._acked:
                self._acked = lsn

    @property
    def application_name(self) -> str:
        return (APPLICATION_PREFIX + self.holder)[:63] if self.holder else "tidewater"

    def probe(self, timeout: float = 2.0) -> None:
        """Cheap reachability check (connect, ``SELECT 1``), for a failed span waiting to restart:
        raises ``UpstreamUnavailable`` (or another ``TidewaterError``) while the upstream is away."""
        probe(self.uri, timeout)

    def open(self) -> None:
        self._side = connect(self.uri)
        self._take_slot()
        self._conn = connect(self.uri, replication=True, application_name=self.application_name)
        self._cur = self._conn.cursor()
        options = {
            "proto_version": str(self.proto_version),
            "publication_names": self.publication,
            "streaming": "on",
            "messages": "true",
        }
        try:
            self._cur.start_replication(
                slot_name=self.slot, decode=False, start_lsn=self.start_lsn, options=options,
                status_interval=max(1, int(self.feedback_interval)))
        except psycopg2.Error as exc:
            err = self._classify(exc)
            if getattr(exc, "pgcode", None) == "55006":  # the slot was taken between our look and the start
                try:
                    _, who = self._slot_holder()
                except Exception:  # noqa: BLE001 - only enriches the message
                    who = ""
                if who:
                    err = UpstreamUnavailable(f"{err.message}; the slot is held by {who}")
            raise err from exc
        log.info("replication started span=%s slot=%s from=%s", self.label, self.slot, lsn_to_str(self.start_lsn))

    def close(self) -> None:
        for c in (self._conn, self._side):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass
        self._conn = self._cur = self._side = None

    def _slot_holder(self) -> tuple[int | None, str]:
        """(active_pid, who) of the slot: who names the capture (or client) whose walsender holds it."""
        with self._side.cursor() as cur:
            cur.execute(
                "SELECT s.active_pid, a.application_name, a.client_addr::text, a.usename FROM pg_replication_slots s "
                "LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = %s", (self.slot,))
            row = cur.fetchone()
        if row is None:
            raise SlotLost(
                f"replication slot {self.slot!r} does not exist on the upstream: it was dropped or lost in a "
                f"failover; changes after the checkpoint may be gone. {_SLOT_LOST_FIX}")
        pid, app, addr, user = row
        if pid is None:
            return None, ""
        app = app or ""
        who = (f"capture {app[len(APPLICATION_PREFIX):]}" if app.startswith(APPLICATION_PREFIX)
               else f"client {app or '(no application_name)'}")
        return pid, f"{who} (walsender pid {pid}, from {addr or 'local socket'}, role {user})"

    def _take_slot(self) -> None:
        """Make sure the slot exists and nobody else streams it (see "Slot takeover" above)."""
        try:
            pid, who = self._slot_holder()
            if pid is None:
                return
            if not self.takeover:
                raise UpstreamUnavailable(f"replication slot {self.slot!r} is in use by {who}")
            log.warning("span=%s: replication slot %s is still held by %s; that holder lost the span, "
                        "terminating its walsender", self.label, self.slot, who)
            try:
                with self._side.cursor() as cur:
                    cur.execute("SELECT pg_terminate_backend(%s, %s)", (pid, int(self.takeover_wait * 1000)))
            except psycopg2.Error as exc:
                if getattr(exc, "pgcode", None) == "42501":
                    raise UpstreamUnavailable(
                        f"replication slot {self.slot!r} is held by {who}, which no longer holds the span, and "
                        f"this role may not terminate that walsender ({str(exc).strip()}); PostgreSQL frees "
                        "the slot after wal_sender_timeout. Fix: connect as the same role, a superuser, or "
                        "a member of pg_signal_backend") from exc
                raise
            deadline = time.monotonic() + self.takeover_wait
            while True:
                now_pid, now_who = self._slot_holder()
                if now_pid is None:
                    log.warning("span=%s: took replication slot %s over from %s", self.label, self.slot, who)
                    return
                if time.monotonic() >= deadline:
                    raise UpstreamUnavailable(
                        f"replication slot {self.slot!r} is still held by {now_who} after terminating it")
                time.sleep(0.05)
        except psycopg2.Error as exc:
            raise classify_error(exc, describe_conn(self._side), f"taking replication slot {self.slot!r}") from exc

    def _classify(self, exc: psycopg2.Error) -> SlotLost | UpstreamUnavailable:
        return self._classify_text(str(exc).strip())

    def _classify_text(self, text: str) -> SlotLost | UpstreamUnavailable:
        if "does not exist" in text and "slot" in text:
            return SlotLost(f"replication slot {self.slot!r} does not exist: {text}. {_SLOT_LOST_FIX}")
        return UpstreamUnavailable(f"replication stream of slot {self.slot!r} failed: {text}")

    # ---- reading ---------------------------------------------------------------------------------
    def messages(self, stop: threading.Event, prefixes: dict[int, bytes] | None = None) -> Iterator[Any]:
        """Yield pgoutput messages and Keepalive watermarks until ``stop`` is set.

        A non-streamed Insert/Update/Delete is yielded raw: with ``prefixes`` (relid -> the span source's payload
        prefix, read at each message: the caller may change it), those of the relations in it in runs, lists of
        ``prefix + payload`` (the stored form), those of other relations not at all; without, each as its raw
        ``bytes`` (first byte in ``pgoutput.PLAIN_CHANGE_TYPES``; ``pgoutput.plain_change_relid`` reads it). A
        malformed one is always yielded as its raw bytes. Begin and Commit come raw too (first byte
        ``pgoutput.BEGIN``/``COMMIT``; ``pgoutput.begin_xid``/``commit_position`` read them), everything else decoded
        (``pgoutput.decode``): no object per row, two fewer per transaction, on the hottest path. The connection is
        drained in batches (:mod:`upstream.postgres.walread`: in C where it builds). ``None`` each time it has read
        everything received so far, before it waits for more: a reader may gather work per message and act on it
        there (``PgSpanSource`` reports its resolved watermark then). Between drains it waits as :class:`StreamWaits` says."""
        cur = self._cur
        assert cur is not None, "open() first"
        reader = walread.reader(self._conn, cur)
        waits = StreamWaits(self._conn)
        try:
            yield from self._read(stop, prefixes, cur, reader, waits)
        finally:
            waits.close()

    def _read(self, stop: threading.Event, prefixes: dict[int, bytes] | None, cur: Any, reader: walread.Reader,
              waits: StreamWaits) -> Iterator[Any]:
        in_stream = False
        last_feedback = 0.0
        last_mark = Keepalive(0, 0.0)
        decode = pgoutput.decode
        plain = pgoutput.PLAIN_CHANGE_TYPES
        begin, commit = pgoutput.BEGIN, pgoutput.COMMIT
        drain = reader.drain
        out: list[Any] = []
        start_t, stop_t = pgoutput_messages.StreamStart, pgoutput_messages.StreamStop
        received = reader.received
        while not stop.is_set():
            try:
                status = drain(out, prefixes, _DRAIN_LIMIT, _RUN_ROWS)
            except psycopg2.Error as exc:
                raise self._classify(exc) from exc
            if out:
                for item in out:
                    if type(item) is list:  # (a run of stored plain changes)
                        yield item
                        continue
                    if not in_stream and item and (item[0] in plain or item[0] == begin or item[0] == commit):
                        yield item
                        continue
                    m = decode(item, in_stream)
                    t = type(m)
                    if t is start_t:
                        in_stream = True
                    elif t is stop_t:
                        in_stream = False
                    yield m
                out = []
            now = time.monotonic()
            if status == walread.MORE:
                if now - last_feedback >= self.feedback_interval:  # (a long catch-up: the slot hears from us)
                    self._feedback(cur, False)
                    last_feedback = now
                continue
            if status == walread.REPLY:
                self._feedback(cur, False)
                last_feedback = now
                continue
            if status != walread.IDLE:
                raise self._stream_failure(status)
            yield None  # nothing more to read right now (the caller's cue to report what it has read)
            if now - last_feedback >= self.feedback_interval:
                self._sample()
                self._feedback(cur, True)
                last_feedback = now
            wal_end = reader.wal_end
            if not reader.in_txn and wal_end:
                mark_time = self._time_for(wal_end)
                if wal_end > last_mark.ts or mark_time > last_mark.time:  # (an object only when it moved)
                    last_mark = Keepalive(wal_end, mark_time)
                    yield last_mark
            got, received = reader.received - received, reader.received
            try:
                waits.wait(cur, got)
            except (OSError, ValueError) as exc:
                raise UpstreamUnavailable(f"replication connection of slot {self.slot!r} broke: {exc}") from exc

    def _feedback(self, cur: Any, reply: bool) -> None:
        """Tell the walsender the acked position (``reply``: and ask for a keepalive, whose WAL end is the mark)."""
        with self._ack_lock:
            acked = self._acked
        try:
            cur.send_feedback(flush_lsn=acked, reply=reply, force=True)
        except psycopg2.Error as exc:
            raise self._classify(exc) from exc

    def _stream_failure(self, status: int) -> UpstreamUnavailable | SlotLost:
        """The error of a drain that ended the stream (:data:`walread.END`), lost the connection
        (:data:`walread.FAILED`) or read a message that is not XLogData or a keepalive (:data:`walread.BAD`)."""
        if status == walread.BAD:
            return UpstreamUnavailable(f"replication stream of slot {self.slot!r}: an unrecognized or truncated "
                                       "replication message")
        return self._classify_text(walread.failure_text(self._conn, status))

    def _sample(self) -> None:
        """Record (upstream WAL flush LSN, wall time) so a keepalive LSN can be mapped to a time."""
        now = time.time()
        if now - self._last_sample < self.sample_interval:
            return
        try:
            with self._side.cursor() as c:
                c.execute("SELECT pg_current_wal_flush_lsn()::text")
                (text,) = c.fetchone()
        except psycopg2.Error as exc:
            raise UpstreamUnavailable(f"upstream side connection failed: {exc}") from exc
        hi, lo = text.split("/")
        self._samples.append(((int(hi, 16) << 32) | int(lo, 16), now))
        self._last_sample = now
        while len(self._samples) > 600:
            self._samples.popleft()

    def _time_for(self, lsn: int) -> float:
        while self._samples and self._samples[0][0] <= lsn:
            self._last_time = max(self._last_time, self._samples.popleft()[1])
        return self._last_time
