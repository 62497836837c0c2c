// Running requests that decode one token per step and need nothing else until a known exit step, tracked in
// aggregate: a step costs O(their block needs), not O(their number). A lazy request's counters are anchored at the
// step it joined: after `now` steps its computed and output counts have grown by (now - anchor) each, and it holds
// exactly the blocks its computed tokens need. It needs a new block every block_size steps, so the lazy set is kept
// in block_size buckets by the residue of the steps at which its members need one.
#pragma once

#include <cstdint>
#include <functional>
#include <algorithm>
#include <vector>

#include "sim_request.hpp"

namespace bear::sim {

class LazyDecoders {
 public:
  LazyDecoders(int64_t block_size, std::vector<Request>& requests)
      : block_size_(block_size), requests_(requests) {}

  // Request `id` (steady decode state, tight blocks) joins after `now` steps; it must leave before `exit_step`.
  void add(int32_t id, int64_t now, int64_t exit_step);
  // Request `id` leaves after `now` steps, its counters brought up to date.
  void remove(int32_t id, int64_t now);

  int64_t count() const { return count_; }
  int64_t context_sum() const { return context_sum_; }
  // After `steps` more steps every member's context has grown by `steps`.
  void advance(int64_t steps) { context_sum_ += steps * count_; }

  // Members needing a new block in step `step` (1-based).
  const std::vector<int32_t>& needers(int64_t step) const { return buckets_[static_cast<size_t>(step % block_size_)]; }
  // (Valid once a member has joined: the buckets are allocated then.)
  // Blocks the members need in steps now+1 .. now+steps.
  int64_t blocks_needed(int64_t now, int64_t steps) const;
  // Largest k <= limit such that the blocks needed in steps now+1 .. now+k fit in `free_blocks`.
  int64_t steps_within_blocks(int64_t now, int64_t limit, int64_t free_blocks) const;

  // The earliest step before which a member must leave (INT64_MAX if none).
  int64_t next_exit();
  // The id of a member that must leave before `step` (removed from the exit queue, not from the set), or -1.
  int32_t pop_due(int64_t step);

 private:
  struct Exit {
    int64_t step;
    int32_t id;
    int64_t generation;
    bool operator>(const Exit& other) const { return step > other.step; }
  };
  int64_t block_size_;
  std::vector<Request>& requests_;
  std::vector<std::vector<int32_t>> buckets_;  // allocated when the first member joins
  // A min-heap on step (std::push_heap / pop_heap with std::greater): entries of members that left stay until they
  // reach the top, or until they outnumber the members (then the heap is rebuilt from the live ones).
  std::vector<Exit> exits_;
  void drop_stale_exits();
  int64_t count_ = 0;
  int64_t context_sum_ = 0;  // Σ computed tokens of the members, now
  int64_t generation_ = 0;
};

}  // namespace bear::sim
