// Measured profiles without actors: profile files (a round trip, and every refusal naming the
// file and the field), timing the distinct ops of gpt-char-tiny on this CPU, and the CPU share
// under contention.
#include <doctest/doctest.h>

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/op_timing.hpp"
#include "scheduler/profile.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("fusion_profile_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Three sites, three nodes; site c has a link but is reached by no probe of ours below.
cluster_spec three_sites() {
  return parse_cluster(R"(name: "three"
site { name: "a" }
site { name: "b" }
site { name: "c" }
node { name: "a1" site: "a" device: "cpu" }
node { name: "b1" site: "b" device: "cpu" cpu_share: 0.5 }
node { name: "c1" site: "c" device: "cpu" memory_gib: 2 }
link { a: "a" b: "b" mbit: 1000 }
link { a: "b" b: "c" mbit: 100 }
)",
                       "three.pbtxt");
}

cluster_profile measured_profile(const cluster_spec& c) {
  cluster_profile p = profile_from_cluster(c);
  p.model = "gpt-char-tiny";
  p.micro_batch = 4;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    auto& n = p.nodes[i];
    n.gflops = 40.5 + static_cast<double>(i);
    n.memory_bytes = (uint64_t{7} << 30) + i;
    n.cpu_share = 0.25 * static_cast<double>(i + 1);
    // The first node under a CFS quota of 0.3 core per 50 ms (saved and loaded as measured).
    if (i == 0) n.quota = {0.3, 0.05};
    n.ops["linear{out=192}(4x64x64)"] = {1.25e-4, 2.5e-4 + static_cast<double>(i) * 1e-6, 3e-5};
    n.ops["gelu{}(4x64x256)"] = {4e-5, 6e-5, 0};
  }
  p.links[0].mbit = 912.25;  // a - b, probed
  p.links[0].rtt_s = 1.5e-3;
  p.links[0].measured = true;
  link_profile ac;           // a - c, probed although the cluster file has no link there
  ac.site_a = c.find_site("a");
  ac.site_b = c.find_site("c");
  ac.mbit = 9400;
  ac.rtt_s = 6e-5;
  ac.measured = true;
  p.links.push_back(ac);
  return p;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The message load_profile throws for `text` against `c`.
std::string load_error(const std::string& text, const cluster_spec& c, const std::string& path) {
  write(path, text);
  try {
    load_profile(path, c);
  } catch (const profile_error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* valid_text = R"({
  "format": "fusion-profile", "version": 1, "model": "m", "micro_batch": 2,
  "nodes": {
    "a1": { "site": "a", "device": "cpu", "cpu_share": 1.0, "ops": { "k": { "forward_s": 0.1, "backward_s": 0.2 } } },
    "b1": { "site": "b", "device": "cpu" },
    "c1": { "site": "c", "device": "cpu" }
  },
  "links": [ { "a": "a", "b": "b", "mbit": 500, "rtt_s": 0.001, "measured": true } ]
})";

}  // namespace

TEST_CASE("scheduler/profile: a saved profile loads back as it was, nodes by name, links by site") {
  cluster_spec c = three_sites();
  cluster_profile p = measured_profile(c);
  const std::string path = temp_file("roundtrip.json");
  save_profile(path, p);
  cluster_profile q = load_profile(path, c);
  CHECK(q.model == "gpt-char-tiny");
  CHECK(q.micro_batch == 4);
  REQUIRE(q.nodes.size() == p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) CHECK(q.nodes[i] == p.nodes[i]);
  REQUIRE(q.links.size() == 3);
  CHECK(q.links[0] == p.links[0]);            // measured: as probed
  CHECK(q.links[1] == p.links[1]);            // b - c: the cluster file's hint
  CHECK(!q.links[1].measured);
  CHECK(q.links[2] == p.links[2]);            // a - c: probed, not in the cluster file

  // Node order in the file does not matter; the result follows the cluster file.
  cluster_spec reordered = parse_cluster(R"(name: "three"
site { name: "c" }
site { name: "b" }
site { name: "a" }
node { name: "c1" site: "c" device: "cpu" }
node { name: "a1" site: "a" device: "cpu" }
node { name: "b1" site: "b" device: "cpu" }
link { a: "a" b: "b" mbit: 10 }
)",
                                         "reordered.pbtxt");
  cluster_profile r = load_profile(path, reordered);
  REQUIRE(r.nodes.size() == 3);
  CHECK(r.nodes[0].name == "c1");
  CHECK(r.nodes[1] == p.nodes[0]);
  const link_profile* ab = r.find_link(reordered.find_site("a"), reordered.find_site("b"));
  REQUIRE(ab != nullptr);
  CHECK(ab->measured);
  CHECK(ab->mbit == 912.25);
  // An unmeasured link in the file is the old hint: the cluster file's current rate stands
  // (b - c is not in `reordered`, so it is gone).
  CHECK(r.find_link(reordered.find_site("b"), reordered.find_site("c")) == nullptr);
  std::filesystem::remove(path);
}

