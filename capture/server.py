"""`cdc server`: one capture process.

Lifecycle: open the sorter under ``--data-dir``, connect to etcd, then loop over *sessions*: grant a
lease, register the capture under it, start the owner (campaigns) and the processor threads, and wait.
If the lease is lost (etcd unreachable longer than the TTL, or the key expired while the process was
frozen) every span stops at once, and the capture registers again under a new lease and a new id, so
nothing it did under the old lease can be confused with the new one. SIGTERM stops cleanly: spans stop
and report their last checkpoint, the owner resigns, the capture key is deleted. SIGKILL loses nothing:
checkpoints are in etcd and the slots keep everything after them.

Health (``capture.health``): ``/livez`` while the main loop turns, ``/readyz`` while registered, etcd answers
and not draining. Under systemd (``Type=notify``, ``capture.sdnotify``): ``READY=1`` at the first
registration, ``WATCHDOG=1`` while live, ``STOPPING=1`` on SIGTERM. SIGHUP re-reads the server config
(``reload_config``) and applies its reloadable keys (``RELOADABLE``) to the running capture; every other
changed key is logged as needing a restart, and an invalid file changes nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from capture.api import ApiServer
from capture.changefeeds import ChangefeedService
from capture.health import Health
from capture.httpguard import ApiSecurity
from capture.incarnation import Incarnation
from capture.logsetup import set_capture_id
from capture.metrics import CaptureCollector, CaptureProcessState, make_registry
from capture.sdnotify import Notifier
from capture.snapshot_launcher import SparkCopyLauncher
from capture.snapshot_launcher import warm_up as warm_up_spark
from capture.verify_runs import VerifyRuns
from cdc.config import ServerConfig
from cdc.crypto import SecretBox
from cdc.errors import InvalidConfig, MetaStoreError, TidewaterError
from cdc.gcpolicy import tune_for_streaming
from cdc.meta.election import Election
from cdc.meta.etcd import EtcdClient
from cdc.meta.keys import owner_prefix
from cdc.meta.session import Session
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.store import MetaStore
from cdc.model import CaptureInfo
from owner.owner import Owner
from processor.processor import Processor, SpanView
from processor.source_process import SPAWNER
from sinks.factory import SinkFactory, sink_class
from sorter.leveldb import LevelDBSorter
from upstream import open_upstream

log = logging.getLogger(__name__)

VERSION = "0.1.0"

# Server config keys a SIGHUP applies to the running capture (read where they are used, on each use). The
# others (etcd, addr, data-dir, cluster-id, log-file, session-ttl, owner-tick, etcd-timeout, owner-flush-interval)
# shape connections, files, the lease timing invariant or a running loop: changing them needs a restart.
RELOADABLE = ("log_level", "gc_ttl", "upstream_check_interval", "error_backoff_min", "error_backoff_max",
              "error_stuck_duration", "checkpoint_interval", "checkpoint_min_interval", "drain_timeout",
              "sorter_disk_quota", "puller_process")


def config_changes(old: ServerConfig, new: ServerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(reloadable, restart_only)``: the keys that differ, each ``{key: new value}``."""
    changed = {f: getattr(new, f) for f in old.__dataclass_fields__ if getattr(old, f) != getattr(new, f)}
    return ({k: v for k, v in changed.items() if k in RELOADABLE},
            {k: v for k, v in changed.items() if k not in RELOADABLE})


def _warm_up() -> None:
    """What the first ``changefeed create`` would otherwise do on its request (~0.5 s, measured with py-spy): import
    the PostgreSQL upstream and the SQL sink (SQLAlchemy, psycopg2) and look for Java and pyspark. Run in a thread as
    the capture starts; raises nothing (a create that needs what is missing says so itself)."""
    warm_up_spark()
    try:
        sink_class("postgresql")
        open_upstream("postgresql://127.0.0.1/warm-up").close()  # (no I/O: sessions open on first use)
    except Exception as exc:  # noqa: BLE001 - only a head start
        log.debug("warm-up: %s", exc)


class AddressInUse(InvalidConfig):
    code = "CDC:ErrAddressInUse"


