// Reading a user's file whole: one place for the ways it fails and the words that say so.
//
// Every loader of a file a person names (config, model, cluster, vocabulary, profile, corpus,
// tokenizer, certificate) reads it through read_file_text, so a missing file, a directory and an
// unreadable file are reported alike, naming the file by what it is for. A directory needs its own
// check: it opens as a stream that reads nothing, and the parser would then report an empty file.
//
// The ground floor: no project includes, no CAF, no CUDA.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "base/result.hpp"

namespace fusion {

/// The whole of the file at `path`, or why not, naming it as `what` ("model file", "cluster
/// file"): "cannot open model file 'm.pbtxt': No such file or directory", "model file '/tmp' is a
/// directory", "cannot read model file 'm.pbtxt': Input/output error".
inline result<std::string> read_file_text(const std::string& path, std::string_view what) {
  const std::string named = std::string(what) + " '" + path + "'";
  if (path.empty()) return fail("no " + std::string(what) + " named (an empty path)");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return fail("cannot open " + named + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fileno(f.get()), &st) != 0) return fail("cannot read " + named + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return fail(named + " is a directory");
  std::string text;
  if (S_ISREG(st.st_mode)) text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, got);
  if (std::ferror(f.get())) return fail("cannot read " + named + ": " + std::strerror(errno));
  return text;
}

}  // namespace fusion