TEST_CASE("scheduler/profile: load_profile names the file and what is wrong") {
  cluster_spec c = three_sites();
  const std::string path = temp_file("bad.json");
  auto expect = [&](const std::string& text, const std::string& part) {
    std::string what = load_error(text, c, path);
    CAPTURE(what);
    CHECK(what.rfind(path + ": ", 0) == 0);
    CHECK(what.find(part) != std::string::npos);
  };
  CHECK(load_error(valid_text, c, path) == "(no error)");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = valid_text;
    auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  SUBCASE("malformed JSON, with its position") {
    expect("{\n  \"format\": \"fusion-profile\",\n  \"nodes\": { oops }\n}", "malformed JSON at line 3, column");
    expect(with("\"mbit\": 500", "\"mbit\": 5e999"), "malformed JSON: a number in it is too large for a double");
  }
  SUBCASE("a missing file") {
    std::filesystem::remove(path);
    std::string what;
    try {
      load_profile(path, c);
    } catch (const profile_error& e) {
      what = e.what();
    }
    CHECK(what == "cannot open profile '" + path + "': No such file or directory");
  }
  SUBCASE("wrong or missing format marker") {
    expect(with("\"fusion-profile\"", "\"fusion-checkpoint\""),
           "not a FusionLLM profile: \"format\" must be \"fusion-profile\", got \"fusion-checkpoint\"");
    expect("{\"nodes\": {}}", "not a FusionLLM profile: \"format\" must be \"fusion-profile\", and it is missing");
    expect(with("\"version\": 1", "\"version\": 2"), "profile format version 2 is not supported");
  }
  SUBCASE("a node of the cluster file is missing") {
    expect(with("\"c1\": { \"site\": \"c\", \"device\": \"cpu\" }", "\"c9\": { \"site\": \"c\" }"),
           "nodes.c9: node 'c9' is not in cluster file three.pbtxt");
    std::string t = with(",\n    \"c1\": { \"site\": \"c\", \"device\": \"cpu\" }", "");
    expect(t, "node 'c1' of cluster file three.pbtxt is missing from \"nodes\"");
  }
  SUBCASE("unknown or moved sites") {
    expect(with("{ \"a\": \"a\", \"b\": \"b\"", "{ \"a\": \"a\", \"b\": \"z\""),
           "links[0]: unknown site 'z' (cluster file three.pbtxt has sites a, b, c)");
    expect(with("\"b1\": { \"site\": \"b\"", "\"b1\": { \"site\": \"q\""), "nodes.b1.site: unknown site 'q'");
    expect(with("\"b1\": { \"site\": \"b\"", "\"b1\": { \"site\": \"c\""),
           "nodes.b1.site is 'c' but cluster file three.pbtxt puts node 'b1' on site 'b'");
  }
  SUBCASE("negative rates and times") {
    expect(with("\"mbit\": 500", "\"mbit\": -5"), "links[0].mbit is -5: it must be more than 0");
    expect(with("\"mbit\": 500", "\"mbit\": 0"), "links[0].mbit is 0: it must be more than 0");
    expect(with("\"forward_s\": 0.1", "\"forward_s\": -0.1"),
           "nodes.a1.ops[\"k\"].forward_s is -0.1: it must be 0 or more");
    expect(with("\"cpu_share\": 1.0", "\"cpu_share\": -1.0"), "nodes.a1.cpu_share is -1.0: it must be 0 or more");
    // A CPU quota needs its CFS period within the kernel's bounds (the estimator's budget per
    // period would otherwise be meaningless).
    expect(with("\"cpu_share\": 1.0", "\"cpu_share\": 1.0, \"cpu_quota\": 0.3"),
           "nodes.a1.cpu_period_s is 0.0: a node with a cpu_quota needs the quota's period, 0.001 to 1 s (the "
           "kernel's CFS bounds)");
    expect(with("\"cpu_share\": 1.0", "\"cpu_share\": 1.0, \"cpu_quota\": 0.3, \"cpu_period_s\": 1e-6"),
           "nodes.a1.cpu_period_s is 1e-06: a node with a cpu_quota needs the quota's period, 0.001 to 1 s (the "
           "kernel's CFS bounds)");
  }
  SUBCASE("fields of the wrong type") {
    expect(with("\"mbit\": 500", "\"mbit\": \"fast\""), "links[0].mbit must be a number, got string");
    expect(with("\"backward_s\": 0.2", "\"backward\": 0.2"), "nodes.a1.ops[\"k\"] has no \"backward_s\"");
    expect(with("\"measured\": true", "\"measured\": 1"), "links[0].measured must be true or false, got 1");
  }
  std::filesystem::remove(path);
}

