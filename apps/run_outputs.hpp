// fusion-train's outputs on disk: where the checkpoints and the metrics go, whether a run may
// start over what an earlier run left there, which checkpoint --resume means, and the lines
// that end a run naming them (docs/training.md, "Checkpoints").
#pragma once

#include <cstdint>
#include <string>

#include "actors/train_config.hpp"
#include "security/certs.hpp"

namespace fusion {

/// What stops output.checkpoint `target` (a checkpoint directory, or one ".ckpt" file) or
/// output.metrics (`is_file`) from being written, in words ("" when nothing does). Checked
/// before anything is loaded, without creating or truncating anything.
std::string output_path_problem(const std::string& target, bool is_file);

/// Settles a training run's outputs before anything is loaded; throws usage_error.
/// - train.resume "latest" (or a checkpoint directory, or its `latest` file) becomes the file
///   it points to; "nothing to resume" when there is none.
/// - Without train.resume, a run refuses to start where an earlier one left checkpoints or a
///   metrics file, unless `force`: then they are removed (said in one line on stderr).
void settle_run_outputs(train_config& run, bool force);

/// The checkpoint --sample reads: train.resume (resolved as above) or the latest of
/// output.checkpoint. Throws usage_error when there is none.
std::string sample_checkpoint(const train_config& run);

/// The run's directory: where its metrics file lies, else its checkpoint directory's parent
/// (or the checkpoint file's directory), else "" when the run writes neither.
std::string run_directory(const train_config& run);

/// Certificates for the admin shell of a one-process run that was given none: a CA, the
/// coordinator's and the admin shell's, made in RUN_DIR/admin-certs (kept and reused when they
/// exist; a fresh temporary directory when the run has no directory). Said in one line on
/// stderr; the admin shell must listen on a loopback address. Returns the directory; throws
/// usage_error.
std::string make_admin_certs(const train_config& run);

/// The fusion-admin command that attaches to this run's admin shell on `port`, for the program
/// `admin_program` (the fusion-admin next to fusion-train) and the run's [security] settings.
std::string admin_command(const std::string& admin_program, const std::string& host, uint16_t port,
                          const security::security_settings& security);

/// The last lines of a run on stderr: the newest checkpoint and how to resume it, the metrics
/// file and the command that plots it.
void print_run_outputs(const train_config& run);

}  // namespace fusion
