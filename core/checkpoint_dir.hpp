// A run's checkpoints on disk (docs/training.md, "Checkpoints"): output.checkpoint names either a
// checkpoint directory, where every save is a new step-numbered file (step-00000100.ckpt), a
// `latest` file names the newest one and only the newest `output.keep-checkpoints` files stay, or,
// when the name ends in ".ckpt", one file that every save replaces.
//
// A save writes the step file (temporary file, fsync, rename), then `latest` (the same way), and
// only then removes the oldest files. A process killed at any instant therefore leaves every
// checkpoint it had already published loadable, and `latest` never names a missing or partial
// file; a kill before the oldest files are removed leaves more than `keep` until the next save
// removes them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint.hpp"

namespace fusion {

/// Whether output.checkpoint's `target` names one checkpoint file (it ends in ".ckpt") rather
/// than a checkpoint directory.
bool names_checkpoint_file(const std::string& target);

/// The file name of step `step`'s checkpoint in a checkpoint directory: "step-00000100.ckpt".
std::string checkpoint_file_name(uint64_t step);

/// Saves `ckpt` under output.checkpoint's `target` (see the file comment) and returns the file
/// written. In a directory (created when missing), keeps the newest `keep` step files (0: all).
/// Throws as save_checkpoint does; nothing is removed when the save fails.
std::string save_checkpoint_to(const std::string& target, const checkpoint& ckpt, int64_t keep);

/// The step files of checkpoint directory `dir` as (step, path), oldest first; none when `dir`
/// does not exist. Temporary files of interrupted saves are not listed.
std::vector<std::pair<uint64_t, std::string>> list_checkpoints(const std::string& dir);

/// The checkpoint a resumed run reads from `target`: for a directory the file `latest` names
/// (or, should `latest` be missing, the step file with the highest step), for a file path the
/// file itself; "" when there is none yet.
std::string latest_checkpoint(const std::string& target);

/// Removes the step files, `latest` and leftover temporary files of checkpoint directory `dir`
/// (or the one file `target` names): a run started over with --force. Returns how many files
/// it removed; throws std::runtime_error naming a file it cannot remove.
int remove_checkpoints(const std::string& target);

}  // namespace fusion
