"""One error hierarchy with stable codes.

Every error raised across a module boundary is a :class:`TidewaterError`. ``code`` is a stable string
(``CDC:ErrXxx``) that appears in API bodies, CLI output and changefeed state; ``retryable`` tells the
owner's state machine whether the failure is transient (``warning`` + backoff) or fatal (``failed``).
Foreign exceptions are wrapped once, at the boundary that caught them.
"""

from __future__ import annotations


class TidewaterError(Exception):
    code = "CDC:ErrUnknown"
    retryable = False
    http_status = 500

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.__cause__ = cause

    def to_dict(self) -> dict[str, str]:
        return {"error_code": self.code, "error_msg": self.message}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


# ---- user input / validation (HTTP 400, CLI exit 1) -------------------------------------------------
class InvalidArgument(TidewaterError):
    code = "CDC:ErrInvalidArgument"
    http_status = 400


class InvalidURI(InvalidArgument):
    code = "CDC:ErrInvalidURI"


class SecretKeyMissing(InvalidURI):
    """A URI stored sealed in etcd that this capture cannot open (its secret key file lacks the key).
    Retryable: the capture's configuration is wrong, not the changefeed; fixed by a restart with the key."""

    code = "CDC:ErrSecretKeyMissing"
    retryable = True


class InvalidConfig(InvalidArgument):
    code = "CDC:ErrInvalidConfig"


class TableNotEligible(InvalidArgument):
    """A matched table cannot be replicated (no primary key and no REPLICA IDENTITY FULL, ...)."""

    code = "CDC:ErrTableIneligible"


class TargetNameConflict(InvalidArgument):
    code = "CDC:ErrTargetTableConflict"


class UpstreamNotReady(InvalidArgument):
    """The upstream is reachable but misconfigured (wal_level, permissions, ...)."""

    code = "CDC:ErrUpstreamNotReady"


class ChangefeedExists(TidewaterError):
    code = "CDC:ErrChangefeedAlreadyExists"
    http_status = 409


class ChangefeedNotFound(TidewaterError):
    code = "CDC:ErrChangefeedNotFound"
    http_status = 404


class ChangefeedStateConflict(TidewaterError):
    code = "CDC:ErrChangefeedStateConflict"
    http_status = 409


# ---- runtime, transient ------------------------------------------------------------------------------
class UpstreamUnavailable(TidewaterError):
    code = "CDC:ErrUpstreamUnavailable"
    retryable = True
    http_status = 503


class SinkUnavailable(TidewaterError):
    code = "CDC:ErrSinkUnavailable"
    retryable = True
    http_status = 503


class SinkFenced(SinkUnavailable):
    """The sink's writer was fenced by a newer one with the same identity (a Kafka transactional id taken over
    by the span's next owner): nothing of the write was committed. Retryable: the span restarts where it is
    still owned, and a fenced writer whose capture lost the span never restarts it."""

    code = "CDC:ErrSinkFenced"


class MetaStoreError(TidewaterError):
    code = "CDC:ErrEtcd"
    retryable = True
    http_status = 503


class NotOwner(TidewaterError):
    """A write conditioned on ownership failed: this capture is not (or no longer) the owner."""

    code = "CDC:ErrNotOwner"
    retryable = True
    http_status = 503


class LeaseLost(TidewaterError):
    code = "CDC:ErrCaptureLeaseLost"
    retryable = True


# ---- runtime, fatal ----------------------------------------------------------------------------------
class SinkError(TidewaterError):
    """The sink rejected data in a way retrying cannot fix (bad schema mapping, constraint, ...)."""

    code = "CDC:ErrSinkFatal"


class DataRejected(SinkError):
    """The target refused data: a value it cannot store (a column too narrow, out of range, strict mode), a row a
    constraint of the target refuses (NOT NULL, CHECK, UNIQUE, a foreign key). ``reason`` is the database's (or the
    value converter's) own words. Fatal: retrying sends the same row again; the target or the row must change. The
    initial copy names the refused row's table and key (``spark_jobs.rejected``)."""

    code = "CDC:ErrSinkDataRejected"

    def __init__(self, message: str, *, reason: str = "", cause: BaseException | None = None) -> None:
        super().__init__(message, cause=cause)
        self.reason = reason or message


class DdlRejected(SinkError):
    """A schema change that the sink cannot apply: untranslatable (a narrowing type change, a type or
    feature the target lacks) or rejected by the target. Names the DDL text, the table and the reason; the
    operator fixes the target or skips that DDL knowingly."""

    code = "CDC:ErrDdlRejected"

    def __init__(self, query: str, table: str, reason: str, *, commit_ts: int = 0,
                 cause: BaseException | None = None) -> None:
        at = f" (commit ts {commit_ts})" if commit_ts else ""
        how = (f"; fix the target, or skip this DDL knowingly with `cdc cli changefeed update -c <id> --skip-ddl-ts "
               f"{commit_ts}` and resume") if commit_ts else ""
        super().__init__(f"DDL {query!r} on table {table}{at} cannot be applied: {reason}{how}", cause=cause)
        self.query = query
        self.table = table
        self.reason = reason
        self.commit_ts = commit_ts


class TargetTableDropped(SinkError):
    """A target table that this changefeed created or wrote rows into is missing downstream, and no upstream DROP or
    RENAME TABLE that the changefeed applied took it away: it was dropped behind the changefeed's back. Creating it
    again would leave every row it held missing while the changefeed goes on as if nothing happened, so the sink
    refuses, naming the table and the fix (copy it again: ``cdc cli changefeed snapshot --table``, then ``resume``; or
    remove and re-create the changefeed). Fatal: retrying finds the table missing again."""

    code = "CDC:ErrTargetTableDropped"

    def __init__(self, message: str, *, table: str = "", cause: BaseException | None = None) -> None:
        super().__init__(message, cause=cause)
        self.table = table


