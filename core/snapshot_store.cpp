// Peer-held snapshots: what a holder keeps and the buddy choice (core/snapshot_store.hpp).
#include "core/snapshot_store.hpp"

#include <algorithm>

#include "core/checkpoint.hpp"

namespace fusion {

uint64_t snapshot_checksum(const std::vector<tensor>& tensors) {
  xxh64_hasher h;
  for (const auto& t : tensors) {
    const uint64_t one = tensor_hash(t);
    h.update(&one, sizeof one);
  }
  return h.digest();
}

snapshot_store::snapshot_store(uint32_t tensors, size_t keep) : tensors_(tensors), keep_(std::max<size_t>(1, keep)) {}

result<bool> snapshot_store::add(uint64_t step, uint32_t index, tensor t) {
  if (index >= tensors_)
    return fail("tensor " + std::to_string(index) + " of the snapshot of step " + std::to_string(step) +
                " is out of range: the op's state has " + std::to_string(tensors_) + " tensors");
  if (!complete_.empty() && step <= complete_.rbegin()->first)
    return fail("a tensor of the snapshot of step " + std::to_string(step) + " arrived, but a complete snapshot of step " +
                std::to_string(complete_.rbegin()->first) + " is held already");
  auto& p = pending_[step];
  if (p.have.empty()) {
    p.tensors.resize(tensors_);
    p.have.assign(tensors_, false);
  }
  if (p.have[index])
    return fail("tensor " + std::to_string(index) + " of the snapshot of step " + std::to_string(step) + " came twice");
  p.tensors[index] = std::move(t);
  p.have[index] = true;
  ++p.count;
  if (p.count < tensors_) return false;
  if (auto s = try_complete(step); !s) return s.failed();
  return true;
}

status snapshot_store::seal(uint64_t step, uint64_t checksum) {
  if (!complete_.empty() && step <= complete_.rbegin()->first)
    return fail("the checksum of the snapshot of step " + std::to_string(step) + " arrived, but a complete snapshot of step " +
                std::to_string(complete_.rbegin()->first) + " is held already");
  auto& p = pending_[step];
  if (p.have.empty()) {
    p.tensors.resize(tensors_);
    p.have.assign(tensors_, false);
  }
  p.checksum = checksum;
  return try_complete(step);
}

status snapshot_store::try_complete(uint64_t step) {
  auto it = pending_.find(step);
  if (it == pending_.end() || it->second.count < tensors_ || !it->second.checksum) return {};
  const uint64_t want = *it->second.checksum;
  const uint64_t got = snapshot_checksum(it->second.tensors);
  if (got != want) {
    pending_.erase(it);
    return fail("the snapshot of step " + std::to_string(step) + " arrived damaged (checksum " + std::to_string(got) +
                ", its sender's " + std::to_string(want) + ") and was dropped");
  }
  complete_[step] = std::move(it->second.tensors);
  pending_.erase(it);
  while (complete_.size() > keep_) complete_.erase(complete_.begin());
  // A stream older than the newest complete snapshot never counts any more.
  pending_.erase(pending_.begin(), pending_.upper_bound(complete_.rbegin()->first));
  return {};
}

std::optional<uint64_t> snapshot_store::checksum_of(uint64_t step) const {
  auto it = pending_.find(step);
  if (it != pending_.end()) {
    if (it->second.count < tensors_) return std::nullopt;
    return snapshot_checksum(it->second.tensors);
  }
  if (auto c = complete_.find(step); c != complete_.end()) return snapshot_checksum(c->second);
  return std::nullopt;
}

std::vector<uint64_t> snapshot_store::complete_steps() const {
  std::vector<uint64_t> out;
  for (auto it = complete_.rbegin(); it != complete_.rend(); ++it) out.push_back(it->first);
  return out;
}

std::optional<std::vector<tensor>> snapshot_store::get(uint64_t step) const {
  auto it = complete_.find(step);
  if (it == complete_.end()) return std::nullopt;
  return it->second;
}

std::vector<uint64_t> snapshot_store::pending_steps() const {
  std::vector<uint64_t> out;
  for (auto& [step, p] : pending_) out.push_back(step);
  return out;
}

uint64_t snapshot_store::bytes() const {
  uint64_t n = 0;
  for (auto& [step, ts] : complete_)
    for (auto& t : ts) n += t.empty() ? 0 : t.nbytes();
  for (auto& [step, p] : pending_)
    for (auto& t : p.tensors) n += t.empty() ? 0 : t.nbytes();
  return n;
}

std::vector<int> snapshot_buddies(const std::vector<std::string>& sites, const std::vector<bool>& alive) {
  const size_t n = sites.size();
  std::vector<int> out(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (i >= alive.size() || !alive[i]) continue;
    int same_site = -1;
    for (size_t k = 1; k < n; ++k) {
      const size_t j = (i + k) % n;
      if (j >= alive.size() || !alive[j]) continue;
      if (sites[j] != sites[i]) {
        out[i] = static_cast<int>(j);
        break;
      }
      if (same_site < 0) same_site = static_cast<int>(j);
    }
    if (out[i] < 0) out[i] = same_site;
  }
  return out;
}

std::optional<uint64_t> newest_common_step(const std::vector<std::vector<uint64_t>>& held) {
  if (held.empty()) return std::nullopt;
  std::vector<uint64_t> common = held[0];
  std::sort(common.begin(), common.end());
  common.erase(std::unique(common.begin(), common.end()), common.end());
  for (size_t i = 1; i < held.size() && !common.empty(); ++i) {
    std::vector<uint64_t> mine = held[i], both;
    std::sort(mine.begin(), mine.end());
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::back_inserter(both));
    common = std::move(both);
  }
  if (common.empty()) return std::nullopt;
  return common.back();
}

}  // namespace fusion
