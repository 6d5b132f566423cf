#include "actors/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/coordinator.hpp"
#include "actors/admin_protocol.hpp"
#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/micro_batches_auto.hpp"
#include "actors/secure_link.hpp"
#include "actors/node_actor.hpp"
#include "actors/op_device.hpp"
#include "core/cluster.hpp"
#include "core/data.hpp"
#include "core/image_source.hpp"
#include "core/token_source.hpp"
#include "core/graph.hpp"
#include "ops/cpu/blas.hpp"
#include "scheduler/schedule.hpp"

namespace fusion {

double peak_rss_mb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// The data source the model's feeds ask for, checked against the model's inputs.
void load_data(run_inputs& in) {
  const auto& cfg = in.cfg;
  if (in.model.is_text() && cfg.data_kind == "tokens") {
    in.bpe = std::make_shared<const tok::bpe_tokenizer>(tok::bpe_tokenizer::load(cfg.tokenizer_dir));
    if (in.bpe->size() > in.model.vocab)
      throw std::runtime_error("tokenizer " + cfg.tokenizer_dir + " has " + std::to_string(in.bpe->size()) +
                               " tokens but model " + cfg.model_file + " has vocabulary " + std::to_string(in.model.vocab));
    std::vector<uint32_t> token_bytes(static_cast<size_t>(in.bpe->size()));
    for (int32_t id = 0; id < in.bpe->size(); ++id) token_bytes[id] = static_cast<uint32_t>(in.bpe->token_bytes(id).size());
    in.data = std::make_unique<token_source>(find_shards(cfg.shards_dir), in.model.context, in.model.vocab,
                                             std::move(token_bytes), cfg.shards_dir);
  } else if (in.model.is_text()) {
    std::string text = read_text_file(cfg.data_file);
    // Before the vocabulary: an empty corpus would write a vocabulary file of no characters.
    if (text.empty()) throw std::runtime_error("corpus file " + cfg.data_file + " is empty: name a text file with data.file");
    if (cfg.vocab_file.empty()) {
      in.tokenizer.build(text);
    } else {
      // The vocabulary follows the corpus (core/data.hpp): loaded, created or rebuilt with a note.
      auto got = prepare_vocabulary(cfg.vocab_file, text, in.tokenizer);
      if (!got.note.empty()) std::fprintf(stderr, "fusion-train: note: %s\n", got.note.c_str());
    }
    if (in.tokenizer.size() > in.model.vocab)
      throw std::runtime_error("corpus " + cfg.data_file + " has " + std::to_string(in.tokenizer.size()) +
                               " distinct characters but model " + cfg.model_file + " has vocabulary " +
                               std::to_string(in.model.vocab));
    in.text = std::make_shared<text_dataset>(in.tokenizer.encode(text), cfg.val_fraction);
    in.data = std::make_unique<text_source>(in.text, in.model.context, cfg.data_file);
  } else {
    image_options o;
    o.dir = cfg.image_dir;
    o.crop_padding = static_cast<int>(cfg.crop_padding);
    o.flip = cfg.flip;
    // Labels are checked against the model's classes (IDX labels are bytes: at most 256 matter).
    if (in.model.logits_node >= 0)
      o.classes = static_cast<int>(std::min<int64_t>(256, in.model.nodes[in.model.logits_node].shape.at(1)));
    try {
      in.data = std::make_unique<image_source>(o);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("[data] settings: ") + e.what());
    }
  }
  for (size_t k = 0; k < in.model.feeds.size(); ++k) {
    const graph_node& n = in.model.nodes[in.model.feeds[k].node];
    in.data->check_input(k, n.name, n.shape, n.type);
  }
  // Every run with train.eval-batches > 0 evaluates at least once, at the end: an evaluation
  // split too short for one batch must stop it now, not after training with nothing saved.
  if (cfg.eval_batches > 0 && in.data->eval_batches(cfg.batch) <= 0)
    throw std::runtime_error(in.data->describe() + ": no evaluation batch of " + std::to_string(cfg.batch) +
                             " rows (lower train.batch or set train.eval-batches = 0)");
}

