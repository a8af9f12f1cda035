#!/usr/bin/env bash
# Prepare this checkout for `make test` / `make demo` on a Debian machine (run as root, registries only):
#   * .venv (python3 -m venv) with the project installed editable, extras $TIDEWATER_EXTRAS (dev,mysql,spark,kafka;
#     kafka is the Kafka sink's kafka-python, dev holds the test servers, the tansu broker included);
#   * Debian mariadb-server when `mariadbd` is missing (the MariaDB test server);
#   * Java >= 17 for Spark (pyspark 4.3): Debian openjdk-17-jre-headless when `java -version` is missing or older.
#     No JDBC driver packages: the Spark jobs read and write through our own Python code, not Spark JDBC.
#   * Debian prometheus when `prometheus`/`promtool` are missing (alert rule tests, the real-Prometheus test;
#     the package's own service is never used: tests start their own server on a free port);
#   * Debian systemd when `systemd-analyze` is missing (`systemd-analyze verify` of the unit).
#   * MySQL 8.0 for the MySQL 8 tests: Ubuntu 22.04's mysql-server-core-8.0 and four libraries Debian 12 lacks,
#     downloaded from archive.ubuntu.com, SHA256-checked against its Packages index and unpacked (dpkg-deb -x, never
#     into the system's dpkg database) into ~/.cache/tidewater/mysql-8.0 ($TIDEWATER_MYSQL8_HOME), by
#     playground/servers/mysql_dist.py. An unreachable archive is a message, not a failure (the tests skip); it is
#     not tried again until .venv/.mysql8-unreachable is removed.
# Idempotent and fast when already done: a stamp in .venv records the hash of pyproject.toml + extras.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
EXTRAS=${TIDEWATER_EXTRAS:-dev,mysql,spark,kafka}
VENV=.venv
STAMP=$VENV/.tidewater-bootstrap

log() { printf 'bootstrap: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else log "need root for: $*"; return 1
    fi
}

apt_updated=0
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ "$apt_updated" -eq 0 ]; then
        as_root apt-get update -qq
        apt_updated=1
    fi
    as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

have_mariadbd() {
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]
}

java_major() {
    # major version of the java Spark would start (JAVA_HOME first); 0 when there is none
    local java out
    java=${JAVA_HOME:+$JAVA_HOME/bin/java}
    [ -n "$java" ] && [ -x "$java" ] || java=$(command -v java || true)
    [ -n "$java" ] || { echo 0; return; }
    out=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -1)
    set -- $out
    if [ "${1:-0}" = 1 ]; then echo "${2:-0}"; else echo "${1:-0}"; fi
}

need_java() {
    case ",$EXTRAS," in *,spark,*) [ "$(java_major)" -lt 17 ] ;; *) return 1 ;; esac
}

have_prometheus() {
    command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1
}

have_systemd_analyze() {
    command -v systemd-analyze >/dev/null 2>&1
}

mysql_dist() {
    # playground/servers/mysql_dist.py's main (not `-m`: the package imports it first, and runpy would warn)
    "$VENV/bin/python" -c 'import sys; from playground.servers import mysql_dist; sys.exit(mysql_dist.main(sys.argv[1:]))' "$@"
}

have_mysql8() {
    # installed, or tried once with the archive unreachable (not retried on every run of an offline machine)
    [ -f "$VENV/.mysql8-unreachable" ] || mysql_dist --check
}

want="$( (cat pyproject.toml; echo "extras=$EXTRAS") | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ] && have_mariadbd \
        && have_prometheus && have_systemd_analyze && ! need_java && have_mysql8; then
    exit 0
fi

# ---- system packages --------------------------------------------------------------------------------------
if ! have_mariadbd; then
    log "installing mariadb-server (apt)"
    apt_install mariadb-server
fi
if ! have_prometheus; then
    log "installing prometheus (apt; its service is not started by the tests)"
    apt_install prometheus
    # the package enables its own service; where an init runs, keep it off so that it holds no port
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi
if ! have_systemd_analyze; then
    log "installing systemd (apt) for systemd-analyze"
    apt_install systemd
fi

if need_java; then
    log "installing openjdk-17-jre-headless (apt): Spark needs Java >= 17, found $(java_major)"
    apt_install openjdk-17-jre-headless
    if need_java; then
        log "java is still older than 17 (JAVA_HOME=${JAVA_HOME:-unset}): point JAVA_HOME at Java 17"
        exit 1
    fi
