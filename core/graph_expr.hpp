// Expressions of the model file format: attribute values, input shapes, block repeat counts and
// constants are written as small arithmetic expressions over named constants ("4*C", "C/NH",
// "0.02/sqrt(2*L)"). Grammar and semantics: docs/model-format.md.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/result.hpp"

namespace fusion {

/// A bad expression; what() has no file or line (the loader adds them).
struct graph_expr_error : error {
  using error::error;
};

/// The value of an expression: an integer, a real, a boolean or a string literal.
struct graph_value {
  enum class kind : uint8_t { integer, real, boolean, string };
  kind type = kind::integer;
  int64_t i = 0;
  double r = 0;
  bool b = false;
  std::string s;

  static graph_value of_int(int64_t v) { return {kind::integer, v, 0, false, {}}; }
  static graph_value of_real(double v) { return {kind::real, 0, v, false, {}}; }
  static graph_value of_bool(bool v) { return {kind::boolean, 0, 0, v, {}}; }
  static graph_value of_string(std::string v) { return {kind::string, 0, 0, false, std::move(v)}; }

  /// The plain text an op reads from its attr_map: "768", "0.02", "1e-05", "true", "tanh".
  std::string to_string() const;
  /// "integer", "real", "boolean", "string".
  const char* kind_name() const;
};

/// Named constants visible to an expression.
using graph_constants = std::map<std::string, graph_value, std::less<>>;

/// Deepest nesting an expression may have: parentheses, sqrt( ) and unary minus each add a
/// level (the evaluator is recursive, so an unbounded depth would overflow the stack).
inline constexpr int max_graph_expr_depth = 64;

/// Evaluates `text`. Integers stay integers under + - * and exact /, % (a division with a
/// remainder is an error: write 7.0/2 for a real result); any real operand makes the result real.
/// Also: unary minus, parentheses, true/false, sqrt(x), and a whole-value 'quoted string'.
/// Throws graph_expr_error naming the problem (undefined constant, syntax, overflow, nesting
/// deeper than max_graph_expr_depth, ...).
graph_value eval_graph_expr(std::string_view text, const graph_constants& constants);

/// Whether `name` can name a constant: [A-Za-z_][A-Za-z0-9_]* and not a keyword (true, false, sqrt).
bool is_constant_name(std::string_view name);

}  // namespace fusion