// The session is the blocking face of the coordinator actor: it loads what can be loaded
// without actors (so bad input fails before any process is involved), starts the actor system
// and the coordinator, and turns each call into one request that waits for its answer.
struct session::impl {
  std::shared_ptr<run_inputs> in = std::make_shared<run_inputs>();
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  coordinator_session coordinator;

  explicit impl(train_config c);
  ~impl();
  void shutdown();

  // Sends xs to the coordinator and waits for its answer of type T; an error becomes an
  // exception in plain words (interrupted_error when the run was stopped). A busy coordinator
  // (recovering from a lost node, say, or the request was cut short by that loss) is asked again
  // until it serves the request, for up to twice the step timeout and at least a minute.
  template <class T, class... Ts>
  T call(const Ts&... xs) {
    caf::scoped_actor self{*sys};
    T out{};
    caf::error err;
    const auto patience = std::chrono::duration<double>(std::max(60.0, 2 * in->cfg.step_timeout_s));
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (;;) {
      err = caf::error{};
      self->request(coordinator, caf::infinite, xs...)
          .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { err = std::move(e); });
      if (code_of(err) != fusion_errc::busy || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (err) {
      if (code_of(err) == fusion_errc::interrupted) throw interrupted_error(describe(err));
      throw std::runtime_error(describe(err));
    }
    return out;
  }
};

session::impl::impl(train_config c) {
  auto& cfg = in->cfg;
  cfg = std::move(c);
  if (cfg.batch < 1) throw std::runtime_error("train.batch must be >= 1, got " + std::to_string(cfg.batch));
  if (cfg.micro_batches < 1 || cfg.batch % cfg.micro_batches != 0)
    throw std::runtime_error("train.micro-batches (" + std::to_string(cfg.micro_batches) +
                             ") must be >= 1 and divide train.batch (" + std::to_string(cfg.batch) + ")");
  pipeline_schedule fixed;
  if (cfg.schedule != "auto" && !parse_schedule(cfg.schedule, fixed))
    throw std::runtime_error("train.schedule must be eager, gpipe, 1f1b or auto, got \"" + cfg.schedule + "\"");
  check_optim_config(cfg.optim);
  // The one place train.sync reaches the planner's pricing (compression_config::allreduce_every).
  cfg.compression.allreduce_every = std::max<int64_t>(1, cfg.optim.sync_every);
  if (!cfg.cluster_file.empty()) {
    if (cfg.device != "cpu")
      throw std::runtime_error("runtime.device=" + cfg.device + " applies to a one-process run; with a cluster "
                               "file each node's device is its `device` entry there");
  } else if (auto usable = device_usable(cfg.device); !usable) {
    throw std::runtime_error("runtime.device: " + usable.error());
  }
  gemm_precision precision;
  try {
    precision = parse_gemm_precision(cfg.precision);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("runtime.precision: ") + e.what());
  }
  // cfg.device was checked above, so cuda_index_of does not throw here.
  if (precision == gemm_precision::bf16 && cfg.cluster_file.empty() && cuda_index_of(cfg.device) < 0)
    throw std::runtime_error("runtime.precision: bf16 applies to the GEMMs of ops on a GPU, and this run has none "
                             "(runtime.device=" + cfg.device + ")");
  if (cfg.micro_batches_auto && cfg.cluster_file.empty()) cfg.micro_batches = choose_local_micro_batches(cfg);
  in->model = load_graph(cfg.model_file, cfg.batch / cfg.micro_batches);
  load_data(*in);

