// A request as the simulation tracks it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "bear/replay.hpp"

namespace bear::sim {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Computed tokens a request admitted from WAITING starts with (vLLM's get_computed_blocks): its cached prefix in
// whole blocks, at most num_tokens - 1 (the last token is computed again to sample from).
inline int64_t prefix_cache_hit(int64_t cached_tokens, int64_t num_tokens, int64_t block_size) {
  return std::min(cached_tokens, num_tokens - 1) / block_size * block_size;
}

enum class Mode : uint8_t { kExplicit, kLazy };

struct Request : detail::Request {
  int64_t seq = 0;  // admission order: RUNNING is ordered by increasing seq
  Mode mode = Mode::kExplicit;
  int64_t tokens = 0;          // tokens scheduled in step `scheduled_step` (explicit requests)
  int64_t scheduled_step = 0;
  // While lazy: computed and output are as of `anchor` steps; see LazyDecoders.
  int64_t anchor = 0;
  int64_t generation = 0;
  int32_t bucket = 0, bucket_index = 0;
  // Prefix caching, once the replay preempted it (core/reference.py): its full blocks that others hold (kept) and that
  // it released to the back of the free queue, `ahead` free blocks before the first of them to go; `evicted` are gone.
  bool resumable = false;
  int64_t kept_hashed = 0, hashed_freed = 0, ahead = 0, evicted = 0;
};

// A resident request as the simulation starts it.
inline detail::Request from_resident(const Resident& r, const EngineConfig& cfg, detail::Where where) {
  detail::Request q;
  q.prompt = r.num_prompt_tokens;
  q.computed = r.num_computed_tokens;
  q.output = r.num_output_tokens;
  q.placeholders = r.num_output_placeholders;
  q.max_tokens = r.max_tokens > 0 ? r.max_tokens : cfg.max_model_len - r.num_prompt_tokens;
  q.target = std::min({r.num_output_tokens + r.remaining_output_tokens, q.max_tokens,
                       cfg.max_model_len - r.num_prompt_tokens});
  q.blocks = r.num_allocated_blocks;
  q.cached = r.cached_tokens;
  q.evictable = r.num_evictable_blocks;
  q.free_ahead = r.num_free_blocks_ahead;
  // When the step in flight was scheduled, its output before was not in yet (async scheduling).
  const int64_t known = r.num_prompt_tokens + r.num_output_tokens -
                        (r.num_output_placeholders > 0 && r.num_output_tokens > 0 ? 1 : 0);
  q.hashed = std::min(r.num_computed_tokens, known) / cfg.block_size;
  q.where = where;
  return q;
}

}  // namespace bear::sim
