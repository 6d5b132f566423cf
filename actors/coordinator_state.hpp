// The coordinator's state, split by concern (membership, the plan's execution, training, the
// requests being served, live rebalancing, recovery), and the functions its behaviors are made of, shared
// by actors/coordinator_phases.cpp (one behavior per phase), actors/coordinator.cpp (joining,
// planning, wiring, re-wiring, failure, shutdown), actors/coordinator_profile.cpp (the cluster
// profile: loaded or measured before placement), actors/coordinator_train.cpp (training steps
// around core/step_machine.hpp, metrics), actors/coordinator_checkpoint.cpp (saving and loading
// checkpoints, the replicas' divergence check), actors/coordinator_eval.cpp (evaluation
// and sampling), actors/coordinator_admin.cpp (queries, pause/resume, the admin actor) and
// actors/coordinator_recover.cpp (going on without a lost node) and actors/coordinator_join.cpp
// (nodes joining and leaving the running job). Internal to actors/.
#pragma once

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/run_inputs.hpp"
#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"
#include "base/result.hpp"
#include "compression/adaptive.hpp"
#include "core/step_machine.hpp"
#include "scheduler/estimator.hpp"
#include "scheduler/plan.hpp"

namespace fusion {

using clock_type = std::chrono::steady_clock;

/// What the coordinator is waiting for, so that a timeout or a stray message is judged right.
// `step`: a training step is in flight; which part of it (forward/backward or the update) is its
// step machine's stage (core/step_machine.hpp), not a second copy here.
enum class activity : uint8_t { idle, joining, profiling, wiring, step, polling, eval, sample, state, migrating, recovering };

/// The step in flight: its bookkeeping (core/step_machine.hpp), its batch and its record.
struct step_ctx {
  clock_type::time_point t0;
  step_machine machine;
  std::vector<tensor> batch;         // one per feed, kept while micro-batches are fed one by one
  step_record rec;
  // Seconds after t0, on this clock: the latest backward done (a report's arrival less its ring
  // time) and the latest all-reduce done (a replicated op's report), for allreduce_exposed_s.
  double last_backward_s = 0, last_ring_s = -1;
  clock_type::time_point update_t0;  // when the update requests went out (step_record::update_s)
};

/// An evaluation or sampling pass in flight: one batch (eval) or one character (sample) at a
/// time; on_loss and on_output move it on, and it ends by answering whoever asked for it.
struct pass_ctx {
  int64_t index = 0, count = 0;     // eval: batch index and count; sample: characters
  double total = 0;
  std::vector<double> losses;
  std::vector<double> metrics;       // eval: (sum, count) per loss-op metric, summed over the pass
  size_t got = 0;
  std::vector<int32_t> context;      // sample
  std::string text;                  // sample
  std::string prompt;
  double temperature = 0;
  activity resume_as = activity::idle;             // eval: what the coordinator did before the pass
  std::function<void(eval_result)> eval_done;      // who asked: the session, or the training loop
  std::function<void(std::string)> sample_done;
};

/// Work an admin command asked for while a step ran, done at the next step boundary.
struct boundary_task {
  std::function<void(std::function<void()> next)> run;  ///< does the work, then calls `next`
  std::function<void(const caf::error&)> refuse;        ///< the run failed or stopped first
};

struct migration_ctx;
struct recovery_ctx;
struct admission_ctx;

/// Who takes part (cluster mode): the nodes of the cluster file by index.
struct membership_state {
  std::vector<node_actor> nodes;                // null: not joined, or gone
  std::vector<node_hello> hellos;
  /// "waiting" (not joined yet), "spare" (a spare not joined yet), "admitting" (joined the
  /// running job, profiled until the next step boundary), "joined", "draining", "left" (drained),
  /// "lost", "recovered" (lost, the run recovered without it), "exited" (after the run).
  std::vector<std::string> node_state;
  size_t joined = 0;
  /// Nodes joining the running job, by index (actors/coordinator_join.cpp).
  std::map<size_t, std::shared_ptr<admission_ctx>> admitting;
  uint64_t admissions = 0;                      // serial of the last admission begun
  security::challenge_book challenges;          // nonces handed to joining nodes and admin shells
};

/// The plan and what executes it.
struct execution_state {
  cluster_profile profile;
  plan current;
  std::unique_ptr<workload_estimator> estimator;  // cluster mode, from the first step on
  std::vector<op_actor> actors;                 // op actors by graph node id (replica 0 of each)
  /// Every op actor: replicas[op][r] runs replica r of graph node `op` on where.node_of(op, r);
  /// replicas[op][0] == actors[op] (everything that reads only replica 0 uses actors).
  std::vector<std::vector<op_actor>> replicas;
  std::map<uint64_t, edge_sender_actor> senders;  // edge senders by plan edge id
  /// adatopk: the hysteresis of every link direction, by (from node, to node, forward).
  std::map<std::tuple<int, int, bool>, ratio_governor> governors;
  std::set<uint64_t> pinned_edges;              // codecs set by the admin `compress`: AdaTopK leaves them
  std::vector<int> compute_nodes;               // non-input graph node ids
  int64_t micro_rows = 0;
};

/// Training progress: the step in flight, passes, what a stop or pause asked for, the outputs.
struct training_state {
  int64_t step = 0;
  std::optional<step_ctx> cur;
  pass_ctx pass;
  step_record last;                             // the last finished step
  clock_type::time_point t0;                    // when the training job began
  clock_type::time_point last_stepped;          // the last optimizer reply of the last step
  int64_t first_step = 0;                       // the step it began at
  bool training_job = false;                    // a train_atom is being served
  bool stop_requested = false, pause_requested = false, rewire_requested = false;
  clock_type::time_point stop_deadline;
  std::string last_checkpoint;                  // "FILE at step N"
  std::ofstream metrics;
  bool run_record_written = false;
  std::mt19937_64 sample_rng;
};

/// Requests being served, answered when their work is done (or the run fails first).
struct pending_requests {
  caf::response_promise start_rp, train_rp, pass_rp, pause_rp;
  std::vector<caf::response_promise> rewire_rps;
};

/// Live rebalancing: admin work held for the step boundary, the migration in flight, the
/// scheduler actor (actors/coordinator_migrate.cpp, actors/coordinator_schedule.cpp).
struct rebalance_state {
  std::vector<boundary_task> at_boundary;       // admin work waiting for the step boundary
  std::function<void(const caf::error&)> running;  // the refusal of the boundary task running, if any
  uint64_t task_token = 0;                      // raised per task: a refused task's late `next` is ignored
  std::shared_ptr<migration_ctx> migration;     // the migration in flight, if any
  std::map<int, int64_t> settling;              // moved op -> last step not measured (warm-up)
  rebalance_settings settings;                  // scheduler.*, changed by the admin's set / scheduler
  scheduler_actor scheduler;                    // spawned on first use
  bool in_flight = false;                       // a scheduler evaluation is out
  bool offer = false;                           // a node joined: judge a re-plan at the next chance
  std::string last_verdict;                     // "scheduler at step 40: wait: ...", for status and watch
};

/// Automatic recovery from a lost node (actors/coordinator_recover.cpp, docs/recovery.md).
struct recovery_state {
  std::shared_ptr<recovery_ctx> ctx;            // the recovery in flight, if any
  /// Op actors and edge senders of plans given up: their late reports are dropped.
  std::set<caf::actor_addr> retired;
  /// Data-channel failures reported before this follow a loss already handled (stale chunks of
  /// given-up edges, connections to the lost node) and are not failures of the new plan.
  clock_type::time_point quiet_until;
  uint64_t losses = 0;                          // nodes lost so far: a held failure report checks it
  int recoveries = 0;                           // completed
};

/// One op's peer-held snapshots (actors/coordinator_snapshot.cpp): a holder on its node and one
/// on its buddy, joined by an edge of their own.
struct snapshot_route {
  int op = -1;                    ///< graph node id
  int node = -1, buddy = -1;      ///< cluster node indices
  uint32_t tensors = 0;           ///< state tensors of a snapshot
  snapshot_holder local, remote;  ///< on `node` (keeps 2) and on `buddy` (keeps 1)
  uint64_t edge = 0;              ///< the edge from `node` to `buddy` that carries the tensors
};

/// Peer-held snapshots (recovery.snapshot-every, docs/recovery.md).
struct snapshot_state {
  std::vector<snapshot_route> routes;  ///< complete once `ready`
  std::vector<int> placed;             ///< the node of every op they were made for (replica 0)
  bool ready = false, building = false;
  uint64_t generation = 0;             ///< raised by every (re)build: an older one's replies are dropped
  uint64_t build_epoch = 0;            ///< st.epoch when the build began (a recovery abandons it)
  int64_t taken = 0;                   ///< snapshots sent so far
  std::string off;                     ///< why snapshots are off (logged once), "" while they run
  std::vector<std::function<void()>> when_built;  ///< called when the build under way ends
};

/// The coordinator's state, split by concern; the phase decides which messages it takes
/// (actors/coordinator_phases.cpp).
struct coordinator_state {
  std::shared_ptr<run_inputs> in;
  run_phase phase = run_phase::joining;
  activity act = activity::idle;
  std::string failure;                          // plain words, once failed
  uint64_t timer = 0;                           // the armed timeout; older ones are stale
  caf::actor admin;                             // the admin actor, when admin.port is set
  membership_state members;
  execution_state exec;
  training_state train;
  pending_requests pending;
  rebalance_state rebalance;
  recovery_state recovery;
  snapshot_state snap;
  /// Raised when a recovery gives up the plan in flight: replies and errors of requests sent
  /// before (gather, the optimizer step) belong to work that no longer exists and are dropped.
  uint64_t epoch = 0;
  static inline const char* name = "coordinator";
};

using coord_ptr = caf::stateful_actor<coordinator_state>*;

inline double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline std::chrono::milliseconds ms_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, seconds) * 1e3));
}

