"""How a changefeed's tables map to spans, and how its upstream resources are named (pure functions).

Shared by the API (creating a changefeed's publications and slots) and the owner (adding tables created
later to the publication of the span they hash to), so both always agree. Both functions are stable
across versions and processes: changing them would move tables between spans of existing changefeeds.
"""

from __future__ import annotations

import hashlib
import zlib

from cdc.events import TableName


def span_of(table: TableName, span_count: int) -> int:
    """Stable assignment of a table to a span (crc32 of the qualified name ``schema.table``)."""
    return zlib.crc32(f"{table.schema}.{table.table}".encode()) % span_count


def resource_name(kind: str, cf_id: str, span: int) -> str:
    """The upstream name of a span's resource (``kind`` is ``pub`` or ``slot``): at most 63 characters,
    lower-case, deterministic; long ids are shortened with a hash so that distinct ids stay distinct."""
    base = f"tidewater_{kind}_{cf_id.lower().replace('-', '_')}_{span}"
    if len(base) <= 63:
        return base
    digest = hashlib.blake2b(base.encode(), digest_size=4).hexdigest()
    return f"{base[:50]}_{digest}_{span}"[:63]
