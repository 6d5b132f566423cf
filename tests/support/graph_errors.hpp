// The error message of a model that must fail to load, and a check of its place and parts,
// for the model-loader tests.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "core/graph.hpp"

namespace fusion::test {

/// The graph_error message `load()` throws; fails the test when it loads.
template <class Load>
std::string graph_error_of(Load&& load) {
  try {
    load();
  } catch (const graph_error& e) {
    return e.what();
  }
  FAIL("expected a graph_error");
  return {};
}

}  // namespace fusion::test

/// Checks that the text fails to load (through the including file's `error_of(text)`), that
/// the message starts with `where` and that it holds every further part.
#define CHECK_GRAPH_ERROR(text, where, ...)                                             \
  do {                                                                                  \
    std::string msg_ = error_of(text);                                                  \
    INFO(msg_);                                                                         \
    CHECK(msg_.rfind(where, 0) == 0);                                                   \
    for (const char* part : {__VA_ARGS__}) CHECK(msg_.find(part) != std::string::npos); \
  } while (false)
