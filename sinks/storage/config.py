"""The storage sink's URI: ``file:///dir?protocol=csv|canal-json|parquet&flush-interval=5s&...`` (no I/O here).

Storage options (TiCDC's names; TiCDC takes ``date-separator`` and ``file-index-width`` from its TOML, Tidewater
from the URI):

=================== ============ =================================================================================
parameter           default      meaning
=================== ============ =================================================================================
``protocol``        (required)   ``csv``, ``canal-json`` (one message per line) or ``parquet`` (typed columns)
``flush-interval``  ``5s``       a Go duration (``500ms``, ``5s``, ``1m``) between 100 ms and 10 min: how long
                                 written rows may wait before their files are published (``BufferedSink.flush_interval``)
``file-size``       ``67108864`` bytes after which a table's file is closed and the next one begun (at a write
                                 boundary: only whole transactions are in a file), between 1 KiB and 512 MiB
``date-separator``  ``day``      ``none``, ``year``, ``month`` or ``day``: the ``{date}`` directory (UTC)
``file-index-width````20``       digits of the file index in ``CDC{index}.ext``, 6 to 20
``worker-count``    -            accepted for TiCDC compatibility, no effect (one writer per span)
=================== ============ =================================================================================

plus the codec options of the protocol (``sinks.codec.EncoderConfig``): CSV ``csv-delimiter``, ``csv-quote``,
``csv-null``, ``csv-terminator``, ``csv-include-commit-ts``, ``csv-output-old-value``,
``csv-binary-encoding-method``, ``csv-output-field-header``; canal-json ``enable-tidb-extension``; all
``unavailable-value-placeholder``. Anything else, or a bad value, is :class:`cdc.errors.InvalidURI` naming the
parameter and the fix (TiCDC clamps an out-of-range ``flush-interval`` or ``file-size`` with a log line; Tidewater
refuses it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cdc.errors import InvalidArgument, InvalidURI
from cdc.uri import parse_sink_uri
from sinks.codec.base import EncoderConfig

EXTENSIONS = {"csv": ".csv", "canal-json": ".json", "parquet": ".parquet"}
"""File extension per protocol (TiCDC's ``GetFileExtension``; Parquet is Tidewater's)."""
DATE_SEPARATORS = ("none", "year", "month", "day")
STORAGE_PARAMS = ("protocol", "flush-interval", "file-size", "date-separator", "file-index-width", "worker-count")
CODEC_PARAMS: dict[str, tuple[str, ...]] = {
    "csv": ("csv-delimiter", "csv-quote", "csv-null", "csv-terminator", "csv-include-commit-ts",
            "csv-output-old-value", "csv-binary-encoding-method", "csv-output-field-header",
            "unavailable-value-placeholder"),
    "canal-json": ("enable-tidb-extension", "unavailable-value-placeholder"),
    "parquet": (),
}
MIN_FLUSH_INTERVAL, MAX_FLUSH_INTERVAL = 0.1, 600.0
MIN_FILE_SIZE, MAX_FILE_SIZE = 1024, 512 * 1024 * 1024
DEFAULT_FILE_SIZE = 64 * 1024 * 1024

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds of a Go duration (``time.ParseDuration``: ``1.5s``, ``300ms``, ``1m30s``); ValueError otherwise."""
    s = text.strip()
    if not s:
        raise ValueError("empty")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(f"{text!r} is not a duration")
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    return total


@dataclass(frozen=True)
class StorageConfig:
    """A parsed storage sink URI (module docstring). ``root`` is the absolute directory."""

    root: str
    protocol: str
    flush_interval: float = 5.0
    file_size: int = DEFAULT_FILE_SIZE
    date_separator: str = "day"
    file_index_width: int = 20
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.protocol]

    @classmethod
    def from_uri(cls, uri: str) -> StorageConfig:
        """Parse and validate ``uri`` (InvalidURI naming the fix)."""
        parsed = parse_sink_uri(uri)
        if parsed.scheme != "file":
            raise InvalidURI(f"not a storage sink URI: {parsed.redacted()!r} (use file:///dir?protocol=csv)")
        params = dict(parsed.params)
        protocol = params.get("protocol", "").strip().lower()
        if not protocol:
            raise InvalidURI(f"storage sink URI {parsed.redacted()!r} names no protocol: add "
                             f"?protocol=csv (or canal-json, parquet)")
        if protocol not in EXTENSIONS:
            raise InvalidURI(f"storage sink protocol {protocol!r} is not supported: use protocol=csv, canal-json or "
                             f"parquet")
        allowed = set(STORAGE_PARAMS) | set(CODEC_PARAMS[protocol])
        unknown = sorted(k for k in params if k not in allowed)
        if unknown:
            raise InvalidURI(f"storage sink URI parameter(s) {', '.join(unknown)} unknown for protocol {protocol}: "
                             f"remove them (known: {', '.join(sorted(allowed))}; docs/sinks.md, \"Storage sink\")")
        kwargs: dict[str, object] = {}
        if "flush-interval" in params:
            raw = params["flush-interval"]
            try:
                seconds = parse_duration(raw)
            except ValueError:
                raise InvalidURI(f"flush-interval={raw!r} is not a duration: use e.g. flush-interval=5s or "
                                 f"500ms") from None
            if not MIN_FLUSH_INTERVAL <= seconds <= MAX_FLUSH_INTERVAL:
                raise InvalidURI(f"flush-interval={raw!r} is out of range: use 100ms to 10m")
            kwargs["flush_interval"] = seconds
        if "file-size" in params:
            kwargs["file_size"] = _int_param(params, "file-size", MIN_FILE_SIZE, MAX_FILE_SIZE, "bytes")
        if "file-index-width" in params:
            kwargs["file_index_width"] = _int_param(params, "file-index-width", 6, 20, "digits")
        if "worker-count" in params:
            _int_param(params, "worker-count", 1, 512, "workers")
        if "date-separator" in params:
            sep = params["date-separator"].strip().lower()
            if sep not in DATE_SEPARATORS:
                raise InvalidURI(f"date-separator={params['date-separator']!r} is not supported: use none, year, "
                                 f"month or day")
            kwargs["date_separator"] = sep
        codec = {k: v for k, v in params.items() if k in CODEC_PARAMS[protocol]}
        try:
            encoder = EncoderConfig.from_params(codec)
        except InvalidArgument as exc:
            raise InvalidURI(f"storage sink URI: {exc.message}; use a valid value (docs/sinks.md, \"Formats\")") \
                from None
        return cls(parsed.path, protocol, encoder=encoder, **kwargs)  # type: ignore[arg-type]


def _int_param(params: dict[str, str], name: str, low: int, high: int, unit: str) -> int:
    raw = params[name]
    try:
        value = int(raw)
    except ValueError:
        raise InvalidURI(f"{name}={raw!r} is not an integer: give the {unit} as digits") from None
    if not low <= value <= high:
        raise InvalidURI(f"{name}={raw!r} is out of range: use {low} to {high} {unit}")
    return value
