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

    def anchored_regexes(self) -> list[tuple[bool, str, str]]:
        """The rules as ``(include, schema_regex, table_regex)`` in the regular-expression dialect PostgreSQL's
        AREs and Python's ``re`` share (anchored; punctuation escaped, also inside a class), so
        that a database can apply this very filter itself (PostgreSQL's DDL trigger joins a new table to its
        span in the creating transaction): ``schema ~ schema_regex AND table ~ table_regex``, last match wins.
        Same verdicts as :meth:`match`."""
        return [(inc, glob_regex(sp), glob_regex(tp)) for inc, sp, tp in self._rules]


def glob_regex(pattern: str) -> str:
    """``fnmatch.fnmatchcase``'s glob (``*``, ``?``, ``[seq]``, ``[!seq]``; a ``[`` without its ``]`` is a
    literal) as an anchored regular expression of the shared dialect (see ``anchored_regexes``)."""
    out = ["^"]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append("\\[")
                continue
            stuff = pattern[i:j]
            i = j + 1
            negate = stuff.startswith("!")
            if negate:
                stuff = stuff[1:]
            body = "".join("\\" + c if c in "\\^[]" else c for c in stuff)  # never empty: "]" first is kept
            out.append(("[^" if negate else "[") + body + "]")
        else:
            out.append(ch if ch.isalnum() or ch == "_" else "\\" + ch if ch.isascii() else ch)
    out.append("$")
    return "".join(out)
