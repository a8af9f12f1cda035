"""upstream.postgres.{conn,catalog,admin} against real PostgreSQL 18 servers."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extras
import pytest

from cdc.errors import InvalidArgument, InvalidURI, TableNotEligible, UpstreamNotReady
from cdc.events import TableName
from cdc.ts import str_to_lsn
from playground.servers import PostgresServer
from upstream.postgres import admin, catalog, eligibility
from upstream.postgres.conn import connect

pytestmark = pytest.mark.integration

SECRET = "Wr0ng-Pa55"
PW_USER = "tw_pw_user"
PW_PASSWORD = "right-password-42"


def _exec(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for stmt in statements:
            cur.execute(stmt)


def _one(conn: Any, query: str, params: Any = None) -> Any:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchone()[0]


def _slot_name() -> str:
    return f"tw_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def conn(pg_server: PostgresServer, pg_database: str) -> Iterator[Any]:
    c = connect(pg_server.uri(pg_database))
    yield c
    c.close()


@pytest.fixture
def plain_role(pg_server: PostgresServer, pg_database: str) -> Iterator[str]:
    """A LOGIN role without REPLICATION, superuser or CREATE on the test database."""
    role = f"tw_role_{uuid.uuid4().hex[:8]}"
    pg_server.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    pg_server.execute(f'DROP OWNED BY "{role}"', db=pg_database)
    pg_server.execute(f'DROP ROLE "{role}"')


@pytest.fixture(scope="module")
def replica_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A second server with wal_level=replica, whose pg_hba demands a password from PW_USER."""
    server = PostgresServer(tmp_path_factory.mktemp("pg_replica"), settings={"wal_level": "replica"}).start()
    server.execute(f"CREATE ROLE {PW_USER} LOGIN PASSWORD '{PW_PASSWORD}'")
    hba = Path(server.data_dir) / "pg_hba.conf"
    hba.write_text(f"host all {PW_USER} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    server.execute("SELECT pg_reload_conf()")
    yield server
    server.stop()


# ---- connections ---------------------------------------------------------------------------------------
def test_connect_pins_session_settings(pg_server: PostgresServer, pg_database: str) -> None:
    c = connect(pg_server.uri(pg_database) + "?application_name=tw-it&options=-c%20work_mem%3D5MB")
    try:
        assert c.autocommit
        assert _one(c, "SHOW TimeZone") == "UTC"
        assert _one(c, "SHOW DateStyle").startswith("ISO")
        assert _one(c, "SHOW IntervalStyle") == "postgres"
        assert _one(c, "SHOW application_name") == "tw-it"
        assert _one(c, "SHOW work_mem") == "5MB"
        assert _one(c, "SELECT current_database()") == pg_database
    finally:
        c.close()
    r = connect(pg_server.uri(pg_database), replication=True)
    try:
        assert isinstance(r, psycopg2.extras.LogicalReplicationConnection)
        cur = r.cursor()
        cur.execute("IDENTIFY_SYSTEM")
        row = cur.fetchone()
        assert row[3] == pg_database  # dbname column: a database-specific (logical) walsender
        cur.execute("SHOW TimeZone")
        assert cur.fetchone()[0] == "UTC"
    finally:
        r.close()


def test_connect_missing_database_or_role_is_invalid_argument(pg_server: PostgresServer) -> None:
    with pytest.raises(InvalidArgument) as ei:
        connect(pg_server.uri("no_such_db_here"))
    assert f"127.0.0.1:{pg_server.port}/no_such_db_here" in str(ei.value)
    assert "does not exist" in str(ei.value)
    assert not ei.value.retryable
    with pytest.raises(InvalidArgument, match="nobody_like_this"):
        connect(pg_server.uri("postgres", user="nobody_like_this"))
    with pytest.raises(InvalidURI):
        connect(pg_server.uri("postgres").replace("postgresql://", "pg://"))


def test_password_authentication_failure(replica_pg: PostgresServer) -> None:
    base = f"127.0.0.1:{replica_pg.port}/postgres"
    with pytest.raises(InvalidArgument) as ei:
        connect(f"postgresql://{PW_USER}:{SECRET}@{base}")
    msg = str(ei.value)
    assert "password authentication failed" in msg and base in msg
    assert SECRET not in msg
    ok = connect(f"postgresql://{PW_USER}:{PW_PASSWORD}@{base}")
    try:
        assert _one(ok, "SELECT current_user") == PW_USER
    finally:
        ok.close()


def test_replication_connection_without_replication_attribute(
    pg_server: PostgresServer, pg_database: str, plain_role: str
) -> None:
    with pytest.raises(UpstreamNotReady, match="REPLICATION"):
        connect(pg_server.uri(pg_database, user=plain_role), replication=True)


# ---- readiness -----------------------------------------------------------------------------------------
def test_check_upstream_reports_facts(conn: Any, pg_database: str) -> None:
    facts = admin.check_upstream(conn)
    assert facts["wal_level"] == "logical"
    assert facts["server_version_num"] == int(_one(conn, "SHOW server_version_num"))
    assert facts["server_version_num"] >= 140000
    assert facts["max_replication_slots"] == int(_one(conn, "SHOW max_replication_slots"))
    assert facts["database"] == pg_database and facts["user"] == "postgres" and facts["is_superuser"]
    used = facts["replication_slots_used"]
    free = facts["max_replication_slots"] - used
    admin.check_upstream(conn, slots_needed=min(free, facts["max_wal_senders"] - facts["wal_senders_used"]))
    with pytest.raises(UpstreamNotReady, match="raise max_replication_slots in postgresql.conf"):
        admin.check_upstream(conn, slots_needed=free + 1)
    name = _slot_name()
    admin.create_slot(conn, name)
    try:
        assert admin.check_upstream(conn, slots_needed=0)["replication_slots_used"] == used + 1
    finally:
        admin.drop_slot(conn, name)


def test_check_upstream_rejects_wal_level_replica(replica_pg: PostgresServer) -> None:
    c = connect(replica_pg.uri("postgres"))
    try:
        with pytest.raises(UpstreamNotReady) as ei:
            admin.check_upstream(c)
    finally:
        c.close()
    msg = str(ei.value)
    assert "'replica'" in msg and "set wal_level = logical in postgresql.conf and restart" in msg
    assert f"127.0.0.1:{replica_pg.port}/postgres" in msg
    assert "REPLICATION" not in msg  # superuser: that is the only problem
    c = connect(replica_pg.uri("postgres"))
    try:
        with pytest.raises(UpstreamNotReady, match="wal_level"):
            admin.create_slot(c, _slot_name())
    finally:
        c.close()


def test_check_upstream_user_without_privileges_and_the_hints_fix_it(
    pg_server: PostgresServer, pg_database: str, plain_role: str
) -> None:
    c = connect(pg_server.uri(pg_database, user=plain_role))
    try:
        with pytest.raises(UpstreamNotReady) as ei:
            admin.check_upstream(c)
        msg = str(ei.value)
        alter = re.search(r'ALTER ROLE "[^"]+" REPLICATION', msg)
        grant = re.search(r'GRANT CREATE ON DATABASE "[^"]+" TO "[^"]+"', msg)
        assert alter and grant, msg
        assert plain_role in alter.group(0)
        pg_server.execute(alter.group(0))
        pg_server.execute(grant.group(0), db=pg_database)
        facts = admin.check_upstream(c)
        assert facts["has_replication"] and facts["can_create"] and not facts["is_superuser"]
    finally:
        c.close()


# ---- catalog -------------------------------------------------------------------------------------------
WEIRD = TableName("Weird Schema", 'Tab "Q" ü')


def test_list_tables(conn: Any) -> None:
    _exec(
        conn,
        "CREATE TABLE public.a (id int PRIMARY KEY)",
        'CREATE SCHEMA "Weird Schema"',
        'CREATE TABLE "Weird Schema"."Tab ""Q"" ü" ("Mixed Col" int)',
        "CREATE TABLE public.parent (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
        "CREATE TABLE public.parent_1 PARTITION OF public.parent FOR VALUES FROM (0) TO (10)",
        "CREATE TABLE public.parent_2 PARTITION OF public.parent FOR VALUES FROM (10) TO (20) PARTITION BY LIST (id)",
        "CREATE TABLE public.parent_2a PARTITION OF public.parent_2 FOR VALUES IN (1)",
        "CREATE VIEW public.v AS SELECT 1 AS one",
        "CREATE MATERIALIZED VIEW public.mv AS SELECT 1 AS one",
        "CREATE UNLOGGED TABLE public.u (id int PRIMARY KEY)",
        "CREATE SEQUENCE public.seq",
        "CREATE TEMP TABLE tmp (id int PRIMARY KEY)",
    )
    expected = sorted([TableName("public", "a"), TableName("public", "parent"), WEIRD])
    assert catalog.list_tables(conn) == expected
    oid = catalog.table_oid(conn, WEIRD)
    assert oid == _one(conn, """SELECT '"Weird Schema"."Tab ""Q"" ü"'::regclass::oid""")
    assert catalog.table_oid(conn, TableName("weird schema", 'Tab "Q" ü')) is None  # exact match only
    assert catalog.table_oid(conn, TableName("public", "nope")) is None
    assert [p.name.table for p in catalog.partitions(conn, TableName("public", "parent"))] == [
        "parent_1",
        "parent_2a",
    ]


_TYPES_DDL = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TYPE pair AS (x int, y text)",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN small_posint AS posint CHECK (VALUE < 100)",
    "CREATE DOMAIN code AS varchar(10)",
    "CREATE DOMAIN int_list AS integer[]",
    "CREATE DOMAIN amount AS numeric(10,2)",
    """CREATE TABLE public.all_types (
        id bigint PRIMARY KEY, c_int2 smallint NOT NULL, c_int4 integer, c_num numeric(10,2),
        c_num_free numeric, c_f4 real, c_f8 double precision, c_bool boolean, c_text text,
        c_vc varchar(20), c_char char(3), c_bytea bytea, c_date date, c_time time, c_timetz timetz,
        c_ts timestamp, c_tstz timestamptz(3), c_interval interval, c_uuid uuid, c_json json,
        c_jsonb jsonb, c_inet inet, c_cidr cidr, c_mac macaddr, c_money money, c_bit bit(3),
        c_varbit varbit, c_xml xml, c_oid oid, c_range int4range, c_point point,
        c_int_arr integer[], c_text_arr text[][], c_vc_arr varchar(5)[], c_dropped int,
        c_posint posint, c_small small_posint, c_code code, c_posint_arr posint[], c_int_list int_list, c_amount amount,
        c_mood mood NOT NULL, c_mood_arr mood[], c_pair pair,
        c_gen bigint GENERATED ALWAYS AS (id * 2) STORED, c_last text)""",
    "ALTER TABLE public.all_types DROP COLUMN c_dropped",
]

