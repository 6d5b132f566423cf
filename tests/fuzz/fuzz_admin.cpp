// Fuzzes the admin shell's command parser (apps/admin_shell.hpp parse_line): splitting on ';'
// outside quotes, quoting and backslash escapes, tokenizing, the command table check with its
// did-you-mean, and tab completion at every split point of the line.
//
// parse_line reports problems in parsed_line::error and never throws; any exception is a bug, as
// is a parse that yields both commands and an error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "apps/admin_shell.hpp"

namespace admin = fusion::admin;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  try {
    auto parsed = admin::parse_line(line);
    if (!parsed.error.empty() && !parsed.commands.empty()) std::abort();
    for (const auto& c : parsed.commands) {
      if (!c.spec || c.spec->name != c.name) std::abort();  // a checked command names its entry
      (void)admin::help_text(c.name);
    }
    // Completion as libedit asks for it: the text before the cursor and the word under it.
    if (size <= 256)
      for (size_t cut = 0; cut <= size; ++cut) {
        size_t word = line.find_last_of(" \t;", cut == 0 ? 0 : cut - 1);
        word = (word == std::string_view::npos || cut == 0) ? 0 : word + 1;
        (void)admin::completions_in(line.substr(0, word), line.substr(word, cut - word));
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "admin shell threw %s\n", e.what());
    std::abort();
  }
  return 0;
}
