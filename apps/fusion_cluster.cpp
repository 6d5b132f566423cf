// fusion-cluster: validates a cluster file, prints the placement of a model on it, prints the
// cluster in a line format for shell scripts (scripts/sites.sh reads it; it never parses pbtxt),
// and makes the run's certificates (security/certs.hpp).
// Plain main() without CAF. Exit codes (docs/training.md's): 0 done, 1 a file that does not load
// or a plan that does not fit, 2 a mistake in the command line (message on stderr).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.hpp"
#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "core/wire.hpp"
#include "ops/optim.hpp"
#include "scheduler/opfence.hpp"
#include "scheduler/placement.hpp"
#include "scheduler/plan.hpp"
#include "scheduler/compression_plan.hpp"
#include "scheduler/micro_batches.hpp"
#include "scheduler/plan_report.hpp"
#include "security/certs.hpp"

namespace {

using namespace fusion;

constexpr const char* usage_text =
    R"(usage: fusion-cluster check CLUSTER [--model FILE [--train.batch B] [--train.micro-batches M]]
       fusion-cluster plan CLUSTER --model FILE [--train.batch B] [--train.micro-batches M]
                           [--cluster.policy P] [--cluster.profile FILE] [--compression.mode MODE]
                           [--train.schedule S] [--train.allreduce f32|f16] [--train.sync step|local:H]
                           [--json]
       fusion-cluster netns CLUSTER
       fusion-cluster certs CLUSTER --out DIR [--days N] [--force]
       fusion-cluster --help | --version

check   validates the cluster file (format: docs/cluster.md) and prints its sites, nodes and
        links. With --model, also loads the model and prints the plan of a run: the placement
        of its operators on the nodes (policy from the cluster file; per node the ops, their
        estimated FLOPs per step and share, every cross-node edge), then the plan's edges, one
        line per direction of every cross-node edge: id, fwd/bwd, producer -> consumer, from ->
        to node, bytes per micro-batch (of B/M rows), codec.
plan    predicts a run without running it: places the model (micro-batches of B/M rows) with the
        policy P from the profile FILE that fusion-train measured (--cluster.profile), or else
        from the rates the cluster file states (gflops, memory_gib, link mbit), and prints per
        stage the node, its ops, predicted compute per step and memory (a replicated stage: one
        line per replica, "2.1/3" is replica 1 of stage 2's three, with its share of the
        micro-batches), per cut edge the bytes and predicted transfer time, the predicted step
        time and tokens/s, the nodes used and the gradient all-reduce of replicas. With OP-Fence
        also its fences and chosen chain, and with opfence the pipeline-only prediction beside it
        (docs/scheduler.md). --compression.mode MODE (none, topk, adatopk, int8 or int4;
        docs/compression.md) predicts with that codec's default settings and lists every edge's
        codec and bytes on the wire. A plan that puts more on a node than its memory is refused,
        naming the node. The pipeline schedule (--train.schedule) is printed with the predicted
        step time under each of eager, gpipe and 1f1b. --json prints the prediction as one JSON object.
netns   prints the cluster for shell scripts, one item per line, fields separated by spaces:
          site NAME INDEX            (INDEX from 1, file order)
          node NAME SITE DEVICE CPU_SHARE
          firewalled NAME            (a node with accept_inbound: false)
                                     (CPU_SHARE: cores, e.g. 0.5; 0 when uncapped)
          link SITE_A SITE_B MBIT    (each direction; site pairs without a line are unshaped)
          coordinator HOST PORT
        scripts/sites.sh reads it to build the network-namespace emulation of the sites,
        scripts/run-sites.sh to start the nodes (and cap their CPU with cgroups).
certs   makes the run's certificates in DIR (docs/security.md): a cluster CA (ca.pem, ca.key),
        coordinator.pem/.key, admin.pem/.key and nodes/NAME.pem/.key for every node of the
        cluster file. Keys are written with mode 0600. Point every process at DIR with
        --security.certs=DIR.

options (the names and meanings of fusion-train's settings where they are the same):
  --model FILE                 the OP-DAG model file
  --train.batch B              global batch: sequences per optimizer step (default: 16)
  --train.micro-batches M      pipeline micro-batches per step, divides B (default: 4); plan takes
                               auto: the divisor of B with the shortest predicted step that fits
                               (re-planned per candidate; op times of a --profile moved by the
                               GEMM-efficiency model, docs/scheduler.md section 5)
  --cluster.policy P           opfence, opfence-replicas, even or explicit (default: the cluster
                               file's placement policy)
  --cluster.profile FILE       measured rates from fusion-train's profile file (--profile for
                               short; default: the rates the cluster file states)
  --train.schedule S           plan: eager, gpipe, 1f1b or auto (default: auto, the fastest predicted;
                               docs/scheduler.md)
  --train.allreduce f32|f16    plan: the values the replicas' gradient all-reduce carries (default: f32;
                               f16 halves its bytes, docs/scheduler.md)
  --train.sync step|local:H    plan: replicas all-reduce every step (default) or average their parameter
                               change every H steps (1/H of the all-reduce per step, docs/scheduler.md)
  --compression.mode MODE      none, topk, adatopk, int8 or int4 (docs/compression.md): predict with that
                               codec's default settings and list every edge's codec and bytes
                               (default: none)
  --json                       plan: one JSON object instead of the table
  --out DIR                    certs: where the certificates go
  --days N                     certs: days every certificate is valid (default: 365, at most 36500)
  --force                      certs: replace an existing CA in DIR (the certificates it signed
                               stop working)

examples:
  fusion-cluster check configs/clusters/sites-3.pbtxt --model configs/models/gpt-char-small.pbtxt
  fusion-cluster plan configs/clusters/paper-48-b.pbtxt --model configs/models/gpt2-xl.pbtxt \
      --train.batch 32 --train.micro-batches 8 --cluster.policy even

exit codes: 0 done; 1 a file that does not load (cluster, model, profile) or a plan that does not
fit; 2 a mistake in the command line, or certs refusing to replace a CA without --force.
Errors go to stderr as FILE:LINE: message.
)";

