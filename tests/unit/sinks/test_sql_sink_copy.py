"""PostgreSQL COPY of upstream text: the text-format escaping is exact, and which groups take COPY
(positional rows that all carry their text, at least ``COPY_MIN_ROWS`` of them) or the typed INSERT."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.dialect.rowtext import RowText
from sinks.sql.ops.output import COPY_MIN_ROWS, last_per_key_texts
from sinks.sql.sink import SQLSink
from sinks.sql.target.pipeline import Pipeline
from tests import rowtexts
from tests.sql_sink_fakes import assume_tables, fake_connection

pytestmark = pytest.mark.unit


def parse_copy_text(data: str, ncols: int) -> list[tuple[str | None, ...]]:
    """PostgreSQL's COPY text-format reader (the subset of escapes it documents), for checking."""
    assert data.endswith("\n") or data == ""
    rows = []
    for line in data.split("\n")[:-1]:
        fields = line.split("\t")
        assert len(fields) == ncols, line
        out: list[str | None] = []
        for f in fields:
            if f == "\\N":
                out.append(None)
                continue
            chars, i = [], 0
            while i < len(f):
                c = f[i]
                if c == "\\":
                    nxt = f[i + 1]
                    chars.append({"t": "\t", "n": "\n", "r": "\r", "\\": "\\", "N": "N"}.get(nxt, nxt))
                    assert nxt in "tnr\\", f
                    i += 2
                else:
                    chars.append(c)
                    i += 1
            out.append("".join(chars))
        rows.append(tuple(out))
    return rows


NASTY = ["", None, "plain", "back\\slash", "\\\\", "tab\tx", "\t", "new\nline", "\n", "cr\r", "\r\n", "\\N", "N",
         "\\.", ".", "żółw 🐢", "end\\", "\\x00ff", '{"a\\"b",NULL}', '{"k": "v\\n"}', "a\tb\nc\rd\\e"]


@pytest.fixture(params=rowtexts.NAMES)
def renderer(request: pytest.FixtureRequest) -> RowText:
    return rowtexts.rowtext_named(request.param)


def test_copy_text_round_trips_every_nasty_value(renderer: RowText) -> None:
    copy_text = renderer.copy_text
    rows = [(a, b, c) for a in NASTY for b in NASTY[:6] for c in (None, "x")]
    data = copy_text(rows).decode("utf-8")
    assert parse_copy_text(data, 3) == rows
    assert data.count("\n") == len(rows)  # one line per row: no raw newline inside a value


def test_copy_text_plain_rows_are_joined_as_they_are(renderer: RowText) -> None:
    copy_text = renderer.copy_text
    assert copy_text([("1", "a b", ""), ("2", "c", "d")]) == b"1\ta b\t\n2\tc\td\n"
    assert copy_text([("1", None), ("\\", "\t")]) == b"1\t\\N\n\\\\\t\\t\n"
    assert copy_text([]) == b""
    assert copy_text([("é", "😀")]) == "é\t😀\n".encode()  # UTF-8


def test_last_per_key_texts_keeps_the_last_row_of_each_key() -> None:
    rows = [(1, "a"), (2, "b"), (1, "c"), ([1, 2], "d"), ([1, 2], "e")]
    texts = [("1", "a"), ("2", "b"), ("1", "c"), ("{1,2}", "d"), ("{1,2}", "e")]
    assert last_per_key_texts(rows, texts, (0,)) == [("2", "b"), ("1", "c"), ("{1,2}", "e")]
    assert last_per_key_texts(rows[:2], texts[:2], (0,)) is texts[:2] or \
        last_per_key_texts(rows[:2], texts[:2], (0,)) == texts[:2]
    assert last_per_key_texts(rows, texts, (0, 1)) == texts


class CopyCursor:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def execute(self, sql: str, params: Any = None) -> None:
        self.calls.append(("execute", sql, params))

    def executemany(self, sql: str, params: Any) -> None:
        self.calls.append(("executemany", sql, list(params)))

    def copy_expert(self, sql: str, file: Any, size: int = 8192) -> None:
        self.calls.append(("copy", sql, file.read()))

    def close(self) -> None:
        pass


def schema(name: str, has_key: bool = True) -> TableSchema:
    cols = (ColumnSchema("id", 0, "int4", nullable=False, is_key=has_key), ColumnSchema("v", 0, "text", nullable=True))
    return TableSchema(TableName("public", name), cols, ("id",) if has_key else ("id", "v"), has_key=has_key,
                       replica_identity="d" if has_key else "f")


K, H = schema("k"), schema("h", has_key=False)


def write(changes: list[RowChange], writes: int = 1) -> list[tuple[str, str, Any]]:
    sink = SQLSink("postgresql://u:p@127.0.0.1:1/db", SinkConfig())
    sink.target.pipeline = Pipeline(threaded=False)
    cur = CopyCursor()
    try:
        assume_tables(sink, "postgresql", K, H)
        conn = fake_connection(cur)
        for _ in range(writes):
            sink.writer(conn).run(changes)
    finally:
        sink.close()
    return cur.calls


def rc(s: TableSchema, op: OpType, i: int, v: str | None, text: bool = True) -> RowChange:
    return RowChange(op, s, 1, row=(i, v), row_text=(str(i), v) if text else None)


def test_an_upsert_group_with_texts_is_copied_into_the_stage_and_merged() -> None:
    n = COPY_MIN_ROWS
    changes = [rc(K, OpType.INSERT, i, f"v{i}") for i in range(n)] + [rc(K, OpType.UPDATE, 0, "last\tone")]
    calls = write(changes, writes=2)
    kinds = [(k, sql.split()[0]) for k, sql, _ in calls]
    # per write: the stage is made sure of once, then COPY into it and one merge
    assert kinds == [("execute", "CREATE"), ("copy", "COPY"), ("execute", "INSERT")] * 2
    stage = calls[0][1].split()[6]
    assert stage.startswith('"tidewater_stage_') and calls[1][1].startswith(f"COPY {stage} (")
    merge = calls[2][1]
    assert f"FROM {stage} ON CONFLICT" in merge and merge.endswith(f"; TRUNCATE {stage}")
    assert parse_copy_text(calls[1][2], 2) == [(str(i), f"v{i}") for i in range(1, n)] + [("0", "last\tone")]


def test_keyless_inserts_are_copied_into_the_table() -> None:
    calls = write([rc(H, OpType.INSERT, i % 3, "x") for i in range(COPY_MIN_ROWS)])
    assert [(k, sql) for k, sql, _ in calls] == [("copy", 'COPY "public"."h" ("id", "v") FROM STDIN')]
    assert len(parse_copy_text(calls[0][2], 2)) == COPY_MIN_ROWS  # duplicates kept: no key


@pytest.mark.parametrize("why", ["few rows", "one row without text"])
def test_other_groups_take_the_typed_insert(why: str) -> None:
    if why == "few rows":
        changes = [rc(K, OpType.INSERT, i, "x") for i in range(COPY_MIN_ROWS - 1)]
    else:
        changes = [rc(K, OpType.INSERT, i, "x", text=i != 5) for i in range(2 * COPY_MIN_ROWS)]
    calls = write(changes)
    assert [k for k, _, _ in calls] == ["execute"] and calls[0][1].startswith('INSERT INTO "public"."k"')
