"""Components as building blocks (hpccm's shape): one module per component owns its selection
rules, its pins, its build steps and its checks; the resolver and the renderers call it."""

from __future__ import annotations

from envbuilder.record import Record


class Refusal(Record):
    """One reason a block refuses a selection: the rule's code, what, why, the fix (a change
    that resolves: fixes.checked holds it); hard: no --allow-unsupported gets past it (as
    the resolver's own `add`: soft unless said)."""

    code: str
    what: str
    why: str
    fix: str
    hard: bool = False
