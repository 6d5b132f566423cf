// The node's data channel (actors/data_channel.hpp) against senders that break off: what a
// connection held half received goes with the connection, and what it held of an edge whose
// route was removed goes with its next frame.
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

// The first of two chunks of a 64 KiB forward tensor of `edge`.
std::pair<wire_header, std::shared_ptr<std::vector<std::byte>>> first_half(uint64_t edge) {
  wire_header h;
  h.dir = wire_direction::forward;
  h.edge = edge;
  h.step = 1;
  h.type = dtype::f32;
  h.shape = {128, 128};
  h.total_bytes = h.payload_bytes = 128 * 128 * 4;
  const auto chunks = split_into_chunks(h, 32 * 1024);
  REQUIRE(chunks.size() == 2);
  return {chunks[0], std::make_shared<std::vector<std::byte>>(chunks[0].chunk_bytes, std::byte{1})};
}

caf::actor_system_config& with_fusion_types(caf::actor_system_config& cfg) {
  add_fusion_message_types(cfg);
  return cfg;
}

// A data channel on a free port whose routes lead to `self`, standing for every op actor and
// edge sender.
struct channel {
  caf::actor_system_config cfg;
  caf::actor_system sys{with_fusion_types(cfg)};
  caf::scoped_actor self{sys};
  std::shared_ptr<route_table> routes = std::make_shared<route_table>();
  std::unique_ptr<data_channel_server> server;

  explicit channel(std::initializer_list<uint64_t> edges) {
    for (uint64_t e : edges)
      routes->set(e, edge_route{caf::actor_cast<tensor_sink>(self), caf::actor_cast<edge_sender_actor>(self)});
    server = std::make_unique<data_channel_server>("127.0.0.1", 0, caf::actor_cast<node_actor>(self), routes);
  }
};

// Queues chunk `h` with its payload on `tx`.
void send(net::frame_sender& tx, const wire_header& h, const std::shared_ptr<std::vector<std::byte>>& bytes) {
  CHECK(tx.send(encode_wire_header(h), bytes->data(), bytes->size(), bytes, [](const status&) {}) ==
        net::send_status::queued);
}

}  // namespace

TEST_CASE("data channel: a sender that breaks off mid-tensor leaves no partial tensor behind") {
  channel ch({9});
  auto& self = ch.self;
  auto& server = *ch.server;
  // The first of two chunks of a tensor of edge 9, then the sender is gone.
  auto [chunk, payload] = first_half(9);
  auto tx = net::frame_sender::connect("127.0.0.1", server.port(), {});
  REQUIRE(tx);
  send(**tx, chunk, payload);
  self->receive([](credit_atom, uint64_t edge, uint32_t n) { CHECK((edge == 9 && n == 1)); },
                caf::after(10s) >> [] { FAIL("the chunk was not acknowledged"); });
  CHECK(server.partial_tensors() == 1);
  (*tx)->close();
  // Before, the half tensor (here 64 KiB, up to a 16 GiB one) stayed for the node's life.
  CHECK(eventually([&] { return server.partial_tensors() == 0; }));
}

TEST_CASE("data channel: a half tensor of an edge unrouted mid-tensor goes with its sender's next frame") {
  channel ch({9, 10});
  auto& self = ch.self;
  auto& server = *ch.server;
  auto tx = net::frame_sender::connect("127.0.0.1", server.port(), {});
  REQUIRE(tx);
  auto [chunk, payload] = first_half(9);
  send(**tx, chunk, payload);
  self->receive([](credit_atom, uint64_t edge, uint32_t) { CHECK(edge == 9); },
                caf::after(10s) >> [] { FAIL("the chunk was not acknowledged"); });
  REQUIRE(server.partial_tensors() == 1);
  // A plan given up: edge 9 is unrouted while its sender, a survivor, keeps the connection and
  // goes on with a whole tensor of edge 10.
  ch.routes->erase(9);
  CHECK(server.partial_tensors() == 1);  // nothing frees it under a payload being written
  wire_header whole;
  whole.dir = wire_direction::forward;
  whole.edge = 10;
  whole.step = 2;
  whole.type = dtype::f32;
  whole.shape = {4};
  whole.total_bytes = whole.payload_bytes = whole.chunk_bytes = 16;
  send(**tx, whole, std::make_shared<std::vector<std::byte>>(16, std::byte{0}));
  bool delivered = false;
  for (int i = 0; i < 2; ++i)
    self->receive([](credit_atom, uint64_t edge, uint32_t) { CHECK(edge == 10); },
                  [&](forward_atom, uint64_t step, uint32_t, uint32_t, uint8_t, const tensor& t) {
                    CHECK(step == 2);
                    CHECK(t.numel() == 4);
                    delivered = true;
                  },
                  caf::after(10s) >> [] { FAIL("edge 10's tensor was not delivered"); });
  CHECK(delivered);
  // Before, the half tensor of edge 9 stayed for the life of the connection.
  CHECK(server.partial_tensors() == 0);
  CHECK(server.accepted() == 1);
}
