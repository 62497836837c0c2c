"""Ground truth for the replay's prefix-cache hits (`cached_tokens`) from vLLM's real scheduler, prefix caching on.

Run with the vLLM virtualenv's Python, like vllm_driver.py (whose engine loop, fake model runner and case mapping it
reuses; imports only vllm, torch and the standard library; works offline):

    python vllm_prefix_driver.py --cases 40 --seed 1 --out cases.jsonl

Method. Prompts are made of two shared prefixes, A and B, and suffixes whose first token no other prompt has. In a
random engine configuration (vllm_driver.sample_engine, sync or async) a request starting with B runs and finishes
(B's blocks are then free but still cached, in vLLM's free queue) while a few starting with A are admitted and finish
their prefill (A's blocks are then held by running requests). Waiting requests arrive (starting with A, B, a part of
A, or nothing shared), and at a step with load the state is converted into a replay case; a query follows (A or B
plus a suffix, a part of A, a running request's whole prompt, or nothing shared), and the engine steps until the
query's first token, as in vllm_driver.py.

The oracle. Each waiting request's and the query's `cached_tokens` is how much of its prompt vLLM's block pool holds
at the snapshot, in whole blocks from the start (what an estimator approximates); vLLM's own get_computed_blocks must
agree with the replay's rule on it (min(cached, num_tokens - 1) rounded down to whole blocks). These are the hits
vLLM finds at admission: nothing a waiting request or the query could hit is cached later (every other prompt differs
from the first token after A or B), and the KV cache holds every block all the requests ever need, so nothing cached
is evicted and memory never binds.

Two fixed cases where memory binds (meta "mode"): "held_tight": the query's cached blocks are held by a running
request; vLLM takes only its other blocks from the free pool and admits it at once, while the replay takes them all
and waits (its rule is conservative: it admits no earlier than vLLM here). "free_tight": the cached blocks are free,
the query waits for a running request's end in both, and the replay is exact.
"""
import argparse
import json
import random
import sys
import tempfile
import time

# First: vllm_driver sets vLLM up to run offline and quietly before vLLM is imported.
from vllm_driver import (BATCH_TIME, ENGINE_KEYS, STOP, VOCAB, Engine, case_request, cdiv,
                         run_to_first_token, sample_engine, write_model_config)

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request, RequestStatus

MAX_WARM_UP_STEPS = 3000


class Prompts:
    """Token ids: shared prefixes, and suffixes starting with a token no other prompt starts its suffix with."""

    def __init__(self, rng):
        self.rng, self.next_first = rng, 3

    def fresh(self, length):
        if length <= 0:
            return []
        first, self.next_first = self.next_first, self.next_first + 1
        return [first] + [self.rng.randrange(VOCAB // 2, VOCAB) for _ in range(length - 1)]


def add_prompt(eng, rid, tokens, max_tokens, hidden, arrival):
    """vllm_driver.Engine.add with given token ids and block hashes (prefix caching)."""
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP], ignore_eos=True)
    eng.hidden[rid] = min(hidden, max_tokens)
    eng.max_tokens[rid] = max_tokens
    eng.sched.add_request(Request(rid, list(tokens), params, None, arrival_time=arrival,
                                  block_hasher=eng.hasher))


def make_request(eng, rid, tokens, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP], ignore_eos=True)
    return Request(rid, list(tokens), params, None, block_hasher=eng.hasher)


def cached_prompt_tokens(sched, req):
    """The oracle: prompt tokens of `req` whose blocks the block pool holds now, in whole blocks from the start;
    checks that vLLM's own lookup finds min(that, num_tokens - 1) rounded down to blocks."""
    pool, bs, cached = sched.kv_cache_manager.block_pool, sched.block_size, 0
    for block_hash in req.block_hashes:
        if cached + bs > req.num_prompt_tokens or not pool.get_cached_block(block_hash, [0]):
            break
        cached += bs
    _, hit, _ = sched.kv_cache_manager.get_computed_blocks(req)
    assert hit == min(cached, req.num_tokens - 1) // bs * bs, (req.request_id, cached, hit)
    return cached