# name, base_type, is_array, type_name, nullable
_EXPECTED_COLUMNS = [
    ("id", "int8", False, "bigint", False),
    ("c_int2", "int2", False, "smallint", False),
    ("c_int4", "int4", False, "integer", True),
    ("c_num", "numeric", False, "numeric(10,2)", True),
    ("c_num_free", "numeric", False, "numeric", True),
    ("c_f4", "float4", False, "real", True),
    ("c_f8", "float8", False, "double precision", True),
    ("c_bool", "bool", False, "boolean", True),
    ("c_text", "text", False, "text", True),
    ("c_vc", "varchar", False, "character varying(20)", True),
    ("c_char", "bpchar", False, "character(3)", True),
    ("c_bytea", "bytea", False, "bytea", True),
    ("c_date", "date", False, "date", True),
    ("c_time", "time", False, "time without time zone", True),
    ("c_timetz", "timetz", False, "time with time zone", True),
    ("c_ts", "timestamp", False, "timestamp without time zone", True),
    ("c_tstz", "timestamptz", False, "timestamp(3) with time zone", True),
    ("c_interval", "interval", False, "interval", True),
    ("c_uuid", "uuid", False, "uuid", True),
    ("c_json", "json", False, "json", True),
    ("c_jsonb", "jsonb", False, "jsonb", True),
    ("c_inet", "inet", False, "inet", True),
    ("c_cidr", "cidr", False, "cidr", True),
    ("c_mac", "macaddr", False, "macaddr", True),
    ("c_money", "money", False, "money", True),
    ("c_bit", "bit", False, "bit(3)", True),
    ("c_varbit", "varbit", False, "bit varying", True),
    ("c_xml", "xml", False, "xml", True),
    ("c_oid", "oid", False, "oid", True),
    ("c_range", "int4range", False, "int4range", True),
    ("c_point", "point", False, "point", True),
    ("c_int_arr", "int4", True, "integer[]", True),
    ("c_text_arr", "text", True, "text[]", True),
    ("c_vc_arr", "varchar", True, "character varying(5)[]", True),
    ("c_posint", "int4", False, "integer", True),  # domains: the base type's name, to be created downstream
    ("c_small", "int4", False, "integer", True),
    ("c_code", "varchar", False, "character varying(10)", True),
    ("c_posint_arr", "int4", True, "integer[]", True),
    ("c_int_list", "int4", True, "integer[]", True),
    ("c_amount", "numeric", False, "numeric(10,2)", True),
    ("c_mood", "text", False, "mood", False),
    ("c_mood_arr", "text", True, "mood[]", True),
    ("c_pair", "text", False, "pair", True),
    ("c_gen", "int8", False, "bigint", True),  # stored generated: published as a plain column (PG 18+)
    ("c_last", "text", False, "text", True),
]


