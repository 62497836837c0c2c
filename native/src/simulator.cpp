#include "simulator.hpp"

#include <algorithm>
#include <limits>

namespace bear::sim {

Simulator::Simulator(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
                     const Options& options, const std::vector<Arrival>& arrivals)
    : cfg_(state.engine),
      coef_(coefficients),
      opt_(options),
      lazy_(state.engine.block_size, reqs_),
      free_blocks_(state.free_blocks),
      shared_blocks_(state.shared_blocks),
      watermark_blocks_(state.watermark_blocks) {
  const size_t num_residents = state.requests.size();
  reqs_.resize(num_residents + arrivals.size() + 1);
  for (size_t i = 0; i < num_residents; ++i) static_cast<detail::Request&>(reqs_[i]) = state.requests[i];
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const int32_t id = static_cast<int32_t>(num_residents + i);
    static_cast<detail::Request&>(reqs_[id]) = from_resident(arrivals[i].request, cfg_, detail::Where::kWaiting);
    arrivals_.emplace_back(arrivals[i].time_s, id);
  }
  query_ = static_cast<int32_t>(reqs_.size() - 1);
  Resident q;
  q.num_prompt_tokens = query.num_prompt_tokens;
  q.remaining_output_tokens = std::max<int64_t>(query.output_tokens, 1);
  q.cached_tokens = query.cached_tokens;
  static_cast<detail::Request&>(reqs_[query_]) = from_resident(q, cfg_, detail::Where::kWaiting);
  arrivals_.emplace_back(options.query_time_s, query_);
  std::stable_sort(arrivals_.begin(), arrivals_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  running_.reserve(reqs_.size());
  explicit_.reserve(reqs_.size());
  for (int32_t id = 0; id < state.num_running; ++id) {
    reqs_[id].seq = next_seq_++;
    running_.emplace_back(id, reqs_[id].seq);
    explicit_.push_back(id);
    if (reqs_[id].placeholders > 0) pending_.push_back(id);
  }
  num_running_ = state.num_running;
  waiting_.reserve(reqs_.size());
  for (int32_t id = static_cast<int32_t>(num_residents) - 1; id >= state.num_running; --id) waiting_.push_back(id);
  // Waiting requests whose own blocks are still cached resume from what is left of them, in the order those go.
  for (int32_t id = state.num_running; id < static_cast<int32_t>(num_residents); ++id) {
    Request& w = reqs_[id];
    if (w.evictable == 0) continue;
    w.resumable = true;
    w.kept_hashed = w.cached / cfg_.block_size - w.evictable;
    w.hashed_freed = w.evictable;
    w.ahead = w.free_ahead;
    w.cached = 0;
    resumable_.push_back(id);
  }
  std::stable_sort(resumable_.begin(), resumable_.end(),
                   [this](int32_t a, int32_t b) { return reqs_[a].ahead < reqs_[b].ahead; });
  sampled_.reserve(reqs_.size());
  if (cfg_.async_scheduling) last_end_ = origin_ = options.in_flight_s;  // the step executing when the state was taken
  // Requests become lazy after the first step: a query admitted at once never pays for the bookkeeping.
}

// ---------------------------------------------------------------------------------------------------------------
// One step.

// One engine step: schedule, then process sampled outputs (this step's under sync scheduling, the previous step's
// under async scheduling).
StepInfo Simulator::step() {
  for (int32_t id = lazy_.pop_due(num_batches_ + 1); id >= 0; id = lazy_.pop_due(num_batches_ + 1)) leave_lazy(id);
  StepInfo info;
  info.scheduled_at_s = schedule_time_s();
  enqueue_arrivals(info.scheduled_at_s);
  batch_.num_prefill_tokens = batch_.num_decode_tokens = batch_.decode_context = batch_.prefill_attention = 0;
  sampled_.clear();
  int64_t budget = cfg_.max_num_batched_tokens;
  // vLLM caps long prefill chunks only when more than one request is resident.
  const int64_t resident = num_running_ + static_cast<int64_t>(waiting_.size());
  const int64_t threshold = resident > 1 ? cfg_.long_prefill_token_threshold : 0;
  if (lazy_.count() > 0 && !lazy_members_fit_budget(threshold)) make_all_explicit();
  info.all_lazy = lazy_.count() > 0 && explicit_.empty();
  if (lazy_.count() > 0) {
    schedule_running_with_lazy(info, budget, threshold);
  } else {
    schedule_running(info, budget, threshold);
  }
  if (!info.preempted) schedule_waiting(info, budget, threshold);  // no admissions in a step that preempted
  ++num_batches_;
  ++num_steps_;
  account_batch(info);
  execute(info.scheduled_at_s);
  if (opt_.record_batches) record_batch();
  if (info.query_sampled) return info;
  if (cfg_.async_scheduling) {
    apply_outputs(pending_, info);
    pending_.swap(sampled_);
  } else {
    apply_outputs(sampled_, info);
  }
  lazy_.advance(1);
  make_lazy_where_possible();
  return info;
}

// Tokens vLLM would give a running request with an unlimited budget (0: it is skipped this step).
int64_t Simulator::wanted_tokens(const Request& r, int64_t threshold) const {
  // Async: the step in flight already samples the request's last allowed token.
  if (r.placeholders > 0 && r.computed + 2 - r.placeholders >= r.prompt + r.max_tokens) return 0;
  int64_t tokens = r.prompt + r.output + r.placeholders - r.computed;
  if (threshold > 0 && threshold < tokens) tokens = threshold;
  return std::max<int64_t>(std::min(tokens, cfg_.max_model_len - r.computed - 1), 0);
}

// The budget must reach every lazy member: vLLM hands it out in admission order, so the lazy members and the
// explicit requests admitted before the last of them must fit it in full.
bool Simulator::lazy_members_fit_budget(int64_t threshold) const {
  int64_t last_lazy_seq = -1;
  for (auto entry = running_.rbegin(); entry != running_.rend(); ++entry) {
    if (alive(*entry) && reqs_[entry->first].mode == Mode::kLazy) {
      last_lazy_seq = entry->second;
      break;
    }
  }
  int64_t tokens = lazy_.count();
  for (const int32_t id : explicit_) {
    if (reqs_[id].seq < last_lazy_seq) tokens += wanted_tokens(reqs_[id], threshold);
  }
  return tokens <= cfg_.max_num_batched_tokens;
}

// Every running request is explicit: vLLM's loop over RUNNING, in admission order, while budget remains.
void Simulator::schedule_running(StepInfo& info, int64_t& budget, int64_t threshold) {
  size_t i = 0;
  while (i < explicit_.size() && budget > 0) {
    const int32_t id = explicit_[i];
    Request& r = reqs_[id];
    const int64_t tokens = std::min(wanted_tokens(r, threshold), budget);
    if (tokens <= 0) {
      ++i;
      continue;
    }
    const int64_t needed =
        std::max<int64_t>(cdiv(std::min(r.computed + tokens, cfg_.max_model_len), cfg_.block_size) - r.blocks, 0);
    if (!allocate(id, needed, info)) break;  // it preempted itself: stop scanning
    add_to_batch(id, tokens, info);
    budget -= tokens;
    ++i;
  }
}

// Lazy members each decode one token, and the budget covers them and every explicit request admitted before the last
// of them (checked), so only the explicit requests after them can find the budget short. Only the explicit requests
// and the lazy ones needing a new block in this step are visited, in admission order if blocks run short.
void Simulator::schedule_running_with_lazy(StepInfo& info, int64_t& budget, int64_t threshold) {
  const std::vector<int32_t>& needers = lazy_.needers(num_batches_ + 1);
  auto blocks_for = [&](const Request& r, int64_t tokens) {
    return std::max<int64_t>(cdiv(std::min(r.computed + tokens, cfg_.max_model_len), cfg_.block_size) - r.blocks, 0);
  };
  // Plan with the free blocks as they are; if they suffice nobody is preempted and the plan is the step.
  int64_t blocks = static_cast<int64_t>(needers.size());
  int64_t left = budget - lazy_.count();
  for (const int32_t id : explicit_) {
    const int64_t tokens = std::min(wanted_tokens(reqs_[id], threshold), left);
    reqs_[id].tokens = tokens;
    if (tokens > 0) blocks += blocks_for(reqs_[id], tokens);
    left -= std::max<int64_t>(tokens, 0);
  }
  int64_t explicit_tokens = 0;
  if (blocks <= free_blocks_) {
    take_blocks(static_cast<int64_t>(needers.size()));
    for (const int32_t id : explicit_) {
      Request& r = reqs_[id];
      const int64_t tokens = r.tokens;
      if (tokens <= 0) continue;
      const int64_t needed = blocks_for(r, tokens);
      take_blocks(needed);
      r.blocks += needed;
      add_to_batch(id, tokens, info);
      explicit_tokens += tokens;
    }
    budget -= lazy_.count() + explicit_tokens;
    return;
  }
  order_.clear();
  for (const int32_t id : needers) order_.emplace_back(reqs_[id].seq, id);
  for (const int32_t id : explicit_) order_.emplace_back(reqs_[id].seq, id);
  std::sort(order_.begin(), order_.end());
  for (const auto& [seq, id] : order_) {
    Request& r = reqs_[id];
    if (r.where != detail::Where::kRunning || r.seq != seq) continue;  // preempted earlier in this step
    if (r.mode == Mode::kLazy) {
      if (!allocate(id, 1, info)) break;
      continue;
    }
    // Lazy members still here all come before this request or fit anyway (see lazy_members_fit_budget).
    const int64_t tokens = std::min(wanted_tokens(r, threshold), budget - lazy_.count() - explicit_tokens);
    if (tokens <= 0) continue;
    if (!allocate(id, blocks_for(r, tokens), info)) break;
    add_to_batch(id, tokens, info);
    explicit_tokens += tokens;
  }
  budget -= lazy_.count() + explicit_tokens;
}

// Takes `blocks` free blocks for running request `id`, preempting the most recently admitted requests (FCFS) until
// they fit. False if the request had to preempt itself.
bool Simulator::allocate(int32_t id, int64_t blocks, StepInfo& info) {
  while (blocks > free_blocks_) {
    const int32_t victim = pop_last_running();
    preempt(victim);
    info.preempted = true;
    if (victim == id) {
      if (num_running_ == 0) info.doomed = id;
      return false;
    }
  }
  take_blocks(blocks);
  if (reqs_[id].mode == Mode::kExplicit) reqs_[id].blocks += blocks;  // a lazy one's blocks follow its tokens
  return true;
}

void Simulator::schedule_waiting(StepInfo& info, int64_t& budget, int64_t threshold) {
  while (budget > 0 && !waiting_.empty()) {
    if (num_running_ >= cfg_.max_num_seqs) break;
    const int32_t id = waiting_.back();
    Request& w = reqs_[id];
    const int64_t num_tokens = w.prompt + w.output;
    // A request starting from scratch first takes the cached part of its prompt (see replay.hpp): those tokens start
    // out computed and its chunk attends to them; its blocks, the cached ones too, still come from the free pool.
    const int64_t hit = w.computed == 0 ? prefix_cache_hit(cached_tokens(w), num_tokens, cfg_.block_size) : 0;
    int64_t tokens = num_tokens - w.computed - hit;
    if (threshold > 0 && threshold < tokens) tokens = threshold;
    if (!cfg_.enable_chunked_prefill && tokens > budget) break;
    tokens = std::min(tokens, budget);
    const int64_t watermark = num_running_ == 0 ? 0 : watermark_blocks_;
    // Head-of-line: the first request that does not fit blocks the queue for this step.
    if (cfg_.scheduler_reserve_full_isl &&
        cdiv(std::min(num_tokens, cfg_.max_model_len), cfg_.block_size) + watermark > free_blocks_) {
      break;
    }
    const int64_t needed = std::max<int64_t>(
        cdiv(std::min(w.computed + hit + tokens, cfg_.max_model_len), cfg_.block_size) - w.blocks, 0);
    if (needed + watermark > free_blocks_) break;
    w.computed += hit;
    w.hashed = hit / cfg_.block_size;
    waiting_.pop_back();
    admit(id);
    if (w.resumable) resumed(id, hit / cfg_.block_size);
    free_blocks_ -= needed;
    evict_front(std::max<int64_t>(needed - hit / cfg_.block_size, 0));  // the hit's blocks are found, not taken
    w.blocks += needed;
    add_to_batch(id, tokens, info);
    info.admitted = true;
    budget -= tokens;
  }
}

void Simulator::add_to_batch(int32_t id, int64_t tokens, StepInfo& info) {
  Request& r = reqs_[id];
  if (tokens == 1) {  // a decode, as vLLM's attention backends split batches (bear.core.batch_time.is_decode)
    batch_.num_decode_tokens += 1;
    batch_.decode_context += r.computed;
  } else {
    batch_.num_prefill_tokens += tokens;
    batch_.prefill_attention += tokens * r.computed + tokens * (tokens + 1) / 2;
  }
  info.num_tokens += tokens;
  r.tokens = tokens;
  r.scheduled_step = num_batches_ + 1;
  const int64_t placeholders_before = r.placeholders;
  r.computed += tokens;
  // vLLM caches its full blocks of known tokens as it schedules them (KVCacheManager.allocate_slots)
  r.hashed = std::max(r.hashed, std::min(r.computed, r.prompt + r.output) / cfg_.block_size);
  // A step samples a request's next token when it computes its last known token (not a partial chunk).
  if (r.computed >= r.prompt + r.output + placeholders_before) {
    sampled_.push_back(id);
    if (cfg_.async_scheduling) r.placeholders += 1;
    if (id == query_) info.query_sampled = true;
  }
}

// The request's blocks go back to the free pool, but for those another running request still holds (shared_blocks_:
// prefix-cache hits on its blocks, paid off by the first blocks released).
// With prefix caching its full blocks join the back of vLLM's free queue, behind the blocks free now, the rest the front.
int64_t Simulator::release(Request& r) {
  const int64_t kept = std::min(shared_blocks_, r.blocks);
  const int64_t freed = r.blocks - kept;
  int64_t to_front = freed;
  if (cfg_.enable_prefix_caching) {
    const int64_t hashed = std::min(r.hashed, r.blocks);
    r.kept_hashed = std::min(kept, hashed);
    r.hashed_freed = std::min(std::max<int64_t>(hashed - kept, 0), freed);
    to_front = freed - r.hashed_freed;
    for (const int32_t id : resumable_) reqs_[id].ahead += to_front;
  }
  shared_blocks_ -= kept;
  free_blocks_ += freed;
  r.blocks = 0;
  return to_front;
}

// `blocks` taken from the front of the free queue evict the cached blocks they reach.
void Simulator::evict_front(int64_t blocks) {
  for (const int32_t id : resumable_) {
    Request& w = reqs_[id];
    if (blocks > w.ahead) w.evicted = std::min(w.evicted + blocks - w.ahead, w.hashed_freed);
    w.ahead = std::max<int64_t>(w.ahead - blocks, 0);
  }
}

// A preempted request admitted again takes its cached blocks out of the free queue (not from its front): the requests
// preempted after it have them no longer ahead.
void Simulator::resumed(int32_t id, int64_t hit_blocks) {
  Request& r = reqs_[id];
  const auto at = std::find(resumable_.begin(), resumable_.end(), id);
  const int64_t touched = std::min(r.hashed_freed - r.evicted, std::max<int64_t>(hit_blocks - r.kept_hashed, 0));
  for (auto later = at + 1; later != resumable_.end(); ++later) {
    reqs_[*later].ahead = std::max<int64_t>(reqs_[*later].ahead - touched, 0);
  }
  resumable_.erase(at);
  r.resumable = false;
}

// Tokens the prefix cache holds for a request being admitted: its cached_tokens, or what is left of its own blocks if
// the replay preempted it (prefix caching on), whichever is more.
int64_t Simulator::cached_tokens(const Request& r) const {
  if (!r.resumable) return r.cached;
  return std::max(r.cached, (r.kept_hashed + r.hashed_freed - r.evicted) * cfg_.block_size);
}

// Recompute preemption: blocks freed, progress lost, back to the front of the queue.
void Simulator::preempt(int32_t id) {
  Request& r = reqs_[id];
  const int64_t free_before = free_blocks_;
  const int64_t to_front = release(r);
  if (cfg_.enable_prefix_caching) {  // behind every block free before, and its own that went to the front
    r.ahead = free_before + to_front;
    r.evicted = 0;
    r.resumable = true;
    resumable_.push_back(id);
  }
  r.computed = 0;
  r.placeholders = 0;
  r.where = detail::Where::kWaiting;
  waiting_.push_back(id);  // the front of the queue
  ++num_preemptions_;
}

// update_from_output() for the explicit samplers (lazy members' outputs follow their anchor): each gets one token;
// those reaching their length finish and free their blocks. A request preempted while its step was in flight still
// receives that (stale) token, as vLLM delivers it.
void Simulator::apply_outputs(const std::vector<int32_t>& samplers, StepInfo& info) {
  bool finished_running = false;
  for (const int32_t id : samplers) {
    Request& r = reqs_[id];
    if (r.where == detail::Where::kFinished) continue;
    ++info.outputs_applied;
    r.output += 1;
    if (r.placeholders > 0) r.placeholders -= 1;
    if (r.where == detail::Where::kWaiting) info.queue_changed = true;
    if (r.output < r.target) continue;
    info.queue_changed = true;
    if (r.where == detail::Where::kRunning) {
      release(r);
      --num_running_;
      finished_running = true;
    } else {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
      if (r.resumable) {  // its blocks stay where they are in the free queue
        resumable_.erase(std::find(resumable_.begin(), resumable_.end(), id));
        r.resumable = false;
      }
    }
    r.where = detail::Where::kFinished;
  }
  if (finished_running) drop_finished_explicit();
}

void Simulator::account_batch(StepInfo& info) {
  batch_.num_decode_tokens += lazy_.count();
  batch_.decode_context += lazy_.context_sum();
  info.num_tokens += lazy_.count();
  const int64_t tokens = batch_.num_prefill_tokens + batch_.num_decode_tokens;
  batch_.time_s = 0.0;  // an empty step runs no forward pass and takes no time
  if (tokens == 0) return;
  batch_.time_s = batch_time_s(coef_, 1.0, static_cast<double>(tokens), static_cast<double>(batch_.decode_context),
                               static_cast<double>(batch_.prefill_attention));
}

// ---------------------------------------------------------------------------------------------------------------
// Arrivals and the clock.

// When the next step is scheduled: after the output of the step before (sync) or two before (async) is processed;
// an idle engine waits for the next arrival, and a frozen one for `not_before_`.
double Simulator::schedule_time_s() const {
  double at = std::max(cfg_.async_scheduling ? end_before_last_ : last_end_, not_before_);
  if (num_running_ == 0 && waiting_.empty() && arrival_pending()) at = std::max(at, next_arrival_s());
  return at;
}

// Requests that arrived by `scheduled_at_s` join the back of the waiting queue.
void Simulator::enqueue_arrivals(double scheduled_at_s) {
  while (arrival_pending() && next_arrival_s() <= scheduled_at_s) {
    waiting_.insert(waiting_.begin(), arrivals_[next_arrival_].second);  // reversed: the back of the queue
    ++next_arrival_;
  }
}

// The step just scheduled executes once the one before has finished (time restarts after an idle gap).
void Simulator::execute(double scheduled_at_s) {
  const double start = std::max(last_end_, scheduled_at_s);
  if (start > last_end_) {
    origin_ = start;
    num_timed_ = 0;
    num_tokens_ = decode_context_ = prefill_attention_ = 0;
  }
  const int64_t tokens = batch_.num_prefill_tokens + batch_.num_decode_tokens;
  if (tokens > 0) {
    ++num_timed_;
    num_tokens_ += tokens;
    decode_context_ += batch_.decode_context;
    prefill_attention_ += batch_.prefill_attention;
  }
  end_before_last_ = last_end_;
  last_end_ = end_after(0);
}

// The end of the last step, or of `quiet_steps` more quiet steps (n decode tokens each, Σ context growing by n).
double Simulator::end_after(int64_t quiet_steps) const {
  const int64_t n = quiet_steps > 0 ? lazy_.count() : 0;
  const i128 context = quiet_steps > 0 ? lazy_.context_sum() : 0;
  const i128 tokens = num_tokens_ + static_cast<i128>(quiet_steps) * n;
  const i128 decode = decode_context_ + static_cast<i128>(quiet_steps) * context +
                      static_cast<i128>(n) * quiet_steps * (quiet_steps - 1) / 2;
  return origin_ + batch_time_s(coef_, static_cast<double>(num_timed_ + quiet_steps), static_cast<double>(tokens),
                                static_cast<double>(decode), static_cast<double>(prefill_attention_));
}

void Simulator::record_batch() {
  batch_.scheduled.clear();
  for (const auto& entry : running_) {
    if (!alive(entry)) continue;
    const Request& r = reqs_[entry.first];
    if (r.mode == Mode::kLazy) {
      batch_.scheduled.emplace_back(entry.first, 1);
    } else if (r.scheduled_step == num_batches_) {
      batch_.scheduled.emplace_back(entry.first, r.tokens);
    }
  }
  batches_.push_back(batch_);
}

// ---------------------------------------------------------------------------------------------------------------
// The running list.

bool Simulator::alive(const std::pair<int32_t, int64_t>& entry) const {
  const Request& r = reqs_[entry.first];
  return r.where == detail::Where::kRunning && r.seq == entry.second;
}

// Removes and returns the most recently admitted running request (the FCFS victim), its counters up to date.
int32_t Simulator::pop_last_running() {
  while (!alive(running_.back())) running_.pop_back();
  const int32_t id = running_.back().first;
  running_.pop_back();
  --num_running_;
  if (reqs_[id].mode == Mode::kLazy) {
    lazy_.remove(id, num_batches_);
    if (cfg_.async_scheduling) pending_.push_back(id);  // its token of the step in flight still arrives
  } else {
    explicit_.pop_back();  // the latest admitted explicit request is the last of explicit_
  }
  return id;
}

void Simulator::admit(int32_t id) {
  Request& r = reqs_[id];
  r.where = detail::Where::kRunning;
  r.seq = next_seq_++;
  running_.emplace_back(id, r.seq);
  explicit_.push_back(id);
  ++num_running_;
}

void Simulator::drop_finished_explicit() {
  explicit_.erase(std::remove_if(explicit_.begin(), explicit_.end(),
                                 [this](int32_t id) { return reqs_[id].where == detail::Where::kFinished; }),
                  explicit_.end());
  if (static_cast<int64_t>(running_.size()) > 2 * num_running_ + 64) {
    running_.erase(std::remove_if(running_.begin(), running_.end(), [this](const auto& e) { return !alive(e); }),
                   running_.end());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Lazy bookkeeping.

// Explicit running requests in steady decode become lazy: one token per step, sampled, with exactly the blocks
// their tokens need, until the step where they finish (or async scheduling skips them at max_tokens).
void Simulator::make_lazy_where_possible() {
  if (!opt_.shortcuts) return;
  const int64_t now = num_batches_;
  auto steady = [this](const Request& r) {
    const bool decoding = cfg_.async_scheduling
                              ? r.placeholders == 1 && r.computed == r.prompt + r.output
                              : r.placeholders == 0 && r.output >= 1 && r.computed == r.prompt + r.output - 1;
    return decoding && r.blocks == cdiv(r.computed, cfg_.block_size) && r.target - r.output >= 2;
  };
  // Lazy members must all fit the budget (lazy_members_fit_budget): more would be made explicit again next step,
  // at a cost of O(running) a step, and joining again after it.
  int64_t joining = 0;
  for (const int32_t id : explicit_) joining += steady(reqs_[id]) ? 1 : 0;
  if (joining == 0 || lazy_.count() + joining > cfg_.max_num_batched_tokens) return;
  for (const int32_t id : explicit_) {
    const Request& r = reqs_[id];
    if (steady(r)) lazy_.add(id, now, now + r.target - r.output);
  }
  auto is_lazy = [this](int32_t id) { return reqs_[id].mode == Mode::kLazy; };
  explicit_.erase(std::remove_if(explicit_.begin(), explicit_.end(), is_lazy), explicit_.end());
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), is_lazy), pending_.end());
}

