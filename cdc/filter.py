"""Table filter rules, TiCDC style: ``['public.*', '!public.tmp_*']``.

Rules are ``schema.table`` glob patterns (``fnmatch``: ``*``, ``?``, ``[...]``); a leading ``!``
excludes. The last rule that matches a table decides (so an exclusion after an inclusion wins); a
table no rule matches is not replicated. Patterns are case-sensitive. A rule without a dot means
``public.<rule>``. Quoted names with dots inside are matched against ``schema.table`` as written.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from cdc.errors import InvalidConfig
from cdc.events import TableName


class TableFilter:
    def __init__(self, rules: Sequence[str]) -> None:
        if not rules:
            raise InvalidConfig("filter.rules is empty: no table would be replicated")
        self._rules: list[tuple[bool, str, str]] = []
        for raw in rules:
            rule = raw.strip()
            negate = rule.startswith("!")
            if negate:
                rule = rule[1:].strip()
            if not rule:
                raise InvalidConfig(f"empty filter rule in {list(rules)!r}")
            schema, dot, table = rule.partition(".")
            if not dot:
                schema, table = "public", rule
            self._rules.append((not negate, schema, table))
        self.rules = tuple(rules)

    def match(self, name: TableName) -> bool:
        verdict = False
        for include, schema_pat, table_pat in self._rules:
            if fnmatch.fnmatchcase(name.schema, schema_pat) and fnmatch.fnmatchcase(name.table, table_pat):
                verdict = include
        return verdict

    def select(self, names: Iterable[TableName]) -> list[TableName]:
        return sorted(n for n in names if self.match(n))
