// A fusion-node process receiving malformed wire messages: each is rejected with a clear error,
// counted, and reported to the coordinator, and the node keeps working; strangers on the data
// channel are refused and counted without a report. The test plays the
// coordinator: it accepts the node's hello, has it host an input actor that forwards to the test,
// and routes an edge to that actor. A second case checks a node's TLS data channel against
// plaintext, foreign, admin and misnamed peers. Over CAF, a tensor half received when its edge is
// unrouted is forgotten and late chunks of that edge are dropped.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <filesystem>
#include <thread>

#include "actors/edge_actor.hpp"
#include "actors/messages.hpp"
#include "actors/node_actor.hpp"
#include "actors/op_actor.hpp"
#include "core/wire.hpp"
#include "net/frame_channel.hpp"
#include "security/certs.hpp"
#include "tests/support/certs_fixture.hpp"
#include "tests/support/child_process.hpp"

using namespace fusion;
using fusion::test::child_process;
using namespace std::chrono_literals;

namespace {

// A port nothing listens on (bound, read and closed again).
uint16_t unused_port() {
  auto l = net::listen_tcp("127.0.0.1", 0);
  REQUIRE(l);
  return l->local_port();
}

// Waits up to 10 s for `text` in the node's log.
bool logged(child_process& node, const std::string& text) {
  for (int i = 0; i < 100; ++i) {
    if (node.output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

wire_chunk make_chunk(const wire_header& h, size_t payload_bytes) {
  wire_chunk c;
  c.header = encode_wire_header(h);
  c.received.assign(payload_bytes, std::byte{1});
  return c;
}

}  // namespace

TEST_CASE("node: malformed wire messages are rejected and counted, and the node stays up") {
  caf::actor_system_config cfg;
  add_fusion_message_types(cfg);
  set_liveness(cfg, 100, 2000);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto me = caf::actor_cast<caf::actor>(self);
  auto port = sys.middleman().publish(me, 0, "127.0.0.1", true);
  REQUIRE(port);
  auto log = (std::filesystem::temp_directory_path() / ("fusion_node_wire_" + std::to_string(::getpid()) + ".log"));
  child_process node({std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                      std::string(FUSION_SOURCE_DIR) + "/configs/nodes/site-a.ini", "--node.name=w0",
                      "--node.coordinator=127.0.0.1:" + std::to_string(*port), "--runtime.threads=1",
                      "--security.mode=off"},  // this test plays a plaintext coordinator
                     log.string());
  node_actor remote_node;
  uint16_t data_port = 0;
  self->receive(
      [&](hello_atom, node_hello& h, node_actor& n) -> caf::message {
        CHECK(h.name == "w0");
        CHECK(h.version == wire_protocol_version);
        CHECK(h.gflops > 0);
        remote_node = n;
        data_port = h.data_port;
        return caf::make_message(welcome_atom::value, int32_t{0}, wire_protocol_version);
      },
      caf::after(30s) >> [&] { FAIL("the node did not say hello: " << node.output()); });
  REQUIRE(remote_node);

  // An input actor on the node forwards whatever the edge delivers to us.
  node_spec spec;
  spec.id = 0;
  spec.name = "tokens";
  spec.kind = "input";
  spec.consumer_slots = {0};
  op_actor input;
  const actor_run_params run;  // (a named object: a temporary trips a GCC 12 -Wmaybe-uninitialized false positive)
  self->request(remote_node, 10s, spawn_atom::value, spec, run)
      .receive([&](op_actor& a) { input = a; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  REQUIRE(input);
  // The test stands in for the input's consumer and for the remote edge sender that gets credits.
  self->send(input, connect_atom::value, std::vector<tensor_sink>{caf::actor_cast<tensor_sink>(me)},
             std::vector<tensor_sink>{}, caf::actor_cast<op_reporter>(me), replica_ring{});
  self->request(remote_node, 10s, route_atom::value, uint64_t{7}, tensor_sink{input},
                caf::actor_cast<edge_sender_actor>(me))
      .receive([](bool) {}, [&](caf::error& e) { FAIL(sys.render(e)); });

  wire_header good;
  good.edge = 7;
  good.dir = wire_direction::forward;
  good.type = dtype::f32;
  good.shape = {2, 2};
  good.total_bytes = 16;
  good.chunk_bytes = 16;

  struct bad_case {
    const char* what;
    wire_header header;
    size_t payload;
    std::string expect;
  };
  // A version from the future: the next one.
  const uint32_t other_version = wire_protocol_version + 1;
  const std::string other_version_text = "wire protocol version " + std::to_string(other_version);
  std::vector<bad_case> cases;
  cases.push_back({"wrong version", good, 16, other_version_text});
  cases.back().header.version = other_version;
  cases.push_back({"shape does not match the size", good, 12, "needs 16 bytes, header says 12"});
  cases.back().header.total_bytes = 12;
  cases.back().header.chunk_bytes = 12;
  cases.push_back({"truncated payload", good, 10, "truncated payload"});
  cases.push_back({"unknown edge", good, 16, "no edge 8"});
  cases.back().header.edge = 8;
  for (auto& bc : cases) {
    CAPTURE(bc.what);
    self->send(remote_node, wire_atom::value, make_chunk(bc.header, bc.payload));
    std::string reported;
    self->receive([&](fail_atom, caf::error& e) { reported = describe(e); },
                  caf::after(10s) >> [] {});
    CHECK(reported.find("node w0") != std::string::npos);
    CHECK(reported.find(bc.expect) != std::string::npos);
  }
  // On the TCP data channel, a connection whose first frame is refused (the wrong version) has
  // delivered nothing of the run: a stranger. It is counted and logged, and the run goes on (no
  // failure reaches the coordinator).
  REQUIRE(data_port != 0);
  auto channel = net::frame_sender::connect("127.0.0.1", data_port);
  REQUIRE(channel);
  auto payload = std::make_shared<std::vector<std::byte>>(16, std::byte{3});
  wire_header bad = good;
  bad.version = other_version;
  REQUIRE((*channel)->send(encode_wire_header(bad), payload->data(), 16, payload) == net::send_status::queued);
  // Bytes that are no frame at all, and a connection that never sends anything.
  auto garbage = net::connect_tcp("127.0.0.1", data_port);
  REQUIRE(garbage);
  const std::string request = "GET / HTTP/1.1\r\nHost: fusion\r\n\r\n";
  REQUIRE(net::send_all(garbage->fd(), request.data(), request.size()).ok());
  auto silent = net::connect_tcp("127.0.0.1", data_port);
  REQUIRE(silent);
  self->receive([&](fail_atom, caf::error& e) { FAIL("a stranger ended the run: " << describe(e)); },
                caf::after(2s) >> [] {});
  auto wait_for_rejections = [&](size_t want) {
    node_stats got;
    for (int i = 0; i < 100 && got.rejected < want; ++i) {
      self->request(remote_node, 10s, stats_atom::value)
          .receive([&](node_stats& st) { got = st; }, [&](caf::error& e) { FAIL(sys.render(e)); });
      if (got.rejected < want) std::this_thread::sleep_for(100ms);
    }
    return got;
  };
  auto st = wait_for_rejections(cases.size() + 2);
  CHECK(st.rejected == cases.size() + 2);
  CHECK(node.output().find(other_version_text) != std::string::npos);
  CHECK(node.output().find("bad magic") != std::string::npos);

  // Still up: a valid message in two chunks is acknowledged chunk by chunk and delivered whole.
  wire_header first = good, second = good;
  first.chunk_bytes = second.chunk_bytes = second.offset = 8;
  wire_chunk c1 = make_chunk(first, 8), c2 = make_chunk(second, 8);
  std::fill(c2.received.begin(), c2.received.end(), std::byte{2});
  self->send(remote_node, wire_atom::value, c1);
  self->send(remote_node, wire_atom::value, c2);
  int credits = 0;
  tensor delivered;
  for (int i = 0; i < 3; ++i)
    self->receive([&](credit_atom, uint64_t edge, uint32_t n) {
                      CHECK(edge == 7);
                      credits += static_cast<int>(n);
                    },
                  [&](forward_atom, uint64_t, uint32_t, uint32_t slot, uint8_t, tensor& t) {
                    CHECK(slot == 0);
                    delivered = std::move(t);
                  },
                  [&](fail_atom, caf::error& e) { FAIL(describe(e)); }, caf::after(10s) >> [] {});
  CHECK(credits == 2);
  REQUIRE(delivered.shape() == shape_t{2, 2});
  CHECK(delivered.bytes()[0] == std::byte{1});
  CHECK(delivered.bytes()[15] == std::byte{2});
  // And a valid frame on the data channel arrives too.
  REQUIRE((*channel)->send(encode_wire_header(good), payload->data(), 16, payload) == net::send_status::queued);
  // `messages` credits and deliveries: the credits counted, the tensor delivered kept.
  auto collect = [&](int messages) {
    int got = 0;
    delivered = tensor{};
    for (int i = 0; i < messages; ++i)
      self->receive([&](credit_atom, uint64_t, uint32_t n) { got += static_cast<int>(n); },
                    [&](forward_atom, uint64_t, uint32_t, uint32_t, uint8_t, tensor& t) { delivered = std::move(t); },
                    [&](fail_atom, caf::error& e) { FAIL(describe(e)); }, caf::after(10s) >> [] {});
    return got;
  };
  CHECK(collect(2) == 1);
  REQUIRE(delivered.shape() == shape_t{2, 2});
  CHECK(delivered.bytes()[7] == std::byte{3});
  (*channel)->close();

  // A tensor half received over CAF when its edge is unrouted (a plan given up) is forgotten,
  // and a late chunk of the removed edge is dropped, not reported: the node once kept the half
  // for its life and refused the same chunk later as "arrived twice".
  auto await_credits = [&](int want) {
    int got = 0;
    for (int i = 0; i < want; ++i)
      self->receive([&](credit_atom, uint64_t, uint32_t n) { got += static_cast<int>(n); },
                    [&](fail_atom, caf::error& e) { FAIL(describe(e)); }, caf::after(10s) >> [] {});
    return got;
  };
  self->send(remote_node, wire_atom::value, c1);
  CHECK(await_credits(1) == 1);
  self->request(remote_node, 10s, unroute_atom::value, uint64_t{7}).receive([](bool) {}, [&](caf::error& e) {
    FAIL(sys.render(e));
  });
  self->send(remote_node, wire_atom::value, c2);  // late: dropped
  self->receive([&](fail_atom, caf::error& e) { FAIL("a late chunk was reported: " << describe(e)); },
                [&](credit_atom, uint64_t, uint32_t) { FAIL("a late chunk was credited"); }, caf::after(1s) >> [] {});
  self->request(remote_node, 10s, route_atom::value, uint64_t{7}, tensor_sink{input},
                caf::actor_cast<edge_sender_actor>(me))
      .receive([](bool) {}, [&](caf::error& e) { FAIL(sys.render(e)); });
  self->send(remote_node, wire_atom::value, c1);
  self->send(remote_node, wire_atom::value, c2);
  CHECK(collect(3) == 2);
  REQUIRE(delivered.shape() == shape_t{2, 2});
  CHECK(delivered.bytes()[15] == std::byte{2});
  CHECK(node.wait(0) == -2);  // still running

  self->request(remote_node, 10s, shutdown_atom::value).receive([](bool) {}, [](caf::error&) {});
  CHECK(node.wait(10) == 0);
}

TEST_CASE("node: its TLS data channel refuses plaintext, foreign, admin and misnamed peers, and takes a node's frames") {
  // The node listens on its data channel before it joins, and keeps trying to reach a
  // coordinator that does not exist: long enough for this test.
  const uint16_t data_port = unused_port();
  auto log = (std::filesystem::temp_directory_path() / ("fusion_node_tls_" + std::to_string(::getpid()) + ".log"));
  child_process node({std::string(FUSION_BINARY_DIR) + "/apps/fusion-node", "--config",
                      std::string(FUSION_SOURCE_DIR) + "/configs/nodes/site-a.ini", "--node.name=w0",
                      "--node.coordinator=127.0.0.1:" + std::to_string(unused_port()),
                      "--node.data-port=" + std::to_string(data_port), "--runtime.threads=1",
                      test::certs_arg()},
                     log.string());
  bool listening = false;
  for (int i = 0; i < 300 && !listening; ++i) {
    listening = net::connect_tcp("127.0.0.1", data_port, 200ms).ok();
    if (!listening) std::this_thread::sleep_for(100ms);
  }
  REQUIRE_MESSAGE(listening, node.output());
  auto tls_of = [](const std::string& dir, security::role r, const std::string& name = {}) {
    auto ctx = net::tls_context::load(security::files_in(dir, r, name));
    REQUIRE_MESSAGE(ctx, ctx.error());
    return *ctx;
  };
  auto connect_as = [&](std::shared_ptr<const net::tls_context> tls, const std::string& expect) {
    net::frame_sender_options o;
    o.tls = std::move(tls);
    o.peer = {security::role::node, expect};
    return net::frame_sender::connect("127.0.0.1", data_port, o);
  };
  auto payload = std::make_shared<std::vector<std::byte>>(16, std::byte{3});
  wire_header h;
  h.edge = 5;
  h.dir = wire_direction::forward;
  h.type = dtype::f32;
  h.shape = {2, 2};
  h.total_bytes = h.chunk_bytes = 16;

  // Plaintext: the TCP connect succeeds, the node refuses what follows.
  auto plain = net::frame_sender::connect("127.0.0.1", data_port);
  REQUIRE(plain);
  (*plain)->send(encode_wire_header(h), payload->data(), 16, payload);
  CHECK_MESSAGE(logged(node, "refused a connection to the data channel: TLS connection from 127.0.0.1:"), node.output());
  CHECK(logged(node, "it does not speak TLS"));

  // A node certificate of another cluster's CA.
  auto other = test::temp_path("certs-other-node", "dir");
  std::filesystem::remove_all(other);
  security::make_cluster_certs(other, {"n1"});
  auto foreign = connect_as(tls_of(other, security::role::node, "n1"), "w0");
  REQUIRE_FALSE(foreign);
  CHECK_MESSAGE(foreign.error().find("not issued by this cluster's CA") != std::string::npos, foreign.error());
  std::filesystem::remove_all(other);

  // The admin's certificate of this cluster.
  auto admin = connect_as(tls_of(test::certs_dir(), security::role::admin), "w0");
  REQUIRE_FALSE(admin);
  CHECK_MESSAGE(admin.error().find("it refused this process's certificate") != std::string::npos, admin.error());
  CHECK_MESSAGE(logged(node, "admin certificate of 'admin', and only a node may connect here"), node.output());

  // A node of the run that expects another node at this address.
  auto misnamed = connect_as(tls_of(test::certs_dir(), security::role::node, "n1"), "n3");
  REQUIRE_FALSE(misnamed);
  CHECK_MESSAGE(misnamed.error().find("it holds the certificate of node 'w0', not of 'n3'") != std::string::npos,
                misnamed.error());

  // A node of the run gets through: its frame reaches the node's checks (no such edge here).
  auto peer = connect_as(tls_of(test::certs_dir(), security::role::node, "n1"), "w0");
  REQUIRE_MESSAGE(peer, peer.error());
  (*peer)->send(encode_wire_header(h), payload->data(), 16, payload);
  CHECK_MESSAGE(logged(node, "no edge 5 ends at this node"), node.output());
  (*peer)->close();
  CHECK(node.wait(0) == -2);  // still running
}
