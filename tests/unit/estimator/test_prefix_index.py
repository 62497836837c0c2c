"""The prompt prefixes an instance's prefix cache likely holds (bear.estimator.prefix_index), and how the router names
them (bear.common.prefix_blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from bear.common.prefix_blocks import (
    HASH_BYTES,
    MAX_PREFIX_BLOCKS,
    PREFIX_BLOCK_TOKENS,
    check_hashes,
    prefix_block_hashes,
)
from bear.estimator.prefix_index import PrefixIndex

SYSTEM = np.arange(1000, 1000 + 10 * PREFIX_BLOCK_TOKENS)  # a 160-token shared prefix (10 blocks)


def prompt(*parts: np.ndarray | range) -> bytes:
    return prefix_block_hashes(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))


def test_prompts_share_the_hashes_of_the_whole_blocks_they_share_and_no_more() -> None:
    a = prompt(SYSTEM, range(5, 45))  # 200 tokens: 12 whole blocks
    b = prompt(SYSTEM, range(7, 47))
    assert len(a) == len(b) == 12 * HASH_BYTES
    assert a[:10 * HASH_BYTES] == b[:10 * HASH_BYTES]
    assert a[10 * HASH_BYTES:11 * HASH_BYTES] != b[10 * HASH_BYTES:11 * HASH_BYTES]
    # a hash names the whole prefix, not its block alone: the same block after different heads differs
    c = prompt(range(1, 17), SYSTEM[:16])
    d = prompt(range(2, 18), SYSTEM[:16])
    assert c[HASH_BYTES:] != d[HASH_BYTES:]


def test_short_prompts_name_no_block_and_long_ones_at_most_the_limit() -> None:
    assert prompt(range(PREFIX_BLOCK_TOKENS - 1)) == b""
    assert len(prompt(range((MAX_PREFIX_BLOCKS + 3) * PREFIX_BLOCK_TOKENS))) == MAX_PREFIX_BLOCKS * HASH_BYTES


def test_hashes_are_the_same_in_every_process() -> None:  # blake2b, not Python's salted hash()
    assert prompt(range(16)).hex() == prefix_block_hashes(np.arange(16, dtype=np.int32)).hex()
    assert prompt(range(16)) == bytes.fromhex(prompt(range(16)).hex())
    assert len(prompt(range(16))) == HASH_BYTES


def test_malformed_hashes_are_named() -> None:
    assert check_hashes(b"", "f") is None
    assert check_hashes(b"x" * 12, "prompt_prefix_hashes") == \
        "prompt_prefix_hashes: 12 bytes, not a multiple of 8"
    assert "more than the limit" in check_hashes(b"x" * HASH_BYTES * (MAX_PREFIX_BLOCKS + 1), "f")


def test_a_prompt_finds_the_longest_prefix_routed_there_before_it() -> None:
    index = PrefixIndex()
    first = prompt(SYSTEM, range(5, 45))
    index.add(first, 0, routed_at_s=10.0)
    assert index.cached_tokens(prompt(SYSTEM, range(7, 47)), before_s=11.0) == 10 * PREFIX_BLOCK_TOKENS
    assert index.cached_tokens(first, before_s=11.0) == 12 * PREFIX_BLOCK_TOKENS  # the same prompt: every block
    assert index.cached_tokens(first, before_s=10.0) == 0  # not brought there by itself, nor at the same moment
    assert index.cached_tokens(prompt(range(3, 200)), before_s=11.0) == 0
    assert index.cached_tokens(b"", before_s=11.0) == 0


def test_a_prefix_keeps_the_time_it_was_first_routed() -> None:
    index = PrefixIndex()
    hashes = prompt(SYSTEM)
    index.add(hashes, 0, routed_at_s=20.0)
    index.add(hashes, 0, routed_at_s=5.0)  # a router's older record, read later from Redis
    assert index.cached_tokens(hashes, before_s=6.0) == len(SYSTEM)


def test_the_least_recently_routed_blocks_go_first_tails_before_heads() -> None:
    index = PrefixIndex()
    index.set_capacity(num_gpu_blocks=15, block_size=PREFIX_BLOCK_TOKENS)  # 15 blocks
    old = prompt(range(5000, 5000 + 8 * PREFIX_BLOCK_TOKENS))  # 8 blocks
    index.add(old, 0, routed_at_s=1.0)
    index.add(prompt(SYSTEM), 0, routed_at_s=2.0)  # 10 blocks: 3 of the old prompt's go, its tail first
    assert len(index) == 15
    assert index.cached_tokens(old, before_s=3.0) == 5 * PREFIX_BLOCK_TOKENS
    assert index.cached_tokens(prompt(SYSTEM), before_s=3.0) == len(SYSTEM)
    index.add(old[:HASH_BYTES], 0, routed_at_s=4.0)  # its head routed again: now the newest
    index.add(prompt(range(9000, 9000 + 5 * PREFIX_BLOCK_TOKENS)), 0, routed_at_s=5.0)
    assert index.cached_tokens(old, before_s=6.0) == PREFIX_BLOCK_TOKENS


def test_outputs_fill_the_cache_too() -> None:
    index = PrefixIndex()
    index.set_capacity(num_gpu_blocks=20, block_size=PREFIX_BLOCK_TOKENS)
    index.add(prompt(SYSTEM), 0, routed_at_s=1.0)
    index.add(prompt(range(7000, 7000 + 2 * PREFIX_BLOCK_TOKENS)), 8 * PREFIX_BLOCK_TOKENS + 5, routed_at_s=2.0)
    assert index.cached_tokens(prompt(SYSTEM), before_s=3.0) == len(SYSTEM)  # 10 + 2 + 8 = 20 blocks
    index.add(b"", 4 * PREFIX_BLOCK_TOKENS, routed_at_s=3.0)  # a short prompt's output: 4 more blocks
    assert index.cached_tokens(prompt(SYSTEM), before_s=4.0) == 6 * PREFIX_BLOCK_TOKENS
    index.add(prompt(SYSTEM), 0, routed_at_s=5.0)  # routed again: back in, the oldest outputs out
    assert index.cached_tokens(prompt(SYSTEM), before_s=6.0) == len(SYSTEM)


def test_capacity_follows_the_engine_cache_and_clear_forgets() -> None:
    index = PrefixIndex()
    index.add(prompt(SYSTEM), 0, routed_at_s=1.0)
    index.set_capacity(num_gpu_blocks=2, block_size=4 * PREFIX_BLOCK_TOKENS)  # 8 prefix blocks
    assert len(index) == 8
    assert index.cached_tokens(prompt(SYSTEM), before_s=2.0) == 8 * PREFIX_BLOCK_TOKENS
    index.clear()
    assert len(index) == 0 and index.cached_tokens(prompt(SYSTEM), before_s=2.0) == 0


@pytest.mark.parametrize("output_tokens", [float("nan"), float("inf"), -3.0])
def test_an_output_length_that_is_no_length_fills_nothing(output_tokens: float) -> None:
    index = PrefixIndex()
    index.set_capacity(num_gpu_blocks=10, block_size=PREFIX_BLOCK_TOKENS)
    index.add(prompt(SYSTEM), output_tokens, routed_at_s=1.0)
    assert index.cached_tokens(prompt(SYSTEM), before_s=2.0) == len(SYSTEM)
