"""What can be checked before any process starts: one line per problem, naming it.

``asyncrl run`` runs these (``asyncrl-worker check``) before it starts the scheduler, and
``asyncrl-worker --role R`` runs its role's before it dials one: a model directory that
cannot be used, a plug-in path that does not import, an engine or device this machine
does not have. Each role declares what it needs (``Actor.check``; the checks themselves
are in ``actors/startup/role_checks.py``); this module asks each role of a run for its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from asyncrl.runtime.contract.config import RunConfig, workers_to_start

from ..actor import Actor

__all__ = ["PreflightError", "load_actor_class", "problems"]


class PreflightError(ValueError):
    """A configuration the run cannot start with; the message is one line."""


def problems(cfg: RunConfig, roles: Iterable[str] | None = None) -> list[str]:
    """Every problem the run's roles (or ``roles``) can see now, each once, in order."""
    found: dict[str, None] = {}
    wanted = [r for r, n in workers_to_start(cfg).items() if n > 0] if roles is None else roles
    for role in wanted:
        try:
            actor_class = load_actor_class(cfg.pipeline.actors, role)
        except PreflightError as error:
            found[str(error)] = None
            continue
        for problem in actor_class.check(cfg):
            found[problem] = None
    return list(found)


def load_actor_class(module_name: str, role: str) -> type[Actor]:
    """``ROLES[role]`` of ``module_name``; PreflightError naming what is missing."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PreflightError(f"pipeline.actors: cannot import {module_name!r}: {error}") from None
    roles = getattr(module, "ROLES", None)
    if not isinstance(roles, Mapping):
        raise PreflightError(
            f"pipeline.actors: {module_name} has no ROLES mapping of role to class"
        )
    if role not in roles:
        known = ", ".join(sorted(roles))
        raise PreflightError(f"{module_name}.ROLES has no role {role!r}; it has: {known}")
    try:
        actor_class = roles[role]  # a lazy table imports the role's module only now
    except ImportError as error:
        raise PreflightError(f"pipeline.actors: {module_name}.ROLES[{role!r}]: {error}") from None
    if getattr(actor_class, "role", None) != role:
        raise PreflightError(f"{module_name}.ROLES[{role!r}] is a class whose role is not {role!r}")
    return actor_class
