// Tests of the metrics file's records (core/metrics_record.hpp): every line parses as JSON
// whatever the names hold, keys keep their order, numbers their precision, and the layout stays
// the one scripts grep ('"type": "step", "step": N').
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/graph.hpp"
#include "core/metrics_record.hpp"

using namespace fusion;
using json = nlohmann::ordered_json;

namespace {

// Names the model loader would refuse, but a graph built in code or a future loader may hold:
// quotes, backslashes, control characters, a '/' and UTF-8.
const std::vector<std::string> odd_names = {"h0.\"attn\"", "back\\slash", "tab\there\nnewline\x01", "a/b é"};

graph graph_named(const std::vector<std::string>& names) {
  graph g;
  g.nodes.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    g.nodes[i].id = static_cast<int>(i);
    g.nodes[i].name = names[i];
  }
  return g;
}

std::vector<std::string> keys_of(const json& j) {
  std::vector<std::string> out;
  for (const auto& item : j.items()) out.push_back(item.key());
  return out;
}

op_measurement measured(int node, std::vector<double> forward_s, std::vector<double> backward_s) {
  op_measurement m;
  m.node = node;
  m.forward_s = std::move(forward_s);
  m.backward_s = std::move(backward_s);
  return m;
}

step_record sample_step() {
  step_record rec;
  rec.step = 3;
  rec.loss = 2.123456789;
  rec.lr = 3e-4;
  rec.grad_norm = 0.5;
  rec.tokens_per_s = 1234.56;
  rec.step_s = 0.25;
  rec.predicted_step_s = 0;
  rec.update_s = 0.0123456789;
  for (int i = 0; i < 4; ++i) rec.ops.push_back(measured(i, {0.0015, 0.002}, {0.0030004}));
  edge_measurement e;
  e.producer = 0;
  e.consumer = 1;
  e.forward = false;
  e.from_node = "node \"a\"";
  e.to_node = "node\\b\r";
  e.bytes = 1000;
  e.dense_bytes = 4000;
  e.tensors = 2;
  e.seconds = 0.0123456789;
  e.encode_s = 0.001;
  e.keep_ratio = 0.25;
  e.idle_starts = 1;
  rec.edges.push_back(e);
  return rec;
}

}  // namespace

TEST_CASE("core/metrics_record: a step record with odd op and node names parses and keeps them") {
  const graph g = graph_named(odd_names);
  const std::string line = step_metrics_line(sample_step(), g, 12.3456, "2026-01-31T12:34:56.789Z");
  INFO(line);
  CHECK(line.find('\n') == std::string::npos);  // one record, one line
  const json j = json::parse(line);
  CHECK(keys_of(j) == std::vector<std::string>{"type", "step", "loss", "lr", "grad_norm", "tokens_per_s", "step_s",
                                               "predicted_step_s", "boundary_s", "update_s", "elapsed_s", "time", "ops", "edges"});
  CHECK(j["type"] == "step");
  CHECK(j["step"] == 3);
  CHECK(j["loss"].get<double>() == 2.123457);  // %.6f, as the records have always had
  CHECK(j["lr"].get<double>() == 3e-4);
  CHECK(j["tokens_per_s"].get<double>() == 1234.6);
  CHECK(j["elapsed_s"].get<double>() == 12.346);
  CHECK(j["update_s"].get<double>() == 0.012346);  // %.6f, as boundary_s
  CHECK(j["time"] == "2026-01-31T12:34:56.789Z");
  REQUIRE(j["ops"].size() == odd_names.size());
  CHECK(keys_of(j["ops"]) == odd_names);  // every name round-trips, in measurement order
  CHECK(j["ops"][odd_names[2]]["fwd_ms"] == json::array({1.5, 2.0}));
  CHECK(j["ops"][odd_names[2]]["bwd_ms"] == json::array({3.0}));
  REQUIRE(j["edges"].size() == 1);
  const json& e = j["edges"][0];
  CHECK(keys_of(e) == std::vector<std::string>{"from", "to", "edge", "dir", "bytes", "dense_bytes", "tensors",
                                               "seconds", "encode_s", "keep_ratio", "idle_starts"});
  CHECK(e["from"] == "node \"a\"");
  CHECK(e["to"] == "node\\b\r");
  CHECK(e["edge"] == odd_names[0] + "->" + odd_names[1]);
  CHECK(e["dir"] == "bwd");
  CHECK(e["bytes"] == 1000);
  CHECK(e["seconds"].get<double>() == 0.012346);
  CHECK(e["idle_starts"] == 1);
}

TEST_CASE("core/metrics_record: the layout scripts grep for stays") {
  const std::string line = step_metrics_line(sample_step(), graph_named(odd_names), 1, "t");
  CHECK(line.rfind("{\"type\": \"step\", \"step\": 3, \"loss\": 2.123457, \"lr\": 0.0003, ", 0) == 0);
  step_record empty;
  empty.step = 8;
  const std::string bare = step_metrics_line(empty, graph{}, 0, "t");
  CHECK(bare.find("\"step\": 8, \"loss\"") != std::string::npos);
  CHECK(bare.find("\"ops\": {}, \"edges\": []}") != std::string::npos);
  CHECK(json::parse(bare)["ops"].is_object());
}

