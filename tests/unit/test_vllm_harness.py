"""The live-vLLM harness's own choices, which depend on the machine: the engine's dtype by what the CPU computes
natively, and the accuracy run's rate by the engine's fitted speed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bear.core.batch_time import BatchTimeCoefficients
from tests.vllm_accuracy import AccuracySettings, PlannedQuery, at_rate, engine_rate, engine_time_alone_s, plan_workload
from tests.vllm_server import engine_dtype, root_cause

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"


@pytest.mark.parametrize(("cpuinfo", "dtype"), [
    (AVX2, "float32"),
    ("flags\t\t: avx2 avx512f avx512_bf16\n", "bfloat16"),
    ("flags\t\t: avx2 avx512f amx_tile amx_bf16\n", "bfloat16"),
    ("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n", "bfloat16"),  # Arm
    ("processor\t: 0\nFeatures\t: fp asimd\n", "float32"),
])
def test_the_engine_computes_in_bfloat16_only_where_the_cpu_does(tmp_path: Path, cpuinfo: str, dtype: str) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert engine_dtype(path) == dtype


def test_without_cpuinfo_the_dtype_is_the_models_own(tmp_path: Path) -> None:
    assert engine_dtype(tmp_path / "missing") == "bfloat16"


def test_a_querys_engine_time_alone_is_its_prefill_chunks_then_one_decode_step_per_further_token() -> None:
    c = BatchTimeCoefficients(b0=1e-3, b1=1e-5, b2=1e-8, b3=1e-9)
    # 700 prompt tokens in chunks of 512 and 188, then 2 decode steps at contexts 701 and 702
    first = 1e-3 + 512e-5 + 1e-9 * (512 * 513 // 2)
    second = 1e-3 + 188e-5 + 1e-9 * (188 * 512 + 188 * 189 // 2)
    decodes = sum(1e-3 + 1e-5 + 1e-8 * context for context in (701, 702))
    assert engine_time_alone_s(c, 700, 3, budget=512) == pytest.approx(first + second + decodes)
    assert engine_time_alone_s(c, 10, 1, budget=512) == pytest.approx(1e-3 + 10e-5 + 1e-9 * 55)


def test_the_rate_brings_the_load_asked_for_and_follows_the_engines_speed() -> None:
    settings = AccuracySettings()
    c = BatchTimeCoefficients(b0=3e-3, b1=4e-5, b2=1e-8, b3=2e-9)
    planned = [PlannedQuery(i, f"q-{i}", "", p, m, float(i))
               for i, (p, m) in enumerate([(40, 10), (900, 50), (7, 128)])]
    rate = engine_rate(c, planned, settings)
    work_s = sum(engine_time_alone_s(c, q.prompt_tokens, q.max_tokens, 512) for q in planned)
    assert rate * work_s / len(planned) == pytest.approx(settings.load)
    slower = BatchTimeCoefficients(*(2 * b for b in (c.b0, c.b1, c.b2, c.b3)))
    assert engine_rate(slower, planned, settings) == pytest.approx(rate / 2)
    assert engine_rate(c, planned, replace(settings, load=0.5)) == pytest.approx(rate / 2)


def test_a_workload_planned_at_one_query_per_second_and_rescaled_is_the_one_planned_at_that_rate() -> None:
    settings = AccuracySettings()
    unit = plan_workload(settings, 30, 5, "q")
    direct = plan_workload(settings, 30, 5, "q", rate_qps=2.5)
    rescaled = at_rate(unit, 2.5)
    assert [(q.prompt, q.max_tokens) for q in rescaled] == [(q.prompt, q.max_tokens) for q in direct]
    assert [q.send_at_s for q in rescaled] == pytest.approx([q.send_at_s for q in direct])
    assert rescaled[-1].send_at_s == pytest.approx(unit[-1].send_at_s / 2.5)


def test_prompts_can_open_with_shared_prefixes_of_the_length_asked_for() -> None:
    from tests.vllm_accuracy import PRETOKEN, shared_prefixes

    plain = plan_workload(AccuracySettings(), 40, 3, "q")
    settings = AccuracySettings(shared_prefix_tokens=300, num_shared_prefixes=2)
    prefixes = shared_prefixes(settings)
    assert len(prefixes) == 2 and prefixes[0] != prefixes[1]
    assert all(300 <= len(PRETOKEN.findall(p)) <= 305 for p in prefixes)  # cut at a word's end
    assert not any(q.prompt.startswith(p[:200]) for p in prefixes for q in plain)  # none by default
    planned = plan_workload(settings, 40, 3, "q")
    opened = [next(i for i, p in enumerate(prefixes) if q.prompt.startswith(p + " ")) for q in planned]
    assert set(opened) == {0, 1}
    assert all(q.prompt_tokens <= settings.max_prompt_tokens + 10 for q in planned)
    assert all(q.prompt_tokens == len(PRETOKEN.findall(q.prompt)) for q in planned)
    assert shared_prefixes(settings) == prefixes  # the warm-up's and the measured run's alike
    assert [q.send_at_s for q in planned] == [q.send_at_s for q in plain]
    with pytest.raises(ValueError, match="shared_prefix_tokens"):
        plan_workload(replace(settings, shared_prefix_tokens=1490), 5, 3, "q")


METRICS = """# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen3-0.6B"} 7.0
vllm:num_preemptions_total{engine="1",model_name="Qwen3-0.6B"} 2.0
vllm:num_preemptions_created{engine="0",model_name="Qwen3-0.6B"} 1.7e+09
"""


def test_a_servers_counter_is_summed_over_its_labels(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.vllm_server import VllmServer

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Metrics) as http:
        threading.Thread(target=http.serve_forever, daemon=True).start()
        server = VllmServer("python", tmp_path, tmp_path, str(tmp_path))
        server.port = http.server_address[1]
        try:
            assert server.counter("vllm:num_preemptions_total") == 9.0
            assert server.counter("vllm:num_requests_total") == 0.0
        finally:
            http.shutdown()


def test_a_failed_start_is_reported_with_the_root_cause_not_the_warnings_or_the_api_servers_traceback() -> None:
    log = "\n".join([
        "(APIServer pid=1) WARNING 12-04 [system_utils.py:255] failed with error current limit exceeds maximum limit. "
        "This can cause fd limit errors like `OSError: [Errno 24] Too many open files`.",
        "(EngineCore pid=2) ERROR 12-04 [core.py:1510] Traceback (most recent call last):",
        "(EngineCore pid=2) ERROR 12-04 [core.py:1510]     raise ValueError(",
        "(EngineCore pid=2) ERROR 12-04 [core.py:1510] ValueError: To serve at least one request with the model's "
        "max seq len (2048), 0.01 GiB KV cache is needed",
        "Traceback (most recent call last):",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ])
    assert root_cause(log) == (": ValueError: To serve at least one request with the model's max seq len (2048), "
                                 "0.01 GiB KV cache is needed")
    assert root_cause("INFO all well\n") == ""
