"""A span source's ``run`` in a process of its own (``[server] puller-process``), so that one busy span uses two
cores: the child reads and decodes the upstream's stream, the capture's process sorts, mounts and writes.

:class:`ChildSpanSource` wraps the span's own :class:`~upstream.base.SpanSource` (one whose ``runs_in_child`` is
True) and is used by the span's runner exactly as that source would be (``processor.span``): ``open`` starts the
child (``python -m processor.source_process``) and hands it the pickled, not yet opened source; the child opens it
and runs ``run`` into a buffer that sends the buffer calls in batches (the sorter's own operations, payloads as the
source encoded them) with the source's new state (``SpanSource.take_state``) and the latest resolved watermark;
``run`` in the parent applies them, in order, to the real sorter and to the wrapped instance
(``SpanSource.put_state``), then reports the watermark. Nothing here knows which upstream it carries.

Guarantees (the same as the thread that runs ``run`` in the capture, and):

- Order: batches are applied in the order the child made the calls; a batch's state before its operations, its
  watermark after them, so every schema version, schema-change commit and watermark means what the source's
  contract says by the time the sink thread can see it.
- Backpressure and memory: the child hands over at most ``BATCH_ROWS`` rows / ``BATCH_BYTES`` bytes per batch,
  through a pipe of at most ``PIPE_BYTES``; a full pipe blocks the child's writes, and with them its reading of the
  upstream. The sorter, and so the span's memory quota and spilling, stays in the capture: at most about two
  batches plus the pipe are in flight.
- Latency: a batch goes when it is full, or ``FLUSH_DELAY`` after its first call (a lone transaction is not held).
- Errors: an exception of the child's ``open``/``run`` is raised by the parent's ``run`` as the same error (same
  class where it can be rebuilt, else the ``cdc.errors`` class of its code with its message: retryable or not as in
  a thread). A child that dies without saying why (killed, crashed) is ``UpstreamUnavailable`` (retryable): the
  span restarts from its checkpoint, as after a lost connection.
- Lifetime: the child never outlives the capture: it exits when the control pipe reaches EOF (or a write to the
  data pipe fails) and has ``PR_SET_PDEATHSIG`` = SIGKILL (on Linux; all children are started by one thread of the
  capture that lives as long as it, :class:`Spawner`). It ignores SIGINT and SIGTERM (a drain stops it through the
  span). ``stop`` set -> the child is told to stop and is waited for, killed after ``stop_timeout``; ``close``
  always reaps it (no zombie). One more child is kept started and waiting (:class:`Spawner`), so that a span start
  does not wait for an interpreter; it too exits at its pipe's EOF.
- Fencing is unchanged: the child writes nothing but the pipe (it holds the upstream slot like the thread did:
  ``open`` takes it over); etcd, the sorter and the sink are the capture's. ``ack(ts)`` is forwarded to it.
- Logging: the child's log records are sent to the capture and logged there under the same logger names.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Container, Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cdc.errors import TidewaterError, UpstreamUnavailable, error_for_code
from cdc.events import TableSchema
from cdc.gcpolicy import tune_for_streaming
from cdc.model import DataWarning
from cdc.ts import Watermark
from upstream.base import ChangeBuffer, ChangeDecoder, SpanSource

log = logging.getLogger(__name__)

BATCH_ROWS = 4096  # buffered changes per batch at most (then it is sent at once)
BATCH_BYTES = 1 << 20  # payload bytes per batch at most
PIPE_BYTES = 1 << 20  # the data pipe's capacity (F_SETPIPE_SZ; the system's default when refused)
FLUSH_DELAY = 0.001  # seconds a batch waits for more calls after its first one

# child -> parent messages (the first item); parent -> child
_BATCH, _LOG, _ERROR, _DONE = 0, 1, 2, 3
_ACK, _STOP = 0, 1
# buffer operations inside a batch
_ADD, _ADD_MANY, _ABORT, _COMMIT = 0, 1, 2, 3

_ROOT = str(Path(__file__).resolve().parent.parent)  # the directory holding the packages (the child's path)


class ChildSpanSource(SpanSource):
    """``inner``'s ``run`` in a child process (module docstring); everything else is ``inner``'s."""

    def __init__(self, inner: SpanSource, label: str, *, stop_timeout: float = 5.0) -> None:
        if not inner.runs_in_child:
            raise ValueError(f"{type(inner).__name__} cannot run in a process of its own")
        self.inner = inner
        self.label = label
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._ctl: Connection | None = None
        self._data: Connection | None = None
        self._ctl_lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # ---- SpanSource --------------------------------------------------------------------------------
    def open(self) -> None:
        try:
            started = SPAWNER.take(type(self.inner).__module__)
        except OSError as exc:
            raise UpstreamUnavailable(f"span {self.label}: cannot start its source process: {exc}") from exc
        self.proc, self._ctl, self._data = started.proc, started.ctl, started.data
        self._send_ctl(pickle.dumps((self.inner, logging.getLogger().getEffectiveLevel()), protocol=5))
        log.info("span=%s source runs in process %d", self.label, self.proc.pid)

    def run(self, buffer: ChangeBuffer, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        data = self._data
        assert data is not None and self.proc is not None, "open() first"
        add, add_many, abort, commit = buffer.add, buffer.add_many, buffer.abort, buffer.commit
        put_state = self.inner.put_state
        loads = pickle.loads
        try:
            while True:
                if stop.is_set():
                    self._stop_child()
                    return
                if not data.poll(0.2):
                    continue
                try:
                    msg = loads(data.recv_bytes())
                except (EOFError, OSError):
                    if stop.is_set():
                        return
                    raise self._died() from None
                kind = msg[0]
                if kind == _BATCH:
                    _, state, ops, resolved = msg
                    if state is not None:
                        put_state(state)
                    for op in ops:
                        code = op[0]
                        if code == _ADD_MANY:
                            add_many(op[1], op[2], op[3])
                        elif code == _COMMIT:
                            commit(op[1], op[2], op[3])
                        elif code == _ADD:
                            add(op[1], op[2], op[3])
                        else:
                            abort(op[1], op[2])
                    if resolved is not None:
                        on_resolved(resolved)
                elif kind == _LOG:
                    logging.getLogger(msg[1]).log(msg[2], "%s", msg[3])
                elif kind == _ERROR:
                    raise self._rebuild(msg)
                else:  # _DONE: run returned (it was told to stop)
                    self._reap(self.stop_timeout)
                    return
        except BaseException:
            self._stop_child()
            raise

    def ack(self, ts: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._send_ctl(pickle.dumps((_ACK, ts)))

    def close(self) -> None:
        """Stop the child (told, then killed after ``stop_timeout``), reap it and close the pipes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_child()
        for conn in (self._ctl, self._data):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()

    def decoder(self) -> ChangeDecoder:
        return self.inner.decoder()

    def schema_change_commits(self) -> Container[int]:
        return self.inner.schema_change_commits()

    def take_warnings(self) -> list[DataWarning]:
        return self.inner.take_warnings()

    def resume_token(self, ts: int) -> str | None:
        """The inner source's (what it learns while it runs must reach this instance by ``put_state``)."""
        return self.inner.resume_token(ts)

    def seed_schemas(self, schemas: Iterable[TableSchema], carried: Collection[int] | None = None) -> None:
        self.inner.seed_schemas(schemas, carried)  # (before open: the child gets them with the pickled source)

    def take_schema_versions(self) -> list[tuple[int, TableSchema]]:
        return self.inner.take_schema_versions()

    # ---- the child, seen from the parent -----------------------------------------------------------
    def _send_ctl(self, blob: bytes) -> None:
        with self._ctl_lock:
            if self._ctl is None:
                raise OSError("no control pipe")
            self._ctl.send_bytes(blob)

    def _stop_child(self) -> None:
        """Tell the child to stop, read (and drop) what it still sends until it exits, kill it after
        ``stop_timeout``; reaps it."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._send_ctl(pickle.dumps((_STOP,)))
        deadline = time.monotonic() + self.stop_timeout
        data = self._data
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if data is not None and data.poll(0.05):
                    data.recv_bytes()  # (a child blocked on a full pipe must get to its stop)
            except (EOFError, OSError):
                break
        self._reap(max(0.0, deadline - time.monotonic()))

    def _reap(self, timeout: float) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("span=%s source process %d did not stop within %.0fs: killed", self.label, proc.pid,
                        self.stop_timeout)
            proc.kill()
            proc.wait()

    def _died(self) -> UpstreamUnavailable:
        proc = self.proc
        assert proc is not None
        self._reap(self.stop_timeout)
        rc = proc.returncode
        how = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit status {rc}"
        return UpstreamUnavailable(f"span {self.label}: its source process {proc.pid} ended without a reason "
                                   f"({how}); the span restarts from its checkpoint")

    def _rebuild(self, msg: tuple[Any, ...]) -> BaseException:
        """The child's exception: the same class and message where pickle rebuilds it, else by its code."""
        _, blob, code, text, type_name, trace = msg
        self._reap(self.stop_timeout)
        exc: BaseException | None = None
        if blob is not None:
            try:  # (not through its __init__, whose arguments may not be its args: DdlRejected)
                cls, args, attrs = pickle.loads(blob)
                exc = cls.__new__(cls, *args)
                BaseException.__init__(exc, *args)
                exc.__dict__.update(attrs)
            except Exception:  # noqa: BLE001 - a class this process cannot import or build: by its code
                exc = None
        if exc is None:
            exc = error_for_code(code, text) if code is not None else RuntimeError(f"{type_name}: {text}")
        if not isinstance(exc, TidewaterError):
            log.error("span=%s source process failed:\n%s", self.label, trace)
        return exc


