// An op actor's state (actors/op_actor.cpp) and what saves, restores and imports it
// (actors/op_state.cpp): shared by the two files only. Internal to actors/.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/op_actor.hpp"
#include "actors/op_device.hpp"
#include "core/live_gate.hpp"
#include "core/ring_reduce.hpp"

namespace fusion::op_internal {

struct fwd_entry {
  std::vector<tensor> inputs;
  int have = 0;
};

struct saved_entry {
  std::vector<tensor> inputs;  // empty tensors when the op's backward does not read them
  std::vector<shape_t> shapes;  // the inputs' shapes (what their gradients are allocated with)
  std::vector<tensor> aux;
};

struct held_forward {  // a forward the live bound holds back (inputs complete)
  uint64_t step = 0;
  std::vector<tensor> inputs;
};

struct bwd_entry {
  std::vector<tensor> grads;  // one per consumer, summed in consumer order for determinism
  int have = 0;
};

// Tensors of an actor live on its backend's device (`dev`): parameters, gradients, optimizer
// state, saved activations and outputs. Incoming tensors are uploaded on arrival; outgoing ones
// leave as they are once the stream is synchronised (a CPU consumer's upload, an edge sender or
// the serializer moves them to the host).
struct op_state {
  node_spec spec;
  actor_run_params run;
  std::unique_ptr<backend> dev;
  std::unique_ptr<op> impl;
  std::vector<param_spec> param_specs;
  std::vector<tensor> params, grads, m, v;
  std::vector<buffer_spec> buffer_specs;
  std::vector<tensor> buffers;  // non-trainable state (batch norm statistics): checkpointed, no optimizer
  // Per micro-batch routes: consumers[i * M + m] takes micro-batch m's output for consumer i,
  // producers[slot * M + m] its gradient for input `slot` (connect_atom).
  std::vector<tensor_sink> consumers, producers;
  op_reporter coordinator;
  replica_ring ring;  // which replica this is, its micro-batches, its all-reduce successor
  std::map<uint32_t, fwd_entry> pending_fwd;
  std::map<uint32_t, saved_entry> saved;
  std::map<uint32_t, bwd_entry> pending_bwd;
  size_t next_bwd = 0;  // index into ring.local_mbs of the next backward
  live_gate gate;       // the schedule's rule (ring.live_limit, ring.forwards_first)
  std::map<uint32_t, held_forward> held;  // training forwards waiting for the gate, by micro-batch
  // Gradient all-reduces by step (replicas > 1): started when this replica's backward is done,
  // or earlier by a faster neighbour's first message.
  std::map<uint64_t, ring_reducer> reduces;
  // What this step's all-reduce measured, reported with the gradients (reduce_timing).
  reduce_timing reduce_stat;
  std::chrono::steady_clock::time_point backward_done;
  std::vector<double> fwd_seconds, bwd_seconds;  // per micro-batch of the current step
  bool reads_data = false;  // an input comes straight from a data input (token ids, targets)
  // A migration's incoming state (import_atom): tensors by index, and the count once announced.
  std::map<uint32_t, tensor> incoming;
  int64_t incoming_count = -1;
  caf::response_promise import_rp;
  // train.sync=local:H (actors/op_local_steps.cpp): the outer optimizer's state, the same on
  // every replica of the op: host copies of the parameters and buffers at the last sync (the
  // anchors the outer step starts from) and the outer Nesterov momentum per parameter.
  std::vector<tensor> anchors, outer_m, buffer_anchors;
  caf::response_promise sync_rp;  // the step_atom of a sync step: answered once the sync is done
  static inline const char* name = "op_actor";
};

using self_ptr = op_actor::stateful_pointer<op_state>;

// Adds the seconds of its scope to the step's ring work (the all-reduce's share of this actor's
// time, which the estimator learns per node).
class ring_work_timer {
 public:
  explicit ring_work_timer(reduce_timing& t) : t_(t), t0_(std::chrono::steady_clock::now()) {}
  ~ring_work_timer() { t_.work_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  ring_work_timer(const ring_work_timer&) = delete;
  ring_work_timer& operator=(const ring_work_timer&) = delete;

 private:
  reduce_timing& t_;
  std::chrono::steady_clock::time_point t0_;
};

/// The ring all-reduce of `step` (gradients, or a local-steps sync), created on first use.
ring_reducer& reducer_of(op_state& st, uint64_t step);
/// Sends ring messages of `step` to the ring successor, counting their value bytes.
void send_ring(self_ptr self, uint64_t step, std::vector<ring_reducer::message>& out);

// ---- local steps (train.sync=local:H): actors/op_local_steps.cpp ----
/// Whether the run takes local steps (run.optim.sync_every > 0).
bool local_steps(const op_state& st);
/// What the replica's gradient is multiplied by before its own step: M over its micro-batches
/// (the loss seeds every micro-batch with 1 / M); 1 without local steps.
float local_grad_factor(const op_state& st);
/// The step number of greet_ring's message, which the ring successor ignores.
constexpr uint64_t ring_greeting_step = ~uint64_t{0};
/// Local steps with replicas: sends the ring successor one value under ring_greeting_step at
/// wiring. The ring's link carries nothing else until the first sync, H steps away, and a
/// node's data channel closes a connection whose first frame has not come within 10 s
/// (net/frame_server.cpp, first_frame_timeout).
void greet_ring(self_ptr self);
/// Whether the step `step` (0-based) ends with a sync: local steps and (step + 1) % H == 0.
bool sync_due(const op_state& st, uint64_t step);
/// Anchors from the current parameters and buffers, outer momentum zero (nothing without local
/// steps): at spawn, and after a state without outer tensors was restored.
void reset_outer_state(op_state& st);
/// Starts the sync after step `step`'s update; the promise answers the step_atom once done.
caf::response_promise begin_sync(self_ptr self, uint64_t step);
/// Sends what the sync's ring gives to send; once done, applies the outer step.
void advance_sync(self_ptr self, uint64_t step, std::vector<ring_reducer::message> out);

/// The names of the state tensors, in the order collect_state lists them: an op of the same spec
/// on another node lists the same names, so a migration ships the tensors by index.
std::vector<std::string> state_keys(const op_state& st);
/// Parameters, optimizer moments and buffers as host tensors, named by state_keys (checkpoint
/// state is host data on every device: it is written to disk or crosses processes).
named_tensors collect_state(op_state& st);
/// Sets every state tensor from `in` (by name); throws naming a missing or misshapen tensor.
void restore_state(op_state& st, named_tensors& in);
/// Restores a migrated state once import_atom announced the count and every tensor arrived,
/// answering the import's promise.
void finish_import(self_ptr self);

}  // namespace fusion::op_internal
