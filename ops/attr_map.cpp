#include <charconv>

#include "ops/op.hpp"

namespace fusion {

namespace {

template <class T>
bool parse_number(const std::string& s, T& out) {
  auto* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc{} && p == end;
}

}  // namespace

int64_t attr_map::get_int(const std::string& key) const {
  auto i = values_.find(key);
  if (i == values_.end()) throw op_error("missing attribute '" + key + "'");
  int64_t v = 0;
  if (!parse_number(i->second, v))
    throw op_error("attribute '" + key + "' must be an integer, got \"" + i->second + "\"");
  return v;
}

int64_t attr_map::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double attr_map::get_float(const std::string& key, double fallback) const {
  auto i = values_.find(key);
  if (i == values_.end()) return fallback;
  double v = 0;
  if (!parse_number(i->second, v))
    throw op_error("attribute '" + key + "' must be a number, got \"" + i->second + "\"");
  return v;
}

bool attr_map::get_bool(const std::string& key, bool fallback) const {
  auto i = values_.find(key);
  if (i == values_.end()) return fallback;
  if (i->second == "true" || i->second == "1") return true;
  if (i->second == "false" || i->second == "0") return false;
  throw op_error("attribute '" + key + "' must be true or false, got \"" + i->second + "\"");
}

std::string attr_map::get_string(const std::string& key, const std::string& fallback) const {
  auto i = values_.find(key);
  return i == values_.end() ? fallback : i->second;
}

}  // namespace fusion