# ---- starting children -----------------------------------------------------------------------------------------
class Started:
    """A started child waiting for its source on ``ctl``; it sends on ``data``."""

    def __init__(self, proc: subprocess.Popen[bytes], ctl: Connection, data: Connection, preload: str) -> None:
        self.proc, self.ctl, self.data, self.preload = proc, ctl, data, preload

    def discard(self) -> None:
        """Close its pipes (it exits at their EOF) and reap it."""
        for conn in (self.ctl, self.data):
            with contextlib.suppress(OSError):
                conn.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_child(preload: str) -> Started:
    """Start ``python -m processor.source_process`` with its two pipes; it imports ``preload`` (the source's module)
    at once, then waits for its source. Raises OSError."""
    ctl_r, ctl_w = os.pipe()
    data_r, data_w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(data_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    env = dict(os.environ)
    # the child imports what this process can (as multiprocessing's spawn does): the pickled source's modules
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in (_ROOT, *sys.path) if p))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "processor.source_process", str(ctl_r), str(data_w), str(os.getpid()),
             preload], pass_fds=(ctl_r, data_w), stdin=subprocess.DEVNULL, env=env, close_fds=True)
    except OSError:
        for fd in (ctl_r, ctl_w, data_r, data_w):
            os.close(fd)
        raise
    os.close(ctl_r)
    os.close(data_w)
    return Started(proc, Connection(ctl_w, readable=False), Connection(data_r, writable=False), preload)