// ---- actors/coordinator_phases.cpp ----
/// The behavior of phase `p`: its own handlers, then those of every phase.
caf::behavior phase_behavior(coord_ptr self, run_phase p);
/// Sets st.phase and switches to its behavior (become).
void enter(coord_ptr self, run_phase p);
/// Installs the one handler of messages no phase behavior takes: a request is answered with a
/// wrong_phase error naming the phase, a stale notice is dropped.
void set_out_of_phase_handler(coord_ptr self);

// ---- actors/coordinator.cpp ----
void fail(coord_ptr self, const caf::error& e);
/// stop_atom (Ctrl-C, the session): a step in flight gets runtime.stop-grace to finish, a paused
/// training job finishes, a run still starting fails as interrupted.
void request_stop(coord_ptr self);
/// The join timeout expired: fails naming the nodes that did not join.
void join_timed_out(coord_ptr self);
/// Every node has joined (or one process): profile, place, spawn and wire, then ready.
void plan_and_wire(coord_ptr self);
/// Whether a hello comes from a node this run may admit at all: the same protocol version, a
/// valid proof (with credentials), a name of the cluster file. Phase and device are checked apart.
status check_node_identity(coordinator_state& st, const node_hello& h);
/// A node's hello: welcomed with its index, or refused saying why.
caf::result<welcome_atom, int32_t, uint32_t> on_hello(coord_ptr self, node_hello& h, node_actor& node);
/// Admin queries and commands only from this process (the admin actor, the session).
caf::error local_only(coord_ptr self, const char* what);
void arm_timeout(coord_ptr self, double seconds);
std::string node_label(const coordinator_state& st, size_t i);
void begin_join(coord_ptr self);
void apply_rewire(coord_ptr self, std::function<void()> done);
/// Tells every op actor its neighbours under st.current and calls `done` once all have answered.
void connect_all(coord_ptr self, std::function<void()> done);
/// Creates the edge senders of `add` (on each edge's sending node), then their routes (on each
/// receiving node), and calls `done`. Route targets are the op actors of st.actors, or what
/// `target_of` gives; errors fail the run unless `on_error` takes them.
void create_edges(coord_ptr self, std::vector<plan_edge> add, std::function<void()> done,
                  std::function<void(caf::error&)> on_error = nullptr,
                  std::function<tensor_sink(const plan_edge&)> target_of = nullptr);
