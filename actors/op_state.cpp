// An op actor's state out and in: for checkpoints (get_state_atom, set_state_atom) and for a
// migration's import (import_atom), on any device (actors/op_state.hpp).
#include "actors/op_state.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "actors/errors.hpp"

namespace fusion::op_internal {

std::vector<std::string> state_keys(const op_state& st) {
  return state_key_names(st.spec.name, st.param_specs, st.buffer_specs);
}

named_tensors collect_state(op_state& st) {
  auto keys = state_keys(st);
  named_tensors out;
  size_t k = 0;
  for (size_t i = 0; i < st.params.size(); ++i)
    for (auto* t : {&st.params[i], &st.m[i], &st.v[i]}) out.emplace_back(keys[k++], st.dev->download(*t));
  for (auto& b : st.buffers) out.emplace_back(keys[k++], st.dev->download(b));
  return out;
}

void restore_state(op_state& st, named_tensors& in) {
  auto restore = [&](const std::string& key, tensor* dst) {
    auto it = std::find_if(in.begin(), in.end(), [&](auto& kv) { return kv.first == key; });
    if (it == in.end()) throw std::runtime_error("checkpoint has no tensor '" + key + "'");
    if (it->second.shape() != dst->shape() || it->second.type() != dtype::f32)
      throw std::runtime_error("checkpoint tensor '" + key + "' has shape " + to_string(it->second.shape()) +
                               ", model expects " + to_string(dst->shape()));
    *dst = st.dev->upload(std::move(it->second));
  };
  for (size_t i = 0; i < st.params.size(); ++i) {
    const std::string key = st.spec.name + "/" + st.param_specs[i].name;
    for (auto [suffix, dst] : {std::pair{"", &st.params[i]}, {".m", &st.m[i]}, {".v", &st.v[i]}})
      restore(key + suffix, dst);
  }
  for (size_t i = 0; i < st.buffers.size(); ++i)
    restore(st.spec.name + "/" + st.buffer_specs[i].name, &st.buffers[i]);
  st.dev->synchronize();
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