def test_table_schema_types(conn: Any) -> None:
    _exec(conn, *_TYPES_DDL)
    table = TableName("public", "all_types")
    schema = catalog.table_schema(conn, table, version=7)
    got = [(c.name, c.base_type, c.is_array, c.type_name, c.nullable) for c in schema.columns]
    assert got == _EXPECTED_COLUMNS
    assert schema.version == 7 and schema.name == table
    assert schema.relation_id == catalog.table_oid(conn, table)
    assert schema.key == ("id",) and schema.has_key and schema.replica_identity == "d"
    assert [c.name for c in schema.columns if c.is_key] == ["id"]
    assert catalog.table_schema(conn, schema.relation_id) == catalog.table_schema(conn, table)
    col = schema.column
    # well-known type oids of pg_catalog, and the declared (domain) type for domain columns
    assert (col("c_int4").type_oid, col("c_int_arr").type_oid, col("c_text").type_oid) == (23, 1007, 25)
    assert col("c_posint").type_oid == _one(conn, "SELECT 'posint'::regtype::oid")
    assert col("c_mood").type_oid == _one(conn, "SELECT 'mood'::regtype::oid")
    mods = {n: col(n).type_modifier for n in ("c_int4", "c_vc", "c_char", "c_num", "c_tstz", "c_bit")}
    assert mods == {
        "c_int4": -1,
        "c_vc": 24,
        "c_char": 7,
        "c_num": (10 << 16 | 2) + 4,
        "c_tstz": 3,
        "c_bit": 3,
    }
    assert col("c_vc_arr").type_modifier == 9
    assert col("c_code").type_modifier == 14  # from the domain's typtypmod