class Spawner:
    """Starts the source processes of this capture from one thread of its own, and keeps one started (its
    interpreter up, the last source's module imported) for the next span, so that a span start does not wait for an
    interpreter (~0.15 s). One thread, because ``PR_SET_PDEATHSIG`` follows the thread that forked: this one lives as
    long as the capture, so a child dies with the capture, not with the span thread that asked for it. Nothing
    runs (no thread, no spare) until the first :meth:`take`: with ``puller-process = false`` it costs nothing."""

    def __init__(self, keep_spare: bool = True) -> None:
        self.keep_spare = keep_spare
        self._lock = threading.Lock()
        self._spare: Started | None = None
        self._asks: list[tuple[str, threading.Event | None, list[Any]]] = []
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    @property
    def spare(self) -> Started | None:
        """The child started for the next span (None: none yet)."""
        return self._spare

    def take(self, preload: str) -> Started:
        """A started child for a source of module ``preload`` (the spare when it is alive and of that module)."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and (spare.preload != preload or spare.proc.poll() is not None):
            spare.discard()
            spare = None
        if spare is None:
            done = threading.Event()
            out: list[Any] = []
            self._ask(preload, done, out)
            done.wait()
            if isinstance(out[0], BaseException):
                raise OSError(f"starting a source process failed: {out[0]}") from out[0]
            spare = out[0]
        if self.keep_spare:
            self._ask(preload, None, [])
        assert isinstance(spare, Started)
        return spare

    def drop_spare(self) -> None:
        """End the spare child, if any (``puller-process`` turned off by a reload: no span will take it). A spare being
        started right now is kept; the next call ends it."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.discard()

    def _ask(self, preload: str, done: threading.Event | None, out: list[Any]) -> None:
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="source-spawner", daemon=True)
                self._thread.start()
            self._asks.append((preload, done, out))
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._asks:
                    self._wake.wait()
                preload, done, out = self._asks.pop(0)
            try:
                started: Started | BaseException = start_child(preload)
            except Exception as exc:  # noqa: BLE001 - given to the waiting span (this thread must go on)
                started = exc
            if done is not None:
                out.append(started)
                done.set()
                continue
            if isinstance(started, BaseException):
                log.warning("could not start a spare span source process: %s", started)
                continue
            with self._lock:
                old, self._spare = self._spare, started
            if old is not None:
                old.discard()


SPAWNER = Spawner()