  cpu::set_blas_threads(std::max(1, cfg.blas_threads));
  int threads = cfg.threads > 0 ? cfg.threads : static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  sys_cfg.set("scheduler.max-threads", static_cast<int64_t>(threads));
  set_scheduler_policy(sys_cfg, cfg.scheduler.empty() ? (cfg.cluster_file.empty() ? "stealing" : "sharing")
                                                      : cfg.scheduler);
  add_fusion_message_types(sys_cfg);
  if (!cfg.cluster_file.empty()) {
    in->cluster = load_cluster(cfg.cluster_file);
    if (!cfg.policy.empty()) {
      auto policy = find_placement_policy(cfg.policy);
      if (!policy) {
        std::string known;
        for (auto& n : placement_policy_names()) known += (known.empty() ? "" : ", ") + n;
        throw std::runtime_error("cluster.policy: unknown placement policy '" + cfg.policy + "' (known: " + known + ")");
      }
      in->cluster.placement.policy = *policy;
    }
    if (cfg.transport != "tcp" && cfg.transport != "caf")
      throw std::runtime_error("flow.transport must be \"tcp\" or \"caf\", got \"" + cfg.transport + "\"");
  }
  if (!cfg.cluster_file.empty() || cfg.admin_port != 0 || cfg.on_admin_listening) {
    // Heartbeats on every connection: nodes and admin shells detect a dead or hung peer alike.
    set_liveness(sys_cfg, cfg.heartbeat_ms, cfg.peer_timeout_ms);
    load_network(sys_cfg, cfg.credentials.get());
  }
  sys = std::make_unique<caf::actor_system>(sys_cfg);
  coordinator = spawn_coordinator(*sys, in);
  try {
    call<bool>(start_atom::value);
  } catch (...) {
    shutdown();  // ~actor_system would otherwise wait forever for the coordinator
    throw;
  }
}

// Ends the nodes and the local actors through the coordinator; ~actor_system then waits for
// nothing that could hang.
session::impl::~impl() { shutdown(); }

void session::impl::shutdown() {
  if (!sys || !coordinator) return;
  caf::scoped_actor self{*sys};
  bool done = false;
  self->request(coordinator, std::chrono::seconds(15), shutdown_atom::value)
      .receive([&](bool) { done = true; }, [&](caf::error&) {});
  if (!done) self->send_exit(coordinator, caf::exit_reason::user_shutdown);
  coordinator = nullptr;
}

session::session(train_config cfg) : impl_(std::make_unique<impl>(std::move(cfg))) {}
session::~session() = default;

train_result session::train() {
  auto& d = *impl_;
  d.call<bool>(train_atom::value);
  train_result r = d.in->result;
  r.peak_rss_mb = peak_rss_mb();
  return r;
}

std::string session::item_name() const { return impl_->in->data->item_name(); }
bool session::is_text() const { return impl_->in->model.is_text(); }
std::string session::describe_data() const { return impl_->in->data->describe(); }

eval_result session::evaluate() {
  auto v = impl_->call<std::vector<double>>(eval_atom::value);
  return {v.at(0), v.at(1), v.at(2)};
}
std::string session::sample(int n, const std::string& prompt, double temperature, uint64_t seed) {
  return impl_->call<std::string>(sample_atom::value, static_cast<int32_t>(n), prompt, temperature, seed);
}
void session::save_checkpoint(const std::string& path) { impl_->call<bool>(save_atom::value, path); }
void session::load_checkpoint(const std::string& path) { impl_->call<bool>(load_atom::value, path); }
void session::rewire() { impl_->call<bool>(rewire_atom::value); }
std::string session::query(const std::string& topic) { return impl_->call<std::string>(query_atom::value, topic); }
std::string session::command(const std::string& verb, const std::vector<std::string>& args) {
  return impl_->call<std::string>(command_atom::value, verb, args);
}
int64_t session::step() const {
  auto status = impl_->call<std::string>(query_atom::value, std::string("status"));
  return nlohmann::json::parse(status).at("step").get<int64_t>();
}
std::vector<std::string> session::cluster_nodes() const {
  std::vector<std::string> out;
  for (auto& n : impl_->in->cluster.nodes) out.push_back(n.name);
  return out;
}
int64_t session::param_count() const { return impl_->in->model.param_count(); }
size_t session::actor_count() const { return impl_->in->model.nodes.size(); }
int64_t session::micro_batches() const { return impl_->in->cfg.micro_batches; }
double session::unigram_entropy() const {
  if (!impl_->in->text) return NAN;
  return fusion::unigram_entropy(impl_->in->text->train_tokens(), impl_->in->tokenizer.size());
}

}  // namespace fusion
