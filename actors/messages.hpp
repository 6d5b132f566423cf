// Message vocabulary between the coordinator (actors/coordinator.hpp), the node actors, the op
// actors and the edge senders, and the CAF serialization of tensors. Only actors/ and apps/
// include this header (it pulls in CAF). docs/architecture.md draws the protocols.
//
// Wiring: coordinator -> every op actor (every replica of it) connect_atom(consumers, producers,
// coordinator, ring), each answered with `true`; no data is fed before every answer is in
// (across processes, tensors on the data channel could otherwise overtake a connect_atom).
// consumers[i * M + m] is where micro-batch m's output for consumer i goes (producers likewise
// per input slot): with stage replicas each micro-batch takes its own route. connect_atom may be
// sent again between steps (re-wiring: new edge senders, or a neighbour that moved).
//
// Protocol of one training step (S = step, M = micro-batches, m = micro-batch index):
//   coordinator -> input actors   forward_atom(S, m, slot 0, mode, tokens|targets)
//   op actor    -> consumer       forward_atom(S, m, slot, mode, activation)       fan-out: one per consumer
//   loss actor  -> coordinator    loss_atom(S, m, loss, metrics)                   then starts backward
//   op actor    -> producer       backward_atom(S, m, consumer index, gradient)    summed in consumer order
//   op replica  -> ring successor reduce_atom(S, k, gradient chunk)                 R > 1: ring all-reduce
//                                 step k of 2 (R - 1), after its last backward
//   op actor    -> coordinator    grads_atom(S, node id, replica, sum of squared grads, forward
//                                 seconds per micro-batch, backward seconds per micro-batch,
//                                 peak of live micro-batches, reduce_timing) after its last backward (and the all-reduce)
//   coordinator -> param actors   step_atom(S, lr, clip scale) -> stepped_atom(node id), or an error
// Errors never escape an actor: it sends fail_atom(caf::error) to the coordinator, a fusion
// error (actors/errors.hpp) whose message names the op or node.
//
// Across processes (actors/node_actor.hpp): a node asks hello_atom(node_hello, node actor); the
// coordinator answers welcome_atom(index, version) or a fusion_errc::refused error saying why.
// Before placing anything the coordinator profiles the cluster (docs/scheduler.md):
//   coordinator -> node  profile_atom(op signatures) -> device_timing: forward, backward and
//                        update seconds per op key, the CPU share and the free memory
//   coordinator -> node  probe_atom(peer name, host, data port, window ms) -> (Mbit/s, RTT s)
//                        of the link to the peer's data channel, or a connect_failed error
// Both run on a thread of their own on the node, so its mailbox keeps flowing meanwhile.
// The coordinator then asks nodes to spawn_atom op actors, edge_atom senders and route_atom
// receiving ends (edge_atom carries the edge's codec settings; compress_atom changes them on a
// live sender; unroute_atom and drop_atom remove them again when the wiring changes), polls
// stats_atom after every step and ends the run with shutdown_atom. A migration moves an op's
// state node to node over the same edge machinery (export_atom, import_atom, retire_atom). Tensors on a cross-process
// edge travel as wire_chunk messages or over the data channel (a proto/wire.proto header + raw
// bytes) and are acknowledged chunk by chunk with credit_atom, which bounds the bytes in flight
// per edge.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <string>
#include <vector>

#include "actors/errors.hpp"
#include "core/wire.hpp"
#include "ops/optim.hpp"
#include "scheduler/op_timing.hpp"
#include "security/admission.hpp"
#include "tensor/tensor.hpp"