def test_weird_identifiers(conn: Any) -> None:
    _exec(
        conn,
        'CREATE SCHEMA "Weird Schema"',
        'CREATE TABLE "Weird Schema"."Tab ""Q"" ü" ("Mixed Col" int, "sp ace" text, "quo""te" text, '
        '"ünïcødé" text, PRIMARY KEY ("quo""te", "Mixed Col"))',
    )
    schema = catalog.table_schema(conn, WEIRD)
    assert schema.name == WEIRD
    assert schema.column_names == ("Mixed Col", "sp ace", 'quo"te', "ünïcødé")
    assert schema.key == ('quo"te', "Mixed Col")
    assert eligibility.check_tables(conn, [WEIRD]) == [schema]


def test_keys_and_replica_identity(conn: Any) -> None:
    _exec(
        conn,
        "CREATE TABLE pk_rev (a int, b int, c text, PRIMARY KEY (b, a))",
        "CREATE TABLE ident (id int PRIMARY KEY, u int NOT NULL, v text)",
        "CREATE UNIQUE INDEX ident_u ON ident (u)",
        "ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_u",
        "CREATE TABLE full_nopk (a int, b text)",
        "ALTER TABLE full_nopk REPLICA IDENTITY FULL",
        "CREATE TABLE full_pk (id int PRIMARY KEY, b text)",
        "ALTER TABLE full_pk REPLICA IDENTITY FULL",
        "CREATE TABLE nokey (a int, b text)",
        "CREATE TABLE nothing_pk (id int PRIMARY KEY)",
        "ALTER TABLE nothing_pk REPLICA IDENTITY NOTHING",
    )

    def s(name: str) -> Any:
        return catalog.table_schema(conn, TableName("public", name))

    pk = s("pk_rev")
    assert (pk.key, pk.has_key, pk.replica_identity) == (("b", "a"), True, "d")
    assert [c.is_key for c in pk.columns] == [True, True, False]
    assert [c.nullable for c in pk.columns] == [False, False, True]
    ident = s("ident")
    assert (ident.key, ident.has_key, ident.replica_identity) == (("u",), True, "i")
    assert [c.name for c in ident.columns if c.is_key] == ["u"]
    full = s("full_nopk")
    assert (full.key, full.has_key, full.replica_identity) == (("a", "b"), False, "f")
    fpk = s("full_pk")
    assert (fpk.key, fpk.has_key, fpk.replica_identity) == (("id",), True, "f")
    none = s("nokey")
    assert (none.key, none.has_key, none.replica_identity) == ((), False, "d")
    nothing = s("nothing_pk")
    assert (nothing.key, nothing.has_key, nothing.replica_identity) == ((), False, "n")
    with pytest.raises(InvalidArgument, match="does not exist"):
        catalog.table_schema(conn, TableName("public", "missing"))


