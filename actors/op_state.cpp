// An op actor's state out and in: for checkpoints (get_state_atom, set_state_atom) and for a
// migration's import (import_atom), on any device (actors/op_state.hpp).
#include "actors/op_state.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "actors/errors.hpp"

namespace fusion::op_internal {

std::vector<std::string> state_keys(const op_state& st) {
  // Local steps: the outer state (the same on every replica), after the op's own tensors.
  return state_key_names(st.spec.name, st.param_specs, st.buffer_specs, local_steps(st));
}

named_tensors collect_state(op_state& st) {
  auto keys = state_keys(st);
  named_tensors out;
  size_t k = 0;
  for (size_t i = 0; i < st.params.size(); ++i)
    for (auto* t : {&st.params[i], &st.m[i], &st.v[i]}) out.emplace_back(keys[k++], st.dev->download(*t));
  for (auto& b : st.buffers) out.emplace_back(keys[k++], st.dev->download(b));
  if (local_steps(st)) {
    for (size_t i = 0; i < st.anchors.size(); ++i)
      for (auto* t : {&st.anchors[i], &st.outer_m[i]}) out.emplace_back(keys[k++], tensor(*t));
    for (auto& a : st.buffer_anchors) out.emplace_back(keys[k++], tensor(a));
  }
  return out;
}

void restore_state(op_state& st, named_tensors& in) {
  // The host tensor `key`, checked against the shape of `like`.
  auto take = [&](const std::string& key, const tensor& like) {
    auto it = std::find_if(in.begin(), in.end(), [&](auto& kv) { return kv.first == key; });
    if (it == in.end()) throw std::runtime_error("checkpoint has no tensor '" + key + "'");
    if (it->second.shape() != like.shape() || it->second.type() != dtype::f32)
      throw std::runtime_error("checkpoint tensor '" + key + "' has shape " + to_string(it->second.shape()) +
                               ", model expects " + to_string(like.shape()));
    return std::move(it->second);
  };
  auto restore = [&](const std::string& key, tensor* dst) { *dst = st.dev->upload(take(key, *dst)); };
  for (size_t i = 0; i < st.params.size(); ++i) {
    const std::string key = st.spec.name + "/" + st.param_specs[i].name;
    for (auto [suffix, dst] : {std::pair{"", &st.params[i]}, {".m", &st.m[i]}, {".v", &st.v[i]}})
      restore(key + suffix, dst);
  }
  for (size_t i = 0; i < st.buffers.size(); ++i)
    restore(st.spec.name + "/" + st.buffer_specs[i].name, &st.buffers[i]);
  st.dev->synchronize();
  if (!local_steps(st)) return;
  // Local steps: the outer state as saved; a state without it (a checkpoint of train.sync=step)
  // starts the outer optimizer here, from the restored parameters.
  const std::string first = st.param_specs.empty() ? "" : st.spec.name + "/" + st.param_specs[0].name + ".outer";
  const bool has_outer = !first.empty() && std::any_of(in.begin(), in.end(), [&](auto& kv) { return kv.first == first; });
  reset_outer_state(st);
  if (!has_outer) return;
  auto restore_host = [&](const std::string& key, tensor* dst) { *dst = take(key, *dst); };
  for (size_t i = 0; i < st.anchors.size(); ++i) {
    const std::string key = st.spec.name + "/" + st.param_specs[i].name;
    restore_host(key + ".outer", &st.anchors[i]);
    restore_host(key + ".outer_m", &st.outer_m[i]);
  }
  for (size_t i = 0; i < st.buffer_anchors.size(); ++i)
    restore_host(st.spec.name + "/" + st.buffer_specs[i].name + ".outer", &st.buffer_anchors[i]);
}

void finish_import(self_ptr self) {
  auto& st = self->state;
  if (st.incoming_count < 0 || static_cast<int64_t>(st.incoming.size()) < st.incoming_count) return;
  auto rp = std::move(st.import_rp);
  auto incoming = std::move(st.incoming);
  st.incoming.clear();
  st.incoming_count = -1;
  auto keys = state_keys(st);
  auto refuse = [&](const std::string& why) {
    rp.deliver(make_error(fusion_errc::bad_state, "op actor '" + st.spec.name + "' refused its migrated state: " + why));
  };
  if (incoming.size() != keys.size() || (!incoming.empty() && incoming.rbegin()->first + 1 != incoming.size()))
    return refuse(std::to_string(incoming.size()) + " tensors arrived, the op has " + std::to_string(keys.size()));
  named_tensors in;
  for (auto& [i, t] : incoming) in.emplace_back(keys[i], std::move(t));
  try {
    restore_state(st, in);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  rp.deliver(true);
}

}  // namespace fusion::op_internal
