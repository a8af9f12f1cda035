"""``xdist_group`` marks that pytest-xdist's ``--dist loadgroup`` really honours, on the pytest this project runs.

pytest-xdist (3.8) tells its controller a test's group by rewriting ``item._nodeid`` to ``<nodeid>@<group>`` in the
worker; pytest 9 no longer reads that attribute (``Node.nodeid`` comes from a structured ``_id``), so the suffix never
reaches the controller and every group is silently ignored: the Spark tests ran on both workers, each starting a JVM
of its own, side by side. :func:`pin_groups` puts the suffix where this pytest reads it; on a pytest that still reads
``_nodeid`` it does nothing (xdist's own hook does it there).
"""

from __future__ import annotations

import pytest


def pin_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker under ``--dist loadgroup``: give every item marked ``xdist_group`` the node id
    ``<nodeid>@<group>`` (groups joined by ``_``, as xdist does), which the controller schedules as one unit. Elsewhere
    (no xdist, another ``--dist``, a pytest that reads ``_nodeid``) it changes nothing."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0]) if m.args else str(m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        ident = getattr(item, "_id", None)
        if not names or ident is None or not hasattr(type(ident), "parse") or "@" in item.nodeid:
            continue
        item._id = type(ident).parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]
