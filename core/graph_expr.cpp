// Recursive-descent evaluator for model-file expressions:
//   expr    := term (('+' | '-') term)*
//   term    := unary (('*' | '/' | '%') unary)*
//   unary   := '-' unary | primary
//   primary := number | name | 'true' | 'false' | 'sqrt' '(' expr ')' | '(' expr ')'
// A value that is one single-quoted string ('tanh') is a string literal.
#include "core/graph_expr.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <vector>

#include "core/graph_names.hpp"

namespace fusion {

std::string graph_value::to_string() const {
  switch (type) {
    case kind::integer: return std::to_string(i);
    case kind::boolean: return b ? "true" : "false";
    case kind::string: return s;
    case kind::real: break;
  }
  char buf[64];
  // Shortest text that reads back to the same double, so attr_map::get_float is exact.
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, r);
  return ec == std::errc{} ? std::string(buf, end) : std::to_string(r);
}

const char* graph_value::kind_name() const {
  switch (type) {
    case kind::integer: return "integer";
    case kind::real: return "real";
    case kind::boolean: return "boolean";
    case kind::string: return "string";
  }
  return "?";
}

bool is_constant_name(std::string_view n) {
  if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return n != "true" && n != "false" && n != "sqrt";
}

namespace {

class expr_parser {
 public:
  expr_parser(std::string_view text, const graph_constants& consts) : text_(text), consts_(consts) {}