/// Removes the routes and edge senders of `drop` (edges of a plan that is no longer current).
void drop_edges(coord_ptr self, std::vector<plan_edge> drop, std::function<void()> done);
void shutdown_nodes(coord_ptr self, std::function<void()> done);
/// Spawns an op actor for every (op, replica) of st.exec.current on its node (in one process:
/// here), sets st.exec.actors and replicas, and calls `done`; errors fail the run.
void spawn_ops(coord_ptr self, std::function<void()> done);
/// Refuses (throws, in plain words) a replicated plan where some replica gets no micro-batch.
void check_replica_routes(const coordinator_state& st);
/// The same for a plan about to replace the running one (a migration), M micro-batches a step.
void check_replica_routes(const placement& where, int64_t M, const cluster_spec& c);
/// Every (graph node id, replica) of the current plan, op by op and replica 0 first: of every
/// graph node, or of the compute nodes only.
std::shared_ptr<std::vector<std::pair<int, int>>> replica_pairs(const coordinator_state& st, bool compute_only);

// ---- actors/coordinator_train.cpp ----
/// train_atom: resets the result, writes the run record and starts the step loop.
void begin_training(coord_ptr self);
void begin_step(coord_ptr self);
void on_loss(coord_ptr self, uint64_t s, uint32_t mb, double loss, const std::vector<double>& metrics);
void on_feed(coord_ptr self, uint64_t s, uint32_t mb);
/// Replica `replica` of op `id` reports its squared gradient norm, per micro-batch times and
/// the peak of micro-batches it held alive and what its all-reduce measured.
void on_grads(coord_ptr self, uint64_t s, int32_t id, int32_t replica, double sq, std::vector<double>& fwd,
              std::vector<double>& bwd, int32_t peak_live, const reduce_timing& ring);
