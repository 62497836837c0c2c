#include "lazy_decoders.hpp"

#include <limits>

namespace bear::sim {

void LazyDecoders::add(int32_t id, int64_t now, int64_t exit_step) {
  if (buckets_.empty()) buckets_.resize(static_cast<size_t>(block_size_));
  Request& r = requests_[static_cast<size_t>(id)];
  r.mode = Mode::kLazy;
  r.anchor = now;
  r.generation = ++generation_;
  // With tight blocks, the first new block is needed by the step that computes token blocks * block_size + 1.
  const int64_t first_need = now + 1 + (r.blocks * block_size_ - r.computed);
  r.bucket = static_cast<int32_t>(first_need % block_size_);
  std::vector<int32_t>& bucket = buckets_[static_cast<size_t>(r.bucket)];
  r.bucket_index = static_cast<int32_t>(bucket.size());
  bucket.push_back(id);
  exits_.push_back(Exit{exit_step, id, r.generation});
  std::push_heap(exits_.begin(), exits_.end(), std::greater<Exit>());
  ++count_;
  context_sum_ += r.computed;
  // Members that leave and join again each step (a budget too small for them all) would otherwise grow the heap by
  // one entry per member per step: gigabytes over a long replay.
  if (static_cast<int64_t>(exits_.size()) > 2 * count_ + 64) drop_stale_exits();
}

void LazyDecoders::drop_stale_exits() {
  auto stale = [this](const Exit& e) {
    const Request& r = requests_[static_cast<size_t>(e.id)];
    return r.mode != Mode::kLazy || r.generation != e.generation;
  };
  exits_.erase(std::remove_if(exits_.begin(), exits_.end(), stale), exits_.end());
  std::make_heap(exits_.begin(), exits_.end(), std::greater<Exit>());
}

void LazyDecoders::remove(int32_t id, int64_t now) {
  Request& r = requests_[static_cast<size_t>(id)];
  std::vector<int32_t>& bucket = buckets_[static_cast<size_t>(r.bucket)];
  const int32_t moved = bucket.back();
  bucket[static_cast<size_t>(r.bucket_index)] = moved;
  requests_[static_cast<size_t>(moved)].bucket_index = r.bucket_index;
  bucket.pop_back();
  const int64_t steps = now - r.anchor;
  context_sum_ -= r.computed + steps;
  --count_;
  r.computed += steps;
  r.output += steps;
  r.blocks = cdiv(r.computed, block_size_);
  // Scheduled in each of those steps: its latest scheduling found all but the output applied since.
  if (steps > 0) r.hashed = std::max(r.hashed, std::min(r.computed, r.prompt + r.output - 1) / block_size_);
  r.mode = Mode::kExplicit;
}

int64_t LazyDecoders::blocks_needed(int64_t now, int64_t steps) const {
  if (count_ == 0) return 0;
  int64_t needed = steps / block_size_ * count_;
  for (int64_t i = 1; i <= steps % block_size_; ++i) {
    needed += static_cast<int64_t>(buckets_[static_cast<size_t>((now + i) % block_size_)].size());
  }
  return needed;
}

int64_t LazyDecoders::steps_within_blocks(int64_t now, int64_t limit, int64_t free_blocks) const {
  if (blocks_needed(now, limit) <= free_blocks) return limit;
  int64_t fits = 0, short_of_blocks = limit;  // blocks_needed(fits) <= free < blocks_needed(short_of_blocks)
  while (short_of_blocks - fits > 1) {
    const int64_t mid = fits + (short_of_blocks - fits) / 2;
    (blocks_needed(now, mid) <= free_blocks ? fits : short_of_blocks) = mid;
  }
  return fits;
}

int64_t LazyDecoders::next_exit() {
  while (!exits_.empty()) {
    const Exit& top = exits_.front();
    const Request& r = requests_[static_cast<size_t>(top.id)];
    if (r.mode == Mode::kLazy && r.generation == top.generation) return top.step;
    // the request left early (preempted, or all were made explicit)
    std::pop_heap(exits_.begin(), exits_.end(), std::greater<Exit>());
    exits_.pop_back();
  }
  return std::numeric_limits<int64_t>::max();
}

int32_t LazyDecoders::pop_due(int64_t step) {
  if (next_exit() > step) return -1;
  const int32_t id = exits_.front().id;
  std::pop_heap(exits_.begin(), exits_.end(), std::greater<Exit>());
  exits_.pop_back();
  return id;
}

}  // namespace bear::sim
