"""OTEL_* settings the OpenTelemetry SDK would fail on, found before it reads them (standard library only).

The SDK reads some of its variables where nothing can catch its error: the span limits when `opentelemetry.sdk.trace`
is imported or a TracerProvider made (a value that is no non-negative integer raises ValueError), the propagators when
`opentelemetry.propagate` is imported (a name no installed package provides raises ValueError), the tracer provider
where a tracer is first asked for (StopIteration), the context when it is first used (a traceback). Each stopped a
service at start, or printed a traceback, `OTEL_SDK_DISABLED=true` or not. As for every other tracing setting (see
bear.common.service), a bad value must not keep a service from serving: `drop_unusable` takes such values out of the
environment before the SDK is imported, so that its defaults apply, and says which and why.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SPAN_LIMITS = (  # the SDK's SpanLimits variables: a non-negative integer, or "unset" (no limit); set empty, it fails
    "OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
)
PROPAGATOR_GROUP = "opentelemetry_propagator"  # the entry points OTEL_PROPAGATORS names
CONTEXT_GROUP = "opentelemetry_context"  # the entry points OTEL_PYTHON_CONTEXT names


def drop_unusable(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Removes from `environ` the OTEL_* values the SDK would fail on (a propagator not installed: only that name);
    returns one sentence per value removed."""
    problems = []
    for name in SPAN_LIMITS:
        value = environ.get(name)
        if value is not None and not _limit_ok(value):
            del environ[name]
            problems.append(f"{name}={value!r} is not a non-negative integer (or 'unset'): ignored, the SDK's default "
                            "applies")
    provider = environ.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    if provider is not None:
        # any name but an installed one stopped every service (StopIteration where a tracer is first asked for); the
        # SDK's own left BEAR's exporters out, so that no span was exported
        problems.append(f"OTEL_PYTHON_TRACER_PROVIDER={provider!r} is ignored: BEAR installs its own tracer provider, "
                        "configured by the other OTEL_* variables")
    context = environ.get("OTEL_PYTHON_CONTEXT")
    if context is not None and context not in (known_contexts := _installed(CONTEXT_GROUP)):
        del environ["OTEL_PYTHON_CONTEXT"]
        problems.append(f"OTEL_PYTHON_CONTEXT={context!r} is not an installed context implementation "
                        f"({', '.join(sorted(known_contexts))}): ignored, the default applies")
    listed = environ.get("OTEL_PROPAGATORS")
    if listed is not None:
        names = [n.strip() for n in listed.split(",") if n.strip()]
        known = _installed(PROPAGATOR_GROUP)
        unknown = [n for n in names if n.lower() != "none" and n not in known]
        if unknown:
            kept = [n for n in names if n not in unknown]
            if kept:
                environ["OTEL_PROPAGATORS"] = ",".join(kept)
            else:
                del environ["OTEL_PROPAGATORS"]
            problems.append(f"OTEL_PROPAGATORS names {', '.join(map(repr, unknown))}, not an installed propagator "
                            f"({', '.join(sorted(known))}): left out, "
                            + (f"propagating with {', '.join(kept)}" if kept else "the default (tracecontext,baggage) "
                               "applies"))
    return problems


def _limit_ok(value: str) -> bool:
    text = value.strip().lower()
    if text == "unset":
        return True
    try:
        return int(text) >= 0
    except ValueError:
        return False


def _installed(group: str) -> set[str]:
    from importlib.metadata import entry_points

    return {entry.name for entry in entry_points(group=group)}