std::string mbit_text(double mbit) {
  std::ostringstream s;
  s << mbit;
  return s.str();
}

void print_netns(const cluster_spec& c) {
  for (size_t i = 0; i < c.sites.size(); ++i) std::cout << "site " << c.sites[i].name << " " << i + 1 << "\n";
  for (auto& n : c.nodes)
    std::cout << "node " << n.name << " " << n.site << " " << n.device << " " << mbit_text(n.cpu_share) << "\n";
  for (auto& l : c.links) std::cout << "link " << l.a << " " << l.b << " " << mbit_text(l.mbit) << "\n";
  for (auto& name : c.firewalled_nodes()) std::cout << "firewalled " << name << "\n";
  std::cout << "coordinator " << c.coordinator_host << " " << c.coordinator_port << "\n";
}

void print_summary(const cluster_spec& c) {
  std::cout << c.file << ": cluster '" << c.name << "' is valid: " << c.sites.size() << " sites, " << c.nodes.size()
            << " nodes, " << c.links.size() << " links, coordinator " << c.coordinator_host << ":"
            << (c.coordinator_port == 0 ? std::string("any") : std::to_string(c.coordinator_port)) << ", placement "
            << placement_policy_names()[static_cast<int>(c.placement.policy)] << "\n";
  for (auto& s : c.sites) {
    std::cout << "  site " << s.name << ":";
    for (auto& n : c.nodes)
      if (n.site == s.name)
        std::cout << " " << n.name << " (" << n.device << (n.accept_inbound ? "" : ", accepts no inbound") << ")";
    std::cout << "\n";
  }
  for (size_t a = 0; a < c.sites.size(); ++a)
    for (size_t b = a + 1; b < c.sites.size(); ++b) {
      double m = c.link_mbit(c.sites[a].name, c.sites[b].name);
      std::cout << "  link " << c.sites[a].name << " <-> " << c.sites[b].name << ": "
                << (std::isinf(m) ? std::string("unshaped") : mbit_text(m) + " Mbit/s") << "\n";
    }
  // docs/transport.md, "Connection reversal": a firewalled node dials its senders; two of them
  // cannot reach each other, and their tensors take the slower way through the coordinator.
  if (auto off = c.firewalled_nodes(); off.size() >= 2) {
    std::cout << "  note: nodes";
    for (size_t i = 0; i < off.size(); ++i) std::cout << (i ? ", " : " ") << "'" << off[i] << "'";
    std::cout << " accept no inbound connection: tensors between any two of them go over CAF through the "
                 "coordinator (slower); the others are dialed by them\n";
  }
}


