// The control plane: the coordinator's phases (a query answered in each, pause and resume), and
// re-wiring a live cluster run between two steps to an equivalent wiring (fresh edge ids, new
// edge senders) with losses bit-identical to an undisturbed run.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/admin_protocol.hpp"
#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/secure_link.hpp"
#include "actors/trainer.hpp"
#include "tests/support/cluster_fixtures.hpp"
#include "tests/support/fixtures.hpp"

using namespace fusion;
using namespace fusion::test::cluster;
using fusion::test::child_process;
using fusion::test::losses_of;
using json = nlohmann::json;

namespace {

std::string phase_of(session& s) { return json::parse(s.query("status"))["phase"].get<std::string>(); }

}  // namespace

TEST_CASE("control: the coordinator answers queries in every phase, pause holds the next step, resume goes on") {
  std::vector<child_process> nodes;
  auto c = tiny_config(40, 2);
  on_nodes(c, write_cluster("phases", 2, "placement { policy: \"even\" }"), 2, nodes, "phases");
  // While nodes join, an admin shell can already ask (the coordinator is an event-based actor):
  // a second actor system asks over the published admin port until the run is ready.
  std::vector<std::string> seen;
  std::thread asker;
  c.on_admin_listening = [&](uint16_t port) {
    asker = std::thread([&seen, port] {
      // An admin shell's side of the TLS connection and the login (apps/fusion_admin.cpp).
      const auto creds = fusion::test::admin_credentials();
      caf::actor_system_config cfg;
      add_fusion_message_types(cfg);
      load_network(cfg, creds.get());
      caf::actor_system sys{cfg};
      caf::scoped_actor self{sys};
      auto admin = connect_actor<admin_actor>(sys, "127.0.0.1", port, true);
      REQUIRE(admin);
      std::string challenge;
      self->request(*admin, std::chrono::seconds(5), challenge_atom::value, security::random_nonce())
          .receive([&](std::string& theirs, security::proof&) { challenge = theirs; },
                   [&](caf::error& e) { FAIL(describe(e)); });
      self->request(*admin, std::chrono::seconds(5), login_atom::value, security::make_proof(*creds, challenge))
          .receive([](std::string&) {}, [&](caf::error& e) { FAIL(describe(e)); });
      for (int i = 0; i < 1500 && (seen.empty() || seen.back() != "ready"); ++i) {
        self->request(*admin, std::chrono::seconds(5), query_atom::value, std::string("status"))
            .receive([&](std::string& js) {
              auto phase = json::parse(js)["phase"].get<std::string>();
              if (seen.empty() || seen.back() != phase) seen.push_back(phase);
            }, [&](caf::error& e) { FAIL(describe(e)); });
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  };
  session s(c);
  asker.join();
  INFO(seen.size());
  REQUIRE(!seen.empty());
  CHECK(seen.front() == "joining");
  CHECK(seen.back() == "ready");
  CHECK(phase_of(s) == "ready");
  auto nodes_json = json::parse(s.query("nodes"));
  REQUIRE(nodes_json["nodes"].size() == 2);
  CHECK(nodes_json["nodes"][0]["state"] == "joined");
  auto placement = json::parse(s.query("placement"));
  CHECK(placement["ops"].size() == s.actor_count());
  CHECK(placement["edges"].size() > 0);
  CHECK_THROWS_WITH_AS(s.query("bogus"), doctest::Contains("unknown topic 'bogus'"), std::runtime_error);
  CHECK_THROWS_WITH_AS(s.command("resume"), doctest::Contains("not paused"), std::runtime_error);
  CHECK_THROWS_WITH_AS(s.command("move", {"x", "n0"}), doctest::Contains("no op of model"), std::runtime_error);
  CHECK_THROWS_WITH_AS(s.command("rebalance"), doctest::Contains("needs placement policy opfence"), std::runtime_error);
  CHECK_THROWS_WITH_AS(s.command("frobnicate"), doctest::Contains("unknown command 'frobnicate'"), std::runtime_error);

  // Training in one thread; pause, queries while paused, resume from this one.
  train_result r;
  std::thread trainer([&] { r = s.train(); });
  for (int i = 0; i < 500 && json::parse(s.query("status"))["step"].get<int>() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(phase_of(s) == "training");
  auto paused = json::parse(s.command("pause"));
  CHECK(paused["phase"] == "paused");
  int held = paused["step"].get<int>();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto still = json::parse(s.query("status"));
  CHECK(still["phase"] == "paused");
  CHECK(still["step"].get<int>() == held);  // no step ran while paused
  CHECK(json::parse(s.query("ops"))["ops"].size() > 0);
  CHECK(json::parse(s.query("links"))["edges"].size() > 0);
  // The paused phase's behavior holds no evaluation, sampling or second training job: the
  // coordinator's one out-of-phase handler answers them in plain words.
  CHECK_THROWS_WITH_AS(s.evaluate(), doctest::Contains("cannot evaluate while paused"), std::runtime_error);
  CHECK_THROWS_WITH_AS(s.sample(5, "In", 1.0, 1), doctest::Contains("cannot sample while paused"), std::runtime_error);
  CHECK_THROWS_WITH_AS(s.train(), doctest::Contains("cannot train while paused"), std::runtime_error);
  CHECK(json::parse(s.command("resume"))["phase"] == "training");
  trainer.join();
  CHECK(r.steps.size() == 40);
  CHECK(phase_of(s) == "ready");
}

TEST_CASE("control: re-wiring a live cluster run keeps the losses bit-identical") {
  const int steps = 8;
  std::vector<double> undisturbed, rewired;
  {
    std::vector<child_process> nodes;
    auto c = tiny_config(steps, 2);
    on_nodes(c, write_cluster("plain", 3, "placement { policy: \"even\" }"), 3, nodes, "plain");
    session s(c);
    undisturbed = losses_of(s.train());
  }
  {
    std::vector<child_process> nodes;
    auto c = tiny_config(steps, 2);
    on_nodes(c, write_cluster("rewire", 3, "placement { policy: \"even\" }"), 3, nodes, "rewire");
    session s(c);
    auto before = json::parse(s.query("placement"))["edges"];
    REQUIRE(before.size() > 0);
    train_result r;
    std::thread trainer([&] { r = s.train(); });
    // Twice while training: each applies at the next step boundary.
    for (int i = 0; i < 500 && json::parse(s.query("status"))["step"].get<int>() < 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s.rewire();
    int at = json::parse(s.query("status"))["step"].get<int>();
    s.rewire();
    trainer.join();
    CHECK(at < steps);
    auto after = json::parse(s.query("placement"))["edges"];
    REQUIRE(after.size() == before.size());
    // Same wiring, fresh ids (two renumberings later).
    for (size_t i = 0; i < after.size(); ++i) {
      CHECK(after[i]["producer"] == before[i]["producer"]);
      CHECK(after[i]["consumer"] == before[i]["consumer"]);
      CHECK(after[i]["from"] == before[i]["from"]);
      CHECK(after[i]["id"].get<uint64_t>() >= before[i]["id"].get<uint64_t>() + 2 * before.size());
    }
    // Traffic after the re-wiring is reported on the new edges.
    CHECK(json::parse(s.query("links"))["edges"].size() > 0);
    rewired = losses_of(r);
  }
  REQUIRE(undisturbed.size() == static_cast<size_t>(steps));
  REQUIRE(rewired.size() == static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    CAPTURE(i);
    CHECK(rewired[i] == undisturbed[i]);  // bit for bit
  }
}
