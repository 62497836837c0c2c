"""What vLLM's prefix cache still holds of a preempted request waiting to resume, read from vLLM's own structures.

With prefix caching on, vLLM frees a preempted request's blocks, but the full ones keep their hashes: they go to the
BACK of the free queue (`BlockPool.free_blocks`, the request's last block first) and stay findable until a new block
is popped from the FRONT of the queue and evicts them. On readmission `KVCacheManager.get_computed_blocks` looks up
the longest cached prefix of `request.block_hashes` (`coordinator.find_longest_cache_hit(request.block_hashes,
request.num_tokens - 1)`) and the request resumes from there. Per request this module reports

- `cached_tokens`: the hit in tokens, as that lookup finds it now;
- `num_evictable_blocks`: of the hit blocks, those in the free queue (ref_cnt == 0); the others are held by running
  requests and cannot be evicted;
- `num_free_blocks_ahead`: free blocks before (towards the front of the queue) the first of those evictable blocks,
  i.e. how many blocks vLLM can still allocate before the request's hit starts to shrink.

Read-only: the lookup is the one get_computed_blocks makes (dictionary gets, no reference counts, stats or events),
and the free queue is walked from its head without being changed, once for all the requests of a call, stopping at
the last evictable block needed or after `max_walk_blocks` blocks (a position beyond it is reported as the cap, which
keeps `num_free_blocks_ahead + num_evictable_blocks <= free blocks`). Blocks are those of the first KV cache group.

Reads vLLM 0.32's `KVCacheManager` (`enable_caching`, `coordinator`, `block_pool.free_block_queue`) and `Request`
(`block_hashes`, `num_tokens`, `skip_reading_prefix_cache`) by attribute; imports nothing from vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_WALK_BLOCKS = 1 << 13  # free-queue blocks walked at most per call (~0.1 us each: <= ~0.8 ms)

CachedPrefix = tuple[int, int, int]  # (cached_tokens, num_evictable_blocks, num_free_blocks_ahead)


def evictable_prefix(kv_cache_manager: Any, request: Any, max_walk_blocks: int = MAX_WALK_BLOCKS) -> CachedPrefix:
    """(cached_tokens, num_evictable_blocks, num_free_blocks_ahead) of one waiting request (see the module)."""
    return evictable_prefixes(kv_cache_manager, (request,), max_walk_blocks)[0]


def evictable_prefixes(kv_cache_manager: Any, requests: Sequence[Any],
                       max_walk_blocks: int = MAX_WALK_BLOCKS) -> list[CachedPrefix]:
    """`evictable_prefix` of each request, with one walk of the free queue for all of them. (0, 0, 0) for every
    request when the engine caches no prefixes."""
    if not kv_cache_manager.enable_caching:
        return [(0, 0, 0)] * len(requests)
    find_longest_cache_hit = kv_cache_manager.coordinator.find_longest_cache_hit
    figures: list[list[int]] = []
    wanted: dict[int, list[int]] = {}  # evictable block id -> indices of the requests whose hit holds it
    for index, request in enumerate(requests):
        if getattr(request, "skip_reading_prefix_cache", False):
            figures.append([0, 0, 0])
            continue
        hit = find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        evictable = [block.block_id for block in hit[0][0] if block.ref_cnt == 0]
        figures.append([hit[1], len(evictable), 0])
        for block_id in evictable:
            wanted.setdefault(block_id, []).append(index)
    if wanted:
        _place(kv_cache_manager.block_pool.free_block_queue, wanted, figures, max_walk_blocks)
    return [(cached, evictable, ahead) for cached, evictable, ahead in figures]


def _place(queue: Any, wanted: dict[int, list[int]], figures: list[list[int]], max_walk_blocks: int) -> None:
    """Sets each request's num_free_blocks_ahead: the position of its first evictable block found walking from the
    front. Invariant: `position` blocks precede `block`, none of them the first evictable block of a request still
    in `unplaced`."""
    unplaced = {index for indices in wanted.values() for index in indices}
    block, tail = queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail
    position = 0
    while unplaced and position < max_walk_blocks:
        if block is tail or block is None:
            raise RuntimeError(f"{len(unplaced)} cached blocks with no reference are missing from the free queue")
        indices = wanted.get(block.block_id)
        if indices is not None:
            for index in indices:
                if index in unplaced:
                    figures[index][2] = position
                    unplaced.discard(index)
        block = block.next_free_block
        position += 1
    for index in unplaced:
        figures[index][2] = max_walk_blocks