int64_t parse_count(const std::string& flag, const std::string& v, int64_t max = std::numeric_limits<int64_t>::max()) {
  char* end = nullptr;
  errno = 0;
  long long b = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || b < 1) throw usage_error(flag + " needs an integer >= 1, got '" + v + "'");
  if (errno == ERANGE || b > max)
    throw usage_error(flag + " must be at most " + std::to_string(max) + ", got " + v);
  return b;
}

// A hundred years: beyond it a certificate's end date is no longer a date OpenSSL's time
// arithmetic (seconds in a long) and every peer's clock agree on.
constexpr int64_t max_certificate_days = 36500;

nlohmann::json plan_json(const workload_estimator& est, const plan_report& r, const opfence_report* fence,
                         const plan& p, const schedule_choice& sc, const micro_batch_choice* micro) {
  const graph& g = est.model();
  const cluster_spec& c = est.cluster();
  nlohmann::json out = {{"model", g.name}, {"cluster", c.name}, {"micro_batches", est.micro_batches()},
                        {"micro_batch_rows", g.batch}, {"step_s", r.step_s}, {"pipeline_s", r.pipeline_s},
                        {"optimizer_s", r.optimizer_s}, {"tokens_per_s", r.tokens_per_s},
                        {"nodes_used", r.nodes_used}, {"stage_count", r.stage_count},
                        {"allreduce_bytes", r.allreduce_bytes}, {"allreduce_s", r.allreduce_s},
                        {"allreduce_exposed_s", r.allreduce_exposed_s}, {"schedule", schedule_name(p.schedule)},
                        {"schedule_step_s", {{"eager", sc.step_of(pipeline_schedule::eager)},
                                             {"gpipe", sc.step_of(pipeline_schedule::gpipe)},
                                             {"1f1b", sc.step_of(pipeline_schedule::one_f_one_b)}}}};
  if (micro) {  // --train.micro-batches auto: every candidate and why the count was chosen
    nlohmann::json candidates = nlohmann::json::array();
    for (auto& m : micro->candidates)
      candidates.push_back({{"micro_batches", m.micro_batches},
                            {"step_s", m.step_s},
                            {"schedule", schedule_name(m.schedule)},
                            {"peak_bytes", m.peak_bytes},
                            {"fits", m.over_memory.empty()},
                            {"over_memory", m.over_memory}});
    out["micro_batches_auto"] = {{"chosen", micro->chosen}, {"reason", micro->reason}, {"candidates", candidates}};
  }
  out["stages"] = nlohmann::json::array();
  for (auto& s : r.stages) {
    nlohmann::json ops = nlohmann::json::array();
    for (int id : s.ops) ops.push_back(g.nodes[id].name);
    out["stages"].push_back({{"stage", s.stage}, {"replica", s.replica}, {"replicas", s.replicas},
                             {"micro_batches", s.micro_batches},
                             {"node", c.nodes[s.node].name}, {"site", c.nodes[s.node].site},
                             {"device", c.nodes[s.node].device}, {"compute_s", s.compute_s},
                             {"memory_bytes", s.memory_bytes}, {"capacity_bytes", s.capacity_bytes}, {"ops", ops}});
  }
  out["idle_nodes"] = nlohmann::json::array();
  for (int k : r.idle_nodes) out["idle_nodes"].push_back(c.nodes[k].name);
  out["cuts"] = nlohmann::json::array();
  for (auto& x : r.cuts)
    out["cuts"].push_back({{"producer", g.nodes[x.producer].name}, {"consumer", g.nodes[x.consumer].name},
                           {"from", c.nodes[x.from].name}, {"to", c.nodes[x.to].name},
                           {"bytes_per_micro_batch", x.bytes_per_micro_batch},
                           {"mbit", std::isinf(x.mbit) ? nlohmann::json(nullptr) : nlohmann::json(x.mbit)},
                           {"transfer_s", x.transfer_s}});
  if (fence) {
    auto names = [&](const std::vector<int>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (int k : v) a.push_back(c.nodes[k].name);
      return a;
    };
    out["fences"] = nlohmann::json::array();
    for (auto& f : fence->fences) out["fences"].push_back(names(f));
    out["chain"] = names(fence->chain);
    out["candidates"] = fence->candidates;
    out["refined_moves"] = fence->refined_moves;
    out["dp_step_s"] = fence->dp_step_s;
    if (est.cluster().placement.policy == placement_policy::opfence_replicas) {
      out["pipeline_step_s"] = fence->pipeline_step_s;
      out["replica_candidates"] = fence->replica_candidates;
      out["replicated"] = fence->replicated;
    }
  }
  return out;
}

