// The project's one result type for fallible functions, and the one base of its exceptions.
//
// Conventions (docs/architecture.md, "Errors"):
//  - a function whose failure is an expected outcome (I/O, the network, a peer's bytes, a
//    certificate) returns `result<T>` (or `status` when there is no value); the message is in
//    plain words for a person and names what failed (file, address, node, field);
//  - a user's file or option refused while a program starts up throws a subclass of
//    `fusion::error` (graph_error, cluster_error, usage_error...), caught at the program's edge;
//  - across actor boundaries errors travel as `caf::error` of the project's one category
//    (actors/errors.hpp), made from a failure by `make_error(code, failure.message)`.
//
// The ground floor: no project includes, no CAF, no CUDA.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace fusion {

/// Base of every exception the project throws on purpose, so a program's edge can tell a refused
/// input (exit 2, message shown as is) from a bug.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Why a fallible function failed, in plain words.
struct failure {
  std::string message;
};

/// A failure with this message (`return fail("cannot open " + path);`).
inline failure fail(std::string message) { return failure{std::move(message)}; }

/// A value or a failure (a minimal std::expected: g++ 12 has none in C++20).
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : value_(std::move(value)) {}
  result(failure f) : error_(f.message.empty() ? "failed" : std::move(f.message)) {}

  /// True when a value is held.
  explicit operator bool() const noexcept { return value_.has_value(); }
  bool ok() const noexcept { return value_.has_value(); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  /// The failure's message; empty when a value is held.
  const std::string& error() const noexcept { return error_; }
  /// The failure itself, to pass it on unchanged (`if (!r) return r.failed();`).
  failure failed() const { return failure{error_}; }

 private:
  std::optional<T> value_;
  std::string error_;
};

/// Success, or a failure.
class [[nodiscard]] status {
 public:
  status() = default;
  status(failure f) : error_(f.message.empty() ? "failed" : std::move(f.message)) {}
  explicit operator bool() const noexcept { return error_.empty(); }
  bool ok() const noexcept { return error_.empty(); }
  /// The failure's message; empty on success.
  const std::string& error() const noexcept { return error_; }
  failure failed() const { return failure{error_}; }

 private:
  // Never empty after a failure (the constructor sees to it): empty means success.
  std::string error_;
};

}  // namespace fusion
