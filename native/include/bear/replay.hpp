// BEA replay core: vLLM V1 batch formation (0.32/0.33, FCFS) from an instance's state up to a new query's first
// token, with the eq. 12 batch-time model. Pure: plain structs in, numbers out. The readable Python reference
// (core/reference.py) implements the same rules step by step.
//
// Prefix caching is an input, not a model of the cache: each request (and the query) says how many of its prompt
// tokens the cache is expected to hold when it is admitted from the waiting queue (`cached_tokens`). That many,
// in whole blocks and at most num_tokens - 1, start out computed (vLLM's get_computed_blocks); the rest is prefilled,
// attending to them as context. KV blocks stay conservative: admission still reserves the whole sequence and the
// request takes all its blocks, the cached ones too, from the free pool, which is exact when the cached blocks are
// free (in vLLM's free queue) and an overestimate when a running request holds them.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace bear {

struct EngineConfig {
  int64_t max_num_batched_tokens = 2048;  // token budget per step
  int64_t max_num_seqs = 256;             // most requests in RUNNING
  int64_t block_size = 16;                // tokens per KV block
  int64_t num_gpu_blocks = 0;             // usable KV blocks
  bool enable_chunked_prefill = true;
  int64_t long_prefill_token_threshold = 0;  // 0 = off
  int64_t max_model_len = 0;
  bool scheduler_reserve_full_isl = true;
  double watermark = 0.0;                 // fraction of all blocks (usable + null) kept free at admission
  bool async_scheduling = false;
  bool enable_prefix_caching = false;  // each request's prompt hit is given (cached_tokens); a preempted one resumes
                                      // from its own blocks still cached
};

// One resident request in vLLM's own terms.
struct Resident {
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;      // vLLM's num_computed_tokens (prompt and output tokens with KV)
  int64_t num_output_tokens = 0;
  int64_t remaining_output_tokens = 1;  // output tokens still to come, including any in flight
  int64_t num_allocated_blocks = 0;
  int64_t max_tokens = 0;               // <= 0: max_model_len - num_prompt_tokens, as vLLM sets it
  int64_t num_output_placeholders = 0;  // async: tokens the step in flight appends to the output
  int64_t cached_tokens = 0;            // prefix tokens the prefix cache holds whenever it is admitted from WAITING
  // A waiting request's own blocks still cached (prefix caching on): the last num_evictable_blocks of those behind
  // cached_tokens sit in the free queue, num_free_blocks_ahead free blocks before the first of them to go.
  int64_t num_evictable_blocks = 0;
  int64_t num_free_blocks_ahead = 0;
};

struct InstanceState {
  EngineConfig engine;
  int64_t free_blocks = 0;
  std::vector<Resident> running;  // admission order
  std::vector<Resident> waiting;  // queue order
  // References to blocks another running request holds too (prefix caching): the running requests' block counts
  // add up to this many more than the blocks they hold; released blocks pay them off first.
  int64_t shared_blocks = 0;
};

namespace detail {
enum class Where : uint8_t { kRunning, kWaiting, kFinished };

// A request as the simulation tracks it (vLLM's counters, plus where it is).
struct Request {
  int64_t prompt = 0, computed = 0, output = 0, placeholders = 0;
  int64_t target = 0;  // output length at which the request stops
  int64_t max_tokens = 0, blocks = 0;
  int64_t cached = 0;  // Resident::cached_tokens
  int64_t evictable = 0, free_ahead = 0;  // Resident::num_evictable_blocks, num_free_blocks_ahead
  int64_t hashed = 0;  // full blocks vLLM has cached for it (prefix caching): as its latest scheduling found its tokens
  Where where = Where::kWaiting;
};
}  // namespace detail

// An instance state checked once and laid out for the simulation: build one per snapshot with prepare(), then replay
// queries against it as often as needed.
struct PreparedState {
  EngineConfig engine;
  int64_t free_blocks = 0;
  int64_t shared_blocks = 0;               // InstanceState::shared_blocks
  int64_t watermark_blocks = 0;            // vLLM: int(watermark * num_blocks), its null block included
  std::vector<detail::Request> requests;   // running (admission order), then waiting (queue order)
  int32_t num_running = 0;
};

