// The replay's simulation of one vLLM engine. Each step mirrors Scheduler.schedule() (running requests first, in
// admission order, then waiting ones, under one token budget) followed by update_from_output() (sampled tokens
// appended, finished requests freed); under async scheduling the update of step k runs after step k+1 has been
// scheduled, as in EngineCore.step_with_batch_queue.
//
// Cost grows with scheduling events, not with batches: running requests in steady decode are kept in aggregate
// (LazyDecoders), so a step touches only requests something happens to (block needs, prefills, preemptions,
// admissions, finishes); runs of quiet steps are applied in closed form. Eq. 12 features are summed as exact
// integers, so every shortcut gives the step-by-step result to the last bit.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "bear/replay.hpp"
#include "lazy_decoders.hpp"
#include "sim_request.hpp"

namespace bear::sim {

using i128 = __int128;

// What one step did, as far as the run loop needs to know.
struct StepInfo {
  bool preempted = false;
  bool admitted = false;
  bool query_sampled = false;
  bool queue_changed = false;  // an output finished a request or reached a waiting one
  bool all_lazy = false;       // every running request was lazy during the step
  double scheduled_at_s = 0.0;
  int32_t doomed = -1;         // preempted itself with nothing else running: it can never complete
  int64_t num_tokens = 0;
  int64_t outputs_applied = 0;
};

class Simulator {
 public:
  Simulator(const PreparedState& state, const Query& query, const BatchTimeCoefficients& coefficients,
            const Options& options, const std::vector<Arrival>& arrivals);
  Result run();

 private:
  // One step.
  StepInfo step();
  int64_t wanted_tokens(const Request& r, int64_t threshold) const;
  bool lazy_members_fit_budget(int64_t threshold) const;
  void schedule_running(StepInfo& info, int64_t& budget, int64_t threshold);
  void schedule_running_with_lazy(StepInfo& info, int64_t& budget, int64_t threshold);
  bool allocate(int32_t id, int64_t blocks, StepInfo& info);
  void schedule_waiting(StepInfo& info, int64_t& budget, int64_t threshold);
  void add_to_batch(int32_t id, int64_t tokens, StepInfo& info);
  void preempt(int32_t id);
  int64_t release(Request& r);  // returns the blocks it put at the front of the free queue
  void apply_outputs(const std::vector<int32_t>& samplers, StepInfo& info);
  void account_batch(StepInfo& info);
  void record_batch();

  // The running list: (id, seq) in admission order; entries of requests that left are skipped.
  bool alive(const std::pair<int32_t, int64_t>& entry) const;
  int32_t pop_last_running();
  void admit(int32_t id);
  void drop_finished_explicit();
  void take_blocks(int64_t blocks) {
    free_blocks_ -= blocks;
    evict_front(blocks);
  }
  void evict_front(int64_t blocks);
  void resumed(int32_t id, int64_t hit_blocks);
  int64_t cached_tokens(const Request& r) const;

  // Lazy bookkeeping.
  void make_lazy_where_possible();
  void leave_lazy(int32_t id);
  void make_all_explicit();

  // Arrivals and the clock (EngineClock in core/reference.py).
  bool arrival_pending() const { return next_arrival_ < arrivals_.size(); }
  double next_arrival_s() const { return arrivals_[next_arrival_].first; }
  double schedule_time_s() const;
  void enqueue_arrivals(double scheduled_at_s);
  void execute(double scheduled_at_s);
  double end_after(int64_t quiet_steps) const;

  // Closed-form runs of quiet steps, the horizon, the result.
  bool quiet(const StepInfo& info) const;
  int64_t run_length();
  int64_t steps_before_next_arrival(int64_t limit) const;
  void fast_forward(int64_t steps);
  double elapsed_s(int64_t extra_steps = 0) const;
  int64_t steps_until_horizon(int64_t limit) const;
  bool infeasible_upfront(Result& result) const;
  void finish(Result& result, Status status);

  const EngineConfig cfg_;
  const BatchTimeCoefficients coef_;
  const Options opt_;
  std::vector<Request> reqs_;
  std::vector<std::pair<int32_t, int64_t>> running_;  // admission order, with stale entries
  int64_t num_running_ = 0;                           // requests in RUNNING
  std::vector<int32_t> explicit_;                     // running requests not lazy, in admission order
  std::vector<int32_t> waiting_;                      // reversed: the head of the queue is back()
  LazyDecoders lazy_;
  int64_t free_blocks_;
  // Waiting with own blocks in the free queue (prefix caching on), in the order those go: the state's, then those
  // preempted here.
  std::vector<int32_t> resumable_;
  int64_t shared_blocks_;
  int64_t watermark_blocks_;
  int64_t next_seq_ = 0;
  int32_t query_;
  // Explicit requests sampling in the step in flight (async) or in the current step (sync); lazy ones implicitly.
  std::vector<int32_t> pending_, sampled_;
  std::vector<std::pair<int64_t, int32_t>> order_;  // scratch: (seq, id) of the requests a step must visit
  std::vector<std::pair<double, int32_t>> arrivals_;  // (time, id) by time, the query last among equals
  size_t next_arrival_ = 0;
  Batch batch_;
  int64_t num_batches_ = 0, num_steps_ = 0, num_preemptions_ = 0;
  // The clock: the last step ended at origin_ + eq. 12 time of the batches since origin_ (exact integer sums).
  double origin_ = 0.0, last_end_ = 0.0, end_before_last_ = 0.0, not_before_ = 0.0;
  int64_t num_timed_ = 0;
  i128 num_tokens_ = 0, decode_context_ = 0, prefill_attention_ = 0;
  std::vector<Batch> batches_;
};

}  // namespace bear::sim
