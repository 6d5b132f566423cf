// The live bound of one op actor: which forwards may start, the peak of live micro-batches, and
// a full 1F1B step of a first stage (limit 4, 8 micro-batches) replayed event by event.
#include <doctest/doctest.h>

#include <string>

#include "core/live_gate.hpp"

namespace fusion {
namespace {

TEST_CASE("core/live_gate: no bound admits every forward") {
  live_gate g;
  for (size_t k = 0; k < 100; ++k) {
    CHECK(g.may_forward(k));
    g.forward_done();
  }
  CHECK(g.peak() == 100);
  CHECK(g.end_step() == 100);
  CHECK(g.live() == 0);
}

TEST_CASE("core/live_gate: a bound of 2 holds the third forward until the first backward") {
  live_gate g(2);
  CHECK(g.may_forward(0));
  CHECK(g.may_forward(1));
  CHECK_FALSE(g.may_forward(2));
  g.forward_done();
  g.forward_done();
  CHECK(g.live() == 2);
  CHECK_FALSE(g.may_forward(2));
  g.backward_done();
  CHECK(g.may_forward(2));
  CHECK_FALSE(g.may_forward(3));
  g.forward_done();
  CHECK(g.end_step() == 2);
  // The next step starts from index 0 again.
  CHECK(g.may_forward(1));
  CHECK_FALSE(g.may_forward(2));
}

TEST_CASE("core/live_gate: 1F1B order of a first stage of four, eight micro-batches") {
  // Forwards are offered as soon as they arrive (all at once here); a backward of micro-batch i
  // arrives once its forward ran. The stage runs what the gate admits, backward first.
  live_gate g(4);
  std::string order;
  size_t next_fwd = 0, next_bwd = 0;
  const size_t M = 8;
  while (next_bwd < M) {
    if (next_bwd < next_fwd && (next_fwd == M || !g.may_forward(next_fwd) || next_fwd - next_bwd >= 4)) {
      g.backward_done();
      order += "B" + std::to_string(next_bwd++);
    } else {
      REQUIRE(g.may_forward(next_fwd));
      g.forward_done();
      order += "F" + std::to_string(next_fwd++);
    }
  }
  CHECK(order == "F0F1F2F3B0F4B1F5B2F6B3F7B4B5B6B7");
  CHECK(g.end_step() == 4);
}

TEST_CASE("core/live_gate: GPipe holds backwards until every forward of the step") {
  live_gate g(0, true, 3);
  CHECK(g.may_forward(2));
  CHECK_FALSE(g.may_backward());
  g.forward_done();
  g.forward_done();
  CHECK_FALSE(g.may_backward());
  g.forward_done();
  CHECK(g.may_backward());
  for (int i = 0; i < 3; ++i) g.backward_done();
  CHECK(g.end_step() == 3);
  CHECK_FALSE(g.may_backward());  // the next step starts over
  CHECK(live_gate().may_backward());
}

}  // namespace
}  // namespace fusion
