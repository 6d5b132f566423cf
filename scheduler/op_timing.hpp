// Timing the ops of a run on this process's device: what a node measures when the coordinator
// profiles the cluster (docs/scheduler.md, section 1). For each distinct op signature of the run
// (op_key: kind, attributes, input shapes and dtypes at the micro-batch shape) it builds the op on
// the device, feeds it random inputs (i32 inputs all zeros, so token ids and targets are valid)
// and times a forward, a backward and one AdamW update of its parameters: a few warm-up calls,
// then the median of a few.
//
// On a CPU each call is timed in thread CPU time, and the node's effective CPU share is measured
// once: a busy loop over a wall-clock window, CPU time over wall time. A cgroup quota or other
// processes on the same cores lower the share; CPU time alone would hide a quota, because a
// capped process runs at full speed in short bursts. The reported op times are wall-equivalent:
// CPU seconds / share. On a CUDA device calls are timed in wall time, each followed by the
// backend's synchronize(); the share is not measured there (reported as 1).
//
// Plain C++ (no CAF); the node actor runs it on a thread of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/graph.hpp"
#include "scheduler/profile.hpp"

namespace fusion {

/// What a node needs to build and time one op: one representative of an op_key.
struct op_signature {
  std::string key;                            ///< op_key() of the representative
  std::string kind;
  std::map<std::string, std::string> attrs;
  std::vector<shape_t> input_shapes;
  std::vector<uint8_t> input_types;           ///< dtype of each input, as its integer value
};

/// The signatures of the distinct ops of `g` (distinct_ops order), at the shapes `g` was loaded
/// with (the run's micro-batch).
std::vector<op_signature> op_signatures(const graph& g);

/// How long and how often to time.
struct timing_options {
  int warmups = 8;                                     ///< at most this many untimed calls per phase first
  int repeats = 3;                                     ///< timed calls per phase (median)
  std::chrono::milliseconds share_window{350};         ///< wall window of the CPU-share busy loop
  /// A phase whose first call took longer than this is warmed up by that call alone and timed
  /// once: keeps the profile of a large model within seconds.
  double slow_call_s = 0.25;
};

/// What one node measured.
struct device_timing {
  std::string device;                         ///< where it was measured ("cpu", "cuda:0")
  /// By op_key, seconds per micro-batch: wall-equivalent (CPU time / cpu_share), or under a CPU
  /// quota below one core (quota.binds()) the CPU time, the op at full speed.
  std::map<std::string, op_timing> ops;
  double cpu_share = 0;                       ///< CPU cores' worth the process got (1 on CUDA)
  cpu_quota quota;                            ///< the cgroup's CPU quota where it binds (else none)
  uint64_t memory_bytes = 0;                  ///< free memory of the device (0: unknown)
  double seconds = 0;                         ///< wall time the whole measurement took
};

/// Puts what a node measured into its profile: op times, CPU share and quota (the free memory is
/// the caller's choice: a cluster file's stated memory comes first).
void take_measured(node_profile& n, device_timing t);

/// Times every signature on `device` ("cpu", "cuda", "cuda:N"). Throws std::runtime_error
/// naming the op key when an op cannot be built or run (bad attributes, no such device).
device_timing time_ops(const std::string& device, const std::vector<op_signature>& ops,
                       const timing_options& options = {});

/// The CPU share this thread gets: thread CPU time over wall time of a busy loop that runs for
/// `window` of wall time. About 1 on an idle core, about 0.25 under a 25% cgroup quota.
double measure_cpu_share(std::chrono::milliseconds window);

/// Free memory of `device` in bytes: MemAvailable (/proc/meminfo) for the CPU, the free device
/// memory for CUDA; 0 when it cannot be read.
uint64_t free_memory_bytes(const std::string& device);

}  // namespace fusion
