"""Binlog positions as Ts: the total order of one MySQL/MariaDB upstream's commits (docs/upstream-mysql.md).

``Ts = (epoch << 56) | (binlog file sequence << 32) | end position of the commit event`` (the XID event, or the
QUERY event that ends a transaction without one). The sequence is the numeric suffix of the binlog file name
(``mariadb-bin.000042`` -> 42, below 2**24); positions within a file are below 2**32 (``max_binlog_size`` is at most
1 GiB), and a file's sequence is greater than every earlier file's, so the Ts of later commits of one server are
greater. The *epoch* (0..255) counts the upstream servers the changefeed has been moved to
(:mod:`upstream.mysql.resume`: a failover to a replica continues with epoch + 1), so every Ts read from the new
server is above every Ts of the old one although its files and positions are unrelated. Within one epoch every
transaction starts at the end position of the one before it: the Ts of the last transaction already downstream
is also where the stream resumes on that server. ``cdc.ts.lsn_to_str`` renders it as ``SEQ/POS`` in hex (the
epoch shows as the high byte of SEQ).
"""

from __future__ import annotations

from cdc.errors import DecodeError

_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1
_SEQ_BITS = 24
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_EPOCH_SHIFT = _POS_BITS + _SEQ_BITS
MAX_EPOCH = 255


def file_sequence(log_file: str) -> int:
    """The numeric suffix of a binlog file name (``mariadb-bin.000042`` -> 42)."""
    _, dot, suffix = log_file.rpartition(".")
    if not dot or not suffix.isdigit():
        raise DecodeError(f"binlog file name {log_file!r} has no numeric suffix")
    return int(suffix)


def to_ts(log_file: str, pos: int, epoch: int = 0) -> int:
    """The Ts of the binlog position ``(log_file, pos)`` of the changefeed's ``epoch``-th upstream server."""
    if not 0 <= pos <= _POS_MASK:
        raise DecodeError(f"binlog position {pos} of {log_file} does not fit in 32 bits")
    seq = file_sequence(log_file)
    if seq > _SEQ_MASK:
        raise DecodeError(f"binlog file sequence {seq} of {log_file} does not fit in 24 bits")
    if not 0 <= epoch <= MAX_EPOCH:
        raise DecodeError(f"upstream epoch {epoch} is outside 0..{MAX_EPOCH}")
    return (epoch << _EPOCH_SHIFT) | (seq << _POS_BITS) | pos


def split_ts(ts: int) -> tuple[int, int]:
    """``(file sequence, position)`` of a Ts made by :func:`to_ts` (its epoch left out: :func:`epoch_of`)."""
    return (ts >> _POS_BITS) & _SEQ_MASK, ts & _POS_MASK


def epoch_of(ts: int) -> int:
    """The upstream epoch of a Ts made by :func:`to_ts` (0 for every Ts of a changefeed never moved)."""
    return ts >> _EPOCH_SHIFT


def file_name(base_files: list[str], sequence: int) -> str | None:
    """The file among ``base_files`` (``SHOW BINARY LOGS``) whose sequence is ``sequence`` (None: purged)."""
    for f in base_files:
        try:
            if file_sequence(f) == sequence:
                return f
        except DecodeError:
            continue
    return None
