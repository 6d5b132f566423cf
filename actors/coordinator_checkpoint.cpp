// A coordinator's checkpoints: saving every op's state (one copy per op, the replicas compared
// with it: the divergence detector) and loading a checkpoint into every replica of every op.
#include <algorithm>
#include <map>
#include <optional>

#include "actors/coordinator_state.hpp"
#include "core/checkpoint.hpp"
#include "core/checkpoint_dir.hpp"
#include "scheduler/placement.hpp"

namespace fusion {

// A BPE tokenizer as a checkpoint records it: its size and 64-bit fingerprint as three int32.
static tensor tokenizer_identity(const tok::bpe_tokenizer& t) {
  const uint64_t f = t.fingerprint();
  const std::vector<int32_t> v = {t.size(), static_cast<int32_t>(static_cast<uint32_t>(f)), static_cast<int32_t>(f >> 32)};
  return tensor::from_i32({3}, v);
}

// The checkpoint names of op `id`'s non-trainable buffers (batch norm statistics): each replica
// updates them from its own micro-batches, so they are per replica; the checkpoint holds their
// mean, weighted by the micro-batches each replica runs.
static std::vector<std::string> buffer_keys(const graph& g, int id) {
  const graph_node& n = g.nodes[id];
  std::vector<std::string> out;
  if (!n.impl) return out;
  std::vector<shape_t> in;
  for (int p : n.inputs) in.push_back(g.nodes[p].shape);
  for (auto& b : n.impl->buffers(in)) out.push_back(n.name + "/" + b.name);
  return out;
}

// Whether a checkpoint tensor holds a local-steps outer state (".outer", ".outer_m").
static bool is_outer_key(const std::string& name) {
  auto ends = [&](const std::string& tail) {
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(".outer") || ends(".outer_m");
}

// Local steps (train.sync=local:H): a replica r >= 1 saves its own state (parameters and
// buffers between syncs, optimizer moments always) under the name with this tail.
static std::string replica_tail(int r) { return "@r" + std::to_string(r); }

// With stage replicas: the first op whose replicas hold different parameters or optimizer state
// (parts[k] is the state of replica who[k].second of op who[k].first), or nothing. With local
// steps the replicas share the outer state always, and the parameters and buffers after a sync
// (their optimizer moments are their own).
static std::optional<std::string> diverged_replicas(const coordinator_state& st,
                                                    const std::vector<std::pair<int, int>>& who,
                                                    const std::vector<named_tensors>& parts) {
  if (!st.exec.current.where.replicated()) return std::nullopt;
  const int64_t H = st.in->cfg.optim.sync_every;
  const bool at_sync = H > 0 && st.train.step % H == 0;
  std::map<int, std::vector<replica_state>> by_op;
  std::map<int, const named_tensors*> first;
  for (size_t k = 0; k < who.size(); ++k) {
    auto [id, r] = who[k];
    by_op[id].push_back({st.in->cluster.nodes.at(st.exec.current.where.node_of(id, r)).name, &parts[k]});
    if (r == 0) first[id] = &parts[k];
  }
  for (auto& [id, replicas] : by_op) {
    std::vector<std::string> skip = buffer_keys(st.in->model, id);
    if (H > 0) {
      skip.clear();
      for (auto& [name, t] : *first[id]) {
        const bool moment = name.size() > 2 && (name.compare(name.size() - 2, 2, ".m") == 0 ||
                                                name.compare(name.size() - 2, 2, ".v") == 0);
        if (!is_outer_key(name) && (moment || !at_sync)) skip.push_back(name);
      }
    }
    if (auto bad = replica_divergence(st.in->model.nodes[id].name, replicas, skip)) return bad;
  }
  return std::nullopt;
}

static const tensor* find_named(const named_tensors& all, const std::string& name) {
  for (auto& kv : all)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void save_checkpoint_async(coord_ptr self, std::string path, std::function<void()> done,
                           std::function<void(const std::string&)> on_write_error) {
  auto& st = self->state;
  auto prev = st.act;
  st.act = activity::state;
  auto timeout = ms_of(st.in->cfg.step_timeout_s);
  // The state of every replica (replica 0 first, per op): replica 0's is saved, the others are
  // compared with it (the divergence detector).
  auto who = replica_pairs(st, true);
  gather<named_tensors>(self, who->size(), [=](size_t k) {
    auto [id, r] = (*who)[k];
    return self->request(self->state.exec.replicas[id][r], timeout, get_state_atom::value);
  }, [=](std::vector<named_tensors> states) {
    auto& s = self->state;
    s.act = prev;
    if (auto bad = diverged_replicas(s, *who, states))
      return fail(self, make_error(fusion_errc::bad_state, *bad + " (the checkpoint of step " +
                                                               std::to_string(s.train.step) + " was not written)"));
    const auto& where = s.exec.current.where;
    const bool local = s.in->cfg.optim.sync_every > 0;
    // Local steps save every replica's own buffers (and average them at each sync) instead.
    for (size_t k = 0; k < states.size() && !local; ++k) {
      const int id = (*who)[k].first;
      if ((*who)[k].second != 0 || where.replicas(id) < 2) continue;
      const auto keys = buffer_keys(s.in->model, id);
      if (keys.empty()) continue;
      // who lists an op's replicas together, replica 0 first.
      std::vector<const named_tensors*> others;
      for (int r = 1; r < where.replicas(id); ++r) others.push_back(&states[k + static_cast<size_t>(r)]);
      std::vector<double> weights;
      for (int n : routed_micro_batches(where, where.stage_of(id))) weights.push_back(n);
      average_replica_buffers(states[k], others, keys, weights);
    }
    std::vector<named_tensors> parts;
    for (size_t k = 0; k < states.size(); ++k) {
      const int r = (*who)[k].second;
      if (r == 0) {
        parts.push_back(std::move(states[k]));
      } else if (local) {
        // Every replica's own state, so a resume between syncs (or of the moments) is exact.
        named_tensors own;
        for (auto& [name, t] : states[k])
          if (!is_outer_key(name)) own.emplace_back(name + replica_tail(r), std::move(t));
        parts.push_back(std::move(own));
      }
    }
    checkpoint ck;
    ck.step = static_cast<uint64_t>(s.train.step);
    ck.model_name = s.in->model.name;
    ck.meta = "model_file=" + s.in->cfg.model_file + "\nseed=" + std::to_string(s.in->cfg.seed) + "\n";
    if (s.in->bpe) {
      ck.tensors.emplace_back("@tokenizer", tokenizer_identity(*s.in->bpe));
    } else if (s.in->model.is_text()) {
      std::vector<int32_t> vocab(s.in->tokenizer.chars().begin(), s.in->tokenizer.chars().end());
      ck.tensors.emplace_back("@vocab", tensor::from_i32({static_cast<int64_t>(vocab.size())}, vocab));
    }
    named_tensors all;
    for (auto& part : parts)
      for (auto& kv : part) all.push_back(std::move(kv));
    // Sorted by name so the file does not depend on timing.
    std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (auto& kv : all) ck.tensors.push_back(std::move(kv));
    // A finite loss does not make finite parameters: one huge update can leave NaN or infinity in
    // them (or the optimizer state) before any loss shows it. It must never replace a good file.
    if (auto bad = first_non_finite(ck))
      return fail_diverged(self, "the parameters were no longer finite after step " + std::to_string(s.train.step) + " (" +
                                     *bad + " holds NaN or infinity) and were not saved");
    std::string written;
    try {
      make_parent_dirs(path);
      written = save_checkpoint_to(path, ck, s.in->cfg.keep_checkpoints);
    } catch (const std::exception& e) {
      if (on_write_error) return on_write_error(e.what());
      return fail(self, make_error(fusion_errc::bad_config, std::string("cannot write checkpoint: ") + e.what()));
    }
    s.train.last_checkpoint = written + " at step " + std::to_string(s.train.step);
    done();
  });
}

void load_checkpoint_async(coord_ptr self, std::string path, std::function<void()> done) {
  auto& st = self->state;
  checkpoint ck;
  try {
    ck = fusion::load_checkpoint(path);
    if (ck.model_name != st.in->model.name)
      throw std::runtime_error("checkpoint " + path + " is for model '" + ck.model_name + "', not '" +
                               st.in->model.name + "'");
    const tensor* t = find_tensor(ck, "@tokenizer");
    if (t || st.in->bpe) {
      const tensor mine = st.in->bpe ? tokenizer_identity(*st.in->bpe) : tensor::from_i32({1}, std::vector<int32_t>{-1});
      if (!t || t->numel() != mine.numel() || !std::equal(mine.i32(), mine.i32() + mine.numel(), t->i32()))
        throw std::runtime_error("checkpoint " + path + " was trained with another tokenizer than this run's (" +
                                 (st.in->bpe ? "data.tokenizer " + st.in->cfg.tokenizer_dir : "characters of " + st.in->cfg.data_file) + ")");
    } else if (const tensor* v = find_tensor(ck, "@vocab")) {
      std::vector<int32_t> mine(st.in->tokenizer.chars().begin(), st.in->tokenizer.chars().end());
      if (v->numel() != static_cast<int64_t>(mine.size()) || !std::equal(mine.begin(), mine.end(), v->i32()))
        throw std::runtime_error("checkpoint " + path + " was trained on a corpus with another vocabulary than " +
                                 st.in->cfg.data_file);
    }
  } catch (const std::exception& e) {
    return fail(self, make_error(fusion_errc::bad_state, e.what()));
  }
  auto all = std::make_shared<named_tensors>(std::make_move_iterator(ck.tensors.begin()),
                                             std::make_move_iterator(ck.tensors.end()));
  // The file holds one copy per op; every replica of the op gets it.
  auto who = replica_pairs(st, true);
  auto prev = st.act;
  st.act = activity::state;
  auto timeout = ms_of(st.in->cfg.step_timeout_s);
  const uint64_t step = ck.step;
  gather<bool>(self, who->size(), [=](size_t k) {
    auto& s = self->state;
    auto [id, r] = (*who)[k];
    const std::string prefix = s.in->model.nodes[id].name + "/";
    named_tensors mine;
    for (auto& kv : *all)
      if (kv.first.rfind(prefix, 0) == 0 && kv.first.find('/', prefix.size()) == std::string::npos &&
          kv.first.find('@') == std::string::npos)
        mine.push_back(kv);
    // Local steps: replica r >= 1 takes its own tensors where the file has them (a checkpoint
    // of the same replica count), else replica 0's. Synchronous replicas all take replica 0's,
    // even from a local-steps checkpoint: with their own moments (or parameters saved between
    // syncs) they would drift apart under the same all-reduced gradient.
    if (r > 0 && s.in->cfg.optim.sync_every > 0)
      for (auto& kv : mine)
        if (const tensor* own = find_named(*all, kv.first + replica_tail(r))) kv.second = *own;
    return self->request(s.exec.replicas[id][r], timeout, set_state_atom::value, std::move(mine));
  }, [=](std::vector<bool>) {
    self->state.act = prev;
    self->state.train.step = static_cast<int64_t>(step);
    done();
  });
}

}  // namespace fusion