def test_check_tables(conn: Any) -> None:
    _exec(
        conn,
        "CREATE TABLE good (id int PRIMARY KEY)",
        "CREATE TABLE full_t (a int)",
        "ALTER TABLE full_t REPLICA IDENTITY FULL",
        "CREATE TABLE bad1 (a int)",
        'CREATE SCHEMA "Weird Schema"',
        'CREATE TABLE "Weird Schema"."no ""key""" (a int)',
        "CREATE TABLE nothing_t (id int PRIMARY KEY)",
        "ALTER TABLE nothing_t REPLICA IDENTITY NOTHING",
    )
    good, full_t = TableName("public", "good"), TableName("public", "full_t")
    schemas = eligibility.check_tables(conn, [full_t, good])
    assert [x.name for x in schemas] == [full_t, good]
    assert schemas[1] == catalog.table_schema(conn, good)

    bad = [
        TableName("public", "bad1"),
        TableName("Weird Schema", 'no "key"'),
        TableName("public", "nothing_t"),
    ]
    with pytest.raises(TableNotEligible) as ei:
        eligibility.check_tables(conn, [good, *bad])
    msg = str(ei.value)
    assert "good" not in msg
    fixes = re.findall(r" or ALTER TABLE (.+?) REPLICA IDENTITY FULL", msg)
    assert fixes == ['"public"."bad1"', '"Weird Schema"."no ""key"""', '"public"."nothing_t"']
    for t in fixes[:2]:
        assert f"ALTER TABLE {t} ADD PRIMARY KEY (" in msg
    assert 'ALTER TABLE "public"."nothing_t" REPLICA IDENTITY DEFAULT' in msg  # it has a primary key
    assert 'ALTER TABLE "public"."nothing_t" ADD PRIMARY KEY' not in msg
    for t in fixes:  # the hints are valid SQL
        _exec(conn, f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    assert [x.has_key for x in eligibility.check_tables(conn, bad)] == [False, False, True]

    with pytest.raises(InvalidArgument) as ei2:
        eligibility.check_tables(conn, [good, TableName("public", "ghost"), TableName("x y", "z")])
    assert not isinstance(ei2.value, TableNotEligible)
    assert '"public"."ghost"' in str(ei2.value) and '"x y"."z"' in str(ei2.value)


def test_check_tables_rejects_views_unlogged_and_bad_partitions(conn: Any) -> None:
    _exec(
        conn,
        "CREATE VIEW v AS SELECT 1 AS one",
        "CREATE UNLOGGED TABLE ul (id int PRIMARY KEY)",
        "CREATE TABLE ppk (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
        "CREATE TABLE ppk_1 PARTITION OF ppk FOR VALUES FROM (0) TO (10)",
        "CREATE TABLE pfull (a int, k int) PARTITION BY RANGE (k)",
        "CREATE TABLE pfull_1 PARTITION OF pfull FOR VALUES FROM (0) TO (10)",
        "ALTER TABLE pfull REPLICA IDENTITY FULL",
    )
    ppk = TableName("public", "ppk")
    assert eligibility.check_tables(conn, [ppk])[0].key == ("id", "k")
    with pytest.raises(TableNotEligible) as ei:
        eligibility.check_tables(conn, [TableName("public", "v"), TableName("public", "ul")])
    msg = str(ei.value)
    assert '"public"."v" is a view' in msg
    assert 'ALTER TABLE "public"."ul" SET LOGGED' in msg
    # REPLICA IDENTITY on a partitioned table does not reach its partitions: the leaf is named
    with pytest.raises(TableNotEligible, match=r'ALTER TABLE "public"."pfull_1" REPLICA IDENTITY FULL'):
        eligibility.check_tables(conn, [TableName("public", "pfull")])
    _exec(conn, "ALTER TABLE pfull_1 REPLICA IDENTITY FULL")
    assert eligibility.check_tables(conn, [TableName("public", "pfull")])[0].replica_identity == "f"


# ---- publications --------------------------------------------------------------------------------------
def test_publications(conn: Any) -> None:
    _exec(
        conn,
        "CREATE TABLE t1 (id int PRIMARY KEY)",
        "CREATE TABLE t2 (id int PRIMARY KEY)",
        'CREATE SCHEMA "Weird Schema"',
        'CREATE TABLE "Weird Schema"."Tab ""Q"" ü" (id int PRIMARY KEY)',
        "CREATE TABLE part (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)",
        "CREATE TABLE part_1 PARTITION OF part FOR VALUES FROM (0) TO (10)",
    )
    t1, t2, part = TableName("public", "t1"), TableName("public", "t2"), TableName("public", "part")
    pub = 'tw pub "1"'
    assert admin.publication_tables(conn, pub) is None
    assert admin.create_publication(conn, pub, [t1, WEIRD, part]) is True
    assert admin.create_publication(conn, pub, [part, WEIRD, t1]) is False  # same tables: idempotent
    assert admin.publication_tables(conn, pub) == sorted([t1, WEIRD, part])
    assert _one(conn, "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (pub,)) is True
    with pytest.raises(InvalidArgument, match="already exists"):
        admin.create_publication(conn, pub, [t1])
    # changes of the partition are published under the root's name
    with conn.cursor() as cur:
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (pub,))
        assert sorted(TableName(*r) for r in cur.fetchall()) == sorted([t1, WEIRD, part])

    assert admin.add_tables_to_publication(conn, pub, [t1, t2]) == [t2]
    assert admin.add_tables_to_publication(conn, pub, [t2]) == []
    assert admin.publication_tables(conn, pub) == sorted([t1, t2, WEIRD, part])
    assert admin.remove_tables_from_publication(conn, pub, [t1, TableName("public", "nope")]) == [t1]
    assert admin.publication_tables(conn, pub) == sorted([t2, WEIRD, part])

    admin.drop_publication(conn, pub)
    admin.drop_publication(conn, pub)
    assert admin.publication_tables(conn, pub) is None
    with pytest.raises(InvalidArgument, match="does not exist"):
        admin.add_tables_to_publication(conn, pub, [t1])
    assert admin.create_publication(conn, "empty_pub", []) is True
    assert admin.publication_tables(conn, "empty_pub") == []


def test_publication_without_table_ownership_is_not_ready(
    pg_server: PostgresServer, pg_database: str, plain_role: str, conn: Any
) -> None:
    _exec(conn, "CREATE TABLE owned_by_postgres (id int PRIMARY KEY)")
    pg_server.execute(f'GRANT CREATE ON DATABASE "{pg_database}" TO "{plain_role}"')
    c = connect(pg_server.uri(pg_database, user=plain_role))
    try:
        with pytest.raises(UpstreamNotReady, match="owner"):
            admin.create_publication(c, "p_not_mine", [TableName("public", "owned_by_postgres")])
    finally:
        c.close()


# ---- slots ---------------------------------------------------------------------------------------------
def test_slot_lifecycle(conn: Any, pg_database: str) -> None:
    name = _slot_name()
    assert admin.slot_info(conn, name) is None
    before = admin.current_wal_lsn(conn)
    lsn = admin.create_slot(conn, name)
    assert lsn >= before
    info = admin.slot_info(conn, name)
    assert info is not None
    assert (info.name, info.plugin, info.slot_type, info.database) == (
        name,
        "pgoutput",
        "logical",
        pg_database,
    )
    assert info.confirmed_flush_lsn == lsn
    assert not info.active and info.active_pid is None and not info.lost
    assert info.restart_lsn is not None and info.restart_lsn <= lsn
    assert info.wal_status == "reserved"
    sql_lsn = _one(
        conn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (name,)
    )
    assert str_to_lsn(sql_lsn) == lsn

    with pytest.raises(InvalidArgument, match="already exists"):
        admin.create_slot(conn, name)
    assert admin.create_slot(conn, name, if_not_exists=True) == lsn

    retained = info.retained_bytes
    assert retained is not None and retained >= 0
    _exec(conn, "CREATE TABLE filler AS SELECT g, repeat('x', 100) AS pad FROM generate_series(1, 5000) g")
    # pg_current_wal_lsn() is the WAL *write* position: with synchronous_commit=off the WAL writer
    # gets there within wal_writer_delay
    deadline = time.monotonic() + 10
    after = admin.slot_info(conn, name)
    while after and (after.retained_bytes or 0) < retained + 500_000 and time.monotonic() < deadline:
        time.sleep(0.05)
        after = admin.slot_info(conn, name)
    assert after is not None and after.retained_bytes is not None
    assert after.retained_bytes >= retained + 500_000
    assert after.restart_lsn == info.restart_lsn and after.confirmed_flush_lsn == lsn
    assert admin.current_wal_lsn(conn) >= after.restart_lsn + after.retained_bytes  # type: ignore[operator]

    assert [s.name for s in admin.list_slots(conn, prefix=name)] == [name]
    assert admin.drop_slot(conn, name) is True
    assert admin.slot_info(conn, name) is None
    assert admin.drop_slot(conn, name) is False


@pytest.mark.parametrize("bad", ["", "Upper", "with-dash", "x" * 64, "sp ace", "ü"])
def test_slot_names_are_validated(conn: Any, bad: str) -> None:
    with pytest.raises(InvalidArgument, match="slot name"):
        admin.create_slot(conn, bad)
    with pytest.raises(InvalidArgument, match="slot name"):
        admin.drop_slot(conn, bad)


def test_drop_active_slot_terminates_the_walsender(
    pg_server: PostgresServer, pg_database: str, conn: Any
) -> None:
    _exec(conn, "CREATE TABLE t (id int PRIMARY KEY)")
    name = _slot_name()
    admin.create_publication(conn, name, [TableName("public", "t")])
    admin.create_slot(conn, name)
    repl = connect(pg_server.uri(pg_database), replication=True)
    try:
        cur = repl.cursor()
        cur.start_replication(
            slot_name=name, decode=False, options={"proto_version": "1", "publication_names": name}
        )
        deadline = time.monotonic() + 10
        info = admin.slot_info(conn, name)
        while not (info and info.active) and time.monotonic() < deadline:
            time.sleep(0.05)
            info = admin.slot_info(conn, name)
        assert info is not None and info.active and info.active_pid
        walsender = info.active_pid
        t0 = time.monotonic()
        assert admin.drop_slot(conn, name, timeout=15) is True
        assert time.monotonic() - t0 < 10
        assert admin.slot_info(conn, name) is None
        assert not _one(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (walsender,))
        with pytest.raises(psycopg2.Error):
            for _ in range(100):
                cur.read_message()
                time.sleep(0.02)
    finally:
        repl.close()


def test_create_slot_if_not_exists_rejects_a_foreign_slot(conn: Any) -> None:
    name = _slot_name()
    _exec(conn, f"SELECT pg_create_logical_replication_slot('{name}', 'test_decoding')")
    try:
        with pytest.raises(InvalidArgument, match="test_decoding"):
            admin.create_slot(conn, name, if_not_exists=True)
    finally:
        assert admin.drop_slot(conn, name)


def test_create_slot_exported_snapshot_matches_consistent_point(
    pg_server: PostgresServer, pg_database: str, conn: Any
) -> None:
    _exec(conn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    name = _slot_name()
    repl = connect(pg_server.uri(pg_database), replication=True)
    try:
        lsn, snapshot = admin.create_slot_exported(repl, name)
        _exec(conn, "INSERT INTO t VALUES (2)")
        reader = connect(pg_server.uri(pg_database))
        try:
            _exec(reader, "BEGIN ISOLATION LEVEL REPEATABLE READ", f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            assert _one(reader, "SELECT array_agg(id ORDER BY id) FROM t") == [1]
            _exec(reader, "COMMIT")
        finally:
            reader.close()
        with pytest.raises(InvalidArgument, match="already exists"):
            admin.create_slot_exported(repl, name)
    finally:
        repl.close()
    info = admin.slot_info(conn, name)
    assert info is not None and info.confirmed_flush_lsn == lsn and info.plugin == "pgoutput"
    assert admin.drop_slot(conn, name)
