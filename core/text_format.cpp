#include "core/text_format.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/graph_names.hpp"

namespace fusion::text_format {

namespace {

namespace gp = google::protobuf;

struct first_error_collector : gp::io::ErrorCollector {
  int line = 0;
  int column = 0;
  std::string message;
  void AddError(int l, gp::io::ColumnNumber c, const std::string& m) override {
    if (message.empty()) {
      line = l + 1;  // protobuf counts from 0
      column = c + 1;
      message = m;
    }
  }
};

// The quoted parts of one of protobuf's messages: `Message type "a.b" has no field named "x".`
// gives {"a.b", "x"}.
std::vector<std::string> quoted(const std::string& m) {
  std::vector<std::string> out;
  for (size_t at = m.find('"'); at != std::string::npos;) {
    size_t end = m.find('"', at + 1);
    if (end == std::string::npos) break;
    out.push_back(m.substr(at + 1, end - at - 1));
    at = m.find('"', end + 1);
  }
  return out;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// How the file writes the message `d`: "node { }" for fusion.pb.cluster_node in a cluster file
// (the proto names carry the file kind as a prefix), "the top level" for the file's own message.
std::string section_of(const gp::Descriptor* d, const gp::Descriptor* root) {
  if (d == root) return "at the top level of the " + root->name() + " file";
  std::string name = d->name();
  if (starts_with(name, (root->name() + "_").c_str())) name = name.substr(root->name().size() + 1);
  return "in '" + name + " { }'";
}

// The field whose value starts at `column` (1-based) of `line`: the name before its ':'.
std::string field_before(const std::string& line, int column) {
  size_t end = std::min(line.size(), static_cast<size_t>(std::max(column - 1, 0)));
  while (end > 0 && std::isspace(static_cast<unsigned char>(line[end - 1]))) --end;
  if (end > 0 && line[end - 1] == ':') --end;
  while (end > 0 && std::isspace(static_cast<unsigned char>(line[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && (std::isalnum(static_cast<unsigned char>(line[begin - 1])) || line[begin - 1] == '_')) --begin;
  return line.substr(begin, end - begin);
}

// The enum values a field called `field` of the file takes, or empty.
std::vector<std::string> enum_values(const gp::Descriptor* root, const std::string& field) {
  std::vector<std::string> out;
  const gp::FileDescriptor* file = root->file();
  for (int m = 0; m < file->message_type_count() && out.empty(); ++m) {
    const gp::FieldDescriptor* f = file->message_type(m)->FindFieldByName(field);
    if (f && f->enum_type())
      for (int v = 0; v < f->enum_type()->value_count(); ++v) out.push_back(f->enum_type()->value(v)->name());
  }
  return out;
}

// A byte that is no text where it stands, in hex: printed raw, a terminal would swallow or garble it.
std::string byte_words(unsigned char c) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", c);
  return std::string("a byte ") + hex + " that is not text (a binary file, or another encoding?)";
}

// A token as a person can read it: quoted (UTF-8 included), or its first control byte in hex.
std::string shown(const std::string& token) {
  for (unsigned char c : token)
    if (c < 0x20 || c == 0x7f) return byte_words(c);
  return "'" + token + "'";
}

// "got 'x'", or "got the end of the file" for protobuf's empty token.
std::string got(const std::string& token) { return token.empty() ? "got the end of the file" : "got " + shown(token); }

// Protobuf's message `m` about `line` of the file in plain words: no message type names, the
// field named. `column` moves to the field's name where protobuf points past it.
std::string plain_words(const std::string& m, const gp::Descriptor* root, const std::string& line, int& column) {
  const auto q = quoted(m);
  const std::string field = field_before(line, column);
  const std::string where = field.empty() ? "" : "field '" + field + "': ";
  auto after = [&](const char* prefix) { return m.substr(std::string(prefix).size()); };
  if (starts_with(m, "Message type ") && m.find("has no field named") != std::string::npos && q.size() >= 2) {
    const gp::Descriptor* d = gp::DescriptorPool::generated_pool()->FindMessageTypeByName(q[0]);
    std::vector<std::string> known;
    for (int i = 0; d && i < d->field_count(); ++i) known.push_back(d->field(i)->name());
    if (auto at = line.rfind(q[1], static_cast<size_t>(std::max(column - 1, 0))); at != std::string::npos)
      column = static_cast<int>(at) + 1;
    return "unknown field '" + q[1] + "'" + (d ? " " + section_of(d, root) : "") + did_you_mean(q[1], known) +
           (known.empty() ? "" : "; it takes " + join(known));
  }
  if (starts_with(m, "Non-repeated field ") && !q.empty()) return "field '" + q[0] + "' is given twice: it takes one value";
  if (starts_with(m, "Field ") && m.find("another member of oneof") != std::string::npos && q.size() >= 2)
    return "fields '" + q[1] + "' and '" + q[0] + "' exclude each other: give one of them";
  if (starts_with(m, "Invalid value for boolean field ") && q.size() >= 2)
    return "field '" + q[0] + "' is true or false, got '" + q[1] + "'";
  if (starts_with(m, "Unknown enumeration value of ") && q.size() >= 2) {
    auto values = enum_values(root, q[1]);
    return "field '" + q[1] + "' cannot be '" + q[0] + "'" + did_you_mean(q[0], values) +
           (values.empty() ? "" : "; it takes " + join(values));
  }
  if (starts_with(m, "Expected integer, got: ")) return where + "expected a whole number, " + got(after("Expected integer, got: "));
  if (starts_with(m, "Expect a decimal number, got: "))
    return where + "expected a decimal number, " + got(after("Expect a decimal number, got: "));
  if (starts_with(m, "Expected double, got: ")) return where + "expected a number, " + got(after("Expected double, got: "));
  if (starts_with(m, "Expected string, got: "))
    return where + "expected a text in double quotes, " + got(after("Expected string, got: "));
  if (starts_with(m, "Expected integer or identifier, got: "))
    return where + "expected a name or a number, " + got(after("Expected integer or identifier, got: "));
  if (starts_with(m, "Integer out of range (")) {
    std::string number = after("Integer out of range (");
    if (!number.empty() && number.back() == ')') number.pop_back();
    return where + "the number " + number + " is out of range";
  }
  if (starts_with(m, "Expected identifier, got: ")) {
    const std::string token = after("Expected identifier, got: ");
    if (token.empty()) return "the file ends inside a block: a '}' is missing";
    return "expected a field name, got " + shown(token);
  }
  if (const size_t mid = m.find("\", found \""); starts_with(m, "Expected \"") && mid != std::string::npos) {
    // `Expected "{", found ""x"".`: the found token may hold quotes itself.
    const std::string want = m.substr(10, mid - 10), token = m.substr(mid + 10, m.size() - mid - 12);
    return where + "expected '" + want + "', " + got(token);
  }
  if (m == "Message is too deep") return "blocks are nested too deeply";
  if (starts_with(m, "Interpreting non ascii codepoint ")) {
    const int byte = std::atoi(after("Interpreting non ascii codepoint ").c_str());
    // Names and numbers are ASCII; UTF-8 belongs inside double quotes.
    return byte_words(static_cast<unsigned char>(byte)) + ", outside a quoted text";
  }
  if (m == "Invalid control characters encountered in text.") {
    const auto at = static_cast<size_t>(std::max(column - 1, 0));
    return at < line.size() ? shown(line.substr(at, 1)) : "a control byte that is not text (a binary file?)";
  }
  return m;  // the tokenizer's own messages ("String literals cannot cross line boundaries.") read plainly
}

std::string line_of_text(const std::string& text, int line) {
  size_t at = 0;
  for (int l = 1; l < line && at != std::string::npos; ++l) {
    at = text.find('\n', at);
    if (at != std::string::npos) ++at;
  }
  if (at == std::string::npos || at > text.size()) return {};
  return text.substr(at, text.find('\n', at) - at);
}

}  // namespace

status parse(const std::string& text, gp::Message& msg, info_tree& tree, const char* what) {
  first_error_collector errors;
  gp::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (parser.ParseFromString(text, &msg)) return {};
  if (errors.message.empty()) errors.message = std::string("cannot parse the ") + what;
  int column = errors.column;
  const std::string words = plain_words(errors.message, msg.GetDescriptor(), line_of_text(text, errors.line), column);
  return fail(std::to_string(errors.line) + ":" + std::to_string(column) + ": parse error: " + words);
}

int line_of(const info_tree* tree, const gp::Descriptor* d, const char* field, int index, int fallback) {
  if (tree == nullptr) return fallback;
  int l = tree->GetLocation(d->FindFieldByName(field), index).line;
  return l < 0 ? fallback : l + 1;
}

const info_tree* nested(const info_tree* tree, const gp::Descriptor* d, const char* field, int index) {
  return tree == nullptr ? nullptr : tree->GetTreeForNested(d->FindFieldByName(field), index);
}

}  // namespace fusion::text_format
