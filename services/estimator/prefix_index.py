"""Which prompt prefixes an instance's prefix cache likely holds, from the prompts routed there.

vLLM (prefix caching, on by default in V1) keeps the KV of every whole block it has computed, named by its prefix,
until it needs the block for something else: freed blocks are reused least recently used first, the tail blocks of a
request before its head. No snapshot says which prefixes are cached, so the estimator keeps its own account per
instance: the prefix blocks (bear.common.prefix_blocks) of every prompt routed there, touched when routed, and as
many blocks as the engine's KV cache holds, the least recently used going first; a routed request's output fills
blocks too (its predicted length, as anonymous blocks in the same order). A request is expected to find cached the
longest prefix of its blocks that a request routed *before it* brought there (`cached_tokens`).

What this cannot see: prompts sent to the engine without Route, and blocks that running requests pin (counted as
evictable). The account is cleared when the engine restarts (its snapshots' engine_started_at_s changes; from a
sidecar that does not say it, when their step count goes back), and a prompt the engine refuses outright adds none.
The estimate is therefore a likely hit, not a certain one; the replay takes it when the request is admitted.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

from bear.common.prefix_blocks import PREFIX_BLOCK_TOKENS, split_hashes

DEFAULT_CAPACITY_BLOCKS = 100_000  # before the instance's first snapshot says its KV cache size


class PrefixIndex:
    """One instance's likely cached prefix blocks. Not thread-safe: the estimator's event loop owns it."""

    __slots__ = ("_blocks", "_anonymous", "_anonymous_blocks", "_capacity", "forgotten")

    def __init__(self, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        # hash -> (first routed at, last routed at), least recently routed first
        self._blocks: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self._anonymous: deque[tuple[float, int]] = deque()  # (routed at, blocks) of outputs, oldest first
        self._anonymous_blocks = 0
        self._capacity = max(1, capacity_blocks)
        # named blocks evicted or cleared so far: until it grows, adding a prompt routed no earlier than those
        # before it changes no answer of `cached_tokens` for an earlier time
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def set_capacity(self, num_gpu_blocks: int, block_size: int) -> None:
        """The engine's KV cache, in prefix blocks (its snapshot's engine settings)."""
        self._capacity = max(1, num_gpu_blocks * block_size // PREFIX_BLOCK_TOKENS)
        self._evict()

    def clear(self) -> None:
        self.forgotten += len(self._blocks)
        self._blocks.clear()
        self._anonymous.clear()
        self._anonymous_blocks = 0

    def add(self, prefix_hashes: bytes, output_tokens: float, routed_at_s: float) -> None:
        """A prompt routed to the instance at `routed_at_s` (once per request), and its predicted output length."""
        blocks = self._blocks
        for key in reversed(list(split_hashes(prefix_hashes))):  # the head is used last: evicted last
            known = blocks.get(key)
            if known is None:
                blocks[key] = (routed_at_s, routed_at_s)
            else:
                blocks[key] = (min(known[0], routed_at_s), max(known[1], routed_at_s))
                blocks.move_to_end(key)
        output_blocks = int(output_tokens // PREFIX_BLOCK_TOKENS) if math.isfinite(output_tokens) else 0
        if output_blocks > 0:
            self._anonymous.append((routed_at_s, output_blocks))
            self._anonymous_blocks += output_blocks
        self._evict()

    def cached_tokens(self, prefix_hashes: bytes, before_s: float) -> int:
        """Tokens of the longest prefix of these blocks that prompts routed before `before_s` brought to the cache."""
        blocks = self._blocks
        matched = 0
        for key in split_hashes(prefix_hashes):
            known = blocks.get(key)
            if known is None or known[0] >= before_s:
                break
            matched += 1
        return matched * PREFIX_BLOCK_TOKENS

    def _evict(self) -> None:
        blocks, anonymous = self._blocks, self._anonymous
        while len(blocks) + self._anonymous_blocks > self._capacity:
            oldest_named = next(iter(blocks.values()))[1] if blocks else math.inf
            if anonymous and anonymous[0][0] <= oldest_named:
                at_s, count = anonymous[0]
                excess = len(blocks) + self._anonymous_blocks - self._capacity
                if count > excess:  # part of this request's output blocks
                    anonymous[0] = (at_s, count - excess)
                    self._anonymous_blocks -= excess
                else:
                    anonymous.popleft()
                    self._anonymous_blocks -= count
            else:
                blocks.popitem(last=False)
                self.forgotten += 1