class CaptureServer:
    def __init__(self, config: ServerConfig, reload_config: Callable[[], ServerConfig] | None = None,
                 notifier: Notifier | None = None) -> None:
        self.config = config
        self._reload_config = reload_config
        self._reload = threading.Event()
        self.notifier = notifier if notifier is not None else Notifier()
        self._ready_sent = False
        self.stopping = threading.Event()
        self.capture_id = ""
        self.session: Session | None = None
        self.owner: Owner | None = None
        self.processor: Processor | None = None
        security = ApiSecurity.from_config(config)  # before anything starts: bad TLS files or tokens fail here
        self.client = EtcdClient(list(config.etcd), timeout=config.etcd_timeout)
        self.store = MetaStore(self.client, config.cluster_id, SecretBox.from_config(config.secret_key_file))
        data_dir = Path(config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        # one process per data directory; the lease its previous process left is revoked by the first session
        self.incarnation = Incarnation(data_dir)
        self._previous_lease = self.incarnation.previous_lease(config.cluster_id, config.etcd)
        # fresh: the sorter is a cache; spans rebuild it from their checkpoints (nothing to keep)
        self.sorter = LevelDBSorter(data_dir / "sorter", disk_quota=config.sorter_disk_quota, fresh=True)
        self.service = ChangefeedService(self.store)
        self.service.gc_ttl = config.gc_ttl
        self.service.verify_runs = VerifyRuns(self.store, config.etcd, data_dir, lambda: self.capture_id)
        self.process = CaptureProcessState(
            session_alive=self._session_alive, etcd=self.client.stats, data_dir=str(data_dir),
            sorter_disk_quota=config.sorter_disk_quota, version=VERSION, addr=config.addr)
        collector = CaptureCollector(
            capture_id="", is_owner=lambda: bool(self.owner and self.owner.is_owner),
            snapshot=self.store.snapshot, spans=self._span_views, sorter_bytes=self.sorter.disk_bytes,
            slot_reports=lambda: self.owner.watcher.reports() if self.owner and self.owner.is_owner else [],
            process=self.process, owner_terms=lambda: o.terms if (o := self.owner) is not None else 0,
            snapshot_progress=SnapshotProgressStore(self.client, config.cluster_id).progress)
        self._collector = collector
        try:
            self.api = ApiServer(config.addr, self.service, self._status, None, make_registry(collector, process=True),
                                 healthy=self._session_alive,
                                 owner_resign=lambda: bool(self.owner and self.owner.resign()),
                                 limits=security.limits, auth=security.auth, tls=security.tls,
                                 forward_tls=security.forward_tls)
        except OSError as exc:
            self.sorter.close()
            self.incarnation.close()
            raise AddressInUse(f"cannot listen on {config.addr}: {exc.strerror or exc} (another cdc server? "
                               "choose another --addr)") from exc
        self._exposure = security.exposure_warning(config.addr)
        self.process.api = self.api.stats
        self.health = Health(session_alive=self._session_alive, etcd_age=self._etcd_age, draining=self._draining,
                             etcd_stale_after=config.session_ttl / 3 + config.etcd_timeout + 1)
        self.api.add_probe("/livez", self.health.liveness)
        self.api.add_probe("/readyz", self.health.readiness)

    # ---- API callbacks ---------------------------------------------------------------------------
    def _session_alive(self) -> bool:
        return self.session is not None and self.session.alive.is_set()

    def _etcd_age(self) -> float | None:
        session = self.session
        return session.refresh_age if session is not None else None

    def _draining(self) -> bool:
        p = self.processor
        return self.process.draining or bool(p is not None and p.draining)

    def _span_views(self) -> list[SpanView]:
        p = self.processor
        return p.span_views() if p is not None else []

    def _runners(self) -> list[tuple[str, int, Any]]:
        p = self.processor
        if p is None:
            return []
        return [(v.changefeed, v.span, v.runner) for v in p.span_views() if v.runner is not None]

    def _status(self) -> dict[str, Any]:
        return {"id": self.capture_id, "version": VERSION, "pid": os.getpid(), "addr": self.config.addr,
                "cluster_id": self.config.cluster_id, "is_owner": bool(self.owner and self.owner.is_owner),
                "spans": [f"{cf}/{span}" for cf, span, _ in self._runners()]}

    # ---- lifecycle -------------------------------------------------------------------------------
    def run(self) -> int:
        self.api.start()
        log.info("cdc server listening on %s://%s (etcd %s, cluster %s, data dir %s)", self.api.scheme,
                 self.config.addr, ",".join(self.config.etcd), self.config.cluster_id, self.config.data_dir)
        for warning in [self._exposure, *ApiSecurity.loose_files(self.config)]:
            if warning:
                log.warning("%s", warning)
        if self.store.secrets is None:
            log.warning("no secret key file (--secret-key-file): changefeed credentials are stored in etcd in "
                        "plain text (docs/operations.md, \"Credentials in etcd\")")
        watchdog_stop = threading.Event()
        if self.notifier.watchdog_interval > 0:
            threading.Thread(target=self.notifier.run_watchdog, args=(lambda: not self.health.liveness(),
                                                                     watchdog_stop),
                             name="sd-watchdog", daemon=True).start()
        self.notifier.notify(f"STATUS=connecting to etcd {','.join(self.config.etcd)}")
        threading.Thread(target=_warm_up, name="warm-up", daemon=True).start()
        try:
            while not self.stopping.is_set():
                self.health.beat()
                self._maybe_reload()
                try:
                    self._run_session()
                except MetaStoreError as exc:
                    log.warning("etcd unavailable (%s); retrying in 1s", exc)
                    self.notifier.notify(f"STATUS=etcd unavailable: {exc}"[:400])
                    self.stopping.wait(1.0)
        finally:
            self.notifier.notify("STOPPING=1", "STATUS=stopping")
            watchdog_stop.set()
            self.api.stop()
            self.service.verify_runs.close()  # (a job stopped by SIGTERM releases its hold)
            self.sorter.close()
            self.client.close()
            self.incarnation.close()
            log.info("cdc server stopped")
        return 0

    def _run_session(self) -> None:
        self.capture_id = str(uuid.uuid4())
        self._collector.capture_id = self.capture_id
        set_capture_id(self.capture_id)
        previous = self._previous_lease
        if previous is not None:  # the process that used this data directory before is gone (capture.incarnation)
            self.client.revoke_lease(previous)  # (etcd unavailable: raised, and the next session tries again)
            self._previous_lease = None
            log.info("revoked lease %x of this data directory's previous process: its captures, election key and "
                     "spans are released now instead of after session-ttl", previous)
        session = Session(self.client, self.config.session_ttl)
        self.session = session
        self.incarnation.record(self.config.cluster_id, self.config.etcd, session.lease_id)
        self.process.sessions += 1
        info = CaptureInfo(self.capture_id, self.config.addr, VERSION, time.time(), os.getpid())
        self.store.register_capture(info, session.lease_id)
        log.info("capture=%s registered (lease %x, ttl %ds)", self.capture_id, session.lease_id,
                 self.config.session_ttl)
        try:
            self.store.reseal_changefeeds()  # plain or old-key credentials -> sealed with the first key
        except TidewaterError as exc:
            log.warning("capture=%s could not reseal changefeed credentials: %s", self.capture_id, exc)
        status = f"STATUS=capture {self.capture_id} registered, serving {self.api.scheme}://{self.config.addr}"
        if self._ready_sent:
            self.notifier.notify(status)
        else:
            self.notifier.notify("READY=1", status)
            self._ready_sent = True
        session_stop = threading.Event()
        election = Election(self.client, session, owner_prefix(self.config.cluster_id))
        # the wiring: owner and processor get the sink and upstream factories from here (they import neither)
        sinks = SinkFactory()
        self.owner = Owner(self.store, election, self.capture_id, self.config, session_alive=session.alive.is_set,
                           sinks=sinks, open_upstream=open_upstream)
        self.processor = Processor(self.store, self.capture_id, self.sorter, self.config, lambda: session.lease_id,
                                   lease_deadline=lambda: session.deadline,
                                   copy_launcher=SparkCopyLauncher(self.config.etcd, self.config.cluster_id,
                                                                   self.config.data_dir),
                                   sinks=sinks, open_upstream=open_upstream)
        threads = [
            threading.Thread(target=self.owner.run, args=(session_stop,), name="owner", daemon=True),
            threading.Thread(target=self.processor.run, args=(session_stop,), name="processor", daemon=True),
        ]
        for th in threads:
            th.start()
        while not self.stopping.is_set() and session.alive.is_set():
            self.health.beat()
            self._maybe_reload()
            self.stopping.wait(0.2)
        lost = not session.alive.is_set()
        if not lost:
            self._drain(session, info)
        if lost:
            log.error("capture=%s lost its etcd session: stopping all spans and registering again", self.capture_id)
        session_stop.set()
        self.owner.wake()
        for th in threads:
            th.join(30)
        owner, self.owner = self.owner, None
        self.process.owner_terms += owner.terms
        if not lost:
            try:
                self.store.delete_capture(self.capture_id)
            except TidewaterError as exc:
                log.warning("could not delete capture key: %s", exc)
        session.close(revoke=not lost)
        self.session = None

    def _drain(self, session: Session, info: CaptureInfo) -> None:
        """SIGTERM: let the owner move this capture's spans to the others before exiting (two-phase
        moves, so no span runs twice), for at most ``drain-timeout`` seconds."""
        try:
            snap = self.store.snapshot()
            others = [c for c in snap.captures.values() if c.id != self.capture_id and not c.draining]
            mine = self._my_spans(snap)
            if not others or not mine:
                return
            self.store.register_capture(replace(info, draining=True), session.lease_id)
            self.process.draining = True
            log.info("capture=%s draining: waiting for the owner to move %d spans", self.capture_id, len(mine))
            deadline = time.monotonic() + self.config.drain_timeout
            while time.monotonic() < deadline and session.alive.is_set():
                self.health.beat()
                mine = self._my_spans(self.store.snapshot())
                if not mine:
                    log.info("capture=%s drained", self.capture_id)
                    return
                time.sleep(0.3)
            log.warning("capture=%s drain timed out with spans %s still here; stopping them", self.capture_id, mine)
        except TidewaterError as exc:
            log.warning("capture=%s drain failed (%s); stopping", self.capture_id, exc)

    def _my_spans(self, snap: Any) -> list[str]:
        return [f"{cf}/{span}" for cf, spans in snap.assignments.items() for span, a in spans.items()
                if a.capture_id == self.capture_id]

    def request_stop(self, *_: Any) -> None:
        log.info("capture=%s stopping (signal)", self.capture_id)
        self.stopping.set()

    def request_reload(self, *_: Any) -> None:
        """SIGHUP: only sets a flag (a signal handler must not take locks); the main loop reloads."""
        self._reload.set()

    def _maybe_reload(self) -> None:
        if not self._reload.is_set():
            return
        self._reload.clear()
        if self._reload_config is None:
            log.warning("capture=%s SIGHUP: no config file to re-read (started without --config)", self.capture_id)
            return
        self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={Notifier.monotonic_usec()}")
        try:
            new = self._reload_config()
        except (OSError, TidewaterError) as exc:
            log.error("capture=%s SIGHUP: config not reloaded, keeping the running one: %s", self.capture_id, exc)
            self.notifier.notify("READY=1", "STATUS=config reload failed; running with the previous config")
            return
        applied, ignored = config_changes(self.config, new)
        self.apply_config(replace(self.config, **applied))
        if ignored:
            log.warning("capture=%s SIGHUP: %s changed in the config file but need a restart to apply",
                        self.capture_id, ", ".join(f"{k.replace('_', '-')}={v!r}" for k, v in sorted(ignored.items())))
        log.info("capture=%s SIGHUP: config reloaded; applied %s", self.capture_id,
                 ", ".join(f"{k.replace('_', '-')}={v!r}" for k, v in sorted(applied.items())) or "no change")
        self.notifier.notify("READY=1", f"STATUS=config reloaded ({len(applied)} change(s) applied)")

    def apply_config(self, config: ServerConfig) -> None:
        """Make ``config`` (which differs from the running one in reloadable keys only) the running one."""
        self.config = config
        logging.getLogger().setLevel(getattr(logging, config.log_level.upper(), logging.INFO))
        self.sorter.disk_quota = config.sorter_disk_quota
        self.process.sorter_disk_quota = config.sorter_disk_quota
        self.service.gc_ttl = config.gc_ttl
        owner, processor = self.owner, self.processor
        if owner is not None:
            owner.config = config
            owner.watcher.gc_ttl = config.gc_ttl
            owner.watcher.interval = config.upstream_check_interval
        if processor is not None:
            processor.config = config
        if not config.puller_process:
            SPAWNER.drop_spare()  # the child started for the next span would wait for one that never takes it


def _probe_addr(addr: str) -> None:
    """Fail before touching the data dir when ``addr`` is taken (e.g. this capture started twice): the
    sorter is opened fresh, which must not happen under a running capture."""
    host, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise InvalidConfig(f"--addr {addr!r} must be HOST:PORT with a numeric port")
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
        try:
            probe.bind((host.strip("[]") or "127.0.0.1", int(port)))
        except OSError as exc:
            raise AddressInUse(f"cannot listen on {addr}: {exc.strerror or exc} (another cdc server? choose "
                               "another --addr)") from exc


def serve(config: ServerConfig, reload_config: Callable[[], ServerConfig] | None = None) -> int:
    """Run a capture until SIGTERM/SIGINT; SIGHUP re-reads the config through ``reload_config``."""
    _probe_addr(config.addr)
    server = CaptureServer(config, reload_config)
    tune_for_streaming()  # (after the imports: they are frozen, never scanned again)
    signal.signal(signal.SIGTERM, server.request_stop)
    signal.signal(signal.SIGINT, server.request_stop)
    signal.signal(signal.SIGHUP, server.request_reload)
    return server.run()
