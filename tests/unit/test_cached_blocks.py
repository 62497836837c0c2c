"""`cached_blocks`: a preempted request's cached prefix from a block pool shaped like vLLM's (the real one:
tests/integration/test_vllm_snapshot_plugin.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from bear.snapshotter.cached_blocks import evictable_prefix, evictable_prefixes

BLOCK_SIZE = 16


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    next_free_block: Block | None = None


@dataclass
class FreeQueue:
    fake_free_list_head: Block = field(default_factory=lambda: Block(-1))
    fake_free_list_tail: Block = field(default_factory=lambda: Block(-1))


@dataclass
class Pool:
    free_block_queue: FreeQueue


@dataclass
class Request:
    block_hashes: list[str]
    num_tokens: int
    skip_reading_prefix_cache: bool = False


class Manager:
    """vLLM's KVCacheManager as the module reads it: the cached blocks by hash, and the free queue in order."""

    def __init__(self, cached: dict[str, Block], free_order: Sequence[Block], enable_caching: bool = True):
        self.enable_caching = enable_caching
        self.cached = cached
        self.lookups = 0
        queue = FreeQueue()
        chain = [queue.fake_free_list_head, *free_order, queue.fake_free_list_tail]
        for before, after in zip(chain, chain[1:]):
            before.next_free_block = after
        self.block_pool = Pool(queue)
        self.coordinator = self

    def find_longest_cache_hit(self, block_hashes: list[str], max_length: int) -> tuple[tuple[list[Block]], int, int]:
        self.lookups += 1
        hit: list[Block] = []
        for block_hash in block_hashes[:max_length // BLOCK_SIZE]:
            if block_hash not in self.cached:
                break
            hit.append(self.cached[block_hash])
        return (hit,), len(hit) * BLOCK_SIZE, 0


def test_a_hit_partly_held_by_a_running_request_and_partly_in_the_free_queue() -> None:
    shared, own = [Block(i, ref_cnt=1) for i in range(2)], [Block(10 + i) for i in range(3)]
    others = [Block(100 + i) for i in range(4)]
    # vLLM frees a preempted request's blocks last block first, behind the blocks already free
    manager = Manager({f"h{i}": b for i, b in enumerate(shared + own)}, [*others[:3], own[2], own[1], own[0],
                                                                          others[3]])
    request = Request([f"h{i}" for i in range(6)], num_tokens=6 * BLOCK_SIZE + 5)  # h5: not cached
    assert evictable_prefix(manager, request) == (5 * BLOCK_SIZE, 3, 3)


def test_the_hit_never_takes_the_last_token() -> None:
    blocks = [Block(i) for i in range(4)]
    manager = Manager({f"h{i}": b for i, b in enumerate(blocks)}, blocks[::-1])
    request = Request([f"h{i}" for i in range(4)], num_tokens=4 * BLOCK_SIZE)  # all cached: the last block recomputed
    assert evictable_prefix(manager, request) == (3 * BLOCK_SIZE, 3, 1)


def test_one_walk_places_every_request_and_stops_at_the_last_one_needed() -> None:
    a, b, shared = [Block(i) for i in range(2)], [Block(10 + i) for i in range(2)], Block(20)
    manager = Manager({"s": shared, "a0": a[0], "a1": a[1], "b0": b[0], "b1": b[1]},
                      [Block(50), b[1], a[1], shared, a[0], b[0]])
    a[1].next_free_block = None  # a walk past the last block it needs would fail here
    requests = [Request(["s", "a0", "a1"], 100), Request(["s", "b0", "b1"], 100), Request(["x"], 100)]
    assert evictable_prefixes(manager, requests) == [(48, 3, 2), (48, 3, 1), (0, 0, 0)]
    assert manager.lookups == 3


def test_a_position_past_the_walk_limit_is_reported_as_the_limit() -> None:
    own = Block(7)
    manager = Manager({"h0": own}, [*(Block(100 + i) for i in range(10)), own])
    assert evictable_prefix(manager, Request(["h0"], 40), max_walk_blocks=4) == (16, 1, 4)
    assert evictable_prefix(manager, Request(["h0"], 40), max_walk_blocks=10) == (16, 1, 10)
    assert evictable_prefix(manager, Request(["h0"], 40), max_walk_blocks=11) == (16, 1, 10)


def test_nothing_is_looked_up_without_prefix_caching_or_for_a_request_that_skips_the_cache() -> None:
    own = Block(7)
    manager = Manager({"h0": own}, [own], enable_caching=False)
    assert evictable_prefixes(manager, [Request(["h0"], 40)]) == [(0, 0, 0)] and manager.lookups == 0
    manager.enable_caching = True
    assert evictable_prefix(manager, Request(["h0"], 40, skip_reading_prefix_cache=True)) == (0, 0, 0)
    assert manager.lookups == 0


def test_a_free_block_missing_from_the_free_queue_is_an_error_not_a_guess() -> None:
    manager = Manager({"h0": Block(7)}, [Block(1), Block(2)])
    with pytest.raises(RuntimeError, match="missing from the free queue"):
        evictable_prefix(manager, Request(["h0"], 40))
