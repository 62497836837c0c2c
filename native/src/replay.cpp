// The replay's public entry points: input checks, preparation of a state, and one replay (see simulator.hpp).
#include "bear/replay.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "simulator.hpp"

namespace bear {
namespace {

using sim::cdiv;

constexpr int64_t kMaxBlockSize = 65536;  // bear.core.state.MAX_BLOCK_SIZE
constexpr int64_t kMaxEngineTokens = int64_t{1} << 28;  // bear.core.state.MAX_ENGINE_TOKENS

void require(bool ok, const char* message) {
  if (!ok) throw std::invalid_argument(message);
}

// Returns nullptr if the request is consistent, else what is wrong with it.
const char* resident_problem(const Resident& r, const EngineConfig& cfg, bool waiting) {
  if (r.num_prompt_tokens < 1) return "num_prompt_tokens must be >= 1";
  if (r.num_computed_tokens < 0 || r.num_output_tokens < 0 || r.num_allocated_blocks < 0 ||
      r.num_output_placeholders < 0) {
    return "token and block counts must be non-negative";
  }
  if (r.cached_tokens < 0 || r.cached_tokens > r.num_prompt_tokens + r.num_output_tokens) {
    return "cached_tokens must be in [0, num_prompt_tokens + num_output_tokens]";
  }
  if (r.num_evictable_blocks != 0 || r.num_free_blocks_ahead != 0) {
    if (!cfg.enable_prefix_caching) return "num_evictable_blocks and num_free_blocks_ahead need enable_prefix_caching";
    if (!waiting) return "num_evictable_blocks and num_free_blocks_ahead are a waiting request's";
    if (r.num_evictable_blocks < 0 || r.num_free_blocks_ahead < 0) {
      return "num_evictable_blocks and num_free_blocks_ahead must be non-negative";
    }
    if (r.num_evictable_blocks > r.cached_tokens / cfg.block_size) {
      return "num_evictable_blocks exceeds the blocks behind cached_tokens";
    }
    if (r.num_free_blocks_ahead > cfg.num_gpu_blocks - r.num_evictable_blocks) {
      return "num_free_blocks_ahead + num_evictable_blocks exceed num_gpu_blocks";
    }
  }
  if (r.remaining_output_tokens < 1) return "remaining_output_tokens must be >= 1";
  // A running request always has a token left to compute (the step that computes its last one samples the next).
  if (r.num_computed_tokens > r.num_prompt_tokens + r.num_output_tokens + r.num_output_placeholders - (waiting ? 0 : 1)) {
    return "more computed tokens than the request has";
  }
  if (r.num_prompt_tokens + r.num_output_tokens >= cfg.max_model_len) {
    return "prompt + output tokens must be shorter than max_model_len";
  }
  if (r.num_allocated_blocks < cdiv(r.num_computed_tokens, cfg.block_size)) {
    return "fewer blocks than its computed tokens need";
  }
  if (waiting && (r.num_computed_tokens != 0 || r.num_allocated_blocks != 0 || r.num_output_placeholders != 0)) {
    return "a waiting request holds no computed tokens, blocks or placeholders";
  }
  return nullptr;
}

void require_consistent(const std::vector<Resident>& residents, const EngineConfig& cfg, bool waiting) {
  for (size_t i = 0; i < residents.size(); ++i) {
    if (const char* problem = resident_problem(residents[i], cfg, waiting)) {
      throw std::invalid_argument(std::string(waiting ? "waiting[" : "running[") + std::to_string(i) + "]: " + problem);
    }
  }
}

}  // namespace

void validate(const InstanceState& state) {
  const EngineConfig& cfg = state.engine;
  require(cfg.max_num_batched_tokens >= 1 && cfg.max_num_seqs >= 1 && cfg.block_size >= 1,
          "engine: max_num_batched_tokens, max_num_seqs and block_size must be >= 1");
  require(cfg.num_gpu_blocks >= 1 && cfg.max_model_len >= 2 && cfg.long_prefill_token_threshold >= 0,
          "engine: num_gpu_blocks >= 1, max_model_len >= 2 and long_prefill_token_threshold >= 0 are required");
  // vLLM's block sizes are tens to hundreds of tokens; the core keeps per-token-slot buckets of a block (memory and
  // time grow with it: 2^28 took 6 GB).
  require(cfg.block_size <= kMaxBlockSize, "engine: block_size must be at most 65536");
  // A step's features (Σ prefill · (context + (prefill + 1) / 2)) must stay far inside int64.
  require(cfg.max_model_len <= kMaxEngineTokens && cfg.max_num_batched_tokens <= kMaxEngineTokens,
          "engine: max_model_len and max_num_batched_tokens must be at most 268435456");
  require(static_cast<int64_t>(state.running.size()) <= cfg.max_num_seqs,
          "more running requests than engine.max_num_seqs");
  require(cfg.watermark >= 0.0 && cfg.watermark < 1.0, "engine: watermark must be in [0, 1)");
  require(state.free_blocks >= 0 && state.free_blocks <= cfg.num_gpu_blocks, "free_blocks out of range");
  require_consistent(state.running, cfg, false);
  require_consistent(state.waiting, cfg, true);
  for (const Resident& r : state.waiting) {
    require(r.num_free_blocks_ahead + r.num_evictable_blocks <= state.free_blocks,
            "a waiting request's num_free_blocks_ahead + num_evictable_blocks exceed free_blocks");
  }
  int64_t held = state.free_blocks - state.shared_blocks;
  int64_t shareable = 0;  // a shared block is a whole block of its holders' computed tokens
  for (const Resident& r : state.running) {
    held += r.num_allocated_blocks;
    shareable += r.num_computed_tokens / cfg.block_size;
  }
  require(state.shared_blocks >= 0 && state.shared_blocks <= shareable,
          "shared_blocks must be in [0, the running requests' full computed blocks]");
  require(held <= cfg.num_gpu_blocks,
          "running requests' blocks (shared ones once) + free_blocks exceed num_gpu_blocks");
}

void validate(const Query& query, const BatchTimeCoefficients& c) {
  require(query.num_prompt_tokens >= 1 && query.output_tokens >= 1, "query: token counts must be >= 1");
  require(query.cached_tokens >= 0 && query.cached_tokens <= query.num_prompt_tokens,
          "query: cached_tokens must be in [0, num_prompt_tokens]");
  for (const double b : {c.b0, c.b1, c.b2, c.b3}) {
    require(std::isfinite(b) && b >= 0.0, "batch time coefficients must be finite and >= 0");
  }
}

PreparedState prepare(const InstanceState& state) {
  validate(state);
  PreparedState prepared;
  prepared.engine = state.engine;
  prepared.free_blocks = state.free_blocks;
  prepared.shared_blocks = state.shared_blocks;
  prepared.watermark_blocks =
      static_cast<int64_t>(state.engine.watermark * static_cast<double>(state.engine.num_gpu_blocks + 1));
  prepared.requests.reserve(state.running.size() + state.waiting.size());
  for (const Resident& r : state.running) {
    prepared.requests.push_back(sim::from_resident(r, state.engine, detail::Where::kRunning));
  }
  for (const Resident& r : state.waiting) {
    prepared.requests.push_back(sim::from_resident(r, state.engine, detail::Where::kWaiting));
  }
  prepared.num_running = static_cast<int32_t>(state.running.size());
  return prepared;
}

void validate(const Arrival& arrival, const EngineConfig& engine) {
  require(std::isfinite(arrival.time_s), "arrival time must be finite");
  if (const char* problem = resident_problem(arrival.request, engine, true)) {
    throw std::invalid_argument(std::string("arrival: ") + problem);
  }
  require(arrival.request.num_evictable_blocks == 0 && arrival.request.num_free_blocks_ahead == 0,
          "arrival: an arrival has no blocks in the free queue (num_evictable_blocks, num_free_blocks_ahead)");
}

Result replay(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
              const Options& options, const std::vector<Arrival>& arrivals) {
  validate(query, coefficients);
  require(std::isfinite(options.query_time_s) && std::isfinite(options.in_flight_s) && options.in_flight_s >= 0,
          "query_time_s and in_flight_s must be finite, in_flight_s >= 0");
  for (const Arrival& arrival : arrivals) validate(arrival, state.engine);
  return sim::Simulator(state, query, coefficients, options, arrivals).run();
}

}  // namespace bear
