"""Canonical state keys from a TextWorld/ALFWorld game's true state (its logic facts).

The key hashes the sorted set of world facts, so it is equal exactly when the world is:
the same state reached by different paths has one key, and actions that change nothing
(``look``, ``inventory``, ``examine``, a rejected action) leave it unchanged.
"""

from __future__ import annotations

from typing import Iterable

from gaca_envs.core import stable_hash

#: ALFWorld PDDL facts that only record what the agent has looked at (set by look,
#: inventory, examine, open and help). No precondition or goal reads them.
ALFWORLD_BOOKKEEPING = frozenset({"checked", "examined"})


def fact_text(fact) -> str:
    """``name(arg1,arg2)`` for a ``textworld.logic.Proposition``."""
    return f"{fact.name}({','.join(v.name for v in fact.arguments)})"


def facts_key(facts: Iterable, exclude: frozenset[str] = frozenset()) -> str:
    """Stable hash of the true facts, leaving out predicates in ``exclude``.

    Derived axioms are left out, and so are negated facts: TextWorld's PDDL state records
    ``not_opened(x)`` after a close, while a never-opened receptacle has no such fact, yet
    both worlds are the same (``opened(x)`` is false).
    """
    parts = sorted(fact_text(f) for f in facts
                   if not f.is_negation and f.name not in exclude
                   and not f.name.startswith("new-axiom@"))
    return stable_hash(parts)