namespace fusion {

/// What a forward pass is for: training saves activations and triggers backward; evaluation only
/// reports the loss; inference sends the logits node's output to the coordinator.
/// `state` is no pass: it marks a tensor of an op's exported state on its way to the op's new
/// node during a migration (micro-batch field: the tensor's index in the state).
enum class pass_mode : uint8_t { train = 0, eval = 1, infer = 2, state = 3 };

using connect_atom = caf::atom_constant<caf::atom("connect")>;
using forward_atom = caf::atom_constant<caf::atom("forward")>;
using backward_atom = caf::atom_constant<caf::atom("backward")>;
/// One ring step of a replicated op's gradient all-reduce (actors/op_actor.cpp).
using reduce_atom = caf::atom_constant<caf::atom("reduce")>;
using loss_atom = caf::atom_constant<caf::atom("loss")>;
using output_atom = caf::atom_constant<caf::atom("output")>;
using grads_atom = caf::atom_constant<caf::atom("grads")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using stepped_atom = caf::atom_constant<caf::atom("stepped")>;
using get_state_atom = caf::atom_constant<caf::atom("getstate")>;
using set_state_atom = caf::atom_constant<caf::atom("setstate")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using welcome_atom = caf::atom_constant<caf::atom("welcome")>;
/// fusion-node's main thread -> its node actor, before the hello: the coordinator to report to.
using coordinator_atom = caf::atom_constant<caf::atom("coord")>;
using spawn_atom = caf::atom_constant<caf::atom("spawn")>;
using edge_atom = caf::atom_constant<caf::atom("edge")>;
/// Node -> node that accepts no inbound connection: dial my data channel (connection reversal).
using reverse_atom = caf::atom_constant<caf::atom("reverse")>;
using route_atom = caf::atom_constant<caf::atom("route")>;
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using credit_atom = caf::atom_constant<caf::atom("credit")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using unroute_atom = caf::atom_constant<caf::atom("unroute")>;
using drop_atom = caf::atom_constant<caf::atom("dropedge")>;
using forget_peer_atom = caf::atom_constant<caf::atom("forgetpeer")>;
using profile_atom = caf::atom_constant<caf::atom("profile")>;
using probe_atom = caf::atom_constant<caf::atom("probe")>;
// The session (actors/trainer.hpp) and tests talking to the coordinator.
using start_atom = caf::atom_constant<caf::atom("start")>;
using train_atom = caf::atom_constant<caf::atom("train")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using sample_atom = caf::atom_constant<caf::atom("sample")>;
using save_atom = caf::atom_constant<caf::atom("save")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using pause_atom = caf::atom_constant<caf::atom("pause")>;
using resume_atom = caf::atom_constant<caf::atom("resume")>;
using rewire_atom = caf::atom_constant<caf::atom("rewire")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
/// Coordinator to itself: feed micro-batch `mb` of step `s` now (paced feeding, see
/// workload_estimator::feed_interval_s).
using feed_atom = caf::atom_constant<caf::atom("feed")>;
/// Coordinator to an edge sender: compress_atom(codec_settings) from the next tensor on
/// (the adaptive rule's ratio changes; docs/compression.md).
using compress_atom = caf::atom_constant<caf::atom("compress")>;
/// Migration (actors/coordinator_migrate.cpp): coordinator -> old op actor export_atom(sender,
/// step) -> state_export, the state tensors it sent through `sender`, an edge sender towards the new
/// node; coordinator -> new op actor import_atom(count) -> true once all `count` arrived and were
/// restored, or a bad_state error; coordinator -> node retire_atom(op actor) ends an op actor it
/// hosts.
using export_atom = caf::atom_constant<caf::atom("export")>;
using import_atom = caf::atom_constant<caf::atom("import")>;
using retire_atom = caf::atom_constant<caf::atom("retire")>;

/// Named tensors, the unit of checkpoint state exchanged with op actors.
using named_tensors = std::vector<std::pair<std::string, tensor>>;

namespace detail {
struct tensor_header {
  uint8_t type = 0;
  std::vector<int64_t> shape;
};
}  // namespace detail

/// Fast path: the element bytes go through apply_raw in one block (host byte order), which the
/// CAF notes measured 10x faster than element-wise encoding. A CUDA tensor is written from a host
/// copy, so remote messages and checkpoint state carry the same bytes from any device (the
/// receiver always gets a CPU tensor and uploads it where it computes).
inline caf::error inspect(caf::serializer& f, tensor& x) {
  if (x.is_cuda()) {
    tensor host;
    try {
      host = x.to_cpu();
    } catch (const std::exception&) {
      return caf::sec::runtime_error;
    }
    return inspect(f, host);
  }
  uint8_t type = static_cast<uint8_t>(x.type());
  auto shape = x.shape();
  uint64_t n = x.empty() ? 0 : x.nbytes();
  return caf::error::eval([&] { return f(caf::meta::type_name("tensor"), type, shape, n); },
                          [&] { return n ? f.apply_raw(n, x.bytes()) : caf::error{}; });
}

/// Rejects headers whose dtype, shape and byte count disagree before allocating anything.
inline caf::error inspect(caf::deserializer& f, tensor& x) {
  uint8_t type = 0;
  std::vector<int64_t> shape;
  uint64_t n = 0;
  if (auto err = f(caf::meta::type_name("tensor"), type, shape, n)) return err;
  if (n == 0 && shape.empty() && type == 0) {
    x = tensor{};
    return {};
  }
  if (type > static_cast<uint8_t>(dtype::f64)) return caf::sec::invalid_argument;
  int64_t count = 1;
  for (auto d : shape) {
    if (d < 0 || (d > 0 && count > (int64_t{1} << 40) / d)) return caf::sec::invalid_argument;
    count *= d;
  }
  if (static_cast<uint64_t>(count) * dtype_size(static_cast<dtype>(type)) != n) return caf::sec::invalid_argument;
  tensor t(std::move(shape), static_cast<dtype>(type));
  if (auto err = n ? f.apply_raw(n, t.bytes()) : caf::error{}) return err;
  x = std::move(t);
  return {};
}

/// For to_string / deep_to_string: the header only.
template <class Inspector>
std::enable_if_t<!std::is_base_of<caf::serializer, Inspector>::value &&
                     !std::is_base_of<caf::deserializer, Inspector>::value,
                 typename Inspector::result_type>
inspect(Inspector& f, tensor& x) {
  auto shape = x.shape();
  return f(caf::meta::type_name("tensor"), shape);
}

/// What a node tells the coordinator when it joins.
/// Admission (actors/secure_link.hpp): challenge_atom(nonce) -> (nonce, security::proof) asks
/// the coordinator or the admin actor to prove its role; login_atom(security::proof) -> name
/// logs an admin shell in.
using challenge_atom = caf::atom_constant<caf::atom("challenge")>;
using login_atom = caf::atom_constant<caf::atom("login")>;

}  // namespace fusion

