"""Policies by name: `build_policy("bear", safety=1.1)`. Names are kebab-case and double as config and Helm values."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from bear.routing.contract import Policy


class UnknownPolicy(ValueError):
    pass


_POLICIES: dict[str, type] = {}
P = TypeVar("P", bound=type)


def register(cls: P) -> P:
    """Class decorator: registers a policy under its `name`. A policy is a dataclass whose fields are its parameters."""
    name = cls.name  # type: ignore[attr-defined]
    if name in _POLICIES:
        raise ValueError(f"policy {name!r} registered twice")
    _POLICIES[name] = cls
    return cls


def policy_names() -> list[str]:
    _load_builtin_policies()
    return sorted(_POLICIES)


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """A fresh policy instance; raises UnknownPolicy (naming the choices) or ValueError (naming the parameter)."""
    _load_builtin_policies()
    cls = _POLICIES.get(name)
    if cls is None:
        raise UnknownPolicy(f"unknown policy {name!r}; choose one of: {', '.join(sorted(_POLICIES))}")
    params = dict(params or {})
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"policy {name!r} has no parameter {unknown[0]!r}; its parameters: {sorted(known) or 'none'}")
    return cls(**params)


_loaded: list[Callable[[], None]] = []


def _load_builtin_policies() -> None:
    if not _loaded:
        import bear.routing.policies  # noqa: F401  (registers every built-in policy)

        _loaded.append(lambda: None)
