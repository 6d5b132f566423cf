#include "core/checkpoint_dir.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fusion {

namespace fs = std::filesystem;

namespace {

constexpr const char* latest_name = "latest";

// The step of a file named "step-<digits>.ckpt", or false for any other name.
bool parse_step_name(const std::string& name, uint64_t& step) {
  const std::string head = "step-", tail = ".ckpt";
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 19 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  step = std::stoull(digits);
  return true;
}

void fsync_dir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

// `latest` in `dir` names `file_name`, replaced atomically: a reader sees the old name or the
// new one, never a partial line.
void write_latest(const std::string& dir, const std::string& file_name) {
  const std::string path = dir + "/" + latest_name, tmp = path + ".tmp";
  auto fail = [&](const std::string& what) {
    std::remove(tmp.c_str());
    throw std::runtime_error("checkpoint pointer " + path + ": " + what + ": " + std::strerror(errno));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create " + tmp);
  const std::string line = file_name + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) fail("cannot write " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp);
  fsync_dir(dir);
}

// The file name `latest` in `dir` holds, or "" when it is missing or names no step file.
std::string read_latest(const std::string& dir) {
  std::ifstream in(dir + "/" + latest_name);
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  uint64_t step;
  // Only a step file of this directory: the pointer must not lead a resume elsewhere.
  if (!parse_step_name(name, step)) return "";
  return name;
}

}  // namespace

bool names_checkpoint_file(const std::string& target) {
  const std::string ext = ".ckpt";
  return target.size() >= ext.size() && target.compare(target.size() - ext.size(), ext.size(), ext) == 0;
}

std::string checkpoint_file_name(uint64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08llu.ckpt", static_cast<unsigned long long>(step));
  return buf;
}

std::vector<std::pair<uint64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    uint64_t step;
    if (parse_step_name(it->path().filename().string(), step)) out.emplace_back(step, it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string save_checkpoint_to(const std::string& target, const checkpoint& ckpt, int64_t keep) {
  if (names_checkpoint_file(target)) {
    save_checkpoint(target, ckpt);
    return target;
  }
  std::error_code ec;
  fs::create_directories(target, ec);
  if (ec) throw std::runtime_error("cannot create checkpoint directory " + target + ": " + ec.message());
  const std::string name = checkpoint_file_name(ckpt.step);
  const std::string path = (fs::path(target) / name).string();
  save_checkpoint(path, ckpt);
  write_latest(target, name);
  if (keep > 0) {
    auto all = list_checkpoints(target);
    // Oldest first; the file just written is never removed, whatever steps older runs left.
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
      if (all[i].second != path) std::remove(all[i].second.c_str());
  }
  return path;
}

std::string latest_checkpoint(const std::string& target) {
  std::error_code ec;
  if (names_checkpoint_file(target)) return fs::is_regular_file(target, ec) ? target : "";
  if (auto name = read_latest(target); !name.empty()) {
    std::string path = (fs::path(target) / name).string();
    if (fs::is_regular_file(path, ec)) return path;
  }
  auto all = list_checkpoints(target);
  return all.empty() ? "" : all.back().second;
}

int remove_checkpoints(const std::string& target) {
  int removed = 0;
  auto remove_one = [&](const std::string& path) {
    std::error_code ec;
    if (fs::remove(path, ec)) ++removed;
    if (ec) throw std::runtime_error("cannot remove " + path + ": " + ec.message());
  };
  if (names_checkpoint_file(target)) {
    remove_one(target);
    remove_one(target + ".tmp");
    return removed;
  }
  for (auto& [step, path] : list_checkpoints(target)) {
    remove_one(path);
    remove_one(path + ".tmp");
  }
  remove_one(target + "/" + latest_name);
  remove_one(target + "/" + latest_name + ".tmp");
  // Temporary files of saves killed before their rename; collected first, removed after.
  std::vector<std::string> leftovers;
  std::error_code ec;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    uint64_t step;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0 && parse_step_name(n.substr(0, n.size() - 4), step))
      leftovers.push_back(it->path().string());
  }
  for (auto& path : leftovers) remove_one(path);
  return removed;
}

}  // namespace fusion
