// A reader that follows CAF 0.17's INI grammar (caf/detail/parser/read_ini.hpp) closely enough to
// classify every value the way CAF would, then compares against the schema.
#include "core/ini_check.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include "base/result.hpp"
#include "core/graph_names.hpp"

namespace fusion {

namespace {

struct ini_value {
  enum class kind { boolean, integer, real, string, atom, timespan, uri, list, map } type = kind::integer;
  std::string text;     ///< as written
  bool negative = false;
  uint64_t magnitude = 0;  ///< integers: |value| when it fits
  std::vector<ini_value> items = {};
};

// A malformed line: thrown by the reader, reported by check_ini, which goes on at the next line.
struct syntax_error : error {
  using error::error;
};

bool is_key_start(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_key_char(char c) { return is_key_start(c) || c == '-'; }

class reader {
 public:
  explicit reader(const std::string& text) : s_(text) {}

  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  int line() const { return line_; }
  void next() {
    if (s_[i_++] == '\n') ++line_;
  }
  void skip_blanks() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\r')) next();
  }
  // Blanks, newlines and ';' comments (inside lists and maps).
  void skip_space() {
    for (;;) {
      skip_blanks();
      if (peek() == '\n') next();
      else if (peek() == ';') skip_line();
      else return;
    }
  }
  void skip_line() {
    while (!at_end() && peek() != '\n') next();
  }
  std::string word(bool (*ok)(char)) {
    std::string w;
    while (!at_end() && ok(peek())) w += s_[i_++];
    return w;
  }
  // The rest of the current line without its comment, for messages.
  std::string rest_of_line() const {
    size_t end = s_.find('\n', i_);
    std::string r = s_.substr(i_, end == std::string::npos ? std::string::npos : end - i_);
    return r.substr(0, r.find_last_not_of(" \t\r") + 1);
  }

  ini_value value() {
    char c = peek();
    if (c == '"') return quoted();
    if (c == '\'') return delimited('\'', ini_value::kind::atom, "atom");
    if (c == '<') return delimited('>', ini_value::kind::uri, "uri");
    if (c == '[') return list();
    if (c == '{') return map();
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.') return number();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::string w = word(is_key_char);
      if (w == "true" || w == "false") return {ini_value::kind::boolean, w};
      throw syntax_error{"unquoted string '" + w + "': strings need double quotes (\"" + w + "\")"};
    }
    if (c == '\n' || c == ';' || at_end()) throw syntax_error{"missing value after '='"};
    throw syntax_error{std::string("unexpected '") + c + "' where a value should start"};
  }

 private:
  ini_value quoted() {
    ini_value v{ini_value::kind::string, "\""};
    for (next();; next()) {
      if (at_end() || peek() == '\n') throw syntax_error{"unterminated string (missing '\"')"};
      v.text += peek();
      if (peek() == '"') break;
      if (peek() == '\\') {
        next();
        if (at_end() || std::string("nrt\\\"").find(peek()) == std::string::npos)
          throw syntax_error{std::string("illegal escape sequence '\\") + peek() + "' (use \\n \\r \\t \\\\ \\\")"};
        v.text += peek();
      }
    }
    next();
    return v;
  }

  ini_value delimited(char close, ini_value::kind k, const char* what) {
    ini_value v{k, std::string(1, peek())};
    for (next(); peek() != close; next()) {
      if (at_end() || peek() == '\n') throw syntax_error{std::string("unterminated ") + what};
      v.text += peek();
    }
    v.text += close;
    next();
    return v;
  }

  // list() and map() recurse through value(); the bound keeps a line of "[[[[..." from
  // overflowing the stack (found by tests/fuzz/fuzz_ini.cpp). Far deeper than any real config.
  static constexpr int max_depth = 64;
  class depth_guard {
   public:
    explicit depth_guard(int& depth) : depth_(depth) {
      if (depth_ >= max_depth)
        throw syntax_error{"lists and maps nested deeper than " + std::to_string(max_depth) + " levels"};
      ++depth_;
    }
    ~depth_guard() { --depth_; }
    depth_guard(const depth_guard&) = delete;
    depth_guard& operator=(const depth_guard&) = delete;

   private:
    int& depth_;
  };

  ini_value list() {
    depth_guard guard(depth_);
    ini_value v{ini_value::kind::list, "["};
    next();
    skip_space();
    while (peek() != ']') {
      if (at_end()) throw syntax_error{"unterminated list (missing ']')"};
      v.items.push_back(value());
      v.text += (v.items.size() > 1 ? ", " : "") + v.items.back().text;
      skip_space();
      if (peek() == ',') {
        next();
        skip_space();
      } else if (peek() != ']') {
        throw syntax_error{"expected ',' or ']' in list"};
      }
    }
    next();
    v.text += "]";
    return v;
  }

