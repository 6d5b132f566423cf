#include "actors/op_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "actors/messages.hpp"
#include "actors/op_device.hpp"
#include "actors/op_state.hpp"
#include "core/live_gate.hpp"
#include "core/ring_reduce.hpp"

namespace fusion {

node_spec make_node_spec(const graph& g, int id) {
  const graph_node& n = g.nodes.at(id);
  node_spec s;
  s.id = id;
  s.name = n.name;
  s.kind = n.kind;
  s.attrs = n.attrs.values();
  for (int p : n.inputs) {
    const graph_node& prod = g.nodes[p];
    s.input_shapes.push_back(prod.shape);
    s.input_types.push_back(static_cast<uint8_t>(prod.type));
    s.producer_is_input.push_back(prod.is_input() ? 1 : 0);
  }
  for (auto& c : n.consumers) s.consumer_slots.push_back(c.slot);
  // Our index in each producer's consumer list, matched by (node, slot).
  for (int slot = 0; slot < static_cast<int>(n.inputs.size()); ++slot) {
    const auto& cons = g.nodes[n.inputs[slot]].consumers;
    int idx = -1;
    for (int i = 0; i < static_cast<int>(cons.size()); ++i)
      if (cons[i].node == id && cons[i].slot == slot) idx = i;
    s.index_at_producer.push_back(idx);
  }
  s.is_loss = id == g.loss_node;
  s.is_logits = id == g.logits_node;
  return s;
}

namespace {

using namespace op_internal;

// Timing slots of the backend (backend::begin_timing): forward and backward of each micro-batch.
size_t forward_slot(uint32_t mb) { return 2 * size_t{mb}; }
size_t backward_slot(uint32_t mb) { return 2 * size_t{mb} + 1; }

size_t consumer_count(const op_state& st) { return st.spec.consumer_slots.size(); }

// The sink of micro-batch `mb` for consumer (or input slot) `i` in per-micro-batch `sinks`.
const tensor_sink& sink_of(const op_state& st, const std::vector<tensor_sink>& sinks, size_t i, uint32_t mb,
                           const char* what) {
  const size_t M = st.run.micro_batches;
  const size_t at = i * M + mb % M;
  if (at >= sinks.size() || !sinks[at])
    throw std::runtime_error(std::string("no ") + what + " " + std::to_string(i) + " is wired for micro-batch " +
                             std::to_string(mb) + " on replica " + std::to_string(st.ring.replica));
  return sinks[at];
}

void report_failure(self_ptr self, const std::string& what) {
  if (self->state.coordinator)
    self->send(self->state.coordinator, fail_atom::value,
               make_error(fusion_errc::op_failed, "op actor '" + self->state.spec.name + "' failed: " + what));
}

void report_grads(self_ptr self, uint64_t step) {
  auto& st = self->state;
  double sq = 0;
  for (auto& g : st.grads) sq += st.dev->sum_of_squares(g);
  // Local steps: the norm of the gradient this replica steps with (clipped per replica).
  const double factor = local_grad_factor(st);
  sq *= factor * factor;
  self->send(st.coordinator, grads_atom::value, step, static_cast<int32_t>(st.spec.id),
             static_cast<int32_t>(st.ring.replica), sq,
             std::exchange(st.fwd_seconds, std::vector<double>(st.run.micro_batches, 0.0)),
             std::exchange(st.bwd_seconds, std::vector<double>(st.run.micro_batches, 0.0)),
             static_cast<int32_t>(st.gate.end_step()), std::exchange(st.reduce_stat, reduce_timing{}));
}

// Sends what the ring all-reduce of `step` gives to send; once it is done, its sums become the
// gradients (every replica now holds the same bits) and the replica reports them.
void advance_reduce(self_ptr self, uint64_t step, std::vector<ring_reducer::message> out) {
  auto& st = self->state;
  send_ring(self, step, out);
  {
    ring_work_timer work(st.reduce_stat);
    auto it = st.reduces.find(step);
    if (it == st.reduces.end() || !it->second.done()) return;
    const std::vector<float>& sum = it->second.values();
    size_t at = 0;
    for (auto& g : st.grads) {
      tensor host(g.shape(), dtype::f32);
      const auto n = static_cast<size_t>(host.numel());
      std::copy(sum.begin() + static_cast<std::ptrdiff_t>(at), sum.begin() + static_cast<std::ptrdiff_t>(at + n),
                host.f32());
      at += n;
      g = st.dev->upload(std::move(host));
    }
    st.reduces.erase(it);
  }
  st.reduce_stat.ring_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.backward_done).count();
  report_grads(self, step);
}

// This replica's backward of the step is done: with one replica it reports its gradients; with
// several they are summed around the ring first (all parameter gradients as one f32 buffer).
void finish_backward(self_ptr self, uint64_t step) {
  auto& st = self->state;
  for (uint32_t m : st.ring.local_mbs) {
    st.fwd_seconds.at(m) = st.dev->timed_seconds(forward_slot(m));
    st.bwd_seconds.at(m) = st.dev->timed_seconds(backward_slot(m));
  }
  // Local steps: each replica steps on its own gradients; the replicas meet at the sync.
  if (st.ring.replicas < 2 || st.params.empty() || local_steps(st)) return report_grads(self, step);
  // A message of an abandoned earlier step must not wait forever for its all-reduce.
  st.reduces.erase(st.reduces.begin(), st.reduces.lower_bound(step));
  st.backward_done = std::chrono::steady_clock::now();
  std::vector<ring_reducer::message> out;
  {
    ring_work_timer work(st.reduce_stat);
    std::vector<float> flat;
    for (auto& g : st.grads) {
      tensor host = st.dev->download(g);
      flat.insert(flat.end(), host.f32(), host.f32() + host.numel());
    }
    out = reducer_of(st, step).start(std::move(flat));
  }
  advance_reduce(self, step, std::move(out));
}

void run_forward(self_ptr self, uint64_t step, uint32_t mb, pass_mode mode, std::vector<tensor> inputs);

// Keeps what micro-batch `mb`'s backward needs. An op whose backward reads no input values (add,
// identity, pooling) keeps only their shapes: a residual stream would otherwise hold a copy per
// add and per fan-out node until the backward. Freeing after queueing the forward is safe on a
// GPU too: allocations are stream-ordered on the device's one stream (ops/cuda/device.cu).
void save_forward(op_state& st, uint32_t mb, std::vector<tensor> inputs, std::vector<tensor> aux) {
  saved_entry e;
  for (auto& t : inputs) e.shapes.push_back(t.shape());
  if (!st.impl->backward_reads_inputs())
    for (auto& t : inputs) t = tensor();
  e.inputs = std::move(inputs);
  e.aux = std::move(aux);
  st.saved[mb] = std::move(e);
}

// The position of micro-batch `mb` among the ones this replica runs (its live_gate index).
size_t local_index(const op_state& st, uint32_t mb) {
  return static_cast<size_t>(std::lower_bound(st.ring.local_mbs.begin(), st.ring.local_mbs.end(), mb) -
                             st.ring.local_mbs.begin());
}

// Runs the held forwards the gate now admits, in micro-batch order (a forward of the loss runs
// its backward at once, which may admit the next).
void release_held(self_ptr self) {
  auto& st = self->state;
  while (!st.held.empty() && st.gate.may_forward(local_index(st, st.held.begin()->first))) {
    const uint32_t mb = st.held.begin()->first;
    held_forward h = std::move(st.held.begin()->second);
    st.held.erase(st.held.begin());
    run_forward(self, h.step, mb, pass_mode::train, std::move(h.inputs));
  }
}

// Runs backward for every micro-batch of this replica whose output gradients are complete,
// strictly in micro-batch order, so parameter gradients accumulate in the same order on every run.
void drain_backward(self_ptr self, uint64_t step) {
  auto& st = self->state;
  const size_t expected = st.spec.is_loss ? 1 : consumer_count(st);
  if (!st.gate.may_backward()) return;  // GPipe: every forward of the step first
  while (st.next_bwd < st.ring.local_mbs.size()) {
    const uint32_t mb = st.ring.local_mbs[st.next_bwd];
    auto it = st.pending_bwd.find(mb);
    if (it == st.pending_bwd.end() || it->second.have != static_cast<int>(expected)) return;
    auto entry = std::move(it->second);
    st.pending_bwd.erase(it);
    auto sv = st.saved.find(mb);
    if (sv == st.saved.end()) throw std::runtime_error("backward for micro-batch " + std::to_string(mb) +
                                                       " without a saved forward");
    tensor dout = std::move(entry.grads[0]);
    for (size_t i = 1; i < entry.grads.size(); ++i) {
      if (entry.grads[i].shape() != dout.shape())
        throw std::runtime_error("gradients for micro-batch " + std::to_string(mb) + " disagree in shape: " +
                                 to_string(entry.grads[i].shape()) + " vs " + to_string(dout.shape()));
      st.dev->add_inplace(dout, entry.grads[i]);
    }
    st.dev->begin_timing(backward_slot(mb));
    const std::vector<shape_t>& shapes = sv->second.shapes;
    size_t n_in = shapes.size();
    std::vector<tensor> din(n_in);
    std::vector<tensor*> din_ptrs(n_in, nullptr);
    for (size_t i = 0; i < n_in; ++i) {
      if (st.spec.producer_is_input[i] || !st.impl->input_has_grad(i)) continue;
      din[i] = st.dev->zeros(shapes[i], dtype::f32);
      din_ptrs[i] = &din[i];
    }
    std::vector<const tensor*> in_ptrs, p_ptrs;
    std::vector<tensor*> g_ptrs;
    for (auto& t : sv->second.inputs) in_ptrs.push_back(&t);
    for (auto& t : st.params) p_ptrs.push_back(&t);
    for (auto& t : st.grads) g_ptrs.push_back(&t);
    st.impl->backward({in_ptrs, p_ptrs, &dout, &sv->second.aux, din_ptrs, g_ptrs, st.dev->context()});
    // Handed on without waiting: the producers' kernels queue behind these on the device's one
    // stream, and a host reader (a CPU op, an edge sender) waits for them (ops/backend.hpp).
    st.dev->end_timing(backward_slot(mb));
    for (size_t i = 0; i < n_in; ++i) {
      if (st.spec.producer_is_input[i]) continue;
      if (din[i].empty()) din[i] = tensor(shapes[i], dtype::f32);  // no-grad slot: host zeros
      self->send(sink_of(st, st.producers, i, mb, "producer of input"), backward_atom::value, step, mb,
                 static_cast<uint32_t>(st.spec.index_at_producer[i]), std::move(din[i]));
    }
    st.saved.erase(sv);  // after the sends: in_ptrs point into it
    st.gate.backward_done();
    if (++st.next_bwd == st.ring.local_mbs.size()) {
      st.next_bwd = 0;
      return finish_backward(self, step);
    }
  }
}

void add_output_grad(self_ptr self, uint64_t step, uint32_t mb, uint32_t consumer, tensor grad) {
  auto& st = self->state;
  if (!std::binary_search(st.ring.local_mbs.begin(), st.ring.local_mbs.end(), mb))
    throw std::runtime_error("a gradient for micro-batch " + std::to_string(mb) + " reached replica " +
                             std::to_string(st.ring.replica) + ", which does not run it");
  size_t expected = st.spec.is_loss ? 1 : consumer_count(st);
  auto& e = st.pending_bwd[mb];
  if (e.grads.empty()) e.grads.resize(expected);
  if (consumer >= expected || !e.grads[consumer].empty())
    throw std::runtime_error("unexpected gradient from consumer " + std::to_string(consumer) +
                             " for micro-batch " + std::to_string(mb));
  e.grads[consumer] = st.dev->upload(std::move(grad));
  ++e.have;
  drain_backward(self, step);
  release_held(self);
}

void run_forward(self_ptr self, uint64_t step, uint32_t mb, pass_mode mode, std::vector<tensor> inputs) {
  auto& st = self->state;
  tensor out;
  std::vector<tensor> aux;
  std::vector<metric_value> metrics;
  if (!st.impl) {  // a data input: pass through
    out = std::move(inputs[0]);
  } else {
    const bool timed = mode == pass_mode::train && mb < st.fwd_seconds.size();
    if (timed) st.dev->begin_timing(forward_slot(mb));
    std::vector<shape_t> shapes;
    std::vector<dtype> types;
    std::vector<const tensor*> in_ptrs, p_ptrs;
    std::vector<tensor*> b_ptrs;
    for (auto& t : inputs) shapes.push_back(t.shape()), types.push_back(t.type()), in_ptrs.push_back(&t);
    for (auto& t : st.params) p_ptrs.push_back(&t);
    for (auto& t : st.buffers) b_ptrs.push_back(&t);
    out = st.dev->empty(st.impl->infer_shape(shapes, types), dtype::f32);
    // Metrics (accuracy) are what evaluation reports; training passes skip their cost.
    const bool want_metrics = mode == pass_mode::eval && st.spec.is_loss;
    st.impl->forward({in_ptrs, p_ptrs, &out, &aux, st.dev->context(), b_ptrs, mode == pass_mode::train,
                      want_metrics ? &metrics : nullptr});
    if (timed) st.dev->end_timing(forward_slot(mb));
    // The output is handed on without waiting (the device's one stream orders the consumers'
    // kernels after these), except by an op that reads token ids or targets: its wait reports a
    // bad id that a CUDA kernel recorded now, before anything is computed from it.
    if (st.reads_data) st.dev->synchronize();
  }
  if (st.spec.is_loss) {
    std::vector<double> flat;  // (sum, count) per metric, in op::metric_names() order
    for (auto& m : metrics) flat.push_back(m.sum), flat.push_back(m.count);
    self->send(st.coordinator, loss_atom::value, step, mb, static_cast<double>(read_scalar(*st.dev, out)),
               std::move(flat));
    if (mode == pass_mode::train) {
      save_forward(st, mb, std::move(inputs), std::move(aux));
      st.gate.forward_done();
      tensor seed_grad(shape_t{}, dtype::f32);
      seed_grad.f32()[0] = 1.0f / static_cast<float>(st.run.micro_batches);
      add_output_grad(self, step, mb, 0, std::move(seed_grad));  // uploaded there
    }
    return;
  }
  if (mode == pass_mode::train && st.impl) {
    save_forward(st, mb, std::move(inputs), std::move(aux));
    st.gate.forward_done();
  }
  if (mode == pass_mode::infer && st.spec.is_logits) {
    self->send(st.coordinator, output_atom::value, step, mb, to_host(*st.dev, std::move(out)));
    return;
  }
  auto mode_u8 = static_cast<uint8_t>(mode);
  const size_t n = consumer_count(st);
  for (size_t i = 0; i < n; ++i) {
    auto slot = static_cast<uint32_t>(st.spec.consumer_slots[i]);
    const tensor_sink& to = sink_of(st, st.consumers, i, mb, "consumer");
    if (i + 1 == n)
      self->send(to, forward_atom::value, step, mb, slot, mode_u8, std::move(out));
    else
      self->send(to, forward_atom::value, step, mb, slot, mode_u8, out);
  }
  // GPipe: gradients that came in early (another replica's route) wait for the last forward.
  if (mode == pass_mode::train && st.gate.forwards_first()) drain_backward(self, step);
}

void apply_step(self_ptr self, uint64_t step, double lr, float scale) {
  auto& st = self->state;
  for (size_t i = 0; i < st.params.size(); ++i) {
    auto& p = st.params[i];
    if (st.run.optim.kind == "sgd")
      st.dev->sgd_update(p, st.grads[i], st.m[i], lr, st.run.optim, st.param_specs[i].decay, scale);
    else
      st.dev->adamw_update(p, st.grads[i], st.m[i], st.v[i], static_cast<int64_t>(step) + 1, lr, st.run.optim,
                           st.param_specs[i].decay, scale);
    st.grads[i].zero();
  }
  st.dev->synchronize();  // a failed update is reported by this step, not by a later one
}

// `compute` was built by spawn_op_actor (so device errors reach the spawner); the actor takes
// ownership of its parts.
op_actor::behavior_type op_actor_fn(self_ptr self, node_spec spec, actor_run_params run, std::shared_ptr<op_compute> compute) {
  auto& st = self->state;
  st.spec = std::move(spec);
  st.run = run;
  st.fwd_seconds.assign(run.micro_batches, 0.0);
  st.bwd_seconds.assign(run.micro_batches, 0.0);
  st.reads_data = std::any_of(st.spec.producer_is_input.begin(), st.spec.producer_is_input.end(),
                              [](auto is_input) { return is_input != 0; });
  st.dev = std::move(compute->dev);
  st.impl = std::move(compute->impl);
  st.param_specs = std::move(compute->param_specs);
  st.params = std::move(compute->params);
  st.grads = std::move(compute->grads);
  st.m = std::move(compute->m);
  st.v = std::move(compute->v);
  st.buffer_specs = std::move(compute->buffer_specs);
  st.buffers = std::move(compute->buffers);
  reset_outer_state(st);
  // Every handler converts exceptions into a fail message: nothing escapes the actor.
  auto guarded = [self](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      report_failure(self, e.what());
    }
  };
  return {
      [=](connect_atom, std::vector<tensor_sink>& consumers, std::vector<tensor_sink>& producers,
          op_reporter& coordinator, replica_ring& ring) -> caf::result<bool> {
        // Between steps only (the coordinator re-wires at step boundaries): nothing is in flight.
        auto& st = self->state;
        const size_t M = st.run.micro_batches;
        if (ring.local_mbs.empty() && ring.replicas <= 1)
          for (uint32_t m = 0; m < M; ++m) ring.local_mbs.push_back(m);
        std::string bad;
        if (consumers.size() != consumer_count(st) * M || producers.size() != st.spec.input_shapes.size() * M)
          bad = std::to_string(consumers.size()) + " consumer and " + std::to_string(producers.size()) +
                " producer routes arrived for " + std::to_string(consumer_count(st)) + " consumers, " +
                std::to_string(st.spec.input_shapes.size()) + " inputs and " + std::to_string(M) + " micro-batches";
        else if (ring.replicas < 1 || ring.replica >= ring.replicas || (ring.replicas > 1 && !ring.next))
          bad = "replica " + std::to_string(ring.replica) + " of " + std::to_string(ring.replicas) + " without a ring";
        else if (!std::is_sorted(ring.local_mbs.begin(), ring.local_mbs.end()) ||
                 std::any_of(ring.local_mbs.begin(), ring.local_mbs.end(), [M](uint32_t m) { return m >= M; }))
          bad = "its micro-batches are not ascending indices below " + std::to_string(M);
        if (!bad.empty())
          return make_error(fusion_errc::connect_failed, "op actor '" + st.spec.name + "' cannot be wired: " + bad);
        st.consumers = std::move(consumers);
        st.producers = std::move(producers);
        st.coordinator = std::move(coordinator);
        st.ring = std::move(ring);
        st.next_bwd = 0;
        st.gate = live_gate(st.ring.live_limit, st.ring.forwards_first, st.ring.local_mbs.size());
        st.held.clear();
        greet_ring(self);
        return true;  // the coordinator waits for every actor before it sends data
      },
      [=](forward_atom, uint64_t step, uint32_t mb, uint32_t slot, uint8_t mode, tensor& value) {
        if (mode == static_cast<uint8_t>(pass_mode::state)) {  // migrated state, tensor number `mb`
          auto& st = self->state;
          // Only an actor spawned for a migration and not wired yet takes state: on a wired op
          // such a tensor is a bad (or hostile) message and is refused, not kept.
          if (st.coordinator)
            return report_failure(self, "a migration state tensor arrived for an op that is not being migrated");
          st.incoming[mb] = std::move(value);
          return finish_import(self);
        }
        guarded([&] {
          auto& st = self->state;
          size_t arity = st.impl ? st.spec.input_shapes.size() : 1;
          auto& e = st.pending_fwd[mb];
          if (e.inputs.empty()) e.inputs.resize(arity);
          if (slot >= arity || !e.inputs[slot].empty())
            throw std::runtime_error("unexpected input for slot " + std::to_string(slot) + " of micro-batch " +
                                     std::to_string(mb));
          e.inputs[slot] = st.dev->upload(std::move(value));
          if (++e.have < static_cast<int>(arity)) return;
          auto inputs = std::move(e.inputs);
          st.pending_fwd.erase(mb);
          // The schedule's bound (1F1B): a training forward waits for an earlier backward.
          if (mode == static_cast<uint8_t>(pass_mode::train) && st.impl && !st.gate.may_forward(local_index(st, mb))) {
            st.held[mb] = {step, std::move(inputs)};
            return;
          }
          run_forward(self, step, mb, static_cast<pass_mode>(mode), std::move(inputs));
        });
      },
      [=](backward_atom, uint64_t step, uint32_t mb, uint32_t consumer, tensor& grad) {
        guarded([&] { add_output_grad(self, step, mb, consumer, std::move(grad)); });
      },
      [=](reduce_atom, uint64_t step, uint32_t k, tensor& chunk) {
        guarded([&] {
          auto& st = self->state;
          if (local_steps(st) && step == ring_greeting_step) return;  // greet_ring's: opened the link
          if (st.ring.replicas < 2 || st.params.empty())
            throw std::runtime_error("a gradient ring message arrived, but this op has no replicas to sum with");
          if (chunk.type() != dtype::f32 || chunk.shape().size() != 1)
            throw std::runtime_error("gradient ring step " + std::to_string(k) + " carried a tensor of shape " +
                                     to_string(chunk.shape()) + ", not a flat f32 chunk");
          std::vector<ring_reducer::message> out;
          {
            ring_work_timer work(st.reduce_stat);
            const tensor host = st.dev->download(chunk);
            std::vector<float> values(host.f32(), host.f32() + host.numel());
            out = reducer_of(st, step).receive(k, std::move(values));
          }
          if (local_steps(st)) return advance_sync(self, step, std::move(out));
          advance_reduce(self, step, std::move(out));
        });
      },
      [=](step_atom, uint64_t step, double lr, float scale) -> caf::result<stepped_atom, int32_t> {
        try {
          apply_step(self, step, lr, scale * local_grad_factor(self->state));
          if (sync_due(self->state, step)) return begin_sync(self, step);
        } catch (const std::exception& e) {
          auto err = make_error(fusion_errc::op_failed,
                                "op actor '" + self->state.spec.name + "' failed in the optimizer step: " + e.what());
          // A sync that began owns the request's answer: the error goes through its promise.
          if (auto& rp = self->state.sync_rp; rp.pending()) {
            auto taken = std::exchange(rp, caf::response_promise{});
            taken.deliver(std::move(err));
            return taken;
          }
          return err;
        }
        return {stepped_atom::value, static_cast<int32_t>(self->state.spec.id)};
      },
      [=](get_state_atom) -> caf::result<named_tensors> {
        // Between a sync step's inner update and the replicas' average (train.sync=local:H) the
        // parameters are neither the step's nor the sync's: a recovery that read them would mix
        // synced and unsynced layers. It takes the checkpoint instead.
        if (self->state.sync_rp.pending())
          return make_error(fusion_errc::op_failed, "op actor '" + self->state.spec.name +
                                                        "' is between its optimizer update and the replicas' sync: "
                                                        "its state is not a step's");
        try {
          return collect_state(self->state);
        } catch (const std::exception& e) {
          return make_error(fusion_errc::op_failed, "op actor '" + self->state.spec.name + "': " + e.what());
        }
      },
      [=](export_atom, tensor_sink& sender, uint64_t step) -> caf::result<state_export> {
        named_tensors out;
        try {
          out = collect_state(self->state);
        } catch (const std::exception& e) {
          return make_error(fusion_errc::op_failed, "op actor '" + self->state.spec.name + "': " + e.what());
        }
        // In order on one edge: the receiver sees them as tensors 0..n-1 of this step.
        const auto mode = static_cast<uint8_t>(pass_mode::state);
        state_export sent;
        for (auto& [key, t] : out) {
          sent.bytes += t.empty() ? 0 : t.nbytes();
          self->send(sender, forward_atom::value, step, sent.tensors++, uint32_t{0}, mode, std::move(t));
        }
        return sent;
      },
      [=](import_atom, uint32_t count) -> caf::result<bool> {
        auto& st = self->state;
        if (st.import_rp.pending())
          return make_error(fusion_errc::bad_state, "op actor '" + st.spec.name + "' is already importing a state");
        st.import_rp = self->make_response_promise();
        st.incoming_count = count;
        auto rp = st.import_rp;
        finish_import(self);
        return rp;
      },
      [=](set_state_atom, named_tensors& in) -> caf::result<bool> {
        try {
          restore_state(self->state, in);
          return true;
        } catch (const std::exception& e) {
          return make_error(fusion_errc::bad_state, "op actor '" + self->state.spec.name + "': " + e.what());
        }
      },
  };
}

}  // namespace

