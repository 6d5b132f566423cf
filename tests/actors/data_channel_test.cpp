// The node's data channel (actors/data_channel.hpp) against senders that break off: what a
// connection held half received goes with the connection.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <thread>

#include "actors/data_channel.hpp"
#include "actors/messages.hpp"
#include "core/wire.hpp"
#include "net/frame_channel.hpp"

using namespace fusion;
using namespace std::chrono_literals;

namespace {

// Waits up to 10 s for `done`.
template <class Fn>
bool eventually(Fn done) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

}  // namespace

TEST_CASE("data channel: a sender that breaks off mid-tensor leaves no partial tensor behind") {
  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto routes = std::make_shared<route_table>();
  routes->set(9, edge_route{caf::actor_cast<tensor_sink>(self), caf::actor_cast<edge_sender_actor>(self)});
  data_channel_server server("127.0.0.1", 0, caf::actor_cast<node_actor>(self), routes);

  // The first of two chunks of a 64 KiB tensor of edge 9, then the sender is gone.
  wire_header h;
  h.dir = wire_direction::forward;
  h.edge = 9;
  h.step = 1;
  h.type = dtype::f32;
  h.shape = {128, 128};
  h.total_bytes = h.payload_bytes = 128 * 128 * 4;
  const auto chunks = split_into_chunks(h, 32 * 1024);
  REQUIRE(chunks.size() == 2);
  auto payload = std::make_shared<std::vector<std::byte>>(chunks[0].chunk_bytes, std::byte{1});
  auto tx = net::frame_sender::connect("127.0.0.1", server.port(), {});
  REQUIRE(tx);
  CHECK((*tx)->send(encode_wire_header(chunks[0]), payload->data(), payload->size(), payload, [](const status&) {}) ==
        net::send_status::queued);
  self->receive([](credit_atom, uint64_t edge, uint32_t n) { CHECK((edge == 9 && n == 1)); },
                caf::after(10s) >> [] { FAIL("the chunk was not acknowledged"); });
  CHECK(server.partial_tensors() == 1);
  (*tx)->close();
  // Before, the half tensor (here 64 KiB, up to a 16 GiB one) stayed for the node's life.
  CHECK(eventually([&] { return server.partial_tensors() == 0; }));
}
