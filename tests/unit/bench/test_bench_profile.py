"""bench.profile: samples are attributed to components by the leaf frame's file, at directory boundaries."""

import pytest

from bench.profile import component_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("file", "component"), [
    ("/work/main/sorter/leveldb.py", "sorter (LevelDB)"),
    ("/tmp/wt-sorter/processor/mounter.py", "mounter"),  # a checkout directory named *sorter is no sorter
    ("/tmp/x/upstream/postgres/stream.py", "replication stream (psycopg2)"),
    ("/tmp/x/upstream/postgres/pgoutput.py", "pgoutput decode and value parsers"),
    ("/venv/lib/python3.11/site-packages/pymysql/connections.py", "driver: PyMySQL"),
    ("/usr/lib/python3.11/threading.py", "thread waits"),
    ("<string>", "generated code (dataclass __init__, lambdas)"),
    ("/somewhere/else.py", "other"),
])
def test_component_of_a_frame(file: str, component: str) -> None:
    assert component_of({"file": file}) == component
