// The message of what a call throws, for tests that check an error's words.
#pragma once

#include <exception>
#include <string>

namespace fusion::test {

/// The what() of the std::exception `fn` throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

/// Whether `s` holds `part`.
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace fusion::test
