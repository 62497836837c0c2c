// The replay loop. Each step mirrors vLLM's Scheduler.schedule() (running requests first, then waiting ones, under one
// token budget) followed by update_from_output() (sampled tokens appended, finished requests freed). Under async
// scheduling the update of step k runs after step k+1 has been scheduled, as in EngineCore.step_with_batch_queue.
// Runs of steps in which every running request decodes one token, nobody is admitted, preempted or finishes are
// fast-forwarded in closed form (Options::shortcuts); the result is identical to stepping them.
#include "bear/replay.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace bear {
namespace {

using i128 = __int128;
using detail::Where;
using Req = detail::Request;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What one step did, as far as the fast-forward needs to know.
struct StepInfo {
  bool preempted = false;
  bool admitted = false;
  bool uniform_decode = true;  // every running request decoded exactly one token and sampled
  bool query_sampled = false;
  bool outputs_changed_queue = false;  // an update finished a request or touched a waiting one
  int32_t doomed = -1;  // a request that preempted itself with nothing else running: it can never complete
  int64_t num_tokens = 0;
  int64_t num_scheduled = 0;
  int64_t outputs_applied = 0;
};

class Simulator {
 public:
  Simulator(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
            const Options& options);
  Result run();

 private:
  StepInfo step();
  void schedule_running(StepInfo& info, int64_t& budget, int64_t threshold);
  void schedule_waiting(StepInfo& info, int64_t& budget, int64_t threshold);
  void add_to_batch(int32_t id, int64_t tokens, StepInfo& info);
  void preempt(int32_t id);
  void apply_outputs(const std::vector<int32_t>& samplers, StepInfo& info);
  int64_t fast_forward_length() const;
  int64_t blocks_needed_within(int64_t steps) const;
  void fast_forward(int64_t steps);
  double elapsed_s(int64_t steps = 0) const;
  int64_t steps_until_horizon(int64_t limit) const;
  void finish(Result& result, Status status);
  bool infeasible_upfront(Result& result) const;