# ---- the child -----------------------------------------------------------------------------------------------
class _Channel:
    """The child's :class:`~upstream.base.ChangeBuffer` and ``on_resolved``: calls gathered into batches, sent
    when full (by the calling thread, which blocks while the pipe is full) or ``FLUSH_DELAY`` after the first
    call of a batch (by a flusher thread)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._take_state: Callable[[], object] = lambda: None  # (the source's, once it is known)
        self._ops: list[tuple[Any, ...]] = []
        self._rows = 0
        self._bytes = 0
        self._resolved: Watermark | None = None
        self._lock = threading.Lock()  # the batch being gathered
        self._send_lock = threading.RLock()  # one message at a time on the pipe (a log record may come from any)
        self._pending = threading.Event()

    def use(self, source: SpanSource) -> None:
        """The source whose state goes with each batch."""
        self._take_state = source.take_state

    # ChangeBuffer
    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        with self._lock:
            ops = self._ops
            ops.append((_ADD, xid, subxid, payload))
            self._rows += 1
            self._bytes += len(payload)
            full = self._rows >= BATCH_ROWS or self._bytes >= BATCH_BYTES
        if full:
            self.flush()
        elif len(ops) == 1:
            self._pending.set()

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        size = sum(map(len, payloads))
        with self._lock:
            ops = self._ops
            ops.append((_ADD_MANY, xid, subxid, payloads))
            self._rows += len(payloads)
            self._bytes += size
            full = self._rows >= BATCH_ROWS or self._bytes >= BATCH_BYTES
        if full:
            self.flush()
        elif len(ops) == 1:
            self._pending.set()

    def abort(self, xid: int, subxid: int) -> None:
        self._op((_ABORT, xid, subxid))

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        self._op((_COMMIT, xid, commit_ts, commit_time))

    def _op(self, op: tuple[Any, ...]) -> None:
        with self._lock:
            ops = self._ops
            ops.append(op)
        if len(ops) == 1:
            self._pending.set()

    def resolved(self, w: Watermark) -> None:
        with self._lock:
            first = self._resolved is None and not self._ops
            self._resolved = w
        if first:
            self._pending.set()

    # sending
    def flush(self) -> None:
        with self._send_lock:
            with self._lock:
                ops, self._ops = self._ops, []
                resolved, self._resolved = self._resolved, None
                self._rows = self._bytes = 0
                state = self._take_state()  # (after the swap: it covers every operation taken)
            if ops or state is not None or resolved is not None:
                self._conn.send_bytes(pickle.dumps((_BATCH, state, ops, resolved), protocol=5))

    def send(self, msg: tuple[Any, ...]) -> None:
        blob = pickle.dumps(msg, protocol=5)
        with self._send_lock:
            self._conn.send_bytes(blob)

    def flusher(self) -> None:
        pending = self._pending
        try:
            while True:
                pending.wait()
                time.sleep(FLUSH_DELAY)
                pending.clear()
                self.flush()
        except OSError:  # the parent is gone
            os._exit(1)


class _Forward(logging.Handler):
    """Sends each log record to the parent, which logs it under the same logger name."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info))
            self.channel.send((_LOG, record.name, record.levelno, text))
        except Exception:  # noqa: BLE001 - the parent is gone; nothing to log to
            pass


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the thread that started this process ends (Linux); exit at once if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _control(conn: Connection, source: SpanSource, stop: threading.Event) -> None:
    """The parent's acks and stop; EOF (the parent is gone): exit at once."""
    try:
        while True:
            msg = pickle.loads(conn.recv_bytes())
            if msg[0] == _ACK:
                source.ack(msg[1])
            else:
                stop.set()
    except (EOFError, OSError):
        os._exit(1)


def main(argv: list[str]) -> int:
    """``python -m processor.source_process CTL_FD DATA_FD PARENT_PID PRELOAD`` (started by :func:`start_child`)."""
    ctl_fd, data_fd, parent = (int(a) for a in argv[:3])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(Exception):  # (a spare waits with its imports done; the source's unpickling says why)
        importlib.import_module(argv[3])
    ctl = Connection(ctl_fd, writable=False)
    channel = _Channel(Connection(data_fd, readable=False))
    root = logging.getLogger()
    root.handlers[:] = [_Forward(channel)]
    source: SpanSource | None = None
    code = 0
    try:
        try:
            source, level = pickle.loads(ctl.recv_bytes())
        except (EOFError, OSError):
            return 1
        assert source is not None
        tune_for_streaming()
        root.setLevel(level)
        channel.use(source)
        stop = threading.Event()
        threading.Thread(target=_control, args=(ctl, source, stop), name="control", daemon=True).start()
        threading.Thread(target=channel.flusher, name="flusher", daemon=True).start()
        source.open()
        source.run(channel, stop, channel.resolved)
        channel.flush()
        channel.send((_DONE,))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent, which fails the span
        code = 1
        try:
            blob: bytes | None = pickle.dumps((type(exc), exc.args, dict(vars(exc))), protocol=5)
        except Exception:  # noqa: BLE001 - not picklable: rebuilt from its code
            blob = None
        trace = "".join(traceback.format_exception(exc))
        with contextlib.suppress(OSError):
            channel.send((_ERROR, blob, getattr(exc, "code", None) if isinstance(exc, TidewaterError) else None,
                          getattr(exc, "message", str(exc)), type(exc).__name__, trace))
    finally:
        if source is not None:
            with contextlib.suppress(Exception):
                source.close()
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
