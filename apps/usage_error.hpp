// The one exception type of a usage mistake, shared by every fusion-* program (with or without
// CAF), so that their argument parsing and checks throw and catch the same thing.
#pragma once

#include <stdexcept>

#include "base/result.hpp"

namespace fusion {

/// A mistake in the command line or the configuration that the user must fix: programs exit 2
/// on it (fusion-train's exit codes: docs/training.md).
struct usage_error : error {
  using error::error;
};

}  // namespace fusion