TEST_CASE("core/metrics_record: a cluster run's step record ends with each node's CPU seconds") {
  step_record rec = sample_step();
  rec.nodes = {{"b \"2\"", 0.123456}, {"a1", 0}};
  const json j = json::parse(step_metrics_line(rec, graph_named(odd_names), 1, "t"));
  CHECK(keys_of(j).back() == "node_cpu_s");
  CHECK(keys_of(j["node_cpu_s"]) == std::vector<std::string>{"b \"2\"", "a1"});  // poll order
  CHECK(j["node_cpu_s"]["b \"2\""].get<double>() == 0.1235);
  CHECK(j["node_cpu_s"]["a1"].get<double>() == 0);
}

TEST_CASE("core/metrics_record: a replica run's step record carries the all-reduce, per step and per op") {
  step_record rec = sample_step();
  rec.allreduce_bytes = 123456;
  rec.allreduce_work_s = 0.0123456789;
  rec.allreduce_exposed_s = 0.25;
  rec.ops[2].reduce_s = {0.010, 0.0205};
  rec.ops[2].reduce_work_s = {0.001, 0.002};
  rec.ops[2].reduce_bytes = 4096;
  const json j = json::parse(step_metrics_line(rec, graph_named(odd_names), 1, "t"));
  CHECK(keys_of(j) == std::vector<std::string>{"type", "step", "loss", "lr", "grad_norm", "tokens_per_s", "step_s",
                                               "predicted_step_s", "boundary_s", "update_s", "allreduce_bytes", "allreduce_work_s",
                                               "allreduce_exposed_s", "elapsed_s", "time", "ops", "edges"});
  CHECK(j["allreduce_bytes"] == 123456);
  CHECK(j["allreduce_work_s"].get<double>() == 0.012346);
  CHECK(j["allreduce_exposed_s"].get<double>() == 0.25);
  const json& op = j["ops"][odd_names[2]];
  CHECK(keys_of(op) == std::vector<std::string>{"fwd_ms", "bwd_ms", "reduce_ms", "reduce_work_ms", "reduce_bytes"});
  CHECK(op["reduce_ms"] == json::array({10.0, 20.5}));
  CHECK(op["reduce_work_ms"] == json::array({1.0, 2.0}));
  CHECK(op["reduce_bytes"] == 4096);
  // An op of one replica keeps the two keys it always had.
  CHECK(keys_of(j["ops"][odd_names[0]]) == std::vector<std::string>{"fwd_ms", "bwd_ms"});
}

TEST_CASE("core/metrics_record: eval records, with and without an accuracy") {
  const json with = json::parse(eval_metrics_line(20, {1.5, 0.8765432}, "x\"y"));
  CHECK(keys_of(with) == std::vector<std::string>{"type", "step", "val_loss", "val_accuracy", "time"});
  CHECK(with["type"] == "eval");
  CHECK(with["val_loss"].get<double>() == 1.5);
  CHECK(with["val_accuracy"].get<double>() == 0.876543);
  CHECK(with["time"] == "x\"y");
  const std::string line = eval_metrics_line(20, {2.5, NAN}, "t");
  CHECK(line.rfind("{\"type\": \"eval\", \"step\": 20, \"val_loss\": 2.5, ", 0) == 0);
  CHECK(keys_of(json::parse(line)) == std::vector<std::string>{"type", "step", "val_loss", "time"});
}

TEST_CASE("core/metrics_record: a compression record escapes the link name") {
  compression_change c;
  c.step = 25;
  c.link = "a\"1 -> b\\1\t fwd";
  c.keep_before = 1;
  c.keep_after = 0.1234567;
  c.mbit = 8;
  c.dense_bytes = 123456789012;
  c.budget_s = 0.5;
  c.codec_before = "f16 keep-all";
  c.codec_after = "top-k 12.3% f16";
  c.reason = "f32 needs 1 s per micro-batch, top-k 12.3% f16 0.4 s: fits the slowest stage's 0.5 s";
  const json j = json::parse(compression_metrics_line(c));
  CHECK(keys_of(j) == std::vector<std::string>{"type", "step", "link", "keep_before", "keep_after", "mbit",
                                               "dense_bytes", "budget_s", "codec_before", "codec_after", "reason"});
  CHECK(j["codec_after"] == c.codec_after);
  CHECK(j["reason"] == c.reason);
  CHECK(j["link"] == c.link);
  CHECK(j["keep_after"].get<double>() == 0.123457);  // what std::ostream wrote before
  CHECK(j["dense_bytes"] == 123456789012);
}

TEST_CASE("core/metrics_record: invalid UTF-8 and non-finite numbers still give a JSON line") {
  const graph g = graph_named({"bad\xff", "ok"});
  step_record rec;
  rec.ops.push_back(measured(0, {0.001}, {}));
  rec.grad_norm = NAN;
  const json j = json::parse(step_metrics_line(rec, g, 0, "t"));
  CHECK(j["ops"].contains("bad\xEF\xBF\xBD"));  // U+FFFD in place of the bad byte
  CHECK(j["grad_norm"].is_null());
}

TEST_CASE("core/metrics_record: metrics_time is ISO 8601 UTC with milliseconds") {
  using namespace std::chrono;
  CHECK(metrics_time(system_clock::time_point(milliseconds(1700000000123))) == "2023-11-14T22:13:20.123Z");
  CHECK(metrics_time(system_clock::time_point(milliseconds(5))) == "1970-01-01T00:00:00.005Z");
  CHECK(metrics_time(system_clock::time_point(milliseconds(-1))) == "1969-12-31T23:59:59.999Z");
}
