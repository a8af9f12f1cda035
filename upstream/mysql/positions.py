"""Binlog positions as Ts: the total order of one MySQL/MariaDB upstream's commits (docs/upstream-mysql.md).

``Ts = (binlog file sequence << 32) | end position of the commit event`` (the XID event, or the QUERY event that
ends a transaction without one). The sequence is the numeric suffix of the binlog file name
(``mariadb-bin.000042`` -> 42); positions within a file are below 2**32 (``max_binlog_size`` is at most 1 GiB), and
a file's sequence is greater than every earlier file's, so the Ts of later commits are greater. Every
transaction starts at the end position of the one before it: the Ts of the last transaction already downstream
is also where the stream resumes. ``cdc.ts.lsn_to_str`` renders it as ``SEQ/POS`` in hex.
"""

from __future__ import annotations

from cdc.errors import DecodeError

_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1


def file_sequence(log_file: str) -> int:
    """The numeric suffix of a binlog file name (``mariadb-bin.000042`` -> 42)."""
    _, dot, suffix = log_file.rpartition(".")
    if not dot or not suffix.isdigit():
        raise DecodeError(f"binlog file name {log_file!r} has no numeric suffix")
    return int(suffix)


def to_ts(log_file: str, pos: int) -> int:
    """The Ts of the binlog position ``(log_file, pos)``."""
    if not 0 <= pos <= _POS_MASK:
        raise DecodeError(f"binlog position {pos} of {log_file} does not fit in 32 bits")
    return (file_sequence(log_file) << _POS_BITS) | pos


def split_ts(ts: int) -> tuple[int, int]:
    """``(file sequence, position)`` of a Ts made by :func:`to_ts`."""
    return ts >> _POS_BITS, ts & _POS_MASK


def file_name(base_files: list[str], sequence: int) -> str | None:
    """The file among ``base_files`` (``SHOW BINARY LOGS``) whose sequence is ``sequence`` (None: purged)."""
    for f in base_files:
        try:
            if file_sequence(f) == sequence:
                return f
        except DecodeError:
            continue
    return None