/// What the command line of a command gives; the fields a command lacks stay as they are.
struct command_args {
  std::string cluster_file, model_file, policy, profile_file, out, compression, schedule = "auto", allreduce = "f32";
  std::string sync = "step";
  std::string batch, micro_batches, days;  ///< checked by parse_count once parsing is done
  bool json = false, force = false;
  bool has_batch = false, has_micro_batches = false, has_days = false, has_compression = false;  ///< given at all
};

/// --train.batch and --train.micro-batches (defaults 16 and 4), checked: B divisible by M. For
/// --train.micro-batches auto, M is the reference count the profile is moved from (the middle
/// divisor of B, as fusion-train measures at).
std::pair<int64_t, int64_t> batch_of(const command_args& a) {
  const int64_t batch = a.has_batch ? parse_count("--train.batch", a.batch) : 16;
  int64_t micro = 4;
  if (a.has_micro_batches && a.micro_batches == "auto") {
    const auto candidates = micro_batch_candidates(batch, 64);
    micro = candidates[candidates.size() / 2];
  } else if (a.has_micro_batches) {
    micro = parse_count("--train.micro-batches", a.micro_batches);
  }
  if (batch % micro != 0)
    throw usage_error("--train.batch " + std::to_string(batch) + " is not a multiple of --train.micro-batches " +
                      std::to_string(micro));
  return {batch, micro};
}

