// A request as the simulation tracks it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "bear/replay.hpp"

namespace bear::sim {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
  q.where = where;
  return q;
}

}  // namespace bear::sim