void on_output(coord_ptr self, tensor& logits);
void on_step_timeout(coord_ptr self);
void begin_eval(coord_ptr self, std::function<void(eval_result)> done);
/// Every micro-batch loss of the evaluation batch in flight is in: sums it, feeds the next.
void end_eval_batch(coord_ptr self);
/// A batch of `rows` rows: one tensor per feed of the model, shaped like its input with `rows` in
/// place of the micro-batch size (contents undefined).
std::vector<tensor> make_batch(const coordinator_state& st, int64_t rows);
/// Pointers to each tensor of `ts`, for data_source calls.
std::vector<tensor*> tensor_pointers(std::vector<tensor>& ts);
/// Sends micro-batches [first, last) of `batch` (one tensor per feed, or only the first feed
/// when sampling) to the input actors, per_mb rows each (last < 0: through the end).
void feed(coord_ptr self, uint64_t s, pass_mode mode, const std::vector<tensor>& batch, int64_t per_mb,
          int64_t first = 0, int64_t last = -1);
void begin_sample(coord_ptr self, int count, std::string prompt, double temperature, uint64_t seed,
                  std::function<void(std::string)> done);
void finish_training(coord_ptr self, bool interrupted);
/// Creates the directories above `file`; a failure throws with the directory named.
void make_parent_dirs(const std::string& file);
/// Fails the run because training diverged: `what`, a hint, and where the last good state is.
void fail_diverged(coord_ptr self, const std::string& what);
void write_run_record(coord_ptr self);

// ---- actors/coordinator_checkpoint.cpp ----
/// Writes a checkpoint of every op's state to `path`, then calls `done`. A file that cannot be
/// written fails the run, or goes to `on_write_error` when one is given (an admin command).
void save_checkpoint_async(coord_ptr self, std::string path, std::function<void()> done,
                           std::function<void(const std::string&)> on_write_error = nullptr);
/// Loads the checkpoint at `path` into every replica of every op, then calls `done`.
void load_checkpoint_async(coord_ptr self, std::string path, std::function<void()> done);

// ---- actors/coordinator_profile.cpp ----
/// Cluster mode, once every node has joined: sets st.profile from cfg.profile_file when that
/// exists, else measures it (op timings on every node, link probes between sites) and saves it
/// there when one is configured; then calls `done`. A failure fails the run instead.
void prepare_profile(coord_ptr self, std::function<void()> done);

