"""`cdc cli`: table rendering, argument parsing, exit codes, against a canned in-process HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cli.main import build_parser, main
from cli.render import CAPTURE_COLUMNS, cell, col, emit, format_table, render_kv, render_table
from tests.http_fakes import CannedHttp

pytestmark = pytest.mark.unit

ERR = {"code": "CDC:ErrSinkUnavailable", "message": "sink down\nretrying", "retryable": True}

CHANGEFEED = {
    "id": "orders", "state": "warning", "upstream_uri": "postgresql://u:***@db/shop", "sink_uri": "sqlite:///t.db",
    "config": {"span_count": 2}, "start_ts": 100, "target_ts": 0, "checkpoint_ts": 4096, "checkpoint": "0/1000",
    "checkpoint_lag": 1.25, "resolved_ts": 8192, "resolved_lag": None, "error": ERR,
    "spans": [
        {"index": 0, "slot": "tidewater_slot_orders_0", "publication": "tidewater_pub_orders_0", "capture": "cap-a",
         "checkpoint": "0/1000", "running": True, "rows": 12, "error": None},
        {"index": 1, "slot": "tidewater_slot_orders_1", "publication": "tidewater_pub_orders_1", "capture": None,
         "checkpoint": None, "running": False, "rows": 0, "error": ERR},
    ],
}


# ---- cells and tables -------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (True, "true"), (False, "false"), (3, "3"), (1.5, "1.5"), (2.0, "2"), (0.12345, "0.123"),
    ("a\nb", "a b"), (ERR, "CDC:ErrSinkUnavailable: sink down retrying"), (["x", 1], '["x",1]'),
    ({"k": 1}, '{"k":1}'),
])
def test_cell(value: Any, text: str) -> None:
    assert cell(value) == text


def test_table_columns_are_aligned_with_two_spaces_and_no_trailing_blanks() -> None:
    rows = [{"id": "a", "state": "normal", "n": 1}, {"id": "longer-id", "state": None, "n": 22}]
    text = render_table(rows, [col("id", "id"), col("state", "state"), col("n", "n")])
    assert text.splitlines() == [
        "ID         STATE   N",
        "a          normal  1",
        "longer-id  -       22",
    ]


def test_every_cell_of_a_column_starts_at_the_same_offset() -> None:
    rows = [{"id": f"cap-{'x' * i}", "address": f"127.0.0.1:{8300 + i * 111}", "is_owner": i == 0,
             "draining": i == 2, "spans": i, "version": "0.1.0", "pid": 100 + i} for i in range(4)]
    lines = render_table(rows, CAPTURE_COLUMNS).splitlines()
    assert len(lines) == 5
    header = lines[0]
    starts = [header.index(h) for h in ("ADDRESS", "OWNER", "DRAINING", "SPANS", "VERSION", "PID")]
    for line, row in zip(lines[1:], rows, strict=True):
        for start, value in zip(starts, (row["address"], cell(row["is_owner"]), cell(row["draining"]),
                                         str(row["spans"]), row["version"], str(row["pid"])), strict=True):
            assert line[start:].startswith(value), (line, value)
            assert line[start - 2:start] == "  "
        assert line == line.rstrip()


def test_empty_table_is_the_header_only() -> None:
    assert render_table([], [col("id", "id"), col("state", "state")]) == "ID  STATE"


def test_key_value_lines_align_values() -> None:
    text = render_kv([("id", "x"), ("checkpoint lag", 1.5), ("error", None)])
    lines = text.splitlines()
    assert lines == ["id:              x", "checkpoint lag:  1.5", "error:           -"]


def test_changefeed_query_table_has_key_values_then_a_spans_table() -> None:
    text = format_table("changefeed", CHANGEFEED)
    head, spans = text.split("\n\n")
    kv = dict(line.split(":", 1) for line in head.splitlines())
    assert kv["id"].strip() == "orders"
    assert kv["state"].strip() == "warning"
    assert kv["checkpoint lag"].strip() == "1.25s"
    assert kv["resolved lag"].strip() == "-"
    assert kv["error"].strip() == "CDC:ErrSinkUnavailable: sink down retrying"
    lines = spans.splitlines()
    assert lines[0].split() == ["SPAN", "CAPTURE", "SLOT", "PUBLICATION", "CHECKPOINT", "RUNNING", "ROWS", "ERROR"]
    assert lines[1].split()[:7] == ["0", "cap-a", "tidewater_slot_orders_0", "tidewater_pub_orders_0", "0/1000",
                                    "true", "12"]
    assert lines[2].split()[:7] == ["1", "-", "tidewater_slot_orders_1", "tidewater_pub_orders_1", "-", "false", "0"]
    assert lines[2].endswith("CDC:ErrSinkUnavailable: sink down retrying")


def test_changefeed_list_table() -> None:
    rows = [{"id": "b", "state": "normal", "checkpoint": "0/10", "checkpoint_lag": 0.5, "error": None,
             "warnings": 0},
            {"id": "a", "state": "failed", "checkpoint": "0/0", "checkpoint_lag": None, "error": ERR, "warnings": 2}]
    lines = format_table("changefeeds", rows).splitlines()
    assert lines[0].split() == ["ID", "STATE", "CHECKPOINT", "CHECKPOINT", "LAG", "WARNINGS", "ERROR"]
    assert lines[1].split() == ["b", "normal", "0/10", "0.5s", "0", "-"]  # server order is kept
    assert lines[2].startswith("a ") and "CDC:ErrSinkUnavailable" in lines[2]


def test_changefeed_query_table_lists_its_data_warnings() -> None:
    warned = {**CHANGEFEED, "warnings": [
        {"code": "CDC:WarnUnreplicatedRows", "table": "public.late", "severity": "divergence", "count": 3,
         "keys": [], "first_time": 1_700_000_000.0, "last_time": 1_700_000_060.0,
         "message": "table public.late already held 3 row(s)"},
        {"code": "CDC:WarnMissingRow", "table": "public.t", "severity": "notice", "count": 2, "keys": ["1", "7"],
         "first_time": 1_700_000_000.0, "last_time": 1_700_000_000.0, "message": "re-read"}]}
    text = format_table("changefeed", warned)
    assert "cdc cli changefeed resume acknowledges" in text
    table = text.split("acknowledges them):\n")[1].splitlines()
    assert table[0].split() == ["SEVERITY", "CODE", "TABLE", "COUNT", "KEYS", "FIRST", "LAST", "MESSAGE"]
    assert table[1].split()[:4] == ["divergence", "CDC:WarnUnreplicatedRows", "public.late", "3"]
    assert "2023-11-14 22:13:20" in table[1] and "2023-11-14 22:14:20" in table[1]
    assert "1, 7" in table[2]
    assert "data warnings" not in format_table("changefeed", CHANGEFEED)


def test_processor_tables() -> None:
    proc = {"changefeed_id": "orders", "capture_id": "cap-a", "address": "127.0.0.1:8300", "checkpoint": "0/20",
            "checkpoint_ts": 32, "resolved_ts": 40, "errors": [{"span": 3, **ERR}],
            "spans": [{"index": 0, "epoch": 2, "checkpoint": "0/20", "checkpoint_lag": 0.25, "resolved_lag": 0.0,
                       "running": True, "rows": 5, "error": None},
                      {"index": 3, "epoch": 1, "checkpoint": "0/30", "checkpoint_lag": None, "resolved_lag": None,
                       "running": False, "rows": 0, "error": ERR}]}
    listed = format_table("processors", [proc]).splitlines()
    assert listed[0].split() == ["CHANGEFEED", "CAPTURE", "SPANS", "CHECKPOINT", "ERRORS"]
    assert listed[1].split() == ["orders", "cap-a", "0,3", "0/20", "1"]
    head, spans = format_table("processor", proc).split("\n\n")
    assert "capture:" in head and "cap-a" in head
    span_lines = spans.splitlines()
    assert span_lines[1].split() == ["0", "2", "0/20", "0.25s", "0s", "true", "5", "-"]
    assert span_lines[2].split()[:7] == ["3", "1", "0/30", "-", "-", "false", "0"]


def test_update_diff_table_and_empty_diff() -> None:
    result = {"changefeed": {"id": "orders"},
              "diff": {"sink_uri": {"old": "sqlite:///a.db", "new": "sqlite:///b.db"},
                       "config.filter.rules": {"old": ["public.a"], "new": ["public.a", "public.b"]}}}
    lines = format_table("update", result).splitlines()
    assert lines[0].split() == ["FIELD", "OLD", "NEW"]
    assert lines[1].split() == ["config.filter.rules", '["public.a"]', '["public.a","public.b"]']
    assert lines[2].split() == ["sink_uri", "sqlite:///a.db", "sqlite:///b.db"]
    assert "nothing changed" in format_table("update", {"changefeed": {"id": "orders"}, "diff": {}})


def test_other_results_print_as_key_values_and_json_is_the_default() -> None:
    assert format_table("object", {"id": "cap-a", "draining": True}).splitlines() == ["id:        cap-a",
                                                                                        "draining:  true"]
    assert json.loads(emit("object", {"x": [1, 2]}, "json")) == {"x": [1, 2]}


# ---- argument parsing -------------------------------------------------------------------------------
def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_output_is_json_by_default_and_accepted_before_or_after_the_command() -> None:
    assert parse("cli", "changefeed", "list").output == "json"
    assert parse("cli", "--output", "table", "changefeed", "list").output == "table"
    assert parse("cli", "changefeed", "list", "--output", "table").output == "table"
    assert parse("cli", "-o", "table", "capture", "list").output == "table"
    args = parse("cli", "processor", "query", "-c", "cf", "--capture-id", "c1", "--server", "http://h:1")
    assert (args.group, args.op, args.changefeed_id, args.capture_id, args.server) == ("processor", "query", "cf",
                                                                                        "c1", "http://h:1")


def test_update_arguments_are_optional_and_none_when_absent() -> None:
    args = parse("cli", "changefeed", "update", "-c", "cf", "--sink-uri", "sqlite:///x.db")
    assert (args.sink_uri, args.config, args.target_ts, args.upstream) == ("sqlite:///x.db", None, None, None)
    args = parse("cli", "changefeed", "update", "-c", "cf", "--target-ts", "42")
    assert args.target_ts == 42


@pytest.mark.parametrize("argv", [
    ["cli", "--output", "yaml", "changefeed", "list"],
    ["cli", "capture", "drain"],  # --capture-id missing
    ["cli", "processor", "query", "-c", "cf"],  # --capture-id missing
    ["cli", "changefeed", "update"],  # -c missing
    ["cli", "owner", "abdicate"],
    ["cli", "changefeed", "update", "-c", "cf", "--target-ts", "soon"],
])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


# ---- against a canned server ------------------------------------------------------------------------
Canned = CannedHttp


@pytest.fixture
def canned() -> Iterator[Canned]:
    server = Canned({})
    yield server
    server.close()


def test_list_in_table_and_json(canned: Canned, capsys: pytest.CaptureFixture[str]) -> None:
    items = [{"id": "cap-a", "address": "127.0.0.1:1", "is_owner": True, "draining": False, "spans": 2,
              "version": "0.1.0", "pid": 7}]
    canned.answers[("GET", "/api/v2/captures")] = (200, items)
    assert main(["cli", "--server", canned.url, "capture", "list"]) == 0
    assert json.loads(capsys.readouterr().out) == items
    assert main(["cli", "--server", canned.url, "--output", "table", "capture", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "ADDRESS", "OWNER", "DRAINING", "SPANS", "VERSION", "PID"]
    assert lines[1].split() == ["cap-a", "127.0.0.1:1", "true", "false", "2", "0.1.0", "7"]


def test_update_sends_only_the_given_fields_and_prints_the_diff(canned: Canned, tmp_path: Any,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cf.toml"
    cfg.write_text("[filter]\nrules = ['public.*']\n")
    diff = {"config.filter.rules": {"old": ["public.a"], "new": ["public.*"]}}
    canned.answers[("PUT", "/api/v2/changefeeds/cf-1")] = (200, {"changefeed": {"id": "cf-1"}, "diff": diff})
    rc = main(["cli", "--server", canned.url, "changefeed", "update", "-c", "cf-1", "--config", str(cfg),
               "--output", "table"])
    assert rc == 0
    assert canned.requests[-1] == ("PUT", "/api/v2/changefeeds/cf-1", {"config": cfg.read_text()})
    out = capsys.readouterr().out
    assert "config.filter.rules" in out and '["public.*"]' in out


def test_drain_and_processor_query_paths(canned: Canned, capsys: pytest.CaptureFixture[str]) -> None:
    canned.answers[("POST", "/api/v2/captures/c%2F1/drain")] = (202, {"id": "c/1", "draining": True})
    assert main(["cli", "--server", canned.url, "capture", "drain", "--capture-id", "c/1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": "c/1", "draining": True}
    canned.answers[("GET", "/api/v2/processors/cf/c1")] = (200, {"changefeed_id": "cf", "capture_id": "c1",
                                                                 "spans": []})
    assert main(["cli", "--server", canned.url, "processor", "query", "-c", "cf", "--capture-id", "c1"]) == 0
    assert json.loads(capsys.readouterr().out)["capture_id"] == "c1"
    canned.answers[("POST", "/api/v2/owner/resign")] = (200, {"resigned": True, "owner": "c1"})
    assert main(["cli", "--server", canned.url, "owner", "resign"]) == 0
    assert json.loads(capsys.readouterr().out)["resigned"] is True


def test_refusal_exits_1_with_the_servers_error_on_stderr(canned: Canned, capsys: pytest.CaptureFixture[str]) -> None:
    err = {"error_code": "CDC:ErrChangefeedStateConflict", "error_msg": "pause it first"}
    canned.answers[("PUT", "/api/v2/changefeeds/cf")] = (409, err)
    assert main(["cli", "--server", canned.url, "-o", "table", "changefeed", "update", "-c", "cf",
                 "--target-ts", "5"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and json.loads(out.err) == err


def test_update_without_fields_exits_2_without_calling_the_server(canned: Canned,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cli", "--server", canned.url, "changefeed", "update", "-c", "cf"]) == 2
    assert json.loads(capsys.readouterr().err)["error_code"] == "CDC:ErrUsage"
    assert canned.requests == []


def test_unreachable_server_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    server = Canned({})
    url = server.url
    server.close()  # nothing listens there any more
    assert main(["cli", "--server", url, "processor", "list"]) == 3
    assert json.loads(capsys.readouterr().err)["error_code"] == "CDC:ErrServerUnreachable"


def test_drain_self_waits_for_the_spans_to_move(canned: Canned, capsys: pytest.CaptureFixture[str]) -> None:
    """The preStop hook: drain the capture behind --server, wait until it holds no span; the wait times out
    with exit code 1; a lone capture (nowhere to move) is reported, not an error."""
    canned.answers[("GET", "/api/v2/status")] = (200, {"id": "me"})
    canned.answers[("POST", "/api/v2/captures/me/drain")] = (202, {"id": "me", "draining": True, "remaining_spans": 2})
    canned.answers[("GET", "/api/v2/captures")] = (200, [{"id": "me", "spans": 0}, {"id": "other", "spans": 4}])
    assert main(["cli", "--server", canned.url, "capture", "drain", "--self", "--wait", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["remaining_spans"] == 0
    assert [r[:2] for r in canned.requests] == [("GET", "/api/v2/status"), ("POST", "/api/v2/captures/me/drain"),
                                                ("GET", "/api/v2/captures")]
    canned.answers[("GET", "/api/v2/captures")] = (200, [{"id": "me", "spans": 1}])
    assert main(["cli", "--server", canned.url, "capture", "drain", "--self", "--wait", "0.6"]) == 1
    assert json.loads(capsys.readouterr().err)["error_code"] == "CDC:ErrTimeout"
    canned.answers[("POST", "/api/v2/captures/me/drain")] = (409, {"error_code": "CDC:ErrCaptureStateConflict",
                                                                   "error_msg": "only capture"})
    assert main(["cli", "--server", canned.url, "capture", "drain", "--self", "--wait", "5"]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": "me", "draining": False, "remaining_spans": None,
                                                   "message": "only capture"}
    assert main(["cli", "--server", canned.url, "capture", "drain", "--capture-id", "me"]) == 1  # not --self