// fusion-cluster plan: the prediction of a run from the cluster file (or a measured profile).
int run_plan(const command_args& a) {
  const std::string& cluster_file = a.cluster_file;
  const std::string& model_file = a.model_file;
  const std::string& policy = a.policy;
  const std::string& profile_file = a.profile_file;
  compression_config compression;
  auto [batch, micro] = batch_of(a);
  const bool json = a.json;
  const bool auto_micro = a.has_micro_batches && a.micro_batches == "auto";
  if (a.has_compression && !parse_codec_kind(a.compression, compression.mode))
    throw usage_error("--compression.mode must be " + codec_names() + ", got '" + a.compression + "'");
  if (!parse_value_type(a.allreduce, compression.allreduce) ||
      (compression.allreduce != value_type::f32 && compression.allreduce != value_type::f16))
    throw usage_error("--train.allreduce must be f32 or f16, got '" + a.allreduce + "'");
  int64_t sync_every = 0;
  if (!parse_sync(a.sync, sync_every))
    throw usage_error("--train.sync must be step or local:H with H a whole number >= 1, got '" + a.sync + "'");
  compression.allreduce_every = std::max<int64_t>(1, sync_every);
  pipeline_schedule fixed = pipeline_schedule::eager;
  if (a.schedule != "auto" && !parse_schedule(a.schedule, fixed))
    throw usage_error("--train.schedule must be eager, gpipe, 1f1b or auto, got '" + a.schedule + "'");
  if (cluster_file.empty()) throw usage_error("plan needs a CLUSTER file");
  if (model_file.empty()) throw usage_error("plan needs --model FILE");
  std::optional<placement_policy> chosen;
  if (!policy.empty() && !(chosen = find_placement_policy(policy)))
    throw usage_error("--cluster.policy must be " + cli::one_of(placement_policy_names()) + ", got '" + policy + "'" +
                      cli::suggest(policy, placement_policy_names()));
  cluster_spec c = load_cluster(cluster_file);
  if (chosen) c.placement.policy = *chosen;
  cluster_profile prof = profile_file.empty() ? profile_from_cluster(c) : load_profile(profile_file, c);
  prof.micro_batches = static_cast<int>(micro);
  graph g = load_graph(model_file, batch / micro);
  std::string micro_line;
  std::optional<micro_batch_choice> micro_choice;
  // OP-Fence judges its candidates under the schedule the run takes (each one's fastest under auto).
  std::optional<pipeline_schedule> schedule;
  if (a.schedule != "auto") schedule = fixed;
  if (auto_micro) {
    const micro_batch_choice mc = choose_micro_batches(
        batch, g, c, prof, [&](int64_t rows) { return load_graph(model_file, rows); },
        [&](const workload_estimator& e, const cluster_profile& p) {
          return plan_compressed_run(e, p, compression, 1, nullptr, schedule);
        },
        schedule, estimator_options{});
    micro_line = "micro-batches: " + std::to_string(mc.chosen) + " (auto: " + mc.reason + "); predicted step " +
                 format_candidates(mc) + "\n";
    micro_choice = mc;
    if (mc.chosen != micro) {
      graph chosen_graph = load_graph(model_file, batch / mc.chosen);
      prof = rescale_profile(prof, g, chosen_graph, static_cast<int>(mc.chosen));
      g = std::move(chosen_graph);
      micro = mc.chosen;
    }
  }
  workload_estimator est(g, c, prof);
  opfence_report fence;
  bool is_fence = is_opfence(c.placement.policy);
  plan p = plan_compressed_run(est, prof, compression, 1, &fence, schedule);
  const schedule_choice sc = choose_schedule(est, p);
  p.schedule = schedule.value_or(sc.chosen);
  plan_report r = report_plan(est, p, static_cast<double>(batch * g.row_items));
  check_plan_fits(est, r);
  if (json) {
    std::cout << plan_json(est, r, is_fence ? &fence : nullptr, p, sc, micro_choice ? &*micro_choice : nullptr).dump(2)
              << "\n";
    return 0;
  }
  std::cout << "plan of model '" << g.name << "' (" << g.param_count() / 1e6 << " M parameters; batch " << batch << " = "
            << micro << " micro-batches of " << batch / micro << ") on cluster '" << c.name << "' ("
            << c.nodes.size() << " nodes), policy " << placement_policy_names()[static_cast<int>(c.placement.policy)]
            << ", rates " << (profile_file.empty() ? "stated by the cluster file" : "measured (" + profile_file + ")")
            << "\n";
  for (size_t k = 0; k < c.nodes.size(); ++k)
    if (prof.nodes[k].gflops <= 0 && prof.nodes[k].ops.empty())
      std::cout << "note: node '" << c.nodes[k].name << "' states no gflops and was not measured: assumed "
                << est.options().default_gflops << " GFLOP/s\n";
  if (is_fence) {
    std::cout << "fences:";
    for (auto& f : fence.fences) {
      std::cout << " {";
      for (size_t i = 0; i < f.size(); ++i) std::cout << (i ? " " : "") << c.nodes[f[i]].name;
      std::cout << "}";
    }
    std::cout << "\nchain:";
    for (int k : fence.chain) std::cout << " " << c.nodes[k].name;
    std::cout << " (best of " << fence.candidates << " candidate plans";
    if (fence.refined_moves > 0 && !fence.replicated)
      std::cout << "; the simulator moved cuts " << fence.refined_moves << " time(s): predicted step " << fence.dp_step_s
                << " s -> " << fence.estimate.step_s << " s";
    std::cout << ")\n";
    if (c.placement.policy == placement_policy::opfence_replicas) {
      std::cout << "replicas: " << fence.replica_candidates << " plans with replica groups simulated; ";
      if (fence.replicated)
        std::cout << "groups of up to " << std::max_element(fence.groups.begin(), fence.groups.end(), [](auto& x, auto& y) {
                       return x.size() < y.size();
                     })->size() << " nodes win: predicted step " << fence.estimate.step_s << " s against "
                  << fence.pipeline_step_s << " s pipeline-only (" << fence.pipeline_step_s / fence.estimate.step_s
                  << "x)\n";
      else
        std::cout << "none beats the pipeline-only plan (predicted step " << fence.pipeline_step_s << " s)\n";
    }
  }
  std::cout << micro_line;
  std::cout << "schedule: " << schedule_name(p.schedule) << " ("
            << (a.schedule == "auto" ? "auto: " + sc.reason : "--train.schedule") << "); " << format_predictions(sc)
            << "\n";
  std::cout << format_plan_report(est, r);
  if (compression.mode != codec_kind::none) std::cout << format_plan(g, c, p);
  return 0;
}

