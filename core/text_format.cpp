#include "core/text_format.hpp"

#include <google/protobuf/io/tokenizer.h>

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

}  // namespace

status parse(const std::string& text, gp::Message& msg, info_tree& tree, const char* what) {
  first_error_collector errors;
  gp::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (parser.ParseFromString(text, &msg)) return {};
  if (errors.message.empty()) errors.message = std::string("cannot parse the ") + what;
  return fail(std::to_string(errors.line) + ":" + std::to_string(errors.column) + ": parse error: " + errors.message);
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
