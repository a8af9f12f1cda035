"""A changefeed's checkpoint followed by an etcd watch of the bench's own: the end of a catch-up is seen when the owner
writes it, not at the bench's next poll of the capture's HTTP API.

The bench used to poll ``GET /api/v2/changefeeds/{id}`` every 0.25 s during a catch-up, so every catch-up figure was
rounded up to the next poll: a 100,000-row catch-up of MariaDB (a) into blackhole whose checkpoint reached the end
~0.26 s after the resume was measured as 0.26 s or 0.51 s depending on which side of the second poll it fell (the
"bimodal" rates of docs/benchmarks.md, 2026-11-29). Polling faster would have the capture serve more requests while
it is measured (its CPU is part of the figure); a watch costs the capture nothing.

:class:`CheckpointWatch` watches the changefeed's status key (``cdc.meta.keys.changefeed_status_key``, the owner's
aggregate that the API's ``checkpoint_ts`` shows) from the moment it is opened; :meth:`CheckpointWatch.wait` returns
as soon as a write puts the checkpoint at or past a Ts, with the time it saw that write.

Thread-safety: the watch's callback runs on its own thread; ``wait`` and ``checkpoint`` may be called from any one
other thread.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from cdc import serde
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient, Watch
from cdc.meta.kv import WatchResponse
from cdc.meta.store import MetaStore
from cdc.model import ChangefeedStatus


class CheckpointWatch:
    """The stored checkpoint of changefeed ``cf_id`` of cluster ``cluster_id`` on the etcd at ``etcd_url`` (opened by
    ``with`` or :meth:`open`, closed by :meth:`close`)."""

    def __init__(self, etcd_url: str, cluster_id: str, cf_id: str) -> None:
        self._key = keys.changefeed_status_key(cluster_id, cf_id)
        self._etcd_url, self._cluster_id, self._cf_id = etcd_url, cluster_id, cf_id
        self._cond = threading.Condition()
        self._checkpoint = 0
        self._seen_at = 0.0  # monotonic time the watch saw the current checkpoint (0: read when opened)
        self._client: EtcdClient | None = None
        self._watch: Watch | None = None

    def open(self) -> CheckpointWatch:
        """Watch first, then read the stored value: every write after the read is delivered, none is missed."""
        self._client = EtcdClient([self._etcd_url])
        self._watch = self._client.watch_prefix(self._key, None, self.on_events)
        status = MetaStore(self._client, self._cluster_id).get_status(self._cf_id)
        if status is not None:
            self._raise_to(status.value.checkpoint_ts, 0.0)
        return self

    def close(self) -> None:
        client, self._client, self._watch = self._client, None, None
        if client is not None:
            client.close()

    def __enter__(self) -> CheckpointWatch:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def checkpoint(self) -> int:
        return self._checkpoint

    def wait(self, ts: int, timeout: float) -> float | None:
        """Wait up to ``timeout`` seconds until the stored checkpoint is at or past ``ts``; the monotonic time the
        watch saw it get there (the time of the call when it was there when opened), None after the timeout (also the
        whole timeout when not open: then it is a sleep)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._checkpoint < ts:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._seen_at or time.monotonic()

    def on_events(self, resp: WatchResponse) -> None:
        """The watch's callback (its own thread): the checkpoint of every put of the status key."""
        now = time.monotonic()
        for ev in resp.events:
            if ev.kv.key != self._key or ev.type == "delete":  # (the prefix also covers longer changefeed ids)
                continue
            self._raise_to(serde.from_json(ChangefeedStatus, ev.kv.value).checkpoint_ts, now)

    def _raise_to(self, checkpoint: int, at: float) -> None:
        with self._cond:
            if checkpoint > self._checkpoint:
                self._checkpoint, self._seen_at = checkpoint, at
                self._cond.notify_all()