namespace op_internal {

ring_reducer& reducer_of(op_state& st, uint64_t step) {
  auto it = st.reduces.find(step);
  if (it == st.reduces.end())
    it = st.reduces.emplace(step, ring_reducer(st.ring.replica, st.ring.replicas, st.ring.f16_values)).first;
  return it->second;
}

void send_ring(self_ptr self, uint64_t step, std::vector<ring_reducer::message>& out) {
  auto& st = self->state;
  ring_work_timer work(st.reduce_stat);
  for (auto& m : out) {
    if (!st.ring.next) throw std::runtime_error("replica " + std::to_string(st.ring.replica) + " has no ring successor");
    tensor chunk(shape_t{static_cast<int64_t>(m.values.size())}, dtype::f32);
    std::copy(m.values.begin(), m.values.end(), chunk.f32());
    // The values' bytes on the wire: the ring's codec carries f16 values in two bytes.
    st.reduce_stat.bytes_sent += m.values.size() * (st.ring.f16_values ? 2 : sizeof(float));
    self->send(st.ring.next, reduce_atom::value, step, m.k, std::move(chunk));
  }
}

}  // namespace op_internal

op_actor spawn_op_actor(caf::actor_system& sys, node_spec spec, actor_run_params params) {
  // A precision no node knows (a damaged or newer coordinator) throws here, which the node
  // reports as a spawn error naming it.
  auto compute = std::make_shared<op_compute>(make_op_compute(params.device, parse_gemm_precision(params.precision),
                                                              spec.kind, attr_map{spec.attrs}, spec.input_shapes,
                                                              spec.name, params.seed, params.optim));
  return sys.spawn(op_actor_fn, std::move(spec), std::move(params), std::move(compute));
}

}  // namespace fusion