def new_engine(eng_cfg, model_dir):
    eng = Engine(eng_cfg, model_dir, prefix_caching=True)
    hash_fn = get_hash_fn_by_name(eng.sched.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    eng.hasher = get_request_block_hasher(eng_cfg["block_size"], hash_fn)
    return eng


def snapshot(eng, eng_cfg, query, query_cached):
    """The scheduler state as a replay case with the oracle's cached_tokens; prefix-shared blocks counted once."""
    s, is_async = eng.sched, eng_cfg["async_scheduling"]
    assert not s.kv_holding_waiting and not s.deferred_waiting
    assert all(r.status == RequestStatus.RUNNING for r in s.running)
    running = [case_request(eng, r, True, is_async)[0] for r in s.running]
    waiting = []
    for r in s.waiting:
        item = case_request(eng, r, False, is_async)[0]
        assert item["num_prompt_tokens"] == r.num_prompt_tokens and not r.num_output_tokens, r.request_id
        cached = cached_prompt_tokens(s, r)
        if cached:
            item["cached_tokens"] = cached
        waiting.append(item)
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    shared = free + sum(r["num_allocated_blocks"] for r in running) - eng_cfg["num_gpu_blocks"]
    assert shared >= 0 and len(s.requests) == len(running) + len(waiting)
    query = dict(query, **({"cached_tokens": query_cached} if query_cached else {}))
    case = {"engine": {**{k: eng_cfg[k] for k in ENGINE_KEYS}, "enable_prefix_caching": True}, "free_blocks": free,
            "running": running, "waiting": waiting, "query": query, "batch_time": dict(BATCH_TIME)}
    if shared:
        case["shared_blocks"] = shared
    return case


def step_until(eng, done):
    """Steps (no arrivals) until `done()` holds at a point where a snapshot can be taken; False if it never does."""
    for _ in range(MAX_WARM_UP_STEPS):
        if len(eng.queue) == eng.depth - 1 and done():
            return True
        eng.step()
    return False


def finish_case(eng, eng_cfg, query_tokens, query_out, mode):
    """Snapshot now, add the query, step to its first token: one output line (None if it never comes)."""
    q = make_request(eng, "q", query_tokens, query_out)
    query_cached = cached_prompt_tokens(eng.sched, q)
    query = {"id": "q", "num_prompt_tokens": len(query_tokens), "output_tokens": query_out}
    case = snapshot(eng, eng_cfg, query, query_cached)
    add_prompt(eng, "q", query_tokens, query_out, query_out, 1e6)
    result = run_to_first_token(eng, "q")
    if result is None:
        return None
    batches, _, stats = result
    meta = {"mode": mode, "async": eng_cfg["async_scheduling"], "query_cached_tokens": query_cached,
            "waiting_cached_tokens": [w.get("cached_tokens", 0) for w in case["waiting"]],
            "shared_blocks": case.get("shared_blocks", 0), "num_batches": len(batches), **stats}
    return {"case": case, "expected": {"first_token_batch": len(batches), "batches": batches}, "meta": meta}


def random_case(seed, index, model_dir):
    rng = random.Random(f"prefix:{seed}:{index}")
    eng_cfg = sample_engine(rng, rng.random() < 0.5)
    mml, bs = eng_cfg["max_model_len"], eng_cfg["block_size"]
    prompts = Prompts(rng)
    a, b = prompts.fresh(rng.randint(1, mml // 3)), prompts.fresh(rng.randint(1, mml // 3))

    def tail(prefix):  # a suffix keeping the prompt (and a few outputs) within max_model_len
        return prompts.fresh(rng.randint(1, max(1, min(mml // 6, mml - len(prefix) - 70))))

    def output(tokens, low, high):
        hidden = rng.randint(low, high)
        return min(hidden + rng.randint(0, 30), mml - len(tokens) - 1), hidden

    finished = b + tail(b)
    group = []
    for _ in range(rng.randint(1, min(4, eng_cfg["max_num_seqs"] - 1))):
        tokens = a + tail(a)
        if rng.random() < 0.5 and len(tokens) // bs * bs > len(a):  # whole blocks, A's all cached still
            tokens = tokens[:len(tokens) // bs * bs]  # a query with this very prompt finds all of it cached
        group.append(tokens)
    later = []
    for _ in range(rng.randint(0, 5)):
        kind = rng.choice(["A", "B", "part", "none"])
        later.append(a + tail(a) if kind == "A" else b + tail(b) if kind == "B" else
                     a[:rng.randint(1, len(a))] if kind == "part" else prompts.fresh(rng.randint(1, mml // 3)))
    kind = rng.choice(["A", "B", "part", "same", "none"])
    query = (a + tail(a) if kind == "A" else b + tail(b) if kind == "B" else a[:rng.randint(1, len(a))]
             if kind == "part" else rng.choice(group) if kind == "same" else prompts.fresh(rng.randint(1, mml // 3)))
    query_out = rng.randint(1, max(1, min(64, mml - len(query) - 1)))
    plans = [(finished, (1, 1))] + [(t, output(t, 50, 400)) for t in group] + [(t, output(t, 1, 200)) for t in later]
    # Every block all of them could ever need, with room for the watermark: nothing cached is evicted.
    demand = sum(cdiv(len(t) + m, bs) for t, (m, _) in plans) + cdiv(len(query) + query_out, bs)
    eng_cfg["num_gpu_blocks"] = int(demand * 1.25) + 16
    eng = new_engine(eng_cfg, model_dir)
    for i, (tokens, (max_tokens, hidden)) in enumerate(plans[:1 + len(group)]):
        add_prompt(eng, f"r{i}", tokens, max_tokens, hidden, 0.0)
    # B's request finished (its blocks free but cached), A's requests past their prefill (A's blocks held).
    ready = step_until(eng, lambda: "r0" not in eng.sched.requests and all(
        r.num_computed_tokens >= r.num_prompt_tokens for r in eng.sched.requests.values()))
    if not ready:
        return None, "no_warm_up"
    for i, (tokens, (max_tokens, hidden)) in enumerate(plans[1 + len(group):]):
        add_prompt(eng, f"w{i}", tokens, max_tokens, hidden, float(i))
    if rng.random() < 0.5:  # some admitted already, perhaps part way through their prompts
        for _ in range(rng.randint(1, 3) * eng.depth):
            eng.step()
        if not step_until(eng, lambda: eng.sched.has_unfinished_requests()):
            return None, "no_snapshot"
    line = finish_case(eng, eng_cfg, query, query_out, "ample")
    return (line, None) if line else (None, "cannot_finish")


def tight_case(mode, model_dir):
    """The query starts with 512 cached tokens (32 blocks of 16) and needs 36 blocks; 35 are free at the snapshot.

    held_tight: the 32 blocks are held by the running request r0 (same prefix): vLLM needs 4 more and admits the query
    at once. free_tight: they are free (their request, r1, finished), and r0 (another prompt) takes at most the 2
    never-used free blocks before its end: the query waits for r0's end in vLLM and in the replay alike."""
    rng = random.Random(f"tight:{mode}")
    eng_cfg = {"max_num_batched_tokens": 2048, "max_num_seqs": 16, "block_size": 16, "num_gpu_blocks": None,
               "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "max_model_len": 4096,
               "scheduler_reserve_full_isl": True, "watermark": 0.0, "async_scheduling": False}
    prompts = Prompts(rng)
    prefix = prompts.fresh(512)
    query = prefix + prompts.fresh(64)
    if mode == "held_tight":
        running = prefix + prompts.fresh(8)  # 33 blocks after its prefill; 35 free
        eng_cfg["num_gpu_blocks"] = 33 + 35
        eng = new_engine(eng_cfg, model_dir)
        add_prompt(eng, "r0", running, 300, 200, 0.0)
    else:
        running = prompts.fresh(300)  # 19 blocks, 2 more by its end; r1's 33 blocks freed; 2 never used
        eng_cfg["num_gpu_blocks"] = 19 + 33 + 2
        eng = new_engine(eng_cfg, model_dir)
        add_prompt(eng, "r0", running, 40, 30, 0.0)
        add_prompt(eng, "r1", prefix + prompts.fresh(8), 1, 1, 0.0)
    eng.step()
    assert eng.sched.kv_cache_manager.block_pool.get_num_free_blocks() == 35
    return finish_case(eng, eng_cfg, query, 8, mode)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=40, help="random cases (the two fixed ones come first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    t_start, emitted, skipped = time.time(), 0, {}
    with open(args.out, "w") as f, tempfile.TemporaryDirectory(prefix="bear-qwen3-") as model_dir:
        write_model_config(model_dir)
        lines = [tight_case(mode, model_dir) for mode in ("held_tight", "free_tight")]
        assert all(lines), "a fixed case did not reach the query's first token"
        for index in range(100 * args.cases):
            if len(lines) == args.cases + 2:
                break
            line, why = random_case(args.seed, index, model_dir)
            if line is None:
                skipped[why] = skipped.get(why, 0) + 1
                continue
            line["meta"]["index"] = index
            lines.append(line)
        for line in lines:
            line["meta"]["seed"] = args.seed
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
            emitted += 1
    print(f"vllm_prefix_driver: wrote {emitted} cases to {args.out}, skipped {skipped}, "
          f"{time.time() - t_start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
