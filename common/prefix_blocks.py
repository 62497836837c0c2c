"""A prompt's prefix blocks, as the router names them and the estimator looks them up (prefix caching).

vLLM's prefix cache keeps the KV of whole blocks of tokens, each named by a hash of every token up to the end of that
block: a new prompt reuses the blocks of its longest cached prefix. The router names a prompt's prefixes the same way,
on its own tokenizer's tokens (those of the model, for the Qwen pool; the chat template's few leading tokens aside):
one 8-byte hash per whole PREFIX_BLOCK_TOKENS tokens, of all the tokens up to the end of that block, packed into one
`bytes` (little-endian, as the wire carries it). Two prompts share their first k hashes exactly when they share their
first k·PREFIX_BLOCK_TOKENS tokens (but for a 64-bit collision). An engine block size that is a multiple of
PREFIX_BLOCK_TOKENS (vLLM's default 16, or 32, 64, ...) is matched block for block; the replay rounds a hit down to
the engine's blocks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

PREFIX_BLOCK_TOKENS = 16
HASH_BYTES = 8
# 16,384 tokens: longer prompts name their first 1024 blocks only (8 KiB of hashes in each dispatch record, which Redis
# keeps for 600 s: a longer shared prefix is taken as cached up to there)
MAX_PREFIX_BLOCKS = 1024


def prefix_block_hashes(token_keys: np.ndarray) -> bytes:
    """The hashes of the prompt's whole blocks, in order (b"" for a prompt shorter than one block)."""
    keys = np.ascontiguousarray(token_keys, dtype="<i8")
    blocks = min(len(keys) // PREFIX_BLOCK_TOKENS, MAX_PREFIX_BLOCKS)
    data = keys[:blocks * PREFIX_BLOCK_TOKENS].tobytes()
    step = PREFIX_BLOCK_TOKENS * 8
    running = hashlib.blake2b(digest_size=HASH_BYTES)
    hashes = bytearray()
    for start in range(0, len(data), step):
        running.update(data[start:start + step])
        hashes += running.copy().digest()
    return bytes(hashes)


def split_hashes(hashes: bytes) -> Iterator[bytes]:
    """The 8-byte hashes of a packed sequence, in order (a trailing partial hash is ignored)."""
    for start in range(0, len(hashes) - HASH_BYTES + 1, HASH_BYTES):
        yield hashes[start:start + HASH_BYTES]


def check_hashes(hashes: bytes, field: str) -> str | None:
    """Why `hashes` cannot be a packed prefix: its length is not a multiple of 8 bytes or is over the limit (None:
    it can be)."""
    if len(hashes) % HASH_BYTES:
        return f"{field}: {len(hashes)} bytes, not a multiple of {HASH_BYTES}"
    if len(hashes) > MAX_PREFIX_BLOCKS * HASH_BYTES:
        return f"{field}: {len(hashes) // HASH_BYTES} hashes, more than the limit of {MAX_PREFIX_BLOCKS}"
    return None