  ini_value map() {
    depth_guard guard(depth_);
    ini_value v{ini_value::kind::map, "{...}"};
    next();
    skip_space();
    while (peek() != '}') {
      if (at_end()) throw syntax_error{"unterminated map (missing '}')"};
      if (word(is_key_char).empty()) throw syntax_error{"expected a key in map"};
      skip_blanks();
      if (peek() == '=') next();
      else if (peek() != '{') throw syntax_error{"expected '=' after map key"};
      skip_blanks();
      v.items.push_back(value());
      skip_space();
      if (peek() == ',') next();
      skip_space();
    }
    next();
    return v;
  }

  ini_value number() {
    ini_value v;
    v.text = word([](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '-'; });
    std::string t = v.text;
    size_t p = 0;
    if (t[p] == '+' || t[p] == '-') v.negative = t[p++] == '-';
    size_t digits = t.find_first_not_of("0123456789", p);
    std::string unit = digits == std::string::npos ? "" : t.substr(digits);
    std::string mantissa = t.substr(p, digits == std::string::npos ? std::string::npos : digits - p);
    auto is_real_tail = [](const std::string& u) {
      return !u.empty() && (u[0] == '.' || u[0] == 'e' || u[0] == 'E') &&
             u.find_first_not_of("0123456789.eE+-") == std::string::npos;
    };
    if (unit.empty() || unit == "ns" || unit == "us" || unit == "ms" || unit == "s" || unit == "min" || unit == "h") {
      if (mantissa.empty()) throw syntax_error{"bad number '" + t + "'"};
      v.type = unit.empty() ? ini_value::kind::integer : ini_value::kind::timespan;
      // A leading 0 makes CAF read octal digits: 010 is 8 and 08 does not parse.
      int base = mantissa.size() > 1 && mantissa[0] == '0' ? 8 : 10;
      for (char c : mantissa) {
        if (c - '0' >= base) throw syntax_error{"'" + t + "' starts with 0, so it would be read as octal; drop the 0"};
        if (v.magnitude > (UINT64_MAX - (c - '0')) / base) throw syntax_error{"integer '" + t + "' is too large"};
        v.magnitude = v.magnitude * base + (c - '0');
      }
      return v;
    }
    if ((unit[0] == 'x' || unit[0] == 'X' || unit[0] == 'b' || unit[0] == 'B') && mantissa == "0") {
      int base = unit[0] == 'x' || unit[0] == 'X' ? 16 : 2;
      std::string ds = unit.substr(1);
      if (ds.empty()) throw syntax_error{"bad number '" + t + "'"};
      for (char c : ds) {
        int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                : std::isxdigit(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10 : 99;
        if (d >= base) throw syntax_error{"bad number '" + t + "'"};
        if (v.magnitude > (UINT64_MAX - d) / base) throw syntax_error{"integer '" + t + "' is too large"};
        v.magnitude = v.magnitude * base + d;
      }
      return v;
    }
    if (is_real_tail(unit)) {
      v.type = ini_value::kind::real;
      size_t e = unit.find_first_of("eE");
      std::string after = e == std::string::npos ? "" : unit.substr(e + 1);
      if (!after.empty() && (after[0] == '+' || after[0] == '-')) after = after.substr(1);
      bool ok = std::count(unit.begin(), unit.end(), '.') <= 1 && (e == std::string::npos ||
                (!after.empty() && after.find_first_not_of("0123456789") == std::string::npos &&
                 unit.find('.', e) == std::string::npos));
      if (!ok) throw syntax_error{"bad number '" + t + "'"};
      return v;
    }
    size_t u = unit.find_first_not_of("0123456789.eE+-");
    if (u != std::string::npos && is_real_tail(unit.substr(0, u)))
      throw syntax_error{"'" + t + "': a timespan needs a whole number (write 1500ms, not 1.5s)"};
    throw syntax_error{"'" + t + "': unknown unit '" + unit + "' (timespans use ns, us, ms, s, min or h)"};
  }

  const std::string& s_;
  size_t i_ = 0;
  int line_ = 1;
  int depth_ = 0;  // lists and maps open around the current value
};

// Whether `v` is a value CAF stores into an option of kind `k`; fails saying why not.
status matches(const ini_value& v, const ini_option& o) {
  using vk = ini_value::kind;
  using ok = ini_option::kind;
  auto got = [&] { return ", got " + v.text; };
  switch (o.type) {
    case ok::boolean:
      if (v.type == vk::boolean) return {};
      break;
    case ok::integer:
    case ok::unsigned_integer:
      if (v.type != vk::integer) break;
      if (o.type == ok::unsigned_integer && v.negative && v.magnitude != 0)
        return fail("expected an unsigned integer (>= 0)" + got());
      if (o.max != 0 && !v.negative && v.magnitude > o.max)
        return fail("expected an integer <= " + std::to_string(o.max) + got());
      if (o.type == ok::integer && v.magnitude > (v.negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1))
        return fail("integer out of range" + got());
      return {};
    case ok::real:
      if (v.type == vk::real) return {};
      break;
    case ok::string:
      if (v.type == vk::string) return {};
      break;
    case ok::timespan:
      if (v.type == vk::timespan) return {};
      break;
    case ok::string_list:
    case ok::integer_list: {
      if (v.type != vk::list) break;
      ini_option element{o.category, o.name, o.type == ok::string_list ? ok::string : ok::integer};
      for (size_t k = 0; k < v.items.size(); ++k)
        if (auto fits = matches(v.items[k], element); !fits)
          return fail("element " + std::to_string(k + 1) + " of the list: " + fits.error());
      return {};
    }
  }
  return fail("expected " + ini_kind_description(o.type) + got());
}

}  // namespace

std::string ini_kind_description(ini_option::kind k) {
  using ok = ini_option::kind;
  switch (k) {
    case ok::boolean: return "true or false";
    case ok::integer: return "an integer (e.g. 42)";
    case ok::unsigned_integer: return "an unsigned integer (e.g. 42)";
    case ok::real: return "a real number with a decimal point (e.g. 1.0)";
    case ok::string: return "a quoted string (e.g. \"text\")";
    case ok::timespan: return "a timespan with a unit (e.g. 250ms, 3s, 1min)";
    case ok::string_list: return "a list of quoted strings (e.g. [\"a\", \"b\"])";
    case ok::integer_list: return "a list of integers (e.g. [1, 2])";
  }
  return "?";
}

std::string to_string(const ini_problem& p) { return p.file + ":" + std::to_string(p.line) + ": " + p.message; }

std::vector<ini_problem> check_ini(const std::string& text, const std::string& file,
                                   const std::vector<ini_option>& schema) {
  std::vector<ini_problem> out;
  std::vector<std::string> categories;
  for (auto& o : schema)
    if (std::find(categories.begin(), categories.end(), o.category) == categories.end())
      categories.push_back(o.category);
  std::map<std::string, int> seen;  // "category.key" -> line
  std::string category;             // "" before the first header
  bool known_category = false;
  reader r(text);
  for (;;) {
    r.skip_blanks();
    if (r.at_end()) break;
    const int line = r.line();
    auto report = [&](std::string msg) { out.push_back({file, line, std::move(msg)}); };
    char c = r.peek();
    try {
      if (c == '\n') {
        r.next();
        continue;
      }
      if (c == ';') {
        r.skip_line();
        continue;
      }
      if (c == '[') {
        r.next();
        r.skip_blanks();
        std::string name = r.word([](char x) { return is_key_char(x) || x == '.'; });
        r.skip_blanks();
        if (name.empty() || !is_key_start(name[0]) || r.peek() != ']')
          throw syntax_error{"malformed category header (expected [name])"};
        r.next();
        category = name;
        known_category = std::find(categories.begin(), categories.end(), name) != categories.end();
        if (!known_category) {
          std::string list;
          for (auto& k : categories) list += (list.empty() ? "" : ", ") + k;
          std::string best = closest_name(name, categories);
          report("unknown category [" + name + "]" + (best.empty() ? "" : " (did you mean [" + best + "]?)") +
                 "; known: " + list);
        }
      } else if (is_key_start(c)) {
        std::string key = r.word(is_key_char);
        r.skip_blanks();
        if (r.peek() == '=') r.next();
        else if (r.peek() != '{') throw syntax_error{"expected '=' after '" + key + "'"};
        r.skip_blanks();
        ini_value v = r.value();
        std::string where = "[" + category + "] " + key;
        if (category.empty()) {
          report("key '" + key + "' is outside any [category] (it would be filed under [global]; write the category above it)");
        } else if (known_category) {
          auto opt = std::find_if(schema.begin(), schema.end(),
                                  [&](auto& o) { return o.category == category && o.name == key; });
          if (opt == schema.end()) {
            std::vector<std::string> keys;
            for (auto& o : schema)
              if (o.category == category) keys.push_back(o.name);
            report("[" + category + "] unknown key '" + key + "'" + did_you_mean(key, keys));
          } else if (auto fits = matches(v, *opt); !fits) {
            report(where + ": " + fits.error());
          }
          auto [it, fresh] = seen.emplace(category + "." + key, line);
          if (!fresh) report(where + ": duplicate key (first set at line " + std::to_string(it->second) + ")");
        }
      } else {
        throw syntax_error{"expected [category], key=value or a ';' comment"};
      }
      r.skip_blanks();
      if (r.peek() == ';') r.skip_line();
      if (!r.at_end() && r.peek() != '\n') throw syntax_error{"unexpected '" + r.rest_of_line() + "' after the value"};
    } catch (const syntax_error& e) {
      report("malformed line: " + std::string(e.what()));
      // Resume at the next line (CAF itself gives up on the whole file).
      r.skip_line();
    }
  }
  return out;
}

}  // namespace fusion
