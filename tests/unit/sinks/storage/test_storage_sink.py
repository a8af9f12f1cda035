"""The storage sink on a real temporary directory: TiCDC's layout, index continuation after a restart, atomic
visibility, exactly-once publication across crashes, table versions (DDL, TRUNCATE), full disks and unwritable
directories (through a file system that fails on purpose)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from cdc.errors import InvalidURI, SinkError, SinkUnavailable
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, TableSchema
from sinks.factory import open_sink
from sinks.storage import layout as L
from sinks.storage.reader import StorageReader, rebuild
from sinks.storage.sink import StorageSink
from tests.unit.sinks.storage.storage_cases import (
    BAG,
    CLOCK,
    KV,
    KV2,
    PROTOCOLS,
    FailingFS,
    Model,
    dele,
    ins,
    sink,
    sorted_rows,
    trunc,
    upd,
    uri,
)

pytestmark = pytest.mark.unit
EXT = {"csv": ".csv", "canal-json": ".json", "parquet": ".parquet"}


def files(root: Path) -> list[str]:
    """Every visible file under ``root`` (hidden temporary names excluded), relative."""
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), root)
            if not any(part.startswith(".tw-") for part in rel.split(os.sep)):
                out.append(rel)
    return sorted(out)


def data_files(root: Path) -> list[str]:
    return [f for f in files(root) if os.path.basename(f).startswith("CDC") and not f.endswith("CDC.index")]


def rows_of(root: Path, protocol: str) -> list[dict]:
    _, states = rebuild(uri(root, protocol), [KV.name])
    return sorted_rows(KV, states[KV.name].rows()) if KV.name in states else []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_layout_is_ticdcs(tmp_path: Path, protocol: str) -> None:
    s = sink(tmp_path, protocol, date_separator="day")
    s.write([ins(KV, 100, id=1, body="a", n=1), ins(BAG, 100, a=1, b="x"), ins(KV, 110, id=2, body="b", n=2)])
    assert data_files(tmp_path) == []  # nothing visible before the flush
    s.flush()
    s.publish_checkpoint(110)
    s.close()
    day = L.date_text("day", CLOCK)
    ext = EXT[protocol]
    width = 20
    kv_file = f"app/kv/99/{day}/CDC{1:0{width}d}{ext}"
    assert data_files(tmp_path) == [f"app/bag/99/{day}/CDC{1:0{width}d}{ext}", kv_file]
    assert (tmp_path / f"app/kv/99/{day}/meta/CDC.index").read_text() == f"CDC{1:0{width}d}{ext}\n"
    assert json.loads((tmp_path / "metadata").read_text()) == {"checkpoint-ts": 110}
    assert (tmp_path / "metadata").read_bytes() == b'{"checkpoint-ts":110}'
    (schema_file,) = os.listdir(tmp_path / "app/kv/meta")
    definition = json.loads((tmp_path / "app/kv/meta" / schema_file).read_text())
    assert schema_file == f"schema_99_{L.definition_checksum(definition):010d}.json"
    assert list(definition)[:8] == ["Table", "Schema", "Version", "TableVersion", "Query", "Type", "TableColumns",
                                    "TableColumnsTotal"]
    assert definition["TableColumns"][0] == {"ColumnName": "id", "ColumnType": "BIGINT", "ColumnPrecision": "20",
                                             "ColumnNullable": "false", "ColumnIsPk": "true"}
    assert (definition["TableVersion"], definition["Query"], definition["Type"]) == (99, "", 0)
    assert rows_of(tmp_path, protocol) == [{"id": 1, "body": "a", "n": 1}, {"id": 2, "body": "b", "n": 2}]


def test_the_ticdc_checksum_of_its_own_test_definitions() -> None:
    """tiflow pkg/sink/cloudstorage/table_definition_test.go: schema_100_3752767265.json, schema_100_3233644819.json"""
    cols = [{"ColumnName": "Id", "ColumnType": "INT", "ColumnDefault": 10, "ColumnPrecision": "11",
             "ColumnNullable": "false", "ColumnIsPk": "true"},
            {"ColumnName": "LastName", "ColumnType": "VARCHAR", "ColumnDefault": "Default LastName",
             "ColumnPrecision": "128", "ColumnNullable": "false"},
            {"ColumnName": "FirstName", "ColumnType": "VARCHAR", "ColumnDefault": "Default FirstName",
             "ColumnPrecision": "64"},
            {"ColumnName": "Birthday", "ColumnType": "DATETIME", "ColumnDefault": 12345678}]
    assert L.definition_checksum({"Table": "table1", "Schema": "schema1", "TableColumns": cols,
                                  "TableColumnsTotal": 4}) == 3752767265
    assert L.definition_checksum({"Table": "", "Schema": "schema1", "TableColumns": None,
                                  "TableColumnsTotal": 0}) == 3233644819


def test_names_that_are_not_plain_path_components() -> None:
    for name in ("a/b", "..", ".hidden", "100%", "Ledger Entries", "Ünïcode", ""):
        component = L.escape_name(name)
        assert "/" not in component and not component.startswith(".") and component
        assert L.unescape_name(component) == name


@pytest.mark.parametrize("protocol", ["csv", "parquet"])
def test_a_restart_continues_the_index_and_never_overwrites(tmp_path: Path, protocol: str) -> None:
    s = sink(tmp_path, protocol)
    for ts in (100, 110):
        s.write([ins(KV, ts, id=ts, body="x", n=0)])
        s.flush()
    s.close()
    ext = EXT[protocol]
    before = {f: hashlib.sha1((tmp_path / f).read_bytes()).hexdigest() for f in data_files(tmp_path)}
    assert sorted(before) == [f"app/kv/99/CDC{i:020d}{ext}" for i in (1, 2)]
    # a file published by someone else meanwhile (another incarnation): the next index goes past it
    os.link(tmp_path / f"app/kv/99/CDC{2:020d}{ext}", tmp_path / f"app/kv/99/CDC{7:020d}{ext}")
    s = sink(tmp_path, protocol)  # same span: its publish record says 110 is published
    assert s.write([ins(KV, 100, id=100, body="x", n=0), ins(KV, 110, id=110, body="x", n=0),
                    ins(KV, 120, id=120, body="y", n=0)]) == 1
    s.flush()
    s.close()
    assert data_files(tmp_path)[-1] == f"app/kv/99/CDC{8:020d}{ext}"
    assert all(hashlib.sha1((tmp_path / f).read_bytes()).hexdigest() == h for f, h in before.items())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_replay_publishes_nothing_twice_also_a_transaction_split_by_its_ddl(tmp_path: Path, protocol: str) -> None:
    changes = [ins(BAG, 100, a=1, b="x"), ins(BAG, 100, a=1, b="x"), ins(KV, 110, id=1, body="a", n=1),
               ins(BAG, 110, a=2, b="y")]
    s = sink(tmp_path, protocol)
    s.write(changes[:3])  # the transaction at 110 is split: its second part comes after a DDL
    s.flush()
    s.close()  # crash: the span replays from its checkpoint (100)
    s = sink(tmp_path, protocol)
    assert s.write(changes) == 1  # only the row after the split
    s.write([ins(BAG, 120, a=3, b="z")])
    s.flush()
    s.publish_checkpoint(120)
    s.close()
    _, states = rebuild(uri(tmp_path, protocol))
    assert sorted_rows(BAG, states[BAG.name].rows()) == Model(BAG).apply([*changes, ins(BAG, 120, a=3, b="z")]).result()
    assert not states[BAG.name].problems


@pytest.mark.parametrize("protocol", ["csv", "parquet"])
def test_a_crash_after_the_publish_record_is_completed_by_the_next_open(tmp_path: Path, protocol: str) -> None:
    fs = FailingFS(str(tmp_path), "link", errno.EIO, path_part="CDC0")
    s = sink(tmp_path, protocol, fs=fs)
    s.write([ins(KV, 100, id=1, body="a", n=1), ins(KV, 100, id=2, body="b", n=2)])
    with pytest.raises(SinkUnavailable, match="publishing"):
        s.flush()
    s.close()  # the committed temporary file stays for the redo
    assert data_files(tmp_path) == []
    s = sink(tmp_path, protocol)  # open_position completes the flush
    assert data_files(tmp_path) == [f"app/kv/99/CDC{1:020d}{EXT[protocol]}"]
    assert s.write([ins(KV, 100, id=1, body="a", n=1), ins(KV, 100, id=2, body="b", n=2)]) == 0
    s.flush()
    s.publish_checkpoint(100)
    s.close()
    assert rows_of(tmp_path, protocol) == [{"id": 1, "body": "a", "n": 1}, {"id": 2, "body": "b", "n": 2}]
    assert not [n for _, _, ns in os.walk(tmp_path) for n in ns if n.endswith(".tmp")]


def test_a_crash_after_the_links_publishes_nothing_again(tmp_path: Path) -> None:
    fs = FailingFS(str(tmp_path), "dirsync", errno.EIO, path_part="/app/kv/99/")
    s = sink(tmp_path, "csv", fs=fs)
    s.write([ins(KV, 100, id=1, body="a", n=1)])
    with pytest.raises(SinkUnavailable):
        s.flush()  # linked, but the directory sync failed: the temporary names are still there
    assert data_files(tmp_path) == [f"app/kv/99/CDC{1:020d}.csv"]
    s = sink(tmp_path, "csv")
    s.write([ins(KV, 100, id=1, body="a", n=1), ins(KV, 110, id=2, body="b", n=2)])
    s.flush()
    s.close()
    assert data_files(tmp_path) == [f"app/kv/99/CDC{i:020d}.csv" for i in (1, 2)]
    assert (tmp_path / f"app/kv/99/CDC{2:020d}.csv").read_text().count("\n") == 1
    assert not [n for _, _, ns in os.walk(tmp_path) for n in ns if n.endswith(".tmp")]


def test_a_crash_before_the_publish_record_leaves_only_hidden_files_which_the_next_run_removes(tmp_path: Path) -> None:
    fs = FailingFS(str(tmp_path), "rename", errno.EIO, path_part=".position")
    s = sink(tmp_path, "csv", fs=fs)
    s.write([ins(KV, 100, id=1, body="a", n=1)])
    with pytest.raises(SinkUnavailable):
        s.flush()
    # no close(): the process died; its temporary file stays
    assert data_files(tmp_path) == []
    temps = [n for _, _, ns in os.walk(tmp_path / "app") for n in ns if n.endswith(".tmp")]
    assert temps
    s = sink(tmp_path, "csv")
    assert s.write([ins(KV, 100, id=1, body="a", n=1)]) == 1  # not published before: written again
    s.flush()
    s.close()
    assert data_files(tmp_path) == [f"app/kv/99/CDC{1:020d}.csv"]
    assert not [n for _, _, ns in os.walk(tmp_path / "app") for n in ns if n.endswith(".tmp")]


@pytest.mark.parametrize(("op", "protocol"), [("write", "csv"), ("write", "parquet"), ("fsync", "csv"),
                                              ("create", "csv")])
def test_a_full_disk_is_sink_unavailable_naming_the_path_and_nothing_is_acknowledged(tmp_path: Path, op: str,
                                                                                     protocol: str) -> None:
    ok = sink(tmp_path, protocol)
    ok.write([ins(KV, 100, id=1, body="a", n=1)])
    ok.flush()
    ok.close()
    record = (tmp_path / ".tidewater/positions/cf/0.position").read_bytes()
    fs = FailingFS(str(tmp_path), op, errno.ENOSPC, path_part="app/kv", times=99)
    s = sink(tmp_path, protocol, fs=fs)
    with pytest.raises(SinkUnavailable) as info:
        s.write([ins(KV, 110, id=2, body="b" * 10_000, n=2)])
        s.flush()
    s.close()
    assert "no space left" in info.value.message and str(tmp_path / "app/kv") in info.value.message
    assert info.value.retryable
    assert data_files(tmp_path) == [f"app/kv/99/CDC{1:020d}{EXT[protocol]}"]
    assert (tmp_path / ".tidewater/positions/cf/0.position").read_bytes() == record  # 110 not acknowledged
    assert not [n for _, _, ns in os.walk(tmp_path / "app") for n in ns if n.endswith(".tmp")]


def test_a_full_disk_while_publishing_is_completed_once_space_is_back(tmp_path: Path) -> None:
    """ENOSPC on the link (a directory entry) after the publish record: the flush failed (the span does not move
    its checkpoint), and the next open publishes the file from the record; the replay writes nothing twice."""
    fs = FailingFS(str(tmp_path), "link", errno.ENOSPC, path_part="/CDC0", times=99)
    s = sink(tmp_path, "canal-json", fs=fs)
    s.write([ins(KV, 110, id=2, body="b", n=2)])
    with pytest.raises(SinkUnavailable, match="no space left"):
        s.flush()
    s.close()
    assert data_files(tmp_path) == []
    s = sink(tmp_path, "canal-json")
    assert s.write([ins(KV, 110, id=2, body="b", n=2)]) == 0
    s.flush()
    s.publish_checkpoint(110)
    s.close()
    assert rows_of(tmp_path, "canal-json") == [{"id": 2, "body": "b", "n": 2}]


def test_an_unwritable_or_wrong_directory_fails_check(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("x")
    with pytest.raises(SinkError, match="plain-file"):
        open_sink(f"file://{tmp_path}/plain-file/lake?protocol=csv").check()
    s = StorageSink(uri(tmp_path / "lake", "csv"), fs=FailingFS(str(tmp_path / "lake"), "create", errno.EACCES))
    with pytest.raises(SinkUnavailable, match="not writable"):
        s.check()


@pytest.mark.parametrize("bad", ["protocol=avro", "protocol=csv&flush-interval=5", "protocol=csv&flush-interval=1h",
                                 "protocol=csv&file-size=12", "protocol=csv&date-separator=week",
                                 "protocol=csv&max-message-bytes=10", "protocol=parquet&csv-quote=x",
                                 "protocol=csv&colour=red", "", "protocol=csv&csv-terminator=x",
                                 "protocol=csv&file-index-width=3"])
def test_bad_uris_name_the_fix(bad: str) -> None:
    with pytest.raises(InvalidURI) as info:
        StorageSink(f"file:///tmp/lake?{bad}")
    assert "use" in info.value.message or "remove" in info.value.message or "add" in info.value.message


def test_uri_options() -> None:
    s = StorageSink("file:///tmp/lake?protocol=canal-json&flush-interval=1m30s&file-size=2048&date-separator=month"
                    "&file-index-width=6&worker-count=4&enable-tidb-extension=true")
    assert (s.flush_interval, s.cfg.file_size, s.cfg.date_separator, s.cfg.file_index_width) == (90.0, 2048, "month", 6)
    assert StorageSink("file:///tmp/lake?protocol=csv").flush_interval == 5.0
    for bad in ("file://host/tmp/x?protocol=csv", "file:///?protocol=csv", "file://relative?protocol=csv"):
        with pytest.raises(InvalidURI, match="file:///absolute"):
            StorageSink(bad)


def _ddl(ts: int, seq: int = 0, before=KV, after=KV2, kind: DdlKind = DdlKind.ADD_COLUMN) -> DdlEvent:
    return DdlEvent(ts, ts / 1000, KV.name, (DdlChange(kind, "note"),), before, after,
                    "ALTER TABLE app.kv ADD COLUMN note varchar(32)", seq)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_ddl_is_a_new_table_version_at_most_once(tmp_path: Path, protocol: str) -> None:
    s = sink(tmp_path, protocol)
    s.write([ins(KV, 100, id=1, body="a", n=1), ins(KV, 120, id=2, body="b", n=2)])
    s.flush()
    assert s.apply_ddl(_ddl(120, 1)) is True
    s.write([ins(KV2, 120, id=3, body="c", n=3, note="x"), ins(KV2, 130, id=4, body="d", n=4, note=None)])
    s.flush()
    s.close()
    meta = sorted(os.listdir(tmp_path / "app/kv/meta"))
    assert [L.parse_schema_file_name(n)[0] for n in meta] == [121, 99]
    d = json.loads((tmp_path / "app/kv/meta" / meta[0]).read_text())
    assert (d["TableVersion"], d["Type"], d["Query"]) == (121, 5, "ALTER TABLE app.kv ADD COLUMN note varchar(32)")
    assert d["TableColumns"][-1] == {"ColumnName": "note", "ColumnType": "VARCHAR", "ColumnPrecision": "32"}
    assert [f.split("/")[2] for f in data_files(tmp_path)] == ["121", "99"]
    s = sink(tmp_path, protocol)  # a replay: the DDL is there already
    assert s.apply_ddl(_ddl(120, 1)) is False
    s.write([ins(KV2, 140, id=5, body="e", n=5, note="y")])
    s.flush()
    s.publish_checkpoint(140)
    s.close()
    assert [f.split("/")[2] for f in data_files(tmp_path)] == ["121", "121", "99"]
    _, states = rebuild(uri(tmp_path, protocol), [KV.name])
    assert [r["note"] for r in sorted_rows(KV2, states[KV.name].rows())] == [None, None, "x", None, "y"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_ddl_after_a_transaction_of_many_ddls_is_still_the_later_version(tmp_path: Path, protocol: str) -> None:
    """``seq`` counts every DDL of a transaction, changefeed-wide: the 501st DDL of a migration committed at 1000
    used to become version 1500, above the next DDL of the same table committed at 1200 (version 1200), so readers
    took the older schema as the table's current one (and a replay could not tell them apart)."""
    kv3 = TableSchema(KV.name, (*KV2.columns, ColumnSchema("extra", 23, "int4", False, "int4", -1, True, False)),
                      ("id",), relation_id=1, version=3)
    s = sink(tmp_path, protocol)
    s.write([ins(KV, 900, id=1, body="a", n=1)])
    s.flush()
    assert s.apply_ddl(_ddl(1000, 500)) is True
    s.write([ins(KV2, 1100, id=2, body="b", n=2, note="x")])
    s.flush()
    later = DdlEvent(1200, 1.2, KV.name, (DdlChange(DdlKind.ADD_COLUMN, "extra"),), KV2, kv3,
                     "ALTER TABLE app.kv ADD COLUMN extra int4", 0)
    assert s.apply_ddl(later) is True
    s.write([ins(kv3, 1300, id=3, body="c", n=3, note="y", extra=7)])
    s.flush()
    s.publish_checkpoint(1300)
    s.close()
    versions = {v: sf for v, sf in StorageReader(uri(tmp_path, protocol)).schema_files(KV.name).items()}
    by_ts = sorted(versions.values(), key=lambda sf: (sf.commit_ts, sf.seq, sf.version))
    assert [sf.version for sf in by_ts] == sorted(sf.version for sf in by_ts)  # versions follow commit order
    assert StorageReader(uri(tmp_path, protocol)).latest_schema(KV.name) == kv3
    s = sink(tmp_path, protocol)  # a replay of both DDLs writes nothing
    assert s.apply_ddl(_ddl(1000, 500)) is False and s.apply_ddl(later) is False
    s.close()
    assert len(StorageReader(uri(tmp_path, protocol)).schema_files(KV.name)) == len(versions)
    _, states = rebuild(uri(tmp_path, protocol), [KV.name])
    assert [(r["id"], r.get("note"), r.get("extra")) for r in sorted_rows(kv3, states[KV.name].rows())] == \
        [(1, None, None), (2, "x", None), (3, "y", 7)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_truncate_starts_a_table_version_between_the_rows_of_its_transaction(tmp_path: Path, protocol: str) -> None:
    changes = [ins(KV, 100, id=1, body="a", n=1), ins(KV, 110, id=2, body="b", n=2), trunc(KV, 110),
               ins(KV, 110, id=3, body="c", n=3), trunc(KV, 110), ins(KV, 110, id=4, body="d", n=4),
               ins(KV, 120, id=5, body="e", n=5)]
    s = sink(tmp_path, protocol)
    s.write(changes)
    s.flush()
    s.publish_checkpoint(120)
    s.close()
    versions = {L.parse_schema_file_name(n)[0]: json.loads((tmp_path / "app/kv/meta" / n).read_text())
                for n in os.listdir(tmp_path / "app/kv/meta")}
    assert sorted(versions) == [99, 110, 111]
    assert versions[110]["Type"] == 11 and versions[110]["Query"] == 'TRUNCATE TABLE "app"."kv"'
    assert rows_of(tmp_path, protocol) == [{"id": 4, "body": "d", "n": 4}, {"id": 5, "body": "e", "n": 5}]
    s = sink(tmp_path, protocol)  # replayed: the truncates claim the same versions, nothing is written again
    assert s.write(changes + [ins(KV, 130, id=6, body="f", n=6)]) == 1
    s.flush()
    s.publish_checkpoint(130)
    s.close()
    assert sorted(L.parse_schema_file_name(n)[0] for n in os.listdir(tmp_path / "app/kv/meta")) == [99, 110, 111]
    assert [r["id"] for r in rows_of(tmp_path, protocol)] == [4, 5, 6]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_key_changes_partial_updates_and_keyless_tables_rebuild_exactly(tmp_path: Path, protocol: str) -> None:
    from cdc.events import UNCHANGED

    kv = [ins(KV, 100, id=1, body="long", n=1), ins(KV, 100, id=2, body="two", n=2),
          upd(KV, 110, {"id": 1}, id=10, body=UNCHANGED, n=11),  # key change keeping an unsent TOAST value
          upd(KV, 120, None, id=2, body=UNCHANGED, n=22),  # in place, TOAST value unsent
          upd(KV, 130, {"id": 10}, id=2, body="swapped", n=3), ins(KV, 130, id=10, body="again", n=0),
          dele(KV, 140, id=2)]
    bag = [ins(BAG, 100, a=1, b="x"), ins(BAG, 100, a=1, b="x"), ins(BAG, 100, a=2, b="y"),
           upd(BAG, 110, {"a": 1, "b": "x"}, a=1, b="z"), dele(BAG, 120, a=2, b="y"),
           upd(BAG, 130, {"a": 1, "b": "z"}, a=1, b=UNCHANGED)]
    s = sink(tmp_path, protocol)
    s.write(kv[:2] + bag[:3])
    s.write(kv[2:] + bag[3:])
    s.flush()
    s.publish_checkpoint(140)
    s.close()
    _, states = rebuild(uri(tmp_path, protocol))
    assert sorted_rows(KV, states[KV.name].rows()) == Model(KV).apply(kv).result()
    assert sorted_rows(BAG, states[BAG.name].rows()) == Model(BAG).apply(bag).result()
    assert not states[KV.name].problems and not states[BAG.name].problems


@pytest.mark.parametrize("protocol", ["csv", "parquet"])
def test_copy_writers_share_a_directory_without_overwriting(tmp_path: Path, protocol: str) -> None:
    """Chunks of the initial copy, written by several processes at once (bulk load: no publish record)."""
    def copy(worker: int) -> None:
        s = sink(tmp_path, protocol, position=False)
        s.set_bulk_load()
        for chunk in range(5):
            base = worker * 1000 + chunk * 10
            s.write([ins(KV, 100, id=base + i, body="c", n=i) for i in range(10)])
            s.flush()
        s.close()

    threads = [threading.Thread(target=copy, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = data_files(tmp_path)
    assert names == [f"app/kv/99/CDC{i:020d}{EXT[protocol]}" for i in range(1, 21)]
    s = sink(tmp_path, protocol)
    s.publish_checkpoint(100)
    s.close()
    assert len(rows_of(tmp_path, protocol)) == 200


def test_a_keyless_copy_retried_starts_a_new_version_each_time(tmp_path: Path) -> None:
    for _attempt in range(2):
        s = sink(tmp_path, "csv", position=False)
        s.set_bulk_load()
        s.write([trunc(BAG, 100), ins(BAG, 100, a=1, b="x"), ins(BAG, 100, a=1, b="x")])
        s.flush()
        s.close()
    assert sorted(L.parse_schema_file_name(n)[0] for n in os.listdir(tmp_path / "app/bag/meta")) == [100, 101]
    sink(tmp_path, "csv").publish_checkpoint(100)
    _, states = rebuild(uri(tmp_path, "csv"))
    assert states[BAG.name].rows() == [{"a": 1, "b": "x"}, {"a": 1, "b": "x"}]


@pytest.mark.parametrize("protocol", ["csv", "canal-json", "parquet"])
def test_file_size_closes_files_at_transaction_boundaries(tmp_path: Path, protocol: str) -> None:
    s = sink(tmp_path, protocol, file_size=1024)
    txns = [[ins(KV, 100 + t, id=t * 10 + i, body="x" * 40, n=t) for i in range(10)] for t in range(8)]
    for txn in txns:
        s.write(txn)
    s.flush()
    s.publish_checkpoint(200)
    s.close()
    reader = StorageReader(uri(tmp_path, protocol))
    dfs = reader.data_files(KV.name)
    assert len(dfs) > 1
    seen: set[int] = set()
    for df in dfs:
        ts = {c.commit_ts for c in reader.read_file(df)}
        assert not ts & seen  # no transaction in two files
        seen |= ts
    assert len(seen) == 8


def test_rows_before_the_checkpoint_only_and_checkpoint_never_backwards(tmp_path: Path) -> None:
    s = sink(tmp_path, "csv")
    s.write([ins(KV, 100, id=1, body="a", n=1), ins(KV, 200, id=2, body="b", n=2)])
    s.flush()
    s.publish_checkpoint(150)
    s.publish_checkpoint(120)  # an older owner's value: ignored
    s.close()
    assert json.loads((tmp_path / "metadata").read_text()) == {"checkpoint-ts": 150}
    assert rows_of(tmp_path, "csv") == [{"id": 1, "body": "a", "n": 1}]


def test_tables_with_rows_and_truncate_targets(tmp_path: Path) -> None:
    s = sink(tmp_path, "csv", date_separator="day")
    s.write([ins(KV, 100, id=1, body="a", n=1)])
    s.flush()
    assert s.tables_with_rows([KV.name, BAG.name]) == [KV.name]
    s.truncate_targets([KV.name, BAG.name])
    s.publish_checkpoint(100)
    s.close()
    assert sorted(L.parse_schema_file_name(n)[0] for n in os.listdir(tmp_path / "app/kv/meta")) == [99, 100]
    assert rows_of(tmp_path, "csv") == []
    assert not (tmp_path / "app/bag").exists()


def test_a_resyncs_truncate_goes_just_below_the_copys_snapshot_and_the_copy_lands_after_it(tmp_path: Path) -> None:
    """A table copy empties the table at its snapshot Ts - 1 (``at``): the stream's rows before it are emptied, the
    copied rows (commit Ts = the snapshot's) go into that version and survive, whatever the reader's batches."""
    from cdc.events import SNAPSHOT
    from cdc.ts import Watermark

    s = sink(tmp_path, "csv")
    s.write([ins(KV, 100, id=1, body="stale", n=1), ins(KV, 400, id=2, body="streamed before the copy", n=2)])
    s.flush()
    s.truncate_targets([KV.name], schemas=[KV], at=Watermark(500, 0.5))
    copier = sink(tmp_path, "csv")
    row = ins(KV, 500, id=2, body="copied", n=2)
    row.extra[SNAPSHOT] = True
    copier.write([row])
    copier.flush()
    copier.close()
    s.publish_checkpoint(500)
    s.close()
    assert sorted(L.parse_schema_file_name(n)[0] for n in os.listdir(tmp_path / "app/kv/meta")) == [99, 499]
    assert rows_of(tmp_path, "csv") == [{"id": 2, "body": "copied", "n": 2}]


def test_forget_removes_the_publish_records(tmp_path: Path) -> None:
    s = sink(tmp_path, "csv")
    s.write([ins(KV, 100, id=1, body="a", n=1)])
    s.flush()
    assert s.forget("cf") == 1 and s.forget("cf") == 0
    s.close()


@pytest.mark.parametrize("protocol", ["csv", "parquet"])
def test_a_concurrent_reader_never_sees_a_partial_file(tmp_path: Path, protocol: str) -> None:
    rows, flushes = 300, 25
    done = threading.Event()
    seen: dict[str, int] = {}
    errors: list[BaseException] = []

    def write() -> None:
        try:
            s = sink(tmp_path, protocol, file_size=1 << 20)
            for f in range(flushes):
                s.write([ins(KV, 100 + f, id=f * rows + i, body="x" * 100, n=i) for i in range(rows)])
                s.flush()
                s.publish_checkpoint(100 + f)
            s.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    def read() -> None:
        reader = StorageReader(uri(tmp_path, protocol))
        try:
            while not done.is_set() or len(seen) < flushes:
                for df in reader.data_files(KV.name):
                    if df.path not in seen:
                        seen[df.path] = len(reader.read_file(df))  # a partial file fails to decode or counts short
                    assert reader.checkpoint() is None or reader.checkpoint() >= 100
                if done.is_set() and len(seen) < flushes and errors:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(seen) == flushes and set(seen.values()) == {rows}
