// fusion-train: trains an OP-DAG model with one CAF actor per operator.
//
//   fusion-train --config configs/runs/char-tiny.ini [--model FILE] [--train.steps=200] ...
//   fusion-train --config configs/runs/char-tiny.ini --sample 300 [--prompt "In the beginning"]
//
// Settings come from the INI file named by --config and are overridden on the command line
// (--category.key=value or --category.key value). CAF's INI parser silently drops unknown keys
// and values of the wrong type, so the file is linted against the option table first and every
// problem is reported. Relative paths in the file are relative to the file's directory.
//
// Exit status: documented in docs/training.md, section "Exit status" (the constants below).
#include <caf/all.hpp>

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <new>

#include "actors/trainer.hpp"
#include "apps/app_options.hpp"
#include "apps/prometheus.hpp"
#include "apps/run_outputs.hpp"
#include "apps/train_settings.hpp"
#include "core/data.hpp"
#include "core/log.hpp"

namespace {

using namespace fusion;

constexpr int exit_done = 0, exit_error = 1, exit_usage = 2, exit_interrupted = 130;

// Set by the first SIGINT/SIGTERM while graceful_stop is on (from the session's start): the
// run finishes the step in flight and checkpoints before exiting. Any other stop signal (the
// second, or one before the session starts) exits at once with status 130.
std::atomic<bool> stop_requested{false};
std::atomic<bool> graceful_stop{false};

// What main() names when memory runs out, and what to try then.
std::string doing = "reading the options";
std::string memory_hint;

extern "C" void on_stop_signal(int) {
  // Only async-signal-safe calls here: atomics, write(2), _exit(2).
  if (graceful_stop.load() && !stop_requested.exchange(true)) {
    static const char msg[] =
        "\nfusion-train: stopping (a step in flight finishes first; interrupt again to exit at once)\n";
    if (::write(2, msg, sizeof msg - 1) < 0) {
    }
    return;
  }
  static const char msg[] = "\nfusion-train: interrupted, exiting at once\n";
  if (::write(2, msg, sizeof msg - 1) < 0) {
  }
  ::_exit(exit_interrupted);
}

void install_stop_handlers() { install_stop_signal_handler(on_stop_signal); }


const char* usage =
    "usage: fusion-train --config FILE.ini [--model FILE] [--steps N] [--resume CKPT] [--cluster FILE]\n"
    "                    [--profile FILE] [--sample N [--prompt TEXT]] [--category.key=value ...]\n\n"
    "Trains an OP-DAG model, one CAF actor per operator, on a text corpus: in this process, or on the\n"
    "fusion-node processes of a cluster file (--cluster). Before placing the operators there it times\n"
    "them on every node and probes the links between sites, or reads the profile of an earlier run\n"
    "(--profile FILE; written there when FILE does not exist yet). Settings are [category] key=value\n"
    "lines of the INI file; the command line overrides any of them as --category.key=value (e.g.\n"
    "--train.steps=50 --optim.lr=3.0e-4, or --train.steps 50). INI reals need a decimal point and\n"
    "strings double quotes; the file is checked and every problem is reported. Relative paths in\n"
    "the file are relative to its directory, those on the command line to the current one.\n\n"
    "Ctrl-C lets the step in flight finish and writes the checkpoint; a second Ctrl-C exits at once.\n\n"
    "examples:\n"
    "  fusion-train --config configs/runs/char-tiny.ini --train.steps=50 --optim.lr=1.0e-3\n"
    "  fusion-train --config configs/runs/char-tiny.ini --resume=latest --train.steps=400\n\n"
    "Exit status: 0 done, 1 the run failed or an input did not load, 2 a mistake in the command line or\n"
    "settings, 130 interrupted; the full list: docs/training.md, section \"Exit status\". See also\n"
    "docs/cluster.md.\n";

// The vocabulary follows the corpus (core/data.hpp): without data.vocab it is the file next to
// the corpus (data/kjv.txt -> data/kjv.vocab); the session loads, creates or rebuilds it (a file
// that lacks characters of the corpus is rebuilt from it, with a note, instead of failing the run).
void settle_vocabulary(train_config& run) {
  if (run.vocab_file.empty()) run.vocab_file = default_vocab_path(run.data_file);
}

// What the run reads, for the out-of-memory message.
std::string data_words(const train_config& run) {
  return run.data_kind == "tokens" ? "the token shards of " + run.shards_dir : "the corpus " + run.data_file;
}

int run(int argc, char** argv) {
  train_app_config cfg;
  static const std::vector<option_alias> aliases = {{"--model", "model.file", true},
                                                    {"--sample", "sample.count", false},
                                                    {"--prompt", "sample.prompt", true},
                                                    {"--resume", "train.resume", true},
                                                    {"--steps", "train.steps", false},
                                                    {"--cluster", "cluster.file", true},
                                                    {"--profile", "cluster.profile", true},
                                                    {"--force", "output.force", false}};
  switch (load_options("fusion-train", usage, cfg, argc, argv, aliases)) {
    case load_result::exit_ok: return exit_done;
    case load_result::exit_usage: return exit_usage;
    case load_result::run: break;
  }
  check_settings(cfg);
  apply_micro_batches(cfg);
  apply_compression(cfg);
  if (cfg.run.optim.total_steps == 0) cfg.run.optim.total_steps = cfg.run.steps;
  cfg.run.threads = static_cast<int>(cfg.threads);
  cfg.run.blas_threads = static_cast<int>(cfg.blas_threads);
  cfg.run.step_timeout_s = cfg.step_timeout_s;
  cfg.run.stop_grace_s = cfg.stop_grace_s;
  cfg.run.progress = !cfg.quiet;
  cfg.run.flow = flow_config{static_cast<uint32_t>(std::min<uint64_t>(cfg.window, UINT32_MAX)), cfg.chunk_kib << 10}
                     .clamped();
  cfg.run.admin_port = static_cast<uint16_t>(cfg.admin_port);
  // Only a run that opens a port (nodes, admin shell) needs an identity. A one-process run whose
  // admin shell was given no certificates makes its own (loopback only).
  const bool no_security = cfg.security.mode == "tls" && cfg.security.certs.empty() && cfg.security.files.ca.empty() &&
                           cfg.security.files.certificate.empty() && cfg.security.files.key.empty();
  if (cfg.run.admin_port != 0 && cfg.run.cluster_file.empty() && no_security && cfg.sample.count == 0)
    cfg.security.certs = make_admin_certs(cfg.run);
  if (!cfg.run.cluster_file.empty() || cfg.run.admin_port != 0)
    cfg.run.credentials = load_security("fusion-train", cfg.security, security::role::coordinator);
  if (cfg.run.admin_port != 0) {
    // The exact command to attach with, printed once the port is open.
    std::string admin = (std::filesystem::path(argv[0]).parent_path() / "fusion-admin").string();
    if (!std::filesystem::exists(admin)) admin = "fusion-admin";
    cfg.run.on_admin_listening = [admin, host = cfg.run.admin_host, sec = cfg.security](uint16_t port) {
      std::fprintf(stderr, "fusion-train: attach the admin shell with: %s\n",
                   admin_command(admin, host, port, sec).c_str());
      std::fprintf(stderr, "fusion-train: or watch the run live with: %s watch\n",
                   admin_command(admin, host, port, sec).c_str());
    };
  }

  if (cfg.sample.count > 0) {
    cfg.run.resume_from = sample_checkpoint(cfg.run);
    cfg.run.metrics_file.clear();
    cfg.run.eval_batches = 0;  // sampling never evaluates: a corpus without validation text is fine
    settle_vocabulary(cfg.run);
    // The session reads the corpus first, then the model and the checkpoint.
    doing = "reading " + data_words(cfg.run) + ", then loading the model " + cfg.run.model_file +
            " and the checkpoint " + cfg.run.resume_from;
    memory_hint = "the whole corpus is held in memory";
    session s(cfg.run);
    doing = "sampling";
    std::cout << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.count), cfg.sample.prompt, cfg.sample.temperature, cfg.run.seed)
              << std::endl;
    return exit_done;
  }

  settle_run_outputs(cfg.run, cfg.force);
  settle_vocabulary(cfg.run);
  std::unique_ptr<prometheus_server> prometheus;
  if (cfg.metrics_port != 0) {
    try {
      prometheus = std::make_unique<prometheus_server>(
          cfg.metrics_host, static_cast<uint16_t>(cfg.metrics_port),
          prometheus_run_info{std::filesystem::path(cfg.run.model_file).stem().string(), "tokens", cfg.run.steps});
    } catch (const std::runtime_error& e) {
      throw usage_error(e.what());
    }
    std::fprintf(stderr, "fusion-train: Prometheus metrics at http://%s:%u/metrics\n", cfg.metrics_host.c_str(),
                 static_cast<unsigned>(prometheus->port()));
    cfg.run.on_step = [p = prometheus.get()](const step_record& rec, double elapsed_s) { p->update(rec, elapsed_s); };
  }
  cfg.run.stop_flag = &stop_requested;
  graceful_stop.store(true);
  memory_hint = "the whole corpus is held in memory; otherwise try a smaller train.batch, more "
                "train.micro-batches or a smaller model";
  doing = "reading " + data_words(cfg.run) + ", then loading the model " + cfg.run.model_file +
          " for train.batch " + std::to_string(cfg.run.batch) + " in " +
          (cfg.run.micro_batches_auto ? std::string("auto") : std::to_string(cfg.run.micro_batches)) + " micro-batches";
  session s(cfg.run);
  doing = "training (train.batch " + std::to_string(cfg.run.batch) + ", " + std::to_string(s.micro_batches()) +
          " micro-batches)";
  std::fprintf(stderr, "fusion-train: model %s, %lld parameters, %zu operator actors, batch %lld in %lld micro-batches\n",
               cfg.run.model_file.c_str(), static_cast<long long>(s.param_count()), s.actor_count(),
               static_cast<long long>(cfg.run.batch), static_cast<long long>(s.micro_batches()));
  std::fprintf(stderr, "fusion-train: data: %s\n", s.describe_data().c_str());
  if (prometheus) prometheus->set_items(s.is_text() ? "tokens" : "images");
  if (s.step() > 0) std::fprintf(stderr, "fusion-train: resumed at step %lld\n", static_cast<long long>(s.step()));
  train_result r = s.train();
  if (r.interrupted) {
    std::fprintf(stderr, "fusion-train: interrupted at step %lld\n", static_cast<long long>(s.step()));
    print_run_outputs(cfg.run);
    return exit_interrupted;
  }
  std::fprintf(stderr, "fusion-train: %lld steps in %.1f s, %.0f %s/s, peak RSS %.0f MiB",
               static_cast<long long>(r.steps_run), r.seconds, r.tokens_per_s, s.item_name().c_str(), r.peak_rss_mb);
  if (!r.val_losses.empty()) std::fprintf(stderr, ", val_loss %.4f", r.val_losses.back().second);
  // An image model evaluates on its test split, a text model on the corpus's validation tail.
  if (!r.val_accuracies.empty())
    std::fprintf(stderr, ", %s accuracy %.2f%%", s.is_text() ? "validation" : "test",
                 100 * r.val_accuracies.back().second);
  if (!r.val_bits_per_byte.empty()) std::fprintf(stderr, ", val_bpb %.4f", r.val_bits_per_byte.back().second);
  if (s.is_text() && !std::isnan(s.unigram_entropy())) std::fprintf(stderr, " (unigram entropy %.4f)", s.unigram_entropy());
  std::fputc('\n', stderr);
  doing = "sampling";
  if (cfg.sample.after_training > 0 && s.is_text())
    std::cout << "--- sample ---\n"
              << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.after_training), cfg.sample.prompt, cfg.sample.temperature,
                          cfg.run.seed)
              << "\n--------------" << std::endl;
  print_run_outputs(cfg.run);
  return exit_done;
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_handlers();
  try {
    return run(argc, argv);
  } catch (const interrupted_error& e) {
    std::cerr << "fusion-train: " << e.what() << "\n";  // "interrupted ..." and why
    return exit_interrupted;
  } catch (const usage_error& e) {
    std::cerr << "fusion-train: " << e.what() << " (see --help)\n";
    return exit_usage;
  } catch (const std::bad_alloc&) {
    std::cerr << "fusion-train: out of memory while " << doing << (memory_hint.empty() ? "" : ": " + memory_hint)
              << "\n";
    return exit_error;
  } catch (const std::exception& e) {
    std::cerr << "fusion-train: error: " << e.what() << "\n";
    return exit_error;
  }
}