TEST_CASE("scheduler/profile: every distinct op of gpt-char-tiny is timed on the CPU") {
  graph g = load_graph(src("configs/models/gpt-char-tiny.pbtxt"), 4);
  auto sigs = op_signatures(g);
  REQUIRE(sigs.size() == distinct_ops(g).size());
  CHECK(sigs.size() < 20);  // the two blocks share their signatures
  auto t0 = std::chrono::steady_clock::now();
  device_timing t = time_ops("cpu", sigs);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("timed " << sigs.size() << " ops in " << took << " s, CPU share " << t.cpu_share);
  CHECK(t.device == "cpu");
  CHECK(t.cpu_share > 0);
  CHECK(t.cpu_share <= 1.5);
  CHECK(t.memory_bytes > 0);
  CHECK(took < 5);
  REQUIRE(t.ops.size() == sigs.size());
  for (int id : distinct_ops(g)) {
    const std::string key = op_key(g, id);
    CAPTURE(key);
    REQUIRE(t.ops.count(key) == 1);
    const op_timing& o = t.ops.at(key);
    CHECK(o.forward_s > 0);
    CHECK(o.backward_s > 0);
    CHECK(o.update_s >= 0);
  }
  // Ops with parameters pay for an update, parameter-free ones do not.
  CHECK(t.ops.at(op_key(g, g.find("h0.qkv"))).update_s > 0);
  CHECK(t.ops.at(op_key(g, g.find("h0.gelu"))).update_s == 0);
}

TEST_CASE("scheduler/profile: the CPU share drops when other threads compete for the core") {
  double alone = measure_cpu_share(std::chrono::milliseconds(100));
  CHECK(alone > 0.05);  // a loaded 2-core test machine may give us far less than a core
  CHECK(alone <= 1.5);
  // This thread and three busy ones on one CPU: each gets about a quarter of it. CPU time
  // alone would not show it (every slice runs at full speed); the wall-clock window does.
  cpu_set_t saved;
  REQUIRE(sched_getaffinity(0, sizeof saved, &saved) == 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);  // new threads inherit it
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 3; ++i)
    busy.emplace_back([&stop] {
      volatile double x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  double shared = measure_cpu_share(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : busy) t.join();
  sched_setaffinity(0, sizeof saved, &saved);
  MESSAGE("CPU share alone " << alone << ", with three busy threads on the same CPU " << shared);
  CHECK(shared > 0.02);
  CHECK(shared < 0.6);
}

}  // namespace fusion
