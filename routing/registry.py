"""Policies by name: `build_policy("bear", {"safety": 1.1})`. Names are kebab-case and double as config and Helm
values. Parameters are checked against the policy's fields — the name, then the type (a number for a float field, not
a string or true; true or false for a bool) — before the policy checks their values."""

from __future__ import annotations

import dataclasses
import types
import typing
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
    _check_types(name, cls, params)
    return cls(**params)


_VALUE_TYPES: dict[Any, tuple[tuple[type, ...], str]] = {  # a field's type → the values it takes, in words
    float: ((int, float), "a number"), int: ((int,), "an integer"), str: ((str,), "a string"),
    bool: ((bool,), "true or false"), type(None): ((type(None),), "null")}


def _check_types(name: str, cls: type, params: Mapping[str, Any]) -> None:
    """Each parameter's value against the type of the policy's field (float, int, str, bool, or one of them or None);
    other annotations are left to the policy."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve here: the policy checks its own values
        return
    for key, value in params.items():
        hint = hints.get(key)
        allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if hint is None or not all(t in _VALUE_TYPES for t in allowed):
            continue
        a_bool_for_a_number = isinstance(value, bool) and bool not in allowed  # True is an int to Python, not to us
        if a_bool_for_a_number or not any(isinstance(value, _VALUE_TYPES[t][0]) for t in allowed):
            expected = " or ".join(_VALUE_TYPES[t][1] for t in allowed)
            raise ValueError(f"policy {name!r}: parameter {key!r} must be {expected}, got {value!r}")


_loaded: list[Callable[[], None]] = []


def _load_builtin_policies() -> None:
    if not _loaded:
        import bear.routing.policies  # noqa: F401  (registers every built-in policy)

        _loaded.append(lambda: None)
