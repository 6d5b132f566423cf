// Local steps across slow links (train.sync=local:H, as DiLoCo does): each replica of an op steps
// its own optimizer on its own micro-batches' gradients, and at every H-th step boundary the
// replicas average their parameter change since the last sync (the pseudo-gradient) through the
// same ring as the gradient all-reduce (f32 or f16, core/ring_reduce.hpp) and apply the outer
// Nesterov step (ops/optim.hpp outer_update) from the parameters of the last sync. Every replica
// holds the same anchors and outer momentum and receives the same ring sum, so they all end with
// the same bits. Ops with one replica take the outer step alone. Buffers (batch-norm statistics)
// are averaged the same way, without the outer optimizer.
#include <algorithm>
#include <utility>

#include "actors/op_state.hpp"
#include "ops/optim.hpp"

namespace fusion::op_internal {

namespace {

// The host copy of a tensor (`dev` may be a GPU): what the outer state is kept as.
tensor host_copy(backend& dev, const tensor& t) { return dev.download(t); }

// Replica's weight in the average: its share of the step's micro-batches (1/R when the routes
// are dealt evenly, DiLoCo's plain mean), so that local:1 with outer lr 1 and momentum 0 takes
// the synchronous step's mean gradient when routes are uneven too.
float replica_weight(const op_state& st) {
  if (st.ring.replicas < 2) return 1.0f;
  return static_cast<float>(st.ring.local_mbs.size()) / static_cast<float>(st.run.micro_batches);
}

// Every replica's share of the averaged change is in `mean`: the outer step on the parameters,
// plain averaging on the buffers; then every replica takes the anchors as its state.
void finish_sync(self_ptr self, const std::vector<float>& mean) {
  auto& st = self->state;
  size_t at = 0;
  for (size_t i = 0; i < st.params.size(); ++i) {
    auto n = st.anchors[i].numel();
    outer_update(st.anchors[i].f32(), mean.data() + at, st.outer_m[i].f32(), n, st.run.optim.outer_lr,
                 st.run.optim.outer_momentum);
    at += static_cast<size_t>(n);
    st.params[i] = st.dev->upload(tensor(st.anchors[i]));
  }
  for (size_t i = 0; i < st.buffers.size(); ++i) {
    const auto n = static_cast<size_t>(st.buffer_anchors[i].numel());
    float* a = st.buffer_anchors[i].f32();
    if (st.ring.replicas < 2) {
      // Alone, the statistics are the op's own: anchor - (anchor - b) could round them.
      st.buffer_anchors[i] = host_copy(*st.dev, st.buffers[i]);
    } else {
      for (size_t j = 0; j < n; ++j) a[j] -= mean[at + j];
      st.buffers[i] = st.dev->upload(tensor(st.buffer_anchors[i]));
    }
    at += n;
  }
  st.dev->synchronize();
  auto rp = std::move(st.sync_rp);
  st.sync_rp = caf::response_promise{};
  rp.deliver(stepped_atom::value, static_cast<int32_t>(st.spec.id));
}

}  // namespace

bool local_steps(const op_state& st) { return st.run.optim.sync_every > 0; }

float local_grad_factor(const op_state& st) {
  if (!local_steps(st) || st.ring.local_mbs.empty()) return 1.0f;
  // Every micro-batch's loss gradient is seeded with 1 / M (the mean over the step's M
  // micro-batches); a replica stepping alone takes the mean over its own.
  return static_cast<float>(st.run.micro_batches) / static_cast<float>(st.ring.local_mbs.size());
}

bool sync_due(const op_state& st, uint64_t step) {
  return local_steps(st) && (step + 1) % static_cast<uint64_t>(st.run.optim.sync_every) == 0;
}

void reset_outer_state(op_state& st) {
  st.anchors.clear();
  st.outer_m.clear();
  st.buffer_anchors.clear();
  if (!local_steps(st)) return;
  for (auto& p : st.params) {
    st.anchors.push_back(host_copy(*st.dev, p));
    tensor zero(p.shape(), dtype::f32);
    std::fill(zero.f32(), zero.f32() + zero.numel(), 0.0f);
    st.outer_m.push_back(std::move(zero));
  }
  for (auto& b : st.buffers) st.buffer_anchors.push_back(host_copy(*st.dev, b));
}

void greet_ring(self_ptr self) {
  auto& st = self->state;
  if (!local_steps(st) || st.ring.replicas < 2 || !st.ring.next || st.params.empty()) return;
  tensor hello(shape_t{1}, dtype::f32);
  hello.f32()[0] = 0.0f;
  self->send(st.ring.next, reduce_atom::value, ring_greeting_step, uint32_t{0}, std::move(hello));
}

caf::response_promise begin_sync(self_ptr self, uint64_t step) {
  auto& st = self->state;
  if (st.sync_rp.pending()) throw std::runtime_error("a sync of the replicas began while the last one was still running");
  st.sync_rp = self->make_response_promise();
  auto rp = st.sync_rp;
  std::vector<float> change;  // anchor - now, parameters then buffers, weighted by the replica's share
  const float w = replica_weight(st);
  {
    ring_work_timer work(st.reduce_stat);
    auto append = [&](const tensor& anchor, const tensor& now_dev) {
      const tensor now = st.dev->download(now_dev);
      const float* a = anchor.f32();
      const float* p = now.f32();
      for (int64_t j = 0; j < now.numel(); ++j) change.push_back(w * (a[j] - p[j]));
    };
    for (size_t i = 0; i < st.params.size(); ++i) append(st.anchors[i], st.params[i]);
    for (size_t i = 0; i < st.buffers.size(); ++i) append(st.buffer_anchors[i], st.buffers[i]);
  }
  if (st.ring.replicas < 2 || change.empty()) {
    finish_sync(self, change);
    return rp;
  }
  // A message of an abandoned earlier sync must not wait forever.
  st.reduces.erase(st.reduces.begin(), st.reduces.lower_bound(step));
  std::vector<ring_reducer::message> out;
  {
    ring_work_timer work(st.reduce_stat);
    out = reducer_of(st, step).start(std::move(change));
  }
  advance_sync(self, step, std::move(out));
  return rp;
}

void advance_sync(self_ptr self, uint64_t step, std::vector<ring_reducer::message> out) {
  auto& st = self->state;
  send_ring(self, step, out);
  auto it = st.reduces.find(step);
  if (it == st.reduces.end() || !it->second.done() || !st.sync_rp.pending()) return;
  std::vector<float> mean = std::move(it->second.values());
  st.reduces.erase(it);
  finish_sync(self, mean);
}

}  // namespace fusion::op_internal