  graph_value run() {
    skip_space();
    if (pos_ == text_.size()) fail("empty expression");
    graph_value v = expr();
    skip_space();
    if (pos_ != text_.size()) fail("unexpected '" + std::string(text_.substr(pos_)) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw graph_expr_error(msg); }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  graph_value number(const graph_value& v, const char* op) const {
    if (v.type == graph_value::kind::integer || v.type == graph_value::kind::real) return v;
    fail(std::string("operator '") + op + "' needs numbers, got " + v.kind_name() + " '" + v.to_string() + "'");
  }

  graph_value binary(char op, graph_value a, graph_value b) const {
    const char name[2] = {op, 0};
    a = number(a, name);
    b = number(b, name);
    using k = graph_value::kind;
    if (a.type == k::integer && b.type == k::integer) {
      int64_t r = 0;
      bool overflow = false;
      switch (op) {
        case '+': overflow = __builtin_add_overflow(a.i, b.i, &r); break;
        case '-': overflow = __builtin_sub_overflow(a.i, b.i, &r); break;
        case '*': overflow = __builtin_mul_overflow(a.i, b.i, &r); break;
        default:
          if (b.i == 0) fail("division by zero");
          // The one quotient that does not fit; x86 traps on INT64_MIN % -1 as well (found by
          // tests/fuzz/fuzz_model.cpp).
          if (b.i == -1 && a.i == std::numeric_limits<int64_t>::min()) {
            if (op == '%') return graph_value::of_int(0);
            fail("integer overflow in " + std::to_string(a.i) + "/" + std::to_string(b.i));
          }
          if (op == '%') return graph_value::of_int(a.i % b.i);
          if (a.i % b.i != 0)
            fail(std::to_string(a.i) + "/" + std::to_string(b.i) +
                 " is not a whole number (write a real, e.g. 1.0*x/y, for a real result)");
          return graph_value::of_int(a.i / b.i);
      }
      if (overflow) fail("integer overflow in " + std::to_string(a.i) + op + std::to_string(b.i));
      return graph_value::of_int(r);
    }
    double x = a.type == k::real ? a.r : static_cast<double>(a.i);
    double y = b.type == k::real ? b.r : static_cast<double>(b.i);
    switch (op) {
      case '+': return graph_value::of_real(x + y);
      case '-': return graph_value::of_real(x - y);
      case '*': return graph_value::of_real(x * y);
      case '/':
        if (y == 0) fail("division by zero");
        return graph_value::of_real(x / y);
      default: fail("'%' needs integers");
    }
  }

  graph_value expr() {
    graph_value v = term();
    for (;;) {
      if (accept('+')) v = binary('+', v, term());
      else if (accept('-')) v = binary('-', v, term());
      else return v;
    }
  }

  graph_value term() {
    graph_value v = unary();
    for (;;) {
      if (accept('*')) v = binary('*', v, unary());
      else if (accept('/')) v = binary('/', v, unary());
      else if (accept('%')) v = binary('%', v, unary());
      else return v;
    }
  }

  // Every nesting (parentheses, sqrt( ), unary minus) recurses through here, so this is where
  // the depth is bounded: 10,000 '(' would otherwise overflow the stack.
  graph_value unary() {
    if (depth_ >= max_graph_expr_depth)
      fail("nested more than " + std::to_string(max_graph_expr_depth) +
           " levels deep (parentheses, sqrt and unary minus count)");
    ++depth_;
    graph_value v = accept('-') ? binary('-', graph_value::of_int(0), unary()) : primary();
    --depth_;
    return v;
  }

  graph_value primary() {
    skip_space();
    if (pos_ == text_.size()) fail("expression ends early");
    char c = text_[pos_];
    if (accept('(')) {
      graph_value v = expr();
      if (!accept(')')) fail("missing ')'");
      return v;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return literal();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
      std::string_view name = text_.substr(start, pos_ - start);
      if (name == "true") return graph_value::of_bool(true);
      if (name == "false") return graph_value::of_bool(false);
      if (accept('(')) return call(name);
      auto it = consts_.find(name);
      if (it == consts_.end()) {
        std::vector<std::string> known;
        for (auto& [k, v] : consts_) known.push_back(k);
        fail("undefined constant '" + std::string(name) + "'" + did_you_mean(name, known));
      }
      return it->second;
    }
    if (c == '\'') fail("a 'quoted string' must be the whole value");
    fail("unexpected '" + std::string(1, c) + "'");
  }

  graph_value call(std::string_view name) {
    if (name != "sqrt") fail("unknown function '" + std::string(name) + "' (known: sqrt)");
    graph_value v = number(expr(), "sqrt");
    if (!accept(')')) fail("missing ')' after sqrt(");
    double x = v.type == graph_value::kind::real ? v.r : static_cast<double>(v.i);
    if (x < 0) fail("sqrt of a negative number");
    return graph_value::of_real(std::sqrt(x));
  }

  graph_value literal() {
    size_t start = pos_;
    bool real = false;
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '.') {
        real = true;
        ++pos_;
      } else if ((c == 'e' || c == 'E') && pos_ > start) {
        real = true;
        ++pos_;
        if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      } else {
        break;
      }
    }
    std::string_view tok = text_.substr(start, pos_ - start);
    const char* first = tok.data();
    const char* last = tok.data() + tok.size();
    if (real) {
      double d = 0;
      auto [p, ec] = std::from_chars(first, last, d);
      if (ec != std::errc{} || p != last) fail("bad number '" + std::string(tok) + "'");
      return graph_value::of_real(d);
    }
    int64_t n = 0;
    auto [p, ec] = std::from_chars(first, last, n);
    if (ec == std::errc::result_out_of_range) fail("integer '" + std::string(tok) + "' is too large");
    if (ec != std::errc{} || p != last) fail("bad number '" + std::string(tok) + "'");
    return graph_value::of_int(n);
  }

  std::string_view text_;
  const graph_constants& consts_;
  size_t pos_ = 0;
  int depth_ = 0;  // unary() calls in progress
};

}  // namespace

graph_value eval_graph_expr(std::string_view text, const graph_constants& constants) {
  auto first = text.find_first_not_of(" \t");
  auto last = text.find_last_not_of(" \t");
  if (first != std::string_view::npos && text[first] == '\'') {
    if (last == first || text[last] != '\'') throw graph_expr_error("unterminated 'quoted string'");
    auto inner = text.substr(first + 1, last - first - 1);
    if (inner.find('\'') != std::string_view::npos) throw graph_expr_error("a 'quoted string' must be the whole value");
    return graph_value::of_string(std::string(inner));
  }
  return expr_parser(text, constants).run();
}

}  // namespace fusion