// ---- actors/coordinator_estimate.cpp ----
/// The estimator's prediction of the next step of the current plan, with the feed interval it
/// assumed (all zero in one process, or when the plan cannot be simulated).
step_estimate predict_step(coord_ptr self);
/// The predicted cost of the current plan per stage and cut (plan_report), "" in one process.
std::string describe_prediction(coord_ptr self);
/// Sets the current plan's pipeline schedule from train.schedule (auto: the estimator's
/// choice) and prints it with the predicted step time of both schedules.
void choose_run_schedule(coord_ptr self);
/// train.micro-batches = auto in a cluster run: picks M from the profile (replanning each
/// candidate), prints why, and moves the model, the profile and the estimator to it
/// (actors/micro_batches_auto.cpp). Nothing for a fixed count or a one-process run.
void choose_run_micro_batches(coord_ptr self);
/// Feeds a finished step's op and edge times to the estimator (moving averages).
void observe_step(coord_ptr self, const step_record& rec);
/// The estimator (cluster mode; built from st.profile on first use), or null in one process.
workload_estimator* estimator_of(coord_ptr self);

// ---- actors/coordinator_compress.cpp ----
/// Cluster mode: places the ops and sets the codec of every edge from cfg.compression into
/// st.current (before any actor exists; plan_compressed_run). Throws what placement throws.
void plan_compression(coord_ptr self);
/// adatopk, every compression.every steps: re-evaluates every link direction's ratio from the
/// refined estimator and sends compress_atom to the senders of the links whose ratio changed.
void adapt_compression(coord_ptr self);
// ---- actors/coordinator_migrate.cpp ----
/// Moves the ops whose node differs between st.current and `where` with their state, between
/// two steps (docs/migration.md), and calls `done` with a JSON summary, or with an error when the
/// migration was abandoned and the old placement still runs. Errors after the switch fail the run.
void migrate(coord_ptr self, placement where, std::string reason,
             std::function<void(caf::error, std::string)> done);
/// The `done` of a migration that answers an admin command: `rp` gets the error or the summary,
/// then `then` runs.
inline std::function<void(caf::error, std::string)> answer_then(caf::response_promise rp, std::function<void()> then) {
  return [rp, then](caf::error e, std::string summary) mutable {
    if (e)
      rp.deliver(e);
    else
      rp.deliver(summary);
    then();
  };
}
/// Moves `ops` (graph node ids) to cluster node `node` (checked again: the placement may have
/// changed since the command), answers `rp` and calls `then`.
void run_move(coord_ptr self, std::vector<int> ops, int node, caf::response_promise rp, std::function<void()> then);
/// Checks a move of `ops` to `node` against the run: the placement it gives, or `err` set.
std::optional<placement> check_move(coord_ptr self, const std::vector<int>& ops, int node, caf::error& err);
/// A node whose ops under `where` would need more than 90% of the memory it reported.
struct memory_shortage {
  size_t node = 0;
  double have = 0, need = 0;  ///< bytes reported by the node; bytes its ops would take
};
/// The first node (cluster order) short of memory under `where`, counting every replica's
/// estimated parameters, gradients, moments and saved activations; nothing without an
/// estimator or when every node has room. Nodes that reported no memory are not checked.
std::optional<memory_shortage> short_of_memory(coord_ptr self, const placement& where);
/// Checks a new placement against the run (a change at all, every replica dealt a micro-batch,
/// joined nodes, memory): `where`, or `err` set.
std::optional<placement> check_placement_change(coord_ptr self, const placement& where, caf::error& err);
/// Gives the stage of graph node `op` the replicas `nodes` (set_stage_replicas, checked again at
/// the step boundary), answers `rp` and calls `then`.
void run_set_replicas(coord_ptr self, int op, std::vector<int> nodes, caf::response_promise rp, std::function<void()> then);
/// set_stage_replicas on the running placement, checked: the placement it gives, or `err` set.
std::optional<placement> check_set_replicas(coord_ptr self, int op, const std::vector<int>& nodes, caf::error& err);
/// The run failed during a migration: whoever asked for it hears `why`.
void end_migration(coord_ptr self, const caf::error& why);
/// Whether losing cluster node `node` only abandons the migration in flight (it was a target
/// that hosts no op, nor any replica of one, of the running placement) rather than needing a
/// recovery; abandons it if so.
bool abandon_migration_on_loss(coord_ptr self, size_t node);
/// While a migration has switched to its new plan but not finished wiring it: the plan it left
/// and that plan's actors, still running (nothing otherwise).
std::optional<std::pair<plan, std::vector<std::vector<op_actor>>>> plan_before_switch(coord_ptr self);
/// Whether cluster node `node` holds an op, or a replica of one, in the running placement.
bool holds_ops(const coordinator_state& st, size_t node);

