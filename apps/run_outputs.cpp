#include "apps/run_outputs.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "apps/usage_error.hpp"
#include "core/checkpoint_dir.hpp"

namespace fusion {

namespace fs = std::filesystem;

namespace {

// The nearest directory at or above `p` that exists (the run creates the missing ones below).
fs::path nearest_existing(fs::path p) {
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) {
    if (!p.has_relative_path()) break;  // "/" itself
    p = p.parent_path();
  }
  return p.empty() ? fs::path(".") : p;
}

std::string writable_problem(const std::string& what, const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return what + " cannot be written: " + dir.string() + " is not a directory";
  // W_OK and X_OK: creating a file (and the temporary one renamed over it) needs both.
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return what + " cannot be written: directory " + dir.string() + " is not writable (" + std::strerror(errno) + ")";
  return "";
}

bool names_latest(const std::string& resume) {
  std::error_code ec;
  return resume == "latest" || (fs::path(resume).filename() == "latest" && !fs::exists(resume, ec));
}

// train.resume as the checkpoint file it means ("" when it is empty).
std::string resolve_resume(const train_config& run) {
  const std::string& r = run.resume_from;
  if (r.empty()) return "";
  std::error_code ec;
  std::string target;
  if (names_latest(r)) {
    if (run.checkpoint_file.empty())
      throw usage_error("--resume=latest reads output.checkpoint, which is not set: set it or name a checkpoint file");
    target = run.checkpoint_file;
  } else if (fs::is_directory(r, ec)) {
    target = r;
  } else if (fs::path(r).filename() == "latest") {
    target = fs::path(r).parent_path().string();  // the pointer file itself
  } else {
    return r;  // a checkpoint file; the session says what is wrong with it
  }
  std::string file = latest_checkpoint(target);
  if (file.empty())
    throw usage_error("nothing to resume: " + target + " holds no checkpoint yet (start the run without --resume)");
  return file;
}

bool non_empty_file(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_regular_file(path, ec) && fs::file_size(path, ec) > 0;
}

}  // namespace

std::string output_path_problem(const std::string& target, bool is_file) {
  std::error_code ec;
  const fs::path p(target);
  if (is_file || names_checkpoint_file(target)) {
    if (fs::is_directory(p, ec))
      return target + " is a directory: name a file in it, e.g. " + (p / (is_file ? "metrics.jsonl" : "model.ckpt")).string();
    if (!p.has_filename()) return target + " names a directory, not a file";
    return writable_problem(target, nearest_existing(p.parent_path()));
  }
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    return target + " is a file, not a checkpoint directory: name a directory (or a file ending in .ckpt)";
  return writable_problem(target, nearest_existing(p));
}

void settle_run_outputs(train_config& run, bool force) {
  if (!run.checkpoint_file.empty())
    if (auto why = output_path_problem(run.checkpoint_file, false); !why.empty())
      throw usage_error("output.checkpoint: " + why);
  if (!run.metrics_file.empty())
    if (auto why = output_path_problem(run.metrics_file, true); !why.empty())
      throw usage_error("output.metrics: " + why);
  if (!run.resume_from.empty()) {
    run.resume_from = resolve_resume(run);
    return;  // a resumed run continues the earlier one: its metrics are appended
  }
  const std::string ckpt = run.checkpoint_file.empty() ? "" : latest_checkpoint(run.checkpoint_file);
  const bool metrics = non_empty_file(run.metrics_file);
  if (ckpt.empty() && !metrics) return;
  std::string found;
  if (!ckpt.empty()) found = "checkpoints in " + run.checkpoint_file + " (latest " + ckpt + ")";
  if (metrics) found += (found.empty() ? "" : " and ") + std::string("the metrics file ") + run.metrics_file;
  if (!force)
    throw usage_error("an earlier run left " + found +
                      ": pass --resume=latest to continue it, --force to start over (removes them), or set "
                      "output.checkpoint and output.metrics to new places");
  int removed = 0;
  try {
    if (!run.checkpoint_file.empty()) removed = remove_checkpoints(run.checkpoint_file);
    if (metrics) fs::remove(run.metrics_file);
  } catch (const std::exception& e) {
    throw usage_error(std::string("--force cannot start over: ") + e.what());
  }
  std::fprintf(stderr, "fusion-train: --force: starting over; removed %d checkpoint file(s) from %s%s%s\n", removed,
               run.checkpoint_file.empty() ? "(none)" : run.checkpoint_file.c_str(), metrics ? " and " : "",
               metrics ? run.metrics_file.c_str() : "");
}

