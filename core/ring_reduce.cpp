#include "core/ring_reduce.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "compression/half.hpp"

namespace fusion {

ring_reducer::ring_reducer(uint32_t replica, uint32_t replicas, bool f16_values)
    : replica_(replica), replicas_(replicas), f16_(f16_values) {
  if (replicas < 2 || replica >= replicas)
    throw std::invalid_argument("a ring all-reduce needs at least 2 replicas and a replica index below their count (" +
                                std::to_string(replica) + " of " + std::to_string(replicas) + ")");
}

std::pair<size_t, size_t> ring_reducer::chunk_range(size_t n, uint32_t c, uint32_t parts) {
  return {n * c / parts, n * (static_cast<size_t>(c) + 1) / parts};
}

uint32_t ring_reducer::chunk_of(uint32_t replica, uint32_t replicas, uint32_t k) {
  const int64_t R = replicas, r = replica, step = k;
  const int64_t c = step < R - 1 ? r - 1 - step : r - (step - (R - 1));
  return static_cast<uint32_t>(((c % R) + R) % R);
}

std::vector<ring_reducer::message> ring_reducer::start(std::vector<float> values) {
  if (started_) throw std::invalid_argument("the ring all-reduce of this replica was started twice");
  started_ = true;
  values_ = std::move(values);
  auto [a, b] = chunk_range(values_.size(), replica_, replicas_);
  std::vector<message> out;
  out.push_back(send_chunk(0, a, b));
  for (auto& m : drain()) out.push_back(std::move(m));
  return out;
}

ring_reducer::message ring_reducer::send_chunk(uint32_t k, size_t a, size_t b) {
  float* own = values_.data() + a;
  // Rounding the own copy too keeps it equal to what the receiver decodes: for the chunk this
  // replica finished, that is the sum every replica ends with. Other own chunks are overwritten
  // by the all-gather later.
  if (f16_)
    for (size_t i = 0; i < b - a; ++i) own[i] = f16_bits_to_f32(f32_to_f16_bits(own[i]));
  return {k, std::vector<float>(own, own + (b - a))};
}

std::vector<ring_reducer::message> ring_reducer::receive(uint32_t k, std::vector<float> chunk) {
  if (k >= steps())
    throw std::invalid_argument("ring step " + std::to_string(k) + " does not exist: " + std::to_string(replicas_) +
                                " replicas take " + std::to_string(steps()) + " steps");
  if (k < next_ || early_.count(k))
    throw std::invalid_argument("ring step " + std::to_string(k) + " arrived twice");
  early_.emplace(k, std::move(chunk));
  if (!started_) return {};
  return drain();
}

std::vector<ring_reducer::message> ring_reducer::drain() {
  std::vector<message> out;
  for (auto it = early_.find(next_); it != early_.end(); it = early_.find(next_)) {
    std::vector<float> in = std::move(it->second);
    early_.erase(it);
    const uint32_t c = chunk_of(replica_, replicas_, next_);
    auto [a, b] = chunk_range(values_.size(), c, replicas_);
    if (in.size() != b - a)
      throw std::invalid_argument("ring step " + std::to_string(next_) + " brought " + std::to_string(in.size()) +
                                  " values for a chunk of " + std::to_string(b - a));
    float* own = values_.data() + a;
    if (next_ < replicas_ - 1) {
      // Reduce-scatter: the running sum that arrived, plus this replica's own part.
      for (size_t i = 0; i < in.size(); ++i) own[i] = in[i] + own[i];
    } else {
      std::copy(in.begin(), in.end(), own);  // all-gather: the finished sum
    }
    ++next_;
    if (next_ == steps()) break;
    out.push_back(send_chunk(next_, a, b));
  }
  return out;
}

}  // namespace fusion
