"""OTEL_* values the OpenTelemetry SDK would fail on are taken out before it reads them (bear.common.otel_settings)."""

from __future__ import annotations

from bear.common.otel_settings import drop_unusable


def test_span_limits_that_are_no_non_negative_integer_are_dropped_and_good_ones_kept() -> None:
    environ = {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "abc", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-1",
               "OTEL_SPAN_EVENT_COUNT_LIMIT": "", "OTEL_SPAN_LINK_COUNT_LIMIT": " 64 ",
               "OTEL_ATTRIBUTE_COUNT_LIMIT": "UNSET", "OTEL_SERVICE_NAME": "router"}
    problems = drop_unusable(environ)
    assert environ == {"OTEL_SPAN_LINK_COUNT_LIMIT": " 64 ", "OTEL_ATTRIBUTE_COUNT_LIMIT": "UNSET",
                       "OTEL_SERVICE_NAME": "router"}
    assert [p.split("=")[0] for p in problems] == ["OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                                                    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT"]


def test_a_propagator_not_installed_is_left_out_and_the_others_kept() -> None:
    environ = {"OTEL_PROPAGATORS": "tracecontext, b3multi,zipkin"}
    [problem] = drop_unusable(environ)
    assert environ["OTEL_PROPAGATORS"] == "tracecontext,b3multi"
    assert "'zipkin', not an installed propagator" in problem and "propagating with tracecontext, b3multi" in problem
    only_unknown = {"OTEL_PROPAGATORS": "xray"}
    [problem] = drop_unusable(only_unknown)
    assert only_unknown == {} and "the default (tracecontext,baggage) applies" in problem


def test_settings_the_sdk_takes_are_left_alone() -> None:
    environ = {"OTEL_PROPAGATORS": "none", "OTEL_SPAN_EVENT_COUNT_LIMIT": "0"}
    assert drop_unusable(environ) == [] and environ == {"OTEL_PROPAGATORS": "none", "OTEL_SPAN_EVENT_COUNT_LIMIT": "0"}
    assert drop_unusable({}) == []


def test_the_tracer_provider_is_bears_own_and_an_unknown_context_is_dropped() -> None:
    """(QA: OTEL_PYTHON_TRACER_PROVIDER=bogus stopped every service with StopIteration; the SDK's own name made BEAR
    add no exporter, so no span left; OTEL_PYTHON_CONTEXT=bogus printed the SDK's traceback.)"""
    for provider in ("bogus", "sdk_tracer_provider"):
        environ = {"OTEL_PYTHON_TRACER_PROVIDER": provider, "OTEL_PYTHON_CONTEXT": "bogus"}
        tracer_problem, context_problem = drop_unusable(environ)
        assert environ == {}
        assert tracer_problem.startswith(f"OTEL_PYTHON_TRACER_PROVIDER={provider!r} is ignored")
        assert context_problem.startswith("OTEL_PYTHON_CONTEXT='bogus' is not an installed context implementation "
                                          "(contextvars_context)")
    environ = {"OTEL_PYTHON_CONTEXT": "contextvars_context"}
    assert drop_unusable(environ) == [] and environ == {"OTEL_PYTHON_CONTEXT": "contextvars_context"}
