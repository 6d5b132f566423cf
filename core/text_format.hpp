// Shared helpers for the protobuf text-format files (model files, cluster files): parsing with
// the first error's line and column, and the file line of any field, so every loader can name
// FILE:LINE in its errors.
#pragma once

#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <string>

#include "base/result.hpp"

namespace fusion::text_format {

using info_tree = google::protobuf::TextFormat::ParseInfoTree;

/// Parses `text` into `msg`, recording field locations in `tree`. Fails with
/// "LINE:COLUMN: parse error: MESSAGE" for the first error (`what` names the kind of file when
/// protobuf gives no message).
status parse(const std::string& text, google::protobuf::Message& msg, info_tree& tree, const char* what);

/// 1-based line of `field` (its index-th value when repeated) in `tree`, or `fallback` when the
/// field is absent or the tree is null.
int line_of(const info_tree* tree, const google::protobuf::Descriptor* d, const char* field, int index = -1,
            int fallback = 0);

/// The location tree of a nested message field, or null.
const info_tree* nested(const info_tree* tree, const google::protobuf::Descriptor* d, const char* field,
                        int index = -1);

}  // namespace fusion::text_format