/// Abandons the migration in flight because `why` (a node it involves was lost, and the run
/// recovers): its fresh actors and transfer edges are removed, whoever asked hears why. Nothing
/// when none runs.
void abandon_migration(coord_ptr self, const std::string& why);

// ---- actors/coordinator_recover.cpp ----
/// Whether a lost node is recovered from (recovery.mode, docs/recovery.md) in this phase.
bool recovery_enabled(const coordinator_state& st);
/// Cluster node `node` is gone (`why`): abandons the step in flight, re-plans on the survivors,
/// restores every op's state from a surviving replica or the last checkpoint, rewinds and goes
/// on; an unrecoverable loss fails the run naming the last good checkpoint. False when recovery
/// is off or the phase has nothing to recover (the caller fails the run as before).
bool recover_from_loss(coord_ptr self, size_t node, const std::string& why);
/// A fail_atom report: from an actor of a given-up plan it is dropped; a data-channel failure
/// during or just after a recovery is logged; one that may be the first sign of a loss not
/// yet detected is held for the peer timeout; anything else fails the run.
void on_failure_report(coord_ptr self, caf::error& e);
/// A held failure report is due: it fails the run unless a node was lost since (`losses`).
void held_failure_due(coord_ptr self, caf::error& e, uint64_t losses);
/// Whether the message being handled comes from an actor of a given-up plan.
bool from_retired(coord_ptr self);

// ---- actors/coordinator_snapshot.cpp ----
/// Cluster runs with recovery.snapshot-every: makes the snapshot holders and edges of the
/// current plan (in the background; training goes on meanwhile), replacing those of an older plan.
/// `built`, if given, is called once they are ready, or snapshots are off, or not wanted.
void prepare_snapshots(coord_ptr self, std::function<void()> built = {});
/// Stops the snapshot holders, forgets their snapshots and makes new ones, then calls `built`.
/// For a checkpoint loaded mid-run: the steps it undid must not come back in a recovery, and a
/// holder refuses snapshots older than one it holds.
void renew_snapshots(coord_ptr self, std::function<void()> built);
/// After the optimizer update of a step: every snapshot-every steps, each op sends its state to
/// its holders (export_atom; the op handles it before the next step's update).
void maybe_snapshot(coord_ptr self);
/// Whether snapshot holders exist to recover from.
bool snapshots_ready(const coordinator_state& st);
/// The state every op had after step `step`, from the peer snapshots held on surviving nodes.
struct snapshot_restore {
  uint64_t step = 0;
  std::map<int, named_tensors> states;  ///< by graph node id (every compute op)
  std::string held_by;                  ///< the nodes whose holders supplied it, for people
};
/// Finds the newest step whose snapshot every op has on a node `alive` says survives, fetches
/// it and calls `done`; `failed` gets why not, in plain words.
void restore_from_snapshots(coord_ptr self, std::vector<bool> alive, std::function<void(snapshot_restore)> done,
                            std::function<void(const std::string&)> failed);
