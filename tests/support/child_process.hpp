// A child process for multi-process tests: started with fork/exec, output to a log file, killed
// (SIGKILL) and reaped when the object goes away, so a failing test leaves no stray nodes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fusion::test {

class child_process {
 public:
  child_process() = default;
  /// Starts `argv[0]` with the given arguments in directory `cwd` (empty: this one); stdout and
  /// stderr go to `log_file`.
  child_process(const std::vector<std::string>& argv, std::string log_file, const std::string& cwd = {})
      : log_(std::move(log_file)) {
    pid_ = ::fork();
    if (pid_ == 0) {
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  child_process(child_process&& o) noexcept : pid_(o.pid_), status_(o.status_), log_(std::move(o.log_)) { o.pid_ = -1; }
  ~child_process() {
    if (pid_ > 0 && status_ < -1) {
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);  // a stopped child must run to die
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  /// Exit code once the child has exited within `timeout_s` (-1: killed by a signal), or -2 when
  /// it is still running after the timeout.
  int wait(double timeout_s) {
    if (status_ >= -1) return status_;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    do {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
    return -2;
  }

  /// Everything the child wrote so far.
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int status_ = -3;  // >= 0 exit code, -1 signalled, < -1 not reaped yet
  std::string log_;
};

}  // namespace fusion::test
