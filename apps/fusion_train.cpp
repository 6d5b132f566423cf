// fusion-train: trains an OP-DAG model with one CAF actor per operator.
//
//   fusion-train --config configs/runs/char-tiny.ini [--model FILE] [--train.steps=200] ...
//   fusion-train --config configs/runs/char-tiny.ini --sample 300 [--prompt "In the beginning"]
//
// Settings come from the INI file named by --config and are overridden on the command line
// (--category.key=value). CAF's INI parser silently drops unknown keys and values of the wrong
// type, so the file is linted against the option table first and every problem is reported.
#include <caf/all.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <variant>

#include "actors/trainer.hpp"
#include "core/graph_names.hpp"
#include "core/ini_check.hpp"

namespace {

using namespace fusion;

// Set by SIGINT/SIGTERM: the run finishes the step in flight and checkpoints before exiting.
std::atomic<bool> stop_requested{false};

extern "C" void on_stop_signal(int) { stop_requested.store(true); }

struct sample_options {
  int64_t count = 0;
  std::string prompt = "\n";
  double temperature = 0.8;
  int64_t after_training = 200;
};

/// One row of the option table: the single source for CAF's parser, --help and the INI linter.
struct option_row {
  const char* category;
  const char* name;
  const char* help;
  std::variant<bool*, int64_t*, uint64_t*, double*, std::string*> target;
};

ini_option::kind kind_of(const option_row& r) {
  switch (r.target.index()) {
    case 0: return ini_option::kind::boolean;
    case 1: return ini_option::kind::integer;
    case 2: return ini_option::kind::unsigned_integer;
    case 3: return ini_option::kind::real;
    default: return ini_option::kind::string;
  }
}

struct train_app_config : caf::actor_system_config {
  train_config run;
  sample_options sample;
  uint64_t threads = 0, blas_threads = 1;
  double step_timeout_s = 600;
  bool quiet = false;
  std::vector<option_row> rows;

  train_app_config() {
    auto& o = run.optim;
    rows = {
        {"model", "file", "OP-DAG model file (.pbtxt); --model FILE for short", &run.model_file},
        {"data", "file", "training text (default data/kjv.txt from scripts/get-data.sh)", &run.data_file},
        {"data", "vocab", "character vocabulary file: read if present, else built from the corpus and written",
         &run.vocab_file},
        {"data", "val-fraction", "fraction of the corpus tail held out for validation", &run.val_fraction},
        {"train", "batch", "global batch: sequences per optimizer step", &run.batch},
        {"train", "micro-batches", "pipeline micro-batches per step (divides batch)", &run.micro_batches},
        {"train", "steps", "total optimizer steps", &run.steps},
        {"train", "seed", "seed for parameter init and batch order", &run.seed},
        {"train", "eval-every", "validate every N steps (0: at the end only)", &run.eval_every},
        {"train", "eval-batches", "validation batches per evaluation", &run.eval_batches},
        {"train", "log-every", "progress line every N steps (when stderr is not a terminal)", &run.log_every},
        {"train", "resume", "checkpoint to resume from (or to sample from)", &run.resume_from},
        {"optim", "kind", "adamw or sgd", &o.kind},
        {"optim", "lr", "peak learning rate", &o.lr},
        {"optim", "min-lr", "cosine schedule floor", &o.min_lr},
        {"optim", "warmup-steps", "linear warm-up steps", &o.warmup_steps},
        {"optim", "total-steps", "cosine schedule length (0: train.steps)", &o.total_steps},
        {"optim", "beta1", "AdamW beta1", &o.beta1},
        {"optim", "beta2", "AdamW beta2", &o.beta2},
        {"optim", "eps", "AdamW epsilon", &o.eps},
        {"optim", "weight-decay", "weight decay (decoupled for AdamW)", &o.weight_decay},
        {"optim", "momentum", "SGD momentum", &o.momentum},
        {"optim", "grad-clip", "max global gradient norm (0: off)", &o.grad_clip},
        {"output", "metrics", "JSON-lines metrics file", &run.metrics_file},
        {"output", "checkpoint", "checkpoint file (written at the end and every checkpoint-every steps)",
         &run.checkpoint_file},
        {"output", "checkpoint-every", "checkpoint interval in steps (0: at the end only)", &run.checkpoint_every},
        {"output", "sample-chars", "characters generated after training (0: none)", &sample.after_training},
        {"sample", "count", "generate N characters from the checkpoint and exit; --sample N for short",
         &sample.count},
        {"sample", "prompt", "text the generation starts from", &sample.prompt},
        {"sample", "temperature", "sampling temperature (0: greedy)", &sample.temperature},
        {"runtime", "threads", "actor scheduler threads (0: one per core)", &threads},
        {"runtime", "blas-threads", "OpenBLAS threads per op call", &blas_threads},
        {"runtime", "step-timeout", "seconds before a stuck step aborts the run", &step_timeout_s},
          {"runtime", "quiet", "no progress lines", &quiet},
    };
    o.total_steps = 0;
    for (auto& r : rows) {
      caf::config_option_adder group{custom_options_, r.category};
      std::visit([&](auto* p) { group.add(*p, r.name, r.help); }, r.target);
    }
  }