  const EngineConfig cfg_;
  const BatchTimeCoefficients coef_;
  const Options opt_;
  std::vector<Req> reqs_;
  std::vector<int32_t> running_;
  std::vector<int32_t> waiting_;  // reversed: the head of the queue is back()
  int64_t free_blocks_;
  int64_t watermark_blocks_;
  int32_t query_;
  // Requests sampling in the step in flight (async) or in the current step (sync).
  std::vector<int32_t> pending_, sampled_;
  Batch batch_;
  // Exact running sums over all batches so far.
  int64_t num_batches_ = 0, num_timed_batches_ = 0, num_steps_ = 0, num_preemptions_ = 0;
  i128 num_tokens_ = 0, decode_context_ = 0, prefill_attention_ = 0;
  std::vector<Batch> batches_;
};

Req make_req(const Resident& r, const EngineConfig& cfg, Where where) {
  Req q;
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

Simulator::Simulator(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
                     const Options& options)
    : cfg_(state.engine),
      coef_(coefficients),
      opt_(options),
      free_blocks_(state.free_blocks),
      watermark_blocks_(state.watermark_blocks) {
  const int32_t num_requests = static_cast<int32_t>(state.requests.size());
  reqs_.reserve(static_cast<size_t>(num_requests) + 1);
  reqs_.assign(state.requests.begin(), state.requests.end());
  Resident q;
  q.num_prompt_tokens = query.num_prompt_tokens;
  q.remaining_output_tokens = std::max<int64_t>(query.output_tokens, 1);
  query_ = num_requests;
  reqs_.push_back(make_req(q, cfg_, Where::kWaiting));
  running_.reserve(reqs_.size());
  for (int32_t id = 0; id < state.num_running; ++id) {
    running_.push_back(id);
    if (reqs_[id].placeholders > 0) pending_.push_back(id);
  }
  waiting_.reserve(reqs_.size());
  for (int32_t id = query_; id >= state.num_running; --id) waiting_.push_back(id);  // the query at the back
  sampled_.reserve(reqs_.size());
}

bool Simulator::infeasible_upfront(Result& result) const {
  const Req& q = reqs_[query_];
  if (q.prompt >= cfg_.max_model_len) {
    result.infeasibility = Infeasibility::kPromptTooLong;
  } else if (cdiv(q.prompt, cfg_.block_size) > cfg_.num_gpu_blocks) {
    result.infeasibility = Infeasibility::kPromptExceedsCache;
  } else {
    return false;
  }
  result.status = Status::kInfeasible;
  result.blocking_request = query_;
  return true;
}

// One engine step: schedule (running requests first, then waiting ones), then process sampled outputs — this
// step's under sync scheduling, the previous step's under async scheduling.
StepInfo Simulator::step() {
  StepInfo info;
  batch_.scheduled.clear();
  batch_.num_prefill_tokens = batch_.num_decode_tokens = batch_.decode_context = batch_.prefill_attention = 0;
  sampled_.clear();
  int64_t budget = cfg_.max_num_batched_tokens;
  // vLLM caps long prefill chunks only when more than one request is resident.
  const int64_t threshold = running_.size() + waiting_.size() > 1 ? cfg_.long_prefill_token_threshold : 0;
  const size_t num_running = running_.size();
  schedule_running(info, budget, threshold);
  if (info.num_scheduled != static_cast<int64_t>(num_running)) info.uniform_decode = false;
  if (!info.preempted) schedule_waiting(info, budget, threshold);

  ++num_batches_;
  ++num_steps_;
  if (info.num_tokens > 0) {  // an empty step runs no forward pass and takes no time
    ++num_timed_batches_;
    const int64_t tokens = batch_.num_prefill_tokens + batch_.num_decode_tokens;
    num_tokens_ += tokens;
    decode_context_ += batch_.decode_context;
    prefill_attention_ += batch_.prefill_attention;
    batch_.time_s = batch_time_s(coef_, 1.0, static_cast<double>(tokens),
                                 static_cast<double>(batch_.decode_context),
                                 static_cast<double>(batch_.prefill_attention));
  } else {
    batch_.time_s = 0.0;
  }
  if (opt_.record_batches) batches_.push_back(batch_);
  if (info.query_sampled) return info;
  if (cfg_.async_scheduling) {
    apply_outputs(pending_, info);
    pending_.swap(sampled_);
  } else {
    apply_outputs(sampled_, info);
  }
  return info;
}

void Simulator::schedule_running(StepInfo& info, int64_t& budget, int64_t threshold) {
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    const int32_t id = running_[i];
    Req& r = reqs_[id];
    // Async: the step in flight already samples the request's last allowed token.
    if (r.placeholders > 0 && r.computed + 2 - r.placeholders >= r.prompt + r.max_tokens) {
      info.uniform_decode = false;
      ++i;
      continue;
    }
    int64_t tokens = r.prompt + r.output + r.placeholders - r.computed;
    if (threshold > 0 && threshold < tokens) tokens = threshold;
    tokens = std::min({tokens, budget, cfg_.max_model_len - r.computed - 1});
    if (tokens <= 0) {
      info.uniform_decode = false;
      ++i;
      continue;
    }
    const int64_t needed = std::max<int64_t>(
        cdiv(std::min(r.computed + tokens, cfg_.max_model_len), cfg_.block_size) - r.blocks, 0);
    bool preempted_itself = false;
    while (needed > free_blocks_) {  // FCFS: preempt the most recently admitted request
      const int32_t victim = running_.back();
      running_.pop_back();
      preempt(victim);
      info.preempted = true;
      if (victim == id) {
        preempted_itself = true;
        if (running_.empty()) info.doomed = id;
        break;
      }
    }
    if (preempted_itself) break;
    free_blocks_ -= needed;
    r.blocks += needed;
    add_to_batch(id, tokens, info);
    budget -= tokens;
    ++i;
  }
}

void Simulator::schedule_waiting(StepInfo& info, int64_t& budget, int64_t threshold) {
  while (budget > 0 && !waiting_.empty()) {
    if (static_cast<int64_t>(running_.size()) >= cfg_.max_num_seqs) break;
    const int32_t id = waiting_.back();
    Req& w = reqs_[id];
    const int64_t num_tokens = w.prompt + w.output;
    int64_t tokens = num_tokens - w.computed;
    if (threshold > 0 && threshold < tokens) tokens = threshold;
    if (!cfg_.enable_chunked_prefill && tokens > budget) break;
    tokens = std::min(tokens, budget);
    const int64_t watermark = running_.empty() ? 0 : watermark_blocks_;
    // Head-of-line: the first request that does not fit blocks the queue for this step.
    if (cfg_.scheduler_reserve_full_isl &&
        cdiv(std::min(num_tokens, cfg_.max_model_len), cfg_.block_size) + watermark > free_blocks_) {
      break;
    }
    const int64_t needed = std::max<int64_t>(
        cdiv(std::min(w.computed + tokens, cfg_.max_model_len), cfg_.block_size) - w.blocks, 0);
    if (needed + watermark > free_blocks_) break;
    waiting_.pop_back();
    running_.push_back(id);
    w.where = Where::kRunning;
    free_blocks_ -= needed;
    w.blocks += needed;
    add_to_batch(id, tokens, info);
    info.admitted = true;
    budget -= tokens;
  }
}

void Simulator::add_to_batch(int32_t id, int64_t tokens, StepInfo& info) {
  Req& r = reqs_[id];
  const bool decode = tokens == 1 && r.computed >= r.prompt;
  if (decode) {
    batch_.num_decode_tokens += 1;
    batch_.decode_context += r.computed;
  } else {
    batch_.num_prefill_tokens += tokens;
    batch_.prefill_attention += tokens * r.computed + tokens * (tokens + 1) / 2;
  }
  if (opt_.record_batches) batch_.scheduled.emplace_back(id, tokens);
  info.num_tokens += tokens;
  ++info.num_scheduled;
  const int64_t placeholders_before = r.placeholders;
  r.computed += tokens;
  // A step samples a request's next token when it computes its last known token (not a partial chunk).
  const bool samples = r.computed >= r.prompt + r.output + placeholders_before;
  if (samples) {
    sampled_.push_back(id);
    if (cfg_.async_scheduling) r.placeholders += 1;
    if (id == query_) info.query_sampled = true;
  }
  if (!(decode && samples)) info.uniform_decode = false;
}

// Recompute preemption: blocks freed, progress lost, back to the front of the queue.
void Simulator::preempt(int32_t id) {
  Req& r = reqs_[id];
  free_blocks_ += r.blocks;
  r.blocks = 0;
  r.computed = 0;
  r.placeholders = 0;
  r.where = Where::kWaiting;
  waiting_.push_back(id);  // the front of the queue
  ++num_preemptions_;
}

// update_from_output(): each sampler gets one token; requests reaching their length finish and free their blocks.
// A request preempted while its step was in flight still receives that (stale) token, as vLLM delivers it.
void Simulator::apply_outputs(const std::vector<int32_t>& samplers, StepInfo& info) {
  bool finished_running = false;
  for (const int32_t id : samplers) {
    Req& r = reqs_[id];
    if (r.where == Where::kFinished) continue;
    ++info.outputs_applied;
    r.output += 1;
    if (r.placeholders > 0) r.placeholders -= 1;
    if (r.where == Where::kWaiting) info.outputs_changed_queue = true;
    if (r.output < r.target) continue;
    info.outputs_changed_queue = true;
    if (r.where == Where::kRunning) {
      free_blocks_ += r.blocks;
      r.blocks = 0;
      finished_running = true;
    } else {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    }
    r.where = Where::kFinished;
  }
  if (finished_running) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [this](int32_t id) { return reqs_[id].where == Where::kFinished; }),
                   running_.end());
  }
}

