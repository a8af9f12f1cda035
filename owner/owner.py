"""The owner: the capture that won the etcd election runs the control loop.

A cycle is one sentence (Patroni): read one snapshot of the cluster, ``reconcile`` it into patches,
commit each patch as an etcd transaction fenced by the election key, and log one line when something
changed. A deposed owner's writes fail their fence (``NotOwner``) and it steps down.

Guarantees: every owner write carries ``election.fence()``; the loop never blocks on the upstream for
longer than one slot drop; it never calls a processor (they talk through etcd only).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cdc.config import ServerConfig
from cdc.errors import MetaStoreError, NotOwner, TidewaterError
from cdc.meta.election import Election
from cdc.meta.store import MetaStore
from owner.reconcile import Action, Assign, DropChangefeed, PutStatus, Unassign, UpdateInfo, reconcile
from upstream.postgres import admin
from upstream.postgres.conn import connect

log = logging.getLogger(__name__)


class Owner:
    def __init__(self, store: MetaStore, election: Election, capture_id: str, config: ServerConfig,
                 session_alive: Callable[[], bool], clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.election = election
        self._session_alive = session_alive
        self.capture_id = capture_id
        self.config = config
        self._clock = clock
        self.is_owner = False

    def run(self, stop: threading.Event) -> None:
        """Campaign, lead until deposed or stopped, campaign again."""
        while not stop.is_set():
            try:
                won = self.election.campaign(self.capture_id.encode(), stop)
            except MetaStoreError as exc:
                log.warning("capture=%s campaign failed: %s", self.capture_id, exc)
                stop.wait(1.0)
                continue
            if not won:
                continue
            self.is_owner = True
            log.info("capture=%s is the owner", self.capture_id)
            try:
                self._lead(stop)
            finally:
                self.is_owner = False
                try:
                    self.election.resign()
                except MetaStoreError:
                    pass
                log.info("capture=%s is no longer the owner", self.capture_id)

    def _lead(self, stop: threading.Event) -> None:
        last_line = ""
        while not stop.is_set():
            if not self._session_alive():
                log.warning("capture=%s owner session lost; stepping down", self.capture_id)
                return
            try:
                actions = reconcile(self.store.snapshot(), self._clock(),
                                    stuck_duration=self.config.error_stuck_duration)
                done = [self._apply(a) for a in actions]
                line = "; ".join(d for d in done if d)
                if line and line != last_line:
                    log.info("owner capture=%s: %s", self.capture_id, line)
                last_line = line
            except NotOwner:
                log.warning("capture=%s lost ownership (fenced write refused); stepping down", self.capture_id)
                return
            except MetaStoreError as exc:
                log.warning("owner capture=%s: etcd unavailable: %s", self.capture_id, exc)
            stop.wait(self.config.owner_tick)

    def _apply(self, action: Action) -> str:
        fence = self.election.fence()
        s = self.store
        if isinstance(action, Assign):
            s.put_assignment(action.cf, action.span, action.assignment, fence)
            return f"span {action.cf}/{action.span} -> capture {action.assignment.capture_id} (epoch {action.assignment.epoch})"
        if isinstance(action, Unassign):
            s.delete_assignment(action.cf, action.span, fence)
            return f"span {action.cf}/{action.span} unassigned"
        if isinstance(action, PutStatus):
            s.put_status(action.cf, action.status, fence)
            return ""
        if isinstance(action, UpdateInfo):
            if s.update_changefeed(action.info, action.expected_mod, fence):
                err = f" ({action.info.error.message})" if action.info.error else ""
                return f"changefeed {action.cf}: {action.reason}{err}"
            return ""
        if isinstance(action, DropChangefeed):
            self._drop_upstream(action)
            s.delete_changefeed(action.cf, fence)
            return f"changefeed {action.cf} removed"
        raise TypeError(action)

    def _drop_upstream(self, action: DropChangefeed) -> None:
        """Drop the changefeed's slots and publications. If the upstream is unreachable the removal
        waits (retried next tick) for up to 5 minutes, then the keys go and the leftover slot names are
        logged as an error, so that an unreachable upstream cannot pin a removed changefeed forever."""
        info = action.info
        try:
            conn = connect(info.upstream_uri)
            try:
                for span in info.spans:
                    admin.drop_slot(conn, span.slot, timeout=10)
                    admin.drop_publication(conn, span.publication)
            finally:
                conn.close()
        except TidewaterError as exc:
            if self._clock() - info.state_since < 300:
                raise MetaStoreError(f"removing changefeed {info.id}: upstream cleanup failed, will retry: {exc}") from exc
            log.error("changefeed=%s removed but its upstream slots %s could not be dropped (%s): drop them by hand "
                      "with SELECT pg_drop_replication_slot(...) or they will retain WAL",
                      info.id, [s.slot for s in info.spans], exc)