std::string sample_checkpoint(const train_config& run) {
  if (!run.resume_from.empty()) return resolve_resume(run);
  if (run.checkpoint_file.empty())
    throw usage_error("--sample needs a checkpoint: set [output] checkpoint or pass --resume FILE");
  std::string file = latest_checkpoint(run.checkpoint_file);
  if (file.empty()) throw usage_error("--sample: " + run.checkpoint_file + " holds no checkpoint yet: train first");
  return file;
}

std::string run_directory(const train_config& run) {
  if (!run.metrics_file.empty()) {
    auto dir = fs::path(run.metrics_file).parent_path();
    return dir.empty() ? "." : dir.string();
  }
  if (!run.checkpoint_file.empty()) {
    auto dir = fs::path(run.checkpoint_file).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "ck/"
    dir = dir.parent_path();
    return dir.empty() ? "." : dir.string();
  }
  return "";
}

std::string make_admin_certs(const train_config& run) {
  const std::string& host = run.admin_host;
  if (host != "127.0.0.1" && host != "localhost" && host != "::1")
    throw usage_error("admin.host is " + host + ", not a loopback address: an admin shell reachable from other "
                      "machines needs the run's certificates (fusion-cluster certs ... --out DIR, then "
                      "--security.certs=DIR); without them it listens on 127.0.0.1 only");
  std::string dir = run_directory(run);
  if (dir.empty()) {
    char tmpl[] = "/tmp/fusion-admin-certs.XXXXXX";
    if (!::mkdtemp(tmpl)) throw usage_error(std::string("cannot create a directory for the admin certificates: ") +
                                            std::strerror(errno));
    dir = tmpl;
  } else {
    dir = (fs::path(dir) / "admin-certs").string();
  }
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "ca.pem", ec)) {
    try {
      security::make_cluster_certs(dir, {});
    } catch (const std::exception& e) {
      throw usage_error(std::string("cannot make the admin shell's certificates: ") + e.what());
    }
  }
  std::fprintf(stderr, "fusion-train: no security.certs given: the admin shell uses certificates made for this run "
                       "in %s and listens on loopback only\n", dir.c_str());
  return dir;
}

std::string admin_command(const std::string& admin_program, const std::string& host, uint16_t port,
                          const security::security_settings& security) {
  std::string cmd = admin_program + " " + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                    std::to_string(port);
  if (security.mode == "off") return cmd + " --security.mode=off";
  if (!security.certs.empty()) cmd += " --security.certs=" + security.certs;
  if (!security.files.ca.empty()) cmd += " --security.ca=" + security.files.ca;
  if (security.certs.empty())
    cmd += " --security.certificate=ADMIN.pem --security.key=ADMIN.key";  // the run's admin identity
  return cmd;
}

void print_run_outputs(const train_config& run) {
  if (!run.checkpoint_file.empty()) {
    std::string file = latest_checkpoint(run.checkpoint_file);
    if (file.empty())
      std::fprintf(stderr, "fusion-train: checkpoint: none written in %s\n", run.checkpoint_file.c_str());
    else
      std::fprintf(stderr, "fusion-train: checkpoint: %s (continue with --resume=latest)\n", file.c_str());
  } else {
    std::fprintf(stderr, "fusion-train: checkpoint: none (output.checkpoint is not set)\n");
  }
  if (run.metrics_file.empty()) {
    std::fprintf(stderr, "fusion-train: metrics: none (output.metrics is not set)\n");
    return;
  }
  std::string png = run.metrics_file;
  if (png.size() > 6 && png.compare(png.size() - 6, 6, ".jsonl") == 0) png.resize(png.size() - 6);
  png += ".png";
  std::fprintf(stderr, "fusion-train: metrics: %s\n", run.metrics_file.c_str());
  std::fprintf(stderr, "fusion-train: plot: scripts/plot.sh %s (draws %s)\n", run.metrics_file.c_str(), png.c_str());
}

}  // namespace fusion