// A lazy member becomes explicit again, its counters brought up to date (under async scheduling it samples in the
// step in flight).
void Simulator::leave_lazy(int32_t id) {
  lazy_.remove(id, num_batches_);
  const int64_t seq = reqs_[id].seq;
  const auto at = std::lower_bound(explicit_.begin(), explicit_.end(), seq,
                                   [this](int32_t other, int64_t s) { return reqs_[other].seq < s; });
  explicit_.insert(at, id);
  if (cfg_.async_scheduling) pending_.push_back(id);
}

void Simulator::make_all_explicit() {
  explicit_.clear();
  for (const auto& entry : running_) {
    if (!alive(entry)) continue;
    const int32_t id = entry.first;
    if (reqs_[id].mode == Mode::kLazy) {
      lazy_.remove(id, num_batches_);
      if (cfg_.async_scheduling) pending_.push_back(id);
    }
    explicit_.push_back(id);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Closed-form runs, the horizon and the result.

// After a quiet step — every running request lazy throughout, nobody admitted, preempted or finished — the
// following steps repeat it exactly until a member's exit or a block shortage: the queue's head stays blocked for
// the same reason (budget and running count unchanged, free blocks only shrinking).
bool Simulator::quiet(const StepInfo& info) const {
  return info.all_lazy && explicit_.empty() && pending_.empty() && !info.admitted && !info.preempted &&
         !info.queue_changed;
}

int64_t Simulator::run_length() {
  const int64_t exit_step = lazy_.next_exit();
  const int64_t limit = exit_step - 1 - num_batches_;
  if (limit <= 0) return 0;
  return lazy_.steps_within_blocks(num_batches_, limit, free_blocks_);
}

// Applies `steps` quiet steps at once: n decode tokens per step, Σ context growing by n each step.
void Simulator::fast_forward(int64_t steps) {
  const int64_t n = lazy_.count();
  const int64_t context = lazy_.context_sum();
  take_blocks(lazy_.blocks_needed(num_batches_, steps));
  if (opt_.record_batches) {
    Batch batch;
    for (const auto& entry : running_) {
      if (alive(entry)) batch.scheduled.emplace_back(entry.first, 1);
    }
    batch.num_decode_tokens = n;
    for (int64_t s = 0; s < steps; ++s) {
      batch.decode_context = context + n * s;
      batch.time_s = batch_time_s(coef_, 1.0, static_cast<double>(n), static_cast<double>(batch.decode_context), 0.0);
      batches_.push_back(batch);
    }
  }
  end_before_last_ = end_after(steps - 1);
  last_end_ = end_after(steps);
  num_batches_ += steps;
  num_timed_ += steps;
  num_tokens_ += static_cast<i128>(steps) * n;
  decode_context_ += static_cast<i128>(steps) * context + static_cast<i128>(n) * steps * (steps - 1) / 2;
  lazy_.advance(steps);
}

// Time from the query's arrival to the end of the last step, or of `extra_steps` more quiet steps.
double Simulator::elapsed_s(int64_t extra_steps) const { return end_after(extra_steps) - opt_.query_time_s; }

// How many of the next `limit` quiet steps are scheduled before the next arrival is due (it must join the queue
// before the first step scheduled at or after its time): step i of the run is scheduled at the end of run step i-1
// (sync) or i-2 (async).
int64_t Simulator::steps_before_next_arrival(int64_t limit) const {
  if (!arrival_pending()) return limit;
  const double due = next_arrival_s();
  if (cfg_.async_scheduling && end_before_last_ >= due) return 0;
  if (end_after(0) >= due) return cfg_.async_scheduling ? std::min<int64_t>(limit, 1) : 0;
  int64_t before = 0, after = limit + 1;  // end_after(before) < due <= end_after(after)
  while (after - before > 1) {
    const int64_t mid = before + (after - before) / 2;
    (end_after(mid) < due ? before : after) = mid;
  }
  return std::min(limit, before + (cfg_.async_scheduling ? 2 : 1));
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

bool Simulator::infeasible_upfront(Result& result) const {
  const Request& q = reqs_[query_];
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

void Simulator::finish(Result& result, Status status) {
  result.status = status;
  result.num_batches = num_batches_;
  result.num_steps = num_steps_;
  result.num_preemptions = num_preemptions_;
  result.time_s = num_batches_ > 0 ? elapsed_s() : 0.0;
  if (status == Status::kFirstToken) result.first_token_batch = num_batches_;
  result.batches = std::move(batches_);
}

// Invariant at the top of each iteration: the state is the engine's just before it schedules the next step (under
// async scheduling, with the previous step in flight: its explicit samplers are pending_, lazy members implicitly).
Result Simulator::run() {
  Result result;
  if (infeasible_upfront(result)) return result;
  while (true) {
    if (num_steps_ >= opt_.max_steps) {
      result.infeasibility = Infeasibility::kStepLimit;  // gave up: the time so far is a lower bound, as at the horizon
      finish(result, Status::kExceedsHorizon);
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
    // A request alone in RUNNING could not grow within the whole cache: it can never complete (it needs at least as
    // many blocks again when it resumes: the replay takes even cached blocks from the free pool). Or nothing changed:
    // the state is frozen until the next arrival, and for good if none is left.
    const bool frozen = info.num_tokens == 0 && !info.preempted && info.outputs_applied == 0;
    if (info.doomed >= 0 || (frozen && !arrival_pending())) {
      result.infeasibility = Infeasibility::kStuck;
      result.blocking_request = info.doomed >= 0 ? info.doomed : (waiting_.empty() ? query_ : waiting_.back());
      finish(result, Status::kInfeasible);
      return result;
    }
    if (frozen) {
      not_before_ = next_arrival_s();
      continue;
    }
    if (!quiet(info)) continue;
    const int64_t steps = steps_before_next_arrival(run_length());
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

}  // namespace bear::sim
