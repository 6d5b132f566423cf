// The one exception type of a usage mistake, shared by every fusion-* program (with or without
// CAF), so that their argument parsing and checks throw and catch the same thing.
#pragma once

#include <stdexcept>

namespace fusion {

/// A mistake in the command line or the configuration that the user must fix: programs exit 2
/// on it (fusion-train's exit codes: docs/training.md).
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace fusion