// A uniform decode step repeats exactly while no running request reaches its length (sync: it would finish in the
// step's update; async: one step later, or the scheduler would skip it at max_tokens) and the free blocks cover
// every block boundary crossed. Nobody is admitted meanwhile: the queue's head stays blocked for the same reason
// (budget and running count are unchanged, free blocks only shrink).
int64_t Simulator::fast_forward_length() const {
  int64_t steps = std::numeric_limits<int64_t>::max();
  for (const int32_t id : running_) steps = std::min(steps, reqs_[id].target - reqs_[id].output - 1);
  if (steps <= 0 || blocks_needed_within(steps) <= free_blocks_) return std::max<int64_t>(steps, 0);
  int64_t fits = 0, short_of_blocks = steps;  // blocks_needed_within(fits) <= free < ...(short_of_blocks)
  while (short_of_blocks - fits > 1) {
    const int64_t mid = fits + (short_of_blocks - fits) / 2;
    (blocks_needed_within(mid) <= free_blocks_ ? fits : short_of_blocks) = mid;
  }
  return fits;
}

// New blocks the running requests need over the next `steps` decode steps.
int64_t Simulator::blocks_needed_within(int64_t steps) const {
  int64_t total = 0;
  for (const int32_t id : running_) {
    const Req& r = reqs_[id];
    total += std::max<int64_t>(cdiv(r.computed + steps, cfg_.block_size) - r.blocks, 0);
  }
  return total;
}