class DdlOrderUnknown(SinkError):
    """Two spans of a changefeed hold name-changing DDLs (CREATE, DROP, RENAME TABLE) of one upstream transaction, and
    at least one of them has no known position in it (seen in the stream alone, without the DDL trigger): applying
    them in the wrong order would put rows under the wrong name downstream, so neither is applied. The message names
    the tables, the commit Ts and the fix."""

    code = "CDC:ErrDdlOrderUnknown"


class UpstreamError(TidewaterError):
    code = "CDC:ErrUpstreamFatal"


class SlotLost(UpstreamError):
    code = "CDC:ErrSlotLost"


class DecodeError(UpstreamError):
    code = "CDC:ErrDecode"


class SnapshotExpired(UpstreamError):
    """The exported snapshot a snapshot copy reads under no longer exists (the replication connection that
    exported it ended or ran another command). Retrying with the same name cannot work: the copy goes on
    under a fresh snapshot (docs/snapshot.md says why that converges)."""

    code = "CDC:ErrSnapshotExpired"


class SnapshotPositionUnknown(TidewaterError):
    """The copy of a key-less table cannot be placed in the stream: its record carries no commit Ts, or a snapshot
    name and Ts that are not one export of the span's copy runs (snapshot names repeat after an upstream restart:
    the name alone proves nothing). Streaming it would drop or duplicate changes, so the span refuses; the record is
    dropped first, so the next run (``resume``) copies the table again, whole, under a new snapshot."""

    code = "CDC:ErrSnapshotPosition"

    def __init__(self, message: str, *, table: str = "", cause: BaseException | None = None) -> None:
        super().__init__(message, cause=cause)
        self.table = table


class SnapshotTableChanged(SinkError):
    """A table's columns or key changed upstream while its copy was under way, and the rows already copied cannot be
    replaced (``on-existing-rows = "merge"``: the target holds the user's rows). The message names the table, both
    definitions and the fix."""

    code = "CDC:ErrSnapshotTableChanged"


class SnapshotTableRewritten(TidewaterError):
    """A table was truncated or rewritten (an ``ALTER TABLE`` that rewrites it) after the exported snapshot a copy
    reads it under: PostgreSQL shows such a table empty to older snapshots, so reading it would copy nothing of it.
    Retryable: the next copy run reads under a fresh snapshot."""

    code = "CDC:ErrSnapshotTableRewritten"
    retryable = True


class SnapshotTableAltered(SnapshotTableRewritten):
    """A table a copy reads was renamed or dropped, or a column it reads was dropped or renamed, after the copy's
    exported snapshot: PostgreSQL resolves the copy's query against the current catalog, so it no longer runs.
    Retryable: the next copy run reads under a fresh snapshot, where the table's new definition is planned anew (its
    copy starts over) or the table, gone, is not copied."""

    code = "CDC:ErrSnapshotTableAltered"


class GCTTLExceeded(TidewaterError):
    """The changefeed was stopped or failed for longer than ``gc-ttl``: the owner dropped its slots (the
    upstream no longer retains its changes), so it can never be resumed, only recreated."""

    code = "CDC:ErrGCTTLExceeded"
    http_status = 409


class SnapshotSuperseded(TidewaterError):
    """A snapshot job run may no longer commit: another run of the same span started, or the span's copy was
    ended (streaming is about to start). Nothing of the chunk was committed."""

    code = "CDC:ErrSnapshotSuperseded"
    http_status = 409


class SparkUnavailable(TidewaterError):
    """Spark cannot run a job here: no Java (or too old), pyspark missing, or the master URL is wrong or
    unreachable. The message names which and the fix."""

    code = "CDC:ErrSparkUnavailable"
    http_status = 503


class SparkNoExecutors(SparkUnavailable):
    """A Spark cluster's master took the copy job but no executor registered for it in time (no worker, or none
    with the cores and memory the job asks for): without executors the job would wait forever. Retryable: the
    changefeed shows it as a warning with this reason and runs the job again (copied chunks stay done)."""

    code = "CDC:ErrSparkNoExecutors"
    retryable = True


class SorterError(TidewaterError):
    code = "CDC:ErrSorter"


class DiskFull(SorterError):
    code = "CDC:ErrDiskFull"
    retryable = True


class VerifyRunNotFound(TidewaterError):
    """No such ``changefeed verify`` run (or, to stop one: not a running job of the capture asked)."""

    code = "CDC:ErrVerifyRunNotFound"
    http_status = 404


class VerifyHoldFailed(TidewaterError):
    """``changefeed verify`` could not hold the changefeed at one point (another verification holds it, a span did
    not answer in time, or one applied past the point): nothing was compared (docs/verify.md, "The hold")."""

    code = "CDC:ErrVerifyHold"
    retryable = True
    http_status = 409


def error_for_code(code: str | None, message: str) -> TidewaterError:
    """The ``TidewaterError`` subclass whose code is ``code`` (an error that crossed a process boundary as code
    and message: a Spark task's, the snapshot job's), so that it keeps its kind and whether it is retryable."""
    stack: list[type[TidewaterError]] = [TidewaterError]
    while stack:
        cls = stack.pop()
        if cls.code == code:
            try:
                return cls(message)
            except TypeError:  # a class whose __init__ takes other arguments (DdlRejected): its kind and the message
                err = cls.__new__(cls, message)
                TidewaterError.__init__(err, message)
                return err
        stack.extend(cls.__subclasses__())
    return TidewaterError(message)
