"""Golden files: the exact bytes every protocol writes for the scenarios of ``codec_cases`` (insert, update, delete,
key change, unchanged TOAST value, snapshot row, truncate, DDL, watermark, every type, batching).

The files are ``golden/<variant>.txt``; each message is shown as its key and value: as the UTF-8 text itself when it
is printable on one line (``key:``/``value:``), else with its bytes mapped 1:1 to characters (ISO-8859-1) and written
as a JSON string (``key~``/``value~``: framing bytes, line ends), so the file is exact and diffable. The time-of-encoding
fields come from the fixed ``codec_cases.CLOCK``, so the files are deterministic.

Regenerate them only on purpose (a deliberate change of a format), then review ``git diff``:

    TIDEWATER_REGEN_GOLDEN=1 python -m pytest tests/unit/sinks/codec/test_codec_golden.py

(the run writes the files and fails, so that a regeneration is never mistaken for a pass).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from codec_cases import CLOCK, cases

from sinks.codec import EncodeError, EncoderConfig, Message, encoder_for

GOLDEN = Path(__file__).parent / "golden"
BASE = EncoderConfig(debezium_database="appdb", max_batch_size=2)
VARIANTS: dict[str, tuple[str, EncoderConfig]] = {
    "canal-json": ("canal-json", BASE),
    "canal-json-no-tidb-extension": ("canal-json", replace(BASE, enable_tidb_extension=False)),
    "debezium": ("debezium", BASE),
    "debezium-no-schema": ("debezium", replace(BASE, schemas_enable=False, tombstones_on_delete=False,
                                                decimal_handling_mode="string", interval_handling_mode="string",
                                                binary_handling_mode="hex")),
    "open-protocol": ("open-protocol", BASE),
    "csv": ("csv", BASE),
    "csv-old-value-escaped": ("csv", replace(BASE, csv_output_old_value=True, csv_quote="", csv_terminator="\n",
                                             csv_output_field_header=True, csv_binary_encoding="hex")),
}


def _bytes(label: str, b: bytes | None) -> str:
    if b is None:
        return f"{label}: null"
    try:
        text = b.decode("utf-8")
        if text.isprintable():
            return f"{label}: {text}"
    except UnicodeDecodeError:
        pass
    return f"{label}~ {json.dumps(b.decode('latin-1'))}"


def _render_message(m: Message) -> list[str]:
    table = str(m.table) if m.table is not None else "-"
    lines = [f"# {m.kind.value} rows={m.rows} table={table} commit_ts={m.commit_ts}",
             _bytes("key", m.key), _bytes("value", m.value)]
    lines += [_bytes(f"header {name}", value) for name, value in m.headers]
    return lines


def render(protocol: str, config: EncoderConfig) -> str:
    out = [f"# golden file of {protocol}; see tests/unit/sinks/codec/test_codec_golden.py", ""]
    for case in cases():
        if protocol not in case.protocols:
            continue
        out.append(f"### {case.name}")
        enc = encoder_for(protocol, config, clock=lambda: CLOCK)
        if case.ddl is not None:
            msgs = [m for m in [enc.encode_ddl(case.ddl)] if m is not None]
        elif case.watermark is not None:
            msgs = [m for m in [enc.encode_watermark(case.watermark)] if m is not None]
        else:
            enc.append_rows(case.changes)
            msgs = enc.build()
        if not msgs:
            out.append("(no message)")
        for m in msgs:
            out += _render_message(m)
        out.append("")
    return "\n".join(out)


@pytest.mark.unit
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_golden(variant: str) -> None:
    protocol, config = VARIANTS[variant]
    text = render(protocol, config)
    path = GOLDEN / f"{variant}.txt"
    if os.environ.get("TIDEWATER_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.fail(f"regenerated {path}: review the diff, then run again without TIDEWATER_REGEN_GOLDEN")
    assert path.exists(), f"{path} is missing: see the module docstring to generate it"
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.unit
def test_debezium_refuses_what_it_cannot_write() -> None:
    """Values without a Debezium representation fail loudly, naming table and column (never null or a guess)."""
    case = next(c for c in cases() if c.name == "insert special values")
    enc = encoder_for("debezium", BASE, clock=lambda: CLOCK)
    with pytest.raises(EncodeError, match=r"all_types.*c_num_free.*decimal-handling-mode"):
        enc.append_rows(case.changes)