// Applies `steps` uniform decode steps at once: per step, n tokens and Σ context growing by n.
void Simulator::fast_forward(int64_t steps) {
  const int64_t n = static_cast<int64_t>(running_.size());
  free_blocks_ -= blocks_needed_within(steps);
  i128 context = 0;
  for (const int32_t id : running_) {
    Req& r = reqs_[id];
    context += r.computed;
    r.computed += steps;
    r.output += steps;
    r.blocks = std::max(r.blocks, cdiv(r.computed, cfg_.block_size));
  }
  if (opt_.record_batches) {
    Batch batch;
    for (const int32_t id : running_) batch.scheduled.emplace_back(id, 1);
    batch.num_decode_tokens = n;
    for (int64_t s = 0; s < steps; ++s) {
      batch.decode_context = static_cast<int64_t>(context) + n * s;
      batch.time_s = batch_time_s(coef_, 1.0, static_cast<double>(n), static_cast<double>(batch.decode_context), 0.0);
      batches_.push_back(batch);
    }
  }
  num_batches_ += steps;
  num_timed_batches_ += steps;
  num_tokens_ += static_cast<i128>(steps) * n;
  decode_context_ += static_cast<i128>(steps) * context + static_cast<i128>(n) * steps * (steps - 1) / 2;
}

double Simulator::elapsed_s(int64_t steps) const {
  // `steps` more uniform decode steps of the running requests (0: the time so far).
  const int64_t n = static_cast<int64_t>(running_.size());
  i128 context = 0;
  if (steps > 0) {
    for (const int32_t id : running_) context += reqs_[id].computed;
  }
  const i128 tokens = num_tokens_ + static_cast<i128>(steps) * n;
  const i128 decode = decode_context_ + static_cast<i128>(steps) * context + static_cast<i128>(n) * steps * (steps - 1) / 2;
  return batch_time_s(coef_, static_cast<double>(num_timed_batches_ + steps), static_cast<double>(tokens),
                      static_cast<double>(decode), static_cast<double>(prefill_attention_));
}

// Smallest s in [1, limit] after which the simulated time passes the horizon, or limit + 1.
int64_t Simulator::steps_until_horizon(int64_t limit) const {
  if (!(elapsed_s(limit) > opt_.horizon_s)) return limit + 1;
  int64_t within = 0, beyond = limit;  // elapsed_s(within) <= horizon < elapsed_s(beyond)
  while (beyond - within > 1) {
    const int64_t mid = within + (beyond - within) / 2;
    (elapsed_s(mid) > opt_.horizon_s ? beyond : within) = mid;
  }
  return beyond;
}