// The query as one instance sees it: its cache hit differs from instance to instance.
struct Query {
  int64_t num_prompt_tokens = 0;
  int64_t output_tokens = 1;
  int64_t cached_tokens = 0;  // prompt tokens this instance's prefix cache holds when the query is admitted
};

struct BatchTimeCoefficients {
  double b0 = 0.0, b1 = 0.0, b2 = 0.0, b3 = 0.0;
};

// A request reaching the instance `time_s` after the state was taken (e.g. dispatched by a router since a snapshot).
struct Arrival {
  double time_s = 0.0;
  Resident request;  // waiting: no computed tokens, blocks or placeholders
};

// The replay's clock (seconds since the state was taken): step m is scheduled once the engine has processed the
// output of step m-1 (sync) or m-2 (async) and executes once step m-1 has finished; the query and each arrival join
// the waiting queue before the first step scheduled at or after their arrival time.
struct Options {
  double horizon_s = std::numeric_limits<double>::infinity();  // counted from the query's arrival
  double query_time_s = 0.0;  // when the query arrives
  double in_flight_s = 0.0;   // async: how long the step executing when the state was taken still runs
  bool record_batches = false;
  bool shortcuts = true;           // fast-forward runs of uniform decode steps in closed form
  int64_t max_steps = 1'000'000;  // steps simulated one by one before giving up
};

enum class Status : int { kFirstToken = 0, kExceedsHorizon = 1, kInfeasible = 2 };

enum class Infeasibility : int {
  kNone = 0,
  kPromptTooLong = 1,        // prompt not shorter than max_model_len
  kPromptExceedsCache = 2,   // more blocks than the whole cache
  kStuck = 3,                // a request that can never complete blocks the query (blocking_request)
  kStepLimit = 4,
};

// One batch and its eq. 12 features: Σ tokens, Σ context·decode, Σ (prefill·context + prefill·(prefill+1)/2).
struct Batch {
  std::vector<std::pair<int32_t, int64_t>> scheduled;  // (request index, tokens) in vLLM's order
  int64_t num_prefill_tokens = 0;
  int64_t num_decode_tokens = 0;
  int64_t decode_context = 0;
  int64_t prefill_attention = 0;
  double time_s = 0.0;
};

// Request indices: running 0..R-1, waiting R..R+W-1, arrivals R+W..R+W+A-1 (in the order given), the query last.
struct Result {
  Status status = Status::kFirstToken;
  Infeasibility infeasibility = Infeasibility::kNone;
  int32_t blocking_request = -1;
  int64_t first_token_batch = 0;  // 1-based index of the batch sampling the query's first token; 0 if none
  int64_t num_batches = 0;        // batches simulated, fast-forwarded ones included
  int64_t num_steps = 0;          // batches simulated one by one
  int64_t num_preemptions = 0;
  double time_s = 0.0;  // TTFT if kFirstToken, else the simulated time from the query's arrival to where it stopped
  std::vector<Batch> batches;     // only with Options::record_batches
};

// Throw std::invalid_argument for inputs the simulation cannot run on.
void validate(const InstanceState& state);
void validate(const Query& query, const BatchTimeCoefficients& coefficients);

// Validates `state` and lays it out for replays (O(residents): once per snapshot, not per query).
PreparedState prepare(const InstanceState& state);

// Replays the prepared state until the query's first token, the horizon, or proof that it never comes.
Result replay(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
              const Options& options, const std::vector<Arrival>& arrivals = {});

// Eq. 12 time of `num_batches` non-empty batches with the given summed features. Both this core and the
// Python reference evaluate it in this order, on exact integer sums, so their times agree to the last bit.
inline double batch_time_s(const BatchTimeCoefficients& c, double num_batches, double num_tokens,
                           double decode_context, double prefill_attention) {
  return c.b0 * num_batches + c.b1 * num_tokens + c.b2 * decode_context + c.b3 * prefill_attention;
}

// Checks one arrival (std::invalid_argument naming the problem).
void validate(const Arrival& arrival, const EngineConfig& engine);

}  // namespace bear