// In the type's namespace, where CAF's argument-dependent lookup finds it.
namespace fusion::security {
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, proof& x) {
  return f(caf::meta::type_name("proof"), x.certificate, x.nonce, x.challenge, x.signature);
}
}  // namespace fusion::security

namespace fusion {

struct node_hello {
  uint32_t version = 0;       ///< wire_protocol_version of the node's build
  std::string name;           ///< must match a node of the cluster file
  std::string site;
  std::string device;         ///< "cpu" or "cuda:N"
  std::string host;           ///< address peers reach this node's data channel on
  uint16_t data_port = 0;     ///< 0: no data channel, tensors go over CAF
  double gflops = 0;          ///< measured sgemm rate of the device
  uint64_t memory_bytes = 0;  ///< physical memory of the host
  int32_t pid = 0;
  /// With security.mode=tls: the node's certificate and signature answering the coordinator's
  /// challenge (security/admission.hpp); empty in plaintext.
  security::proof proof;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_hello& x) {
  return f(caf::meta::type_name("node_hello"), x.version, x.name, x.site, x.device, x.host, x.data_port, x.gflops,
           x.memory_bytes, x.pid, x.proof);
}

/// One chunk of a tensor on a cross-process edge: the encoded wire header and the raw payload.
/// The sender side references the bytes of a shared tensor (no copy before serialization); the
/// receiving side owns the bytes it read. A chunk never exceeds wire_chunk::max_bytes.
struct wire_chunk {
  static constexpr uint64_t max_bytes = flow_config::max_chunk_bytes;
  std::string header;
  /// Sender side: the first byte of the tensor or payload the bytes come from (an aliasing
  /// pointer that keeps its owner alive; null for an empty tensor).
  std::shared_ptr<const std::byte> source;
  uint64_t offset = 0, length = 0;       ///< sender side: the byte range of `source`
  std::vector<std::byte> received;       ///< receiver side