// ---- actors/coordinator_join.cpp ----
/// Whether cluster node `i` may take work: joined and not draining.
bool usable_node(const coordinator_state& st, size_t i);
/// usable_node for every node of the cluster file.
std::vector<bool> usable_nodes(const coordinator_state& st);
/// A hello while the run is wired (ready, training, paused): the node is checked as at start,
/// welcomed, profiled in the background and admitted at the next step boundary.
caf::result<welcome_atom, int32_t, uint32_t> on_late_hello(coord_ptr self, node_hello& h, node_actor& node);
/// admit_atom: profiles the node of admission `serial` (after its welcome went out).
void profile_joiner(coord_ptr self, size_t node, uint64_t serial);
/// A node was lost that holds nothing to recover (being admitted, or holding no op and no part
/// in a migration): marks it lost and says so. False when the loss needs a recovery.
bool lost_quietly(coord_ptr self, size_t node, const std::string& why);
/// The admin `drain NODE`: moves its ops to the other nodes, then lets it leave.
caf::result<std::string> command_drain(coord_ptr self, const std::vector<std::string>& args);

// ---- actors/coordinator_commands.cpp ----
/// An admin command (actors/admin_protocol.hpp): pause, resume, move, plan, rebalance, compress,
/// checkpoint, scheduler, set.
caf::result<std::string> run_command(coord_ptr self, const std::string& verb, const std::vector<std::string>& args);
/// Runs `work(rp, next)` now when no step runs and nothing else is in flight, else at the next
/// step boundary; `work` answers `rp` and calls `next` when done.
void run_or_queue(coord_ptr self, caf::response_promise rp,
                  std::function<void(caf::response_promise, std::function<void()>)> work);
/// At a step boundary: runs the work admin commands queued, in order, then calls `done`.
void run_boundary_tasks(coord_ptr self, std::function<void()> done);
/// Answers every queued command with `why` (the run failed or stopped first).
void refuse_boundary_tasks(coord_ptr self, const caf::error& why);
/// Answers the boundary task that runs, if any, with `why` and ends its chain: a lost node cut
/// it short (its replies are dropped, so it would never answer). The tasks after it stay queued.
void refuse_running_task(coord_ptr self, const caf::error& why);

// ---- actors/coordinator_schedule.cpp ----
/// After a step: every scheduler.every steps of an OP-Fence cluster run, asks the scheduler actor
/// for a verdict; a migrate verdict is queued for the step boundary after it arrives.
void maybe_reschedule(coord_ptr self);
/// The scheduler's commands (plan, rebalance, scheduler, set), or nullopt for another verb.
std::optional<caf::result<std::string>> scheduler_command(coord_ptr self, const std::string& verb,
                                                          const std::vector<std::string>& args);

// ---- actors/coordinator_admin.cpp ----
void publish_admin(coord_ptr self);
std::string answer_query(coord_ptr self, const std::string& topic, caf::error& err);
std::string status_json(coord_ptr self);
std::string ops_json(coord_ptr self);
std::string links_json(coord_ptr self);
void request_pause(coord_ptr self, caf::response_promise rp);
std::string request_resume(coord_ptr self, caf::error& err);

/// Sends one request per index and calls `done` with the n replies (in index order) once all
/// are in; the first error fails the run, or goes to `on_error` when one is given (a migration
/// that can be abandoned). `request_i(i)` returns CAF's response handle. Replies that arrive
/// after a recovery gave up the plan they were sent under (st.epoch) are dropped.
template <class T, class RequestI, class Done>
void gather(coord_ptr self, size_t n, RequestI request_i, Done done,
            std::function<void(caf::error&)> on_error = nullptr) {
  struct pending {
    std::vector<T> values;
    size_t left = 0;
    bool failed = false;
  };
  auto g = std::make_shared<pending>();
  const uint64_t epoch = self->state.epoch;
  g->values.resize(n);
  g->left = n;
  if (n == 0) {
    done(std::move(g->values));
    return;
  }
  for (size_t i = 0; i < n; ++i)
    request_i(i).then(
        [=](T& v) {
          if (g->failed || self->state.epoch != epoch) return;
          g->values[i] = std::move(v);
          if (--g->left == 0) done(std::move(g->values));
        },
        [=](caf::error& e) {
          if (g->failed || self->state.epoch != epoch) return;
          g->failed = true;
          if (on_error)
            on_error(e);
          else
            fail(self, e);
        });
}

}  // namespace fusion