// fusion-cluster certs: the CA and one identity per holder of the cluster file.
int run_certs(const command_args& a) {
  const std::string& cluster_file = a.cluster_file;
  const std::string& out = a.out;
  security::cert_options options;
  if (a.has_days) options.days = static_cast<int>(parse_count("--days", a.days, max_certificate_days));
  options.overwrite = a.force;
  if (cluster_file.empty()) throw usage_error("certs needs a CLUSTER file");
  if (out.empty()) throw usage_error("certs needs --out DIR");
  // Like a training run over an earlier run's checkpoints: refused until --force says so.
  if (const std::string ca = (std::filesystem::path(out) / "ca.pem").string(); !a.force && std::filesystem::exists(ca))
    throw usage_error(ca + " exists: the certificates it signed would stop working; pass --force to replace the CA");
  cluster_spec c = load_cluster(cluster_file);
  std::vector<std::string> names;
  for (const auto& n : c.nodes) names.push_back(n.name);
  const std::vector<security::written_file> written = security::make_cluster_certs(out, names, options);
  std::cout << "certificates of cluster '" << c.name << "' (" << names.size() << " nodes, valid " << options.days
            << " days) in " << out << ":\n";
  for (const auto& w : written) std::cout << "  " << w.path << "  " << w.what << "\n";
  std::cout << "point every process at them with security.certs=" << out << "\n";
  return 0;
}

// One command per run; throws usage_error for mistakes in the command line.
int run(int argc, char** argv) {
  cli::command_program program(usage_text, "fusion-cluster " FUSION_VERSION " (wire protocol " +
                                               std::to_string(wire_protocol_version) + ")");
  command_args a;
  CLI::App* check_cmd = program.command("check");
  CLI::App* plan_cmd = program.command("plan");
  CLI::App* netns_cmd = program.command("netns");
  CLI::App* certs_cmd = program.command("certs");
  for (auto* cmd : {check_cmd, plan_cmd, netns_cmd, certs_cmd}) cmd->add_option("cluster", a.cluster_file);
  for (auto* cmd : {check_cmd, plan_cmd}) {
    program.option(cmd, "--model", a.model_file);
    program.option(cmd, "--train.batch", a.batch, &a.has_batch);
    program.option(cmd, "--train.micro-batches", a.micro_batches, &a.has_micro_batches);
    program.renamed(cmd, "--batch", "use --train.batch B and --train.micro-batches M (micro-batches of B/M rows)");
    program.renamed(cmd, "--micro-batches", "use --train.micro-batches M");
  }
  program.option(plan_cmd, "--cluster.policy", a.policy);
  program.option(plan_cmd, "--cluster.profile,--profile", a.profile_file);
  program.option(plan_cmd, "--compression.mode", a.compression, &a.has_compression);
  program.option(plan_cmd, "--train.schedule", a.schedule);
  program.option(plan_cmd, "--train.allreduce", a.allreduce);
  program.option(plan_cmd, "--train.sync", a.sync);
  program.flag(plan_cmd, "--json", a.json);
  for (auto [old_flag, advice] : {std::pair{"--policy", "use --cluster.policy P"},
                                  {"--compression", "use --compression.mode MODE"}})
    program.renamed(plan_cmd, old_flag, advice);
  program.option(certs_cmd, "--out", a.out);
  program.option(certs_cmd, "--days", a.days, &a.has_days);
  program.flag(certs_cmd, "--force", a.force);
  const std::string cmd = program.parse(argc, argv);
  if (cmd.empty()) return 0;  // --help, help or --version
  if (cmd == "plan") return run_plan(a);
  if (cmd == "certs") return run_certs(a);
  const std::string& cluster_file = a.cluster_file;
  const std::string& model_file = a.model_file;
  if (cluster_file.empty()) throw usage_error(cmd + " needs a CLUSTER file");
  if ((a.has_batch || a.has_micro_batches) && model_file.empty())
    throw usage_error(std::string(a.has_batch ? "--train.batch" : "--train.micro-batches") + " needs --model");
  const auto [batch, micro] = batch_of(a);
  cluster_spec c = load_cluster(cluster_file);
  if (cmd == "netns") {
    print_netns(c);
    return 0;
  }
  print_summary(c);
  if (!model_file.empty()) {
    graph g = load_graph(model_file, batch / micro);
    plan p = plan_run(g, c, profile_from_cluster(c));
    std::cout << format_plan(g, c, p);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fusion::cli::run_main("fusion-cluster", [&] { return run(argc, argv); });
}