  const std::byte* data() const { return source ? source.get() + offset : received.data(); }
  uint64_t size() const { return source ? length : received.size(); }
};

inline caf::error inspect(caf::serializer& f, wire_chunk& x) {
  uint64_t n = x.size();
  return caf::error::eval([&] { return f(caf::meta::type_name("wire_chunk"), x.header, n); },
                          [&] { return n ? f.apply_raw(n, const_cast<std::byte*>(x.data())) : caf::error{}; });
}

/// A length beyond max_bytes is refused before allocating (a corrupt or hostile peer).
inline caf::error inspect(caf::deserializer& f, wire_chunk& x) {
  uint64_t n = 0;
  if (auto err = f(caf::meta::type_name("wire_chunk"), x.header, n)) return err;
  if (n > wire_chunk::max_bytes) return caf::sec::invalid_argument;
  x.source.reset();
  x.received.resize(n);
  return n ? f.apply_raw(n, x.received.data()) : caf::error{};
}

template <class Inspector>
std::enable_if_t<!std::is_base_of<caf::serializer, Inspector>::value &&
                     !std::is_base_of<caf::deserializer, Inspector>::value,
                 typename Inspector::result_type>
inspect(Inspector& f, wire_chunk& x) {
  return f(caf::meta::type_name("wire_chunk"), x.header);
}

/// Traffic of one cross-process edge since the last stats_atom poll.
struct edge_stat {
  uint64_t edge = 0;
  uint64_t bytes = 0;      ///< payload bytes of the tensors completed (what crossed the wire)
  uint64_t dense_bytes = 0;///< the same tensors uncompressed
  uint64_t tensors = 0;    ///< tensors completed (all chunks acknowledged)
  double seconds = 0;      ///< summed time the link was busy with them: from a tensor's first chunk sent (or
                           ///< the previous tensor's completion, if later) to its last chunk acknowledged
  double encode_s = 0;     ///< summed time spent compressing them
  double keep_ratio = 1;   ///< the sender's current keep ratio (1: dense)
  /// Of `tensors`, those that found the edge idle and were timed from their own first chunk:
  /// their seconds include a round trip (the data's way there, the acknowledgement's way back),
  /// while a tensor queued behind another was timed from that one's acknowledgement and has none.
  uint64_t idle_starts = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, edge_stat& x) {
  return f(caf::meta::type_name("edge_stat"), x.edge, x.bytes, x.dense_bytes, x.tensors, x.seconds, x.encode_s,
           x.keep_ratio, x.idle_starts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, codec_settings& x) {
  return f(caf::meta::type_name("codec_settings"), x.kind, x.keep_ratio, x.values, x.block, x.error_feedback,
           x.scale_block);
}

/// A node's answer to stats_atom: edge traffic sent from it and the CPU it used since the last
/// poll, the wire messages it refused since it started, and the CPU quota it runs under now.
struct node_stats {
  std::vector<edge_stat> edges;
  uint64_t rejected = 0;
  std::string last_rejection;
  /// CPU seconds (user and system, every thread) the node process used since the last poll.
  double cpu_s = 0;
  /// The process's CPU quota now (cores 0: none): a cgroup may change it while the run trains.
  double quota_cores = 0, quota_period_s = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_stats& x) {
  return f(caf::meta::type_name("node_stats"), x.edges, x.rejected, x.last_rejection, x.cpu_s, x.quota_cores,
           x.quota_period_s);
}

// Profiling (scheduler/op_timing.hpp, scheduler/profile.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_signature& x) {
  return f(caf::meta::type_name("op_signature"), x.key, x.kind, x.attrs, x.input_shapes, x.input_types);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_timing& x) {
  return f(caf::meta::type_name("op_timing"), x.forward_s, x.backward_s, x.update_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_timing& x) {
  return f(caf::meta::type_name("device_timing"), x.device, x.ops, x.cpu_share, x.quota.cores, x.quota.period_s,
           x.memory_bytes, x.seconds);
}

/// An op actor's answer to export_atom: what it sent towards its new node.
struct state_export {
  uint32_t tensors = 0;
  uint64_t bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_export& x) {
  return f(caf::meta::type_name("state_export"), x.tensors, x.bytes);
}

// ---- typed interfaces of the data plane ----

/// Anything tensors of a step are sent to: an op actor, or the edge sender that stands in for an
/// op on another node. Senders address a consumer or producer as a tensor_sink and do not know
/// which of the two it is (location transparency, checked by the compiler).
///   forward_atom(step, micro-batch, input slot, pass_mode, activation)
///   backward_atom(step, micro-batch, consumer index, gradient)
///   reduce_atom(step, ring step k, gradient chunk)   from the op's previous replica in its ring
using tensor_sink =
    caf::typed_actor<caf::reacts_to<forward_atom, uint64_t, uint32_t, uint32_t, uint8_t, tensor>,
                     caf::reacts_to<backward_atom, uint64_t, uint32_t, uint32_t, tensor>,
                     caf::reacts_to<reduce_atom, uint64_t, uint32_t, tensor>>;

/// What one replica's gradient all-reduce of a step measured (grads_atom; zeros with one replica).
struct reduce_timing {
  uint64_t bytes_sent = 0;  ///< value bytes this replica sent to its ring successor (f16: 2 per value)
  double work_s = 0;        ///< seconds the op actor spent on the ring: flatten, chunk copies, sums, unflatten
  double ring_s = 0;        ///< seconds from its last backward done to its all-reduce done
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reduce_timing& x) {
  return f(caf::meta::type_name("reduce_timing"), x.bytes_sent, x.work_s, x.ring_s);
}

/// An op actor's place among the replicas of its op (connect_atom): which replica it is, the
/// micro-batches of a step routed through it (ascending), and where its gradient ring goes on.
struct replica_ring {
  tensor_sink next;                 ///< replica (replica + 1) % replicas, or its edge sender; null when replicas == 1
  uint32_t replica = 0;
  uint32_t replicas = 1;
  std::vector<uint32_t> local_mbs;  ///< micro-batches of a step this replica runs (all M when replicas == 1)
  /// The schedule's bound on micro-batches of activations alive at once (live_limits in
  /// scheduler/schedule.hpp): (stages - position) under 1F1B, else 0 (none).
  uint32_t live_limit = 0;
  /// GPipe: no backward before every forward of the step (of local_mbs) is done.
  bool forwards_first = false;
  bool f16_values = false;          ///< the ring carries f16 values (train.allreduce=f16): it rounds what it sends
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_ring& x) {
  return f(caf::meta::type_name("replica_ring"), x.next, x.replica, x.replicas, x.local_mbs, x.live_limit,
           x.forwards_first, x.f16_values);
}

/// What an edge sender sends to node actors: wire_atom(chunk) to the receiving node (when the edge
/// does not use the data channel), and stats_atom(edge_stat) after every tensor and
/// fail_atom(error) to its own node. A typed view of the node actor for the edge sender.
using node_inbox = caf::typed_actor<caf::reacts_to<wire_atom, wire_chunk>, caf::reacts_to<stats_atom, edge_stat>,
                                    caf::reacts_to<fail_atom, caf::error>>;

/// The sending end of a cross-node edge (actors/edge_actor.hpp): a tensor sink that also takes
/// the receiving node's credits and codec changes.
using edge_sender_actor =
    tensor_sink::extend<caf::reacts_to<credit_atom, uint64_t, uint32_t>, caf::reacts_to<compress_atom, codec_settings>>;

/// What an op actor reports to the coordinator: loss_atom(step, micro-batch, loss, metric sums)
/// from the loss op, output_atom(step, micro-batch, logits) when sampling, grads_atom(step, node
/// id, replica, squared gradient norm, forward and backward seconds per micro-batch: zero for
/// the micro-batches another replica ran, the most micro-batches of activations it held at once
/// in the step, and what its all-reduce measured) after its last backward and, with replicas,
/// the gradient all-reduce, and fail_atom(error). A typed view of the coordinator for the senders: the
/// coordinator itself is dynamically typed, because its behavior changes with the run's phase
/// (actors/coordinator_phases.cpp) and a typed CAF actor must take its whole interface in every
/// behavior.
using op_reporter = caf::typed_actor<caf::reacts_to<loss_atom, uint64_t, uint32_t, double, std::vector<double>>,
                                     caf::reacts_to<output_atom, uint64_t, uint32_t, tensor>,
                                     caf::reacts_to<grads_atom, uint64_t, int32_t, int32_t, double,
                                                    std::vector<double>, std::vector<double>, int32_t, reduce_timing>,
                                     caf::reacts_to<fail_atom, caf::error>>;

/// An op actor (actors/op_actor.hpp): a tensor sink that is wired, steps its optimizer and hands
/// over its state. connect_atom(consumers, producers, coordinator, ring) -> true (consumers[i *
/// M + m]: consumer i's sink for micro-batch m; producers[slot * M + m] likewise); step_atom(step, lr,
/// clip scale) -> stepped_atom(node id); get_state_atom -> named tensors; export_atom(sink, step)
/// sends the state through `sink` -> what was sent; import_atom(count) -> true once `count` state
/// tensors arrived and were restored; set_state_atom(named tensors) -> true.
using op_actor = tensor_sink::extend<
    caf::replies_to<connect_atom, std::vector<tensor_sink>, std::vector<tensor_sink>, op_reporter,
                    replica_ring>::with<bool>,
    caf::replies_to<step_atom, uint64_t, double, float>::with<stepped_atom, int32_t>,
    caf::replies_to<get_state_atom>::with<named_tensors>,
    caf::replies_to<export_atom, tensor_sink, uint64_t>::with<state_export>,
    caf::replies_to<import_atom, uint32_t>::with<bool>, caf::replies_to<set_state_atom, named_tensors>::with<bool>>;

// ---- what spawn_atom and edge_atom carry (coordinator -> node) ----

/// Everything an op actor needs to know about its node, independent of the graph object
/// (so that a node can later be spawned in another process from this description alone).
struct node_spec {
  int id = -1;
  std::string name;
  std::string kind;                               ///< op kind, or "input"
  std::map<std::string, std::string> attrs;
  std::vector<shape_t> input_shapes;              ///< shapes at load time (define parameter shapes)
  std::vector<uint8_t> input_types;               ///< dtype of each input, as its integer value
  std::vector<int> consumer_slots;                ///< per consumer: the input slot it feeds
  std::vector<int> index_at_producer;             ///< per input slot: our index in the producer's consumers
  std::vector<uint8_t> producer_is_input;         ///< per input slot: the producer is a data input
  bool is_loss = false;
  bool is_logits = false;
};

/// Training parameters shared by all op actors of a run.
struct actor_run_params {
  uint32_t micro_batches = 1;
  uint64_t seed = 0;
  optim_config optim;
  /// Where the op computes: "cpu", "cuda" or "cuda:N" (ops/backend.hpp make_backend). Data
  /// inputs always stay on the CPU.
  std::string device = "cpu";
  /// How the GEMMs of a CUDA op compute: "fp32" or "bf16" (runtime.precision; ignored on the CPU).
  std::string precision = "fp32";
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_spec& x) {
  return f(caf::meta::type_name("node_spec"), x.id, x.name, x.kind, x.attrs, x.input_shapes, x.input_types,
           x.consumer_slots, x.index_at_producer, x.producer_is_input, x.is_loss, x.is_logits);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optim_config& x) {
  return f(caf::meta::type_name("optim_config"), x.kind, x.lr, x.min_lr, x.beta1, x.beta2, x.eps, x.weight_decay,
           x.momentum, x.grad_clip, x.warmup_steps, x.total_steps, x.sync_every, x.outer_lr, x.outer_momentum);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_run_params& x) {
  return f(caf::meta::type_name("actor_run_params"), x.micro_batches, x.seed, x.optim, x.device,
           x.precision);
}

/// Flow-control settings of one edge sender (core/wire.hpp holds the defaults and limits).
using edge_config = flow_config;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, flow_config& x) {
  return f(caf::meta::type_name("edge_config"), x.window, x.chunk_bytes);
}

// ---- the admin protocol (what each query and command means: actors/admin_protocol.hpp) ----

using query_atom = caf::atom_constant<caf::atom("query")>;
using command_atom = caf::atom_constant<caf::atom("command")>;

/// The admin actor's interface. With security.mode=tls a shell first asks challenge_atom (the
/// coordinator proves its role) and logs in with login_atom and its proof of the admin role
/// (actors/secure_link.hpp); queries and commands from a peer that has not logged in are refused.
using admin_actor = caf::typed_actor<caf::replies_to<query_atom, std::string>::with<std::string>,
                                     caf::replies_to<command_atom, std::string, std::vector<std::string>>::with<std::string>,
                                     caf::replies_to<challenge_atom, std::string>::with<std::string, security::proof>,
                                     caf::replies_to<login_atom, security::proof>::with<std::string>>;

// ---- peer-held snapshots (actors/snapshot_holder.hpp, docs/recovery.md) ----

/// coordinator -> node hold_atom(op name, state tensors, keep, forward, buddy holder) -> a fresh
/// snapshot holder for one op; seal_atom(step, checksum): the sender's checksum of a snapshot;
/// held_atom -> the steps of the complete snapshots held; fetch_atom(step) -> their tensors.
using hold_atom = caf::atom_constant<caf::atom("hold")>;
using seal_atom = caf::atom_constant<caf::atom("seal")>;
using held_atom = caf::atom_constant<caf::atom("held")>;
using fetch_atom = caf::atom_constant<caf::atom("fetch")>;

/// Keeps the snapshots of one op's state (core/snapshot_store.hpp). It takes an op's exported
/// state tensors as a tensor sink (forward_atom, pass_mode::state, micro-batch field: the
/// tensor's index); a holder on the op's own node also passes them on towards its buddy's holder
/// and, once a snapshot is whole, sends that holder the checksum (seal_atom). stop_atom ends it.
using snapshot_holder =
    tensor_sink::extend<caf::reacts_to<seal_atom, uint64_t, uint64_t>,
                        caf::replies_to<held_atom>::with<std::vector<uint64_t>>,
                        caf::replies_to<fetch_atom, uint64_t>::with<std::vector<tensor>>, caf::reacts_to<stop_atom>>;

// ---- the node and the coordinator as their peers see them ----

/// A node actor (actors/node_actor.hpp), one per fusion-node process: the node_inbox of edge
/// senders plus what fusion-node, its data channel and the coordinator ask of it.
///   coordinator_atom(coordinator) -> true        from fusion-node, before its hello; the node
///                                                reports failures to it and stops when it is gone
///   spawn_atom(spec, run) -> op actor;  retire_atom(op) -> whether the node hosted it
///   edge_atom(edge, receiving node, flow, host, data port, receiver dials, peer node name, codec)
///                                                -> edge sender; receiver dials: the receiving node
///                                                accepts no inbound connection, so the sending node
///                                                asks it to dial its own data channel (reverse_atom)
///   reverse_atom(sending node's name, host, data port, token) -> true  once this node has opened
///                                                the data channel connection to the sending node
///   route_atom(edge, target, sender), unroute_atom(edge), drop_atom(edge) -> true
///   forget_peer_atom(node name, host, data port) -> true  the node was lost: its data channel
///                                                connections are aborted, never used again
///   profile_atom(op signatures) -> device_timing
///   probe_atom(peer, host, data port, warm-up ms, window ms) -> (Mbit/s, round trip s)
///   wire_atom(why, stray)                        a chunk its data channel refused
///   stats_atom -> node_stats (edge traffic since the last poll);  shutdown_atom -> true
///   hold_atom(op name, state tensors, keep, forward, buddy) -> a snapshot holder it hosts
using node_actor = node_inbox::extend<
    caf::replies_to<coordinator_atom, op_reporter>::with<bool>,
    caf::replies_to<spawn_atom, node_spec, actor_run_params>::with<op_actor>,
    caf::replies_to<retire_atom, op_actor>::with<bool>,
    caf::replies_to<edge_atom, uint64_t, node_inbox, edge_config, std::string, uint16_t, bool, std::string,
                    codec_settings>::with<edge_sender_actor>,
    caf::replies_to<reverse_atom, std::string, std::string, uint16_t, std::string>::with<bool>,
    caf::replies_to<route_atom, uint64_t, tensor_sink, edge_sender_actor>::with<bool>,
    caf::replies_to<unroute_atom, uint64_t>::with<bool>, caf::replies_to<drop_atom, uint64_t>::with<bool>,
    caf::replies_to<forget_peer_atom, std::string, std::string, uint16_t>::with<bool>,
    caf::replies_to<profile_atom, std::vector<op_signature>>::with<device_timing>,
    caf::replies_to<probe_atom, std::string, std::string, uint16_t, uint32_t, uint32_t>::with<double, double>,
    caf::reacts_to<wire_atom, std::string, bool>, caf::replies_to<stats_atom>::with<node_stats>,
    caf::replies_to<shutdown_atom>::with<bool>,
    caf::replies_to<hold_atom, std::string, uint32_t, uint32_t, edge_sender_actor, snapshot_holder>::with<snapshot_holder>>;

/// The coordinator as a joining node sees it: challenge_atom(nonce) -> (nonce, proof) when the
/// run is secured, then hello_atom(hello, node actor) -> welcome_atom(index, protocol version).
/// A typed view, like op_reporter (the coordinator's behavior changes with its phase).
using coordinator_hub =
    caf::typed_actor<caf::replies_to<challenge_atom, std::string>::with<std::string, security::proof>,
                     caf::replies_to<hello_atom, node_hello, node_actor>::with<welcome_atom, int32_t, uint32_t>>;

/// The coordinator as its session (actors/trainer.hpp, the blocking face of a run) sees it:
/// one request per session call, each answered once the work behind it is done, or with an
/// error (wrong_phase when the run is in no state for it).
using coordinator_session = caf::typed_actor<
    caf::replies_to<start_atom>::with<bool>, caf::replies_to<train_atom>::with<bool>,
    caf::replies_to<eval_atom>::with<std::vector<double>>,
    caf::replies_to<sample_atom, int32_t, std::string, double, uint64_t>::with<std::string>,
    caf::replies_to<save_atom, std::string>::with<bool>, caf::replies_to<load_atom, std::string>::with<bool>,
    caf::replies_to<rewire_atom>::with<bool>, caf::replies_to<query_atom, std::string>::with<std::string>,
    caf::replies_to<command_atom, std::string, std::vector<std::string>>::with<std::string>,
    caf::replies_to<shutdown_atom>::with<bool>>;

/// Registers every message type above with an actor system config (same names on every node).
void add_fusion_message_types(caf::actor_system_config& cfg);

/// coordinator -> itself: admit_atom(node index, admission serial): profile a node that joined
/// the running job, once its welcome has gone out (actors/coordinator_join.cpp).
using admit_atom = caf::atom_constant<caf::atom("admit")>;

}  // namespace fusion