void Simulator::finish(Result& result, Status status) {
  result.status = status;
  result.num_batches = num_batches_;
  result.num_steps = num_steps_;
  result.num_preemptions = num_preemptions_;
  result.time_s = elapsed_s();
  if (status == Status::kFirstToken) result.first_token_batch = num_batches_;
  result.batches = std::move(batches_);
}

// Invariant at the top of each iteration: the state is the engine's just before it schedules the next step
// (under async scheduling, with the previous step still in flight: its samplers are pending_).
Result Simulator::run() {
  Result result;
  if (infeasible_upfront(result)) return result;
  while (true) {
    if (num_steps_ >= opt_.max_steps) {
      result.infeasibility = Infeasibility::kStepLimit;
      finish(result, Status::kInfeasible);
      return result;
    }
    const StepInfo info = step();
    if (info.query_sampled) {
      finish(result, Status::kFirstToken);
      return result;
    }
    if (elapsed_s() > opt_.horizon_s) {
      finish(result, Status::kExceedsHorizon);
      return result;
    }
    // Nothing can change any more; or a request alone in RUNNING could not grow within the whole cache: it can
    // never complete (without prefix caching it needs at least as many blocks again when it resumes).
    if ((info.num_tokens == 0 && !info.preempted && info.outputs_applied == 0) || info.doomed >= 0) {
      result.infeasibility = Infeasibility::kStuck;
      result.blocking_request = info.doomed >= 0 ? info.doomed : (waiting_.empty() ? query_ : waiting_.back());
      finish(result, Status::kInfeasible);
      return result;
    }
    if (!opt_.shortcuts || !info.uniform_decode || info.admitted || info.preempted || info.outputs_changed_queue) {
      continue;
    }
    const int64_t steps = fast_forward_length();
    if (steps <= 0) continue;
    const int64_t past_horizon = steps_until_horizon(steps);
    if (past_horizon <= steps) {
      fast_forward(past_horizon);
      finish(result, Status::kExceedsHorizon);
      return result;
    }
    fast_forward(steps);
  }
}

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
  if (r.remaining_output_tokens < 1) return "remaining_output_tokens must be >= 1";
  if (r.num_computed_tokens > r.num_prompt_tokens + r.num_output_tokens + r.num_output_placeholders) {
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
  require(cfg.watermark >= 0.0 && cfg.watermark < 1.0, "engine: watermark must be in [0, 1)");
  require(state.free_blocks >= 0 && state.free_blocks <= cfg.num_gpu_blocks, "free_blocks out of range");
  require_consistent(state.running, cfg, false);
  require_consistent(state.waiting, cfg, true);
  int64_t held = state.free_blocks;
  for (const Resident& r : state.running) held += r.num_allocated_blocks;
  require(held <= cfg.num_gpu_blocks, "running requests' blocks + free_blocks exceed num_gpu_blocks");
}

void validate(const Query& query, const BatchTimeCoefficients& c) {
  require(query.num_prompt_tokens >= 1 && query.output_tokens >= 1, "query: token counts must be >= 1");
  for (const double b : {c.b0, c.b1, c.b2, c.b3}) {
    require(std::isfinite(b) && b >= 0.0, "batch time coefficients must be finite and >= 0");
  }
}

PreparedState prepare(const InstanceState& state) {
  validate(state);
  PreparedState prepared;
  prepared.engine = state.engine;
  prepared.free_blocks = state.free_blocks;
  prepared.watermark_blocks =
      static_cast<int64_t>(state.engine.watermark * static_cast<double>(state.engine.num_gpu_blocks + 1));
  prepared.requests.reserve(state.running.size() + state.waiting.size());
  for (const Resident& r : state.running) prepared.requests.push_back(make_req(r, state.engine, Where::kRunning));
  for (const Resident& r : state.waiting) prepared.requests.push_back(make_req(r, state.engine, Where::kWaiting));
  prepared.num_running = static_cast<int32_t>(state.running.size());
  return prepared;
}

Result replay(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
              const Options& options) {
  validate(query, coefficients);
  return Simulator(state, query, coefficients, options).run();
}

}  // namespace bear
