"""The filter's rules as anchored regular expressions (what PostgreSQL's DDL trigger applies to a new table)
give the same verdicts as the filter itself: checked here with Python's ``re`` over random patterns and names;
tests/integration/test_pg_table_join.py checks PostgreSQL's regex engine on the same expressions."""

from __future__ import annotations

import fnmatch
import random
import re

import pytest

from cdc.events import TableName
from cdc.filter import TableFilter, glob_regex

pytestmark = pytest.mark.unit

ALPHABET = "ab_.*?[]!-^\\$(xZ1é"
PATTERNS = ["*", "a*", "t?x", "[abc]z", "[!a-c]*", "x[", "a.b", "[]]x", "[!]]", "[]", "we$ird(", "[a-", "*[!_]",
            "[\\]", "a^b", "[^a]", "(x)", "a+b", "{1}", "é*", "[[]", "[!!]"]


def _random(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, n)))


def test_glob_regex_matches_exactly_what_fnmatchcase_matches() -> None:
    rng = random.Random(7)
    patterns = PATTERNS + [_random(rng, 6) for _ in range(600)]
    names = [_random(rng, 5) for _ in range(300)] + ["", "a", "ab", "t_x", "az", "x[", "a.b", "]x", "]", "[]",
                                                     "we$ird(", "é", "[a-", "\\", "a^b", "^", "!"]
    for pat in patterns:
        try:
            rx = re.compile(glob_regex(pat))
        except re.error:  # a reversed range: fnmatch's own translation fails the same way
            with pytest.raises(re.error):
                fnmatch.fnmatchcase("x", pat)
            continue
        for name in names:
            assert bool(rx.search(name)) == fnmatch.fnmatchcase(name, pat), (pat, name, glob_regex(pat))


def test_anchored_regexes_give_the_filter_verdict_last_rule_wins() -> None:
    f = TableFilter(["public.*", "!public.tmp_*", "sales.[!x]*", "orders"])
    rules = f.anchored_regexes()

    def verdict(t: TableName) -> bool:
        out = False
        for inc, srx, trx in rules:
            if re.search(srx, t.schema) and re.search(trx, t.table):
                out = inc
        return out

    for t in [TableName("public", "a"), TableName("public", "tmp_1"), TableName("sales", "xy"),
              TableName("sales", "yx"), TableName("other", "orders"), TableName("public", "orders")]:
        assert verdict(t) == f.match(t), t
