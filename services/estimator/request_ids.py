"""The router's request id of a request as vLLM's engine names it, so that dispatch records match residents.

The router hands its request id to the client, which sends it to vLLM as `X-Request-Id`. vLLM 0.32's OpenAI server
builds the engine's id from it and the engine core appends 8 random hex characters to keep ids unique
(`InputProcessor.assign_request_id`, unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION):

    /v1/completions        cmpl-<X-Request-Id>-<prompt index>-<8 hex>
    /v1/chat/completions   chatcmpl-<X-Request-Id>-<8 hex>

Anything else (another endpoint, a simulated instance that uses the router's ids as they are) is its own key.
"""

from __future__ import annotations

import functools
import re

_COMPLETION = re.compile(r"cmpl-(?P<id>.+?)-\d+(?:-[0-9a-f]{8})?")
_CHAT = re.compile(r"chatcmpl-(?P<id>.+?)(?:-[0-9a-f]{8})?")


@functools.lru_cache(maxsize=1 << 16)  # a resident is looked up in every snapshot of its instance, a step each
def router_request_id(engine_request_id: str) -> str:
    """`cmpl-r42-0-1a2b3c4d` and `chatcmpl-r42-1a2b3c4d` → `r42`; any other id → itself."""
    match = _CHAT.fullmatch(engine_request_id) or _COMPLETION.fullmatch(engine_request_id)
    return match.group("id") if match else engine_request_id