  std::vector<ini_option> schema() const {
    std::vector<ini_option> out;
    for (auto& r : rows) out.push_back({r.category, r.name, kind_of(r)});
    return out;
  }
};

/// Rewrites "--model F", "--sample N", "--prompt P", "--resume F" into CAF's --key=value form
/// and pulls out "--config F".
std::vector<std::string> normalise_args(int argc, char** argv, std::string& config_file) {
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"--model", "--model.file"}, {"--sample", "--sample.count"}, {"--prompt", "--sample.prompt"},
      {"--resume", "--train.resume"}, {"--steps", "--train.steps"}};
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string key = a.substr(0, eq);
    bool has_value = eq != std::string::npos;
    std::string value = has_value ? a.substr(eq + 1) : "";
    auto take_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    if (key == "--config") {
      if (!take_value()) throw std::runtime_error("--config needs a file name");
      config_file = value;
      continue;
    }
    auto alias = std::find_if(aliases.begin(), aliases.end(), [&](auto& kv) { return kv.first == key; });
    if (alias != aliases.end()) {
      if (!take_value()) throw std::runtime_error(key + " needs a value");
      bool is_string = alias->second != "--sample.count" && alias->second != "--train.steps";
      out.push_back(alias->second + "=" + (is_string ? "\"" + value + "\"" : value));
      continue;
    }
    // CAF rejects "--key=" outright; an empty string option must be spelled --key="".
    out.push_back(has_value && value.empty() ? a + "\"\"" : a);
  }
  return out;
}

const char* kind_name(ini_option::kind k) {
  switch (k) {
    case ini_option::kind::boolean: return "bool";
    case ini_option::kind::integer: return "int";
    case ini_option::kind::unsigned_integer: return "uint";
    case ini_option::kind::real: return "real";
    default: return "string";
  }
}

void print_help(const train_app_config& cfg) {
  std::cout << "usage: fusion-train --config FILE.ini [--model FILE] [--steps N] [--resume CKPT]\n"
               "                    [--sample N [--prompt TEXT]] [--category.key=value ...]\n\n"
               "Trains an OP-DAG model, one CAF actor per operator, on a text corpus. Settings are\n"
               "[category] key=value lines of the INI file; the command line overrides any of them as\n"
               "--category.key=value (e.g. --train.steps=50 --optim.lr=3.0e-4). INI reals need a decimal\n"
               "point and strings double quotes; the file is checked and every problem is reported.\n\n"
               "options:\n";
  for (auto& r : cfg.rows) {
    std::string key = std::string("--") + r.category + "." + r.name + "=<" + kind_name(kind_of(r)) + ">";
    std::printf("  %-36s %s\n", key.c_str(), r.help);
  }
  std::cout << "\nsee docs/training.md for details, metrics and checkpoints" << std::endl;
}

/// CAF reports "parser_error(not_an_option, ({"argument" = "--x=1"}))"; say it in our words and
/// suggest the closest known option.
void report_cli_error(const train_app_config& cfg, const std::vector<std::string>& args, const std::string& caf_text) {
  std::string bad;
  for (auto& a : args)
    if (caf_text.find("\"" + a + "\"") != std::string::npos) bad = a;
  std::string key = bad.substr(0, bad.find('='));
  std::vector<std::string> known;
  for (auto& r : cfg.rows) known.push_back(std::string("--") + r.category + "." + r.name);
  if (bad.empty()) {
    std::cerr << "fusion-train: bad command line: " << caf_text << "\n";
  } else if (caf_text.find("not_an_option") != std::string::npos) {
    std::cerr << "fusion-train: unknown option '" << key << "'" << did_you_mean(key, known) << " (see --help)\n";
  } else {
    auto open = caf_text.find('('), comma = caf_text.find(',');
    std::string reason = open < comma && comma != std::string::npos ? caf_text.substr(open + 1, comma - open - 1) : caf_text;
    std::replace(reason.begin(), reason.end(), '_', ' ');
    std::cerr << "fusion-train: bad value in '" << bad << "': " << reason << " (see --help for the option's type)\n";
  }
}