fi

# ---- virtualenv -------------------------------------------------------------------------------------------
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import pip' >/dev/null 2>&1; then
    log "$VENV is broken (no pip); recreating"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || { log "$PYTHON is $("$PYTHON" -V 2>&1); Python >= 3.11 is required"; exit 1; }
    log "creating $VENV with $("$PYTHON" -V 2>&1)"
    if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
        # Debian ships venv/ensurepip separately.
        rm -rf "$VENV"
        pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        log "python3 -m venv failed; installing python${pyver}-venv (apt)"
        apt_install "python${pyver}-venv" || apt_install python3-venv
        "$PYTHON" -m venv "$VENV"
    fi
fi

log "installing the project into $VENV (extras: $EXTRAS)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"

# the snapshot reader's COPY helper (upstream/postgres/copy_out.c): built now rather than by the first copy; without a
# C compiler the copy falls back to psycopg2's copy_expert (more client CPU per row)
"$VENV/bin/python" -m upstream.postgres.copy_out >/dev/null || log "COPY helper not built: copies use copy_expert"
# the row codec (upstream/postgres/rowcodec.c, a CPython extension: the compiler and this Python's headers): pgoutput
# tuples and values decoded in C; without it rows are decoded by the pure-Python reference (same values, more CPU)
if ! "$VENV/bin/python" -c 'import pathlib, sysconfig, sys; sys.exit(not (pathlib.Path(sysconfig.get_paths()["include"]) / "Python.h").is_file())'; then
    pyver=$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    log "installing python${pyver}-dev (apt): the row codec needs Python.h"
    apt_install "python${pyver}-dev" || apt_install python3-dev || log "no Python headers: rows are decoded in Python"
fi
"$VENV/bin/python" -m upstream.postgres.rowcodec >/dev/null || log "row codec not built: rows are decoded in Python"
# the replication reader (upstream/postgres/walread.c, same needs): a span drains its walsender connection in C; without
# it psycopg2's read_message reads each message (same items, more CPU per row)
"$VENV/bin/python" -m upstream.postgres.walread >/dev/null || log "replication reader not built: the stream is read through psycopg2"
# the MySQL/MariaDB span source's rows-event decoder (upstream/mysql/rowcodec.c, same needs); without it the binlog's
# rows are decoded by upstream/mysql/rowdecode.py (same payloads, more CPU)
"$VENV/bin/python" -m upstream.mysql.rowcodec >/dev/null || log "MySQL row codec not built: binlog rows are decoded in Python"
# the SQL sink's row renderer (sinks/sql/dialect/rowtext.c, a CPython extension like the row codec): COPY text and
# MySQL literal rows; without it the same text is rendered in Python
"$VENV/bin/python" -m sinks.sql.dialect.rowtext >/dev/null || log "row renderer not built: the SQL sink renders rows in Python"
# the initial copy's literal rows for MySQL/MariaDB targets (sinks/sql/dialect/copy_literals.c, same needs); without it
# those chunks are parsed in Python (same rows, more CPU)
"$VENV/bin/python" -m sinks.sql.dialect.copy_literals >/dev/null || log "C literal rows not built: MySQL copies parse rows"
# MySQL 8.0 (playground/servers/mysql_dist.py): the MySQL 8 test server; without it those tests skip
if ! mysql_dist --check; then
    log "fetching MySQL 8.0 (Ubuntu jammy packages, ~30 MB) into ${TIDEWATER_MYSQL8_HOME:-~/.cache/tidewater/mysql-8.0}"
    if mysql_dist >/dev/null && mysql_dist --check; then
        rm -f "$VENV/.mysql8-unreachable"
    else
        log "MySQL 8 not installed (archive.ubuntu.com unreachable?): the MySQL 8 tests skip"
        touch "$VENV/.mysql8-unreachable"
    fi
fi
# the Spark driver's class-data archive (spark_jobs/cds.py): the snapshot job's JVM starts with about half the CPU
case ",$EXTRAS," in *,spark,*)
    log "archiving the Spark driver's classes (once, ~20 s)"
    "$VENV/bin/python" -m spark_jobs.cds >/dev/null || log "Spark class-data archive not built: the driver starts without it" ;;
esac

echo "$want" > "$STAMP"
log "done"