int run(int argc, char** argv) {
  train_app_config cfg;
  std::string config_file;
  auto args = normalise_args(argc, argv, config_file);
  bool help = std::find_if(args.begin(), args.end(), [](auto& a) { return a == "-h" || a == "--help"; }) != args.end();
  if (help) {
    print_help(cfg);
    return 0;
  }
  // One read of the file serves both the linter and CAF's parser.
  std::stringstream ini;
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) throw std::runtime_error("cannot open config file " + config_file);
    ini << in.rdbuf();
    auto problems = check_ini(ini.str(), config_file, cfg.schema());
    if (!problems.empty()) {
      for (auto& p : problems) std::cerr << to_string(p) << "\n";
      std::cerr << "fusion-train: " << problems.size() << " problem(s) in " << config_file << "\n";
      return 2;
    }
  }
  if (auto err = cfg.parse(args, ini)) {
    report_cli_error(cfg, args, cfg.render(err));
    return 2;
  }
  if (cfg.cli_helptext_printed) return 0;
  if (cfg.run.model_file.empty())
    throw std::runtime_error("no model file: set [model] file in the config or pass --model FILE");
  if (cfg.run.optim.total_steps == 0) cfg.run.optim.total_steps = cfg.run.steps;
  cfg.run.threads = static_cast<int>(cfg.threads);
  cfg.run.blas_threads = static_cast<int>(cfg.blas_threads);
  cfg.run.step_timeout_s = cfg.step_timeout_s;
  cfg.run.progress = !cfg.quiet;

  if (cfg.sample.count > 0) {
    if (cfg.run.resume_from.empty()) cfg.run.resume_from = cfg.run.checkpoint_file;
    if (cfg.run.resume_from.empty())
      throw std::runtime_error("--sample needs a checkpoint: set [output] checkpoint or pass --resume FILE");
    cfg.run.metrics_file.clear();
    session s(cfg.run);
    std::cout << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.count), cfg.sample.prompt, cfg.sample.temperature, cfg.run.seed)
              << std::endl;
    return 0;
  }

  cfg.run.stop_flag = &stop_requested;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  session s(cfg.run);
  std::fprintf(stderr, "fusion-train: model %s, %lld parameters, %zu operator actors, batch %lld in %lld micro-batches\n",
               cfg.run.model_file.c_str(), static_cast<long long>(s.param_count()), s.actor_count(),
               static_cast<long long>(cfg.run.batch), static_cast<long long>(cfg.run.micro_batches));
  if (s.step() > 0) std::fprintf(stderr, "fusion-train: resumed at step %lld\n", static_cast<long long>(s.step()));
  train_result r = s.train();
  if (r.interrupted) {
    std::fprintf(stderr, "fusion-train: interrupted at step %lld%s\n", static_cast<long long>(s.step()),
                 cfg.run.checkpoint_file.empty() ? " (no checkpoint configured)"
                                                 : (", checkpoint written to " + cfg.run.checkpoint_file).c_str());
    return 130;
  }
  std::fprintf(stderr, "fusion-train: %zu steps in %.1f s, %.0f tokens/s, peak RSS %.0f MiB", r.steps.size(), r.seconds,
               r.tokens_per_s, r.peak_rss_mb);
  if (!r.val_losses.empty()) std::fprintf(stderr, ", val_loss %.4f", r.val_losses.back().second);
  std::fprintf(stderr, " (unigram entropy %.4f)\n", s.unigram_entropy());
  if (cfg.sample.after_training > 0)
    std::cout << "--- sample ---\n"
              << cfg.sample.prompt
              << s.sample(static_cast<int>(cfg.sample.after_training), cfg.sample.prompt, cfg.sample.temperature,
                          cfg.run.seed)
              << "\n--------------" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "fusion-train: error: " << e.what() << "\n";
    return 1;
  }
}
