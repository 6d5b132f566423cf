// The admin shell's logic (apps/admin_shell.hpp): splitting, checking, tables, durations.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "actors/admin_protocol.hpp"
#include "apps/admin_shell.hpp"

namespace {

using namespace fusion::admin;
using nlohmann::json;
using strings = std::vector<std::string>;

strings lines_of(const std::string& text) {
  strings out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// The line that contains `needle` ("" if none).
std::string line_with(const std::string& text, const std::string& needle) {
  for (auto& l : lines_of(text))
    if (l.find(needle) != std::string::npos) return l;
  return {};
}

const char* sample_status = R"({"phase": "training", "step": 120, "steps": 300, "loss": 2.43117,
  "tokens_per_s": 10234.4, "eta_s": 65.2, "elapsed_s": 130, "model": "configs/models/gpt-char-tiny.pbtxt",
  "cluster": "", "failure": ""})";

const char* sample_nodes = R"({"nodes": [
  {"name": "a-gpu", "site": "a", "device": "cuda:0", "gflops": 51234.56, "memory_bytes": 17179869184, "pid": 41, "state": "running"},
  {"name": "b", "site": "site-b", "device": "cpu", "gflops": 88.0, "memory_bytes": 8589934592, "pid": 42, "state": "lost"}]})";

const char* sample_placement = R"({"policy": "even-stages",
  "ops": [{"op": "emb", "node": "a"}, {"op": "h0", "node": "a"}, {"op": "h1", "node": "a"},
          {"op": "h2", "node": "b"}, {"op": "head", "node": "b"}, {"op": "loss", "node": "c"}],
  "edges": [{"id": 7, "dir": "fwd", "producer": "h1", "consumer": "h2", "from": "a", "to": "b",
             "bytes_per_micro_batch": 65536, "codec": "none"},
            {"id": 12, "dir": "bwd", "producer": "h2", "consumer": "h1", "from": "b", "to": "a",
             "bytes_per_micro_batch": 65536, "codec": "none"}]})";

const char* sample_ops = R"({"step": 42, "ops": [
  {"op": "zeta", "node": "a", "fwd_ms": 1.5, "bwd_ms": 3.25},
  {"op": "alpha", "node": "b", "fwd_ms": 12.126, "bwd_ms": 30}]})";

const char* sample_links = R"({"step": 42, "edges": [
  {"id": 7, "dir": "fwd", "producer": "h1", "consumer": "h2", "from": "a", "to": "b", "bytes": 3145728,
   "tensors": 2, "seconds": 0.25, "mbit_s": 100.66}]})";

}  // namespace

TEST_CASE("apps/admin-shell: a line splits into commands at semicolons outside quotes") {
  CHECK(split_commands("status; nodes") == strings{"status", "nodes"});
  CHECK(split_commands("  status ;; ;nodes ;  ") == strings{"status", "nodes"});
  CHECK(split_commands("move 'h0;h1' b; ops") == strings{"move 'h0;h1' b", "ops"});
  CHECK(split_commands("checkpoint \"a;b.ckpt\"") == strings{"checkpoint \"a;b.ckpt\""});
  CHECK(split_commands("checkpoint a\\;b") == strings{"checkpoint a\\;b"});
  CHECK(split_commands("").empty());
  CHECK_THROWS_WITH(split_commands("move 'h0 b; ops"), doctest::Contains("unterminated"));
}

TEST_CASE("apps/admin-shell: words split on blanks, quotes group and are removed") {
  CHECK(tokenize("  move \"h0.*\"   node-a ") == strings{"move", "h0.*", "node-a"});
  CHECK(tokenize("checkpoint 'my run.ckpt'") == strings{"checkpoint", "my run.ckpt"});
  CHECK(tokenize("checkpoint a\\ b") == strings{"checkpoint", "a b"});
  CHECK(tokenize("checkpoint a\\;b") == strings{"checkpoint", "a;b"});
  CHECK(tokenize("x \"\"") == strings{"x", ""});
  CHECK(tokenize("'it''s'") == strings{"its"});
  CHECK(tokenize("\t").empty());
  CHECK_THROWS_WITH(tokenize("move \"h0"), doctest::Contains("unterminated"));
}

TEST_CASE("apps/admin-shell: the shell's commands are exactly the protocol's topics and verbs") {
  CHECK(command_names(command_kind::query) == fusion::admin_topics());
  CHECK(command_names(command_kind::verb) == fusion::admin_verbs());
  CHECK(find_command("move")->max_args == 2);
  CHECK(find_command("rebalance")->max_args == 1);
  CHECK(find_command("nope") == nullptr);
}

TEST_CASE("apps/admin-shell: unknown commands and wrong arguments are refused with clear messages") {
  auto r = parse_line("nodez");
  CHECK(r.commands.empty());
  CHECK(r.error.find("unknown command 'nodez'") != std::string::npos);
  CHECK(r.error.find("did you mean 'nodes'?") != std::string::npos);
  CHECK(parse_line("stauts").error.find("did you mean 'status'?") != std::string::npos);
  // Nothing close: no advice, but the way to the list.
  r = parse_line("frobnicate");
  CHECK(r.error.find("did you mean") == std::string::npos);
  CHECK(r.error.find("'help'") != std::string::npos);

  CHECK(parse_line("status now").error == "'status' takes no arguments (usage: status)");
  CHECK(parse_line("move h0").error == "'move' needs 2 arguments (usage: move OP|GLOB NODE)");
  CHECK(parse_line("compress 7").error.find("usage: compress EDGE none|RATIO|auto") != std::string::npos);
  CHECK(parse_line("checkpoint a b").error == "'checkpoint' takes at most 1 argument (usage: checkpoint [FILE])");
  CHECK(parse_line("help placment").error.find("did you mean 'placement'?") != std::string::npos);
  CHECK(parse_line("move 'h0").error.find("unterminated") != std::string::npos);

  // One bad command keeps the whole line from running.
  r = parse_line("status; nodez; ops");
  CHECK(r.commands.empty());
  CHECK(r.error.find("'nodez'") != std::string::npos);
}

TEST_CASE("apps/admin-shell: good lines give their commands with kinds and arguments") {
  auto r = parse_line("status; move 'h1.*' site-b ; checkpoint; help ops; quit");
  REQUIRE(r.error.empty());
  REQUIRE(r.commands.size() == 5);
  CHECK(r.commands[0].spec->kind == command_kind::query);
  CHECK(r.commands[1].name == "move");
  CHECK(r.commands[1].args == strings{"h1.*", "site-b"});
  CHECK(r.commands[1].spec->kind == command_kind::verb);
  CHECK(r.commands[2].args.empty());
  CHECK(r.commands[3].spec->kind == command_kind::help);
  CHECK(r.commands[4].spec->kind == command_kind::quit);
  CHECK(parse_line("exit").commands.at(0).spec->kind == command_kind::quit);
  CHECK(parse_line("   ").commands.empty());
  CHECK(parse_line("# a comment; nodez").error.empty());
  CHECK(parse_line("# a comment").commands.empty());
}

TEST_CASE("apps/admin-shell: help lists every command, one command on request") {
  auto all = help_text();
  for (auto& c : commands()) CHECK(all.find(c.usage) != std::string::npos);
  CHECK(line_with(all, "move OP|GLOB NODE").find("with their state") != std::string::npos);
  CHECK(line_with(all, "set KEY=VALUE").find("scheduler setting") != std::string::npos);
  auto one = help_text("links");
  CHECK(lines_of(one).size() == 1);
  CHECK(one.find("Mbit/s") != std::string::npos);
}

TEST_CASE("apps/admin-shell: completion offers the commands that start with the prefix") {
  CHECK(completions("p") == strings{"pause", "placement", "plan"});
  CHECK(completions("re") == strings{"rebalance", "replicas", "resume"});
  CHECK(completions("e") == strings{"exit"});
  CHECK(completions("zz").empty());
  CHECK(completions("").size() == commands().size());
  CHECK(completions_in("", "st") == strings{"status"});
  CHECK(completions_in("status; ", "no") == strings{"nodes"});
  CHECK(completions_in("help ", "li") == strings{"links"});
  CHECK(completions_in("move ", "p").empty());  // op names are not completed
  CHECK(completions_in("checkpoint 'a;", "p").empty());
  CHECK(completions_in("checkpoint \"open ", "p").empty());
}

TEST_CASE("apps/admin-shell: durations read like 42s, 1m05s, 2h03m") {
  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(42.4) == "42s");
  CHECK(format_duration(65) == "1m05s");
  CHECK(format_duration(59.6) == "1m00s");
  CHECK(format_duration(3599) == "59m59s");
  CHECK(format_duration(2 * 3600 + 3 * 60 + 5) == "2h03m");
  CHECK(format_duration(90000) == "1d01h");
  CHECK(format_duration(-1) == "-");
  CHECK(format_duration(std::nan("")) == "-");
  CHECK(format_duration(INFINITY) == "-");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(65536) == "64.0 KiB");
  CHECK(format_bytes(3.5 * 1024 * 1024) == "3.5 MiB");
  CHECK(format_bytes(1.5 * 1024 * 1024 * 1024) == "1.50 GiB");
}

TEST_CASE("apps/admin-shell: tables pad every column to its widest cell") {
  auto t = format_table({"op", "ms"}, {{"embedding", "1.5"}, {"h0", "12.25"}}, {false, true});
  CHECK(t == "op            ms\nembedding    1.5\nh0         12.25\n");
  CHECK(format_table({}, {{"a", "b"}, {"ccc", "d"}}) == "a    b\nccc  d\n");
}

TEST_CASE("apps/admin-shell: status renders as aligned key/value lines") {
  auto out = render("status", json::parse(sample_status));
  INFO(out);
  CHECK(line_with(out, "phase") == "phase     training");
  CHECK(line_with(out, "step") == "step      120/300");
  CHECK(line_with(out, "loss") == "loss      2.4312");
  CHECK(line_with(out, "tokens/s") == "tokens/s  10234");
  CHECK(line_with(out, "ETA") == "ETA       1m05s");
  CHECK(line_with(out, "elapsed") == "elapsed   2m10s");
  CHECK(line_with(out, "model").find("gpt-char-tiny.pbtxt") != std::string::npos);
  CHECK(line_with(out, "cluster") == "cluster   -");
  CHECK(out.find("failure") == std::string::npos);  // an empty failure is no failure

  auto failed = json::parse(sample_status);
  failed["phase"] = "failed";
  failed["failure"] = "node b stopped answering heartbeats";
  failed["eta_s"] = nullptr;
  failed["loss"] = nullptr;
  out = render("status", failed);
  CHECK(line_with(out, "failure") == "failure   node b stopped answering heartbeats");
  CHECK(line_with(out, "ETA") == "ETA       -");
  CHECK(line_with(out, "loss") == "loss      -");
  failed["eta_s"] = 0;
  failed["tokens_per_s"] = 0;
  CHECK(line_with(render("status", failed), "ETA") == "ETA       -");
}

TEST_CASE("apps/admin-shell: nodes render as a table with GFLOP/s and memory in GiB") {
  auto out = render("nodes", json::parse(sample_nodes));
  INFO(out);
  auto l = lines_of(out);
  REQUIRE(l.size() == 3);
  CHECK(l[0].find("name") == 0);
  for (auto* col : {"site", "device", "GFLOP/s", "memory GiB", "state"}) CHECK(l[0].find(col) != std::string::npos);
  CHECK(l[1].find("a-gpu") == 0);
  CHECK(l[1].find("51234.6") != std::string::npos);
  CHECK(l[1].find("16.0") != std::string::npos);
  CHECK(l[2].find("lost") != std::string::npos);
  // Columns line up: every row's state starts where the header's does.
  CHECK(l[1].find("running") == l[0].find("state"));
  CHECK(l[2].find("lost") == l[0].find("state"));
  // Right-aligned numbers end where their header ends.
  CHECK(l[2].find("88.0") + 4 == l[0].find("GFLOP/s") + 7);
  CHECK(render("nodes", json::parse(R"({"nodes": []})")) == "no nodes\n");
}

TEST_CASE("apps/admin-shell: placement shows runs of ops per node, then the edges") {
  auto out = render("placement", json::parse(sample_placement));
  INFO(out);
  CHECK(lines_of(out).at(0) == "policy: even-stages");
  auto run_a = line_with(out, "emb .. h1");
  CHECK(run_a.find(" 3 ") != std::string::npos);
  CHECK(run_a.substr(run_a.size() - 1) == "a");
  CHECK(line_with(out, "h2 .. head").find(" 2 ") != std::string::npos);
  auto single = line_with(out, "loss");
  CHECK(single.find("..") == std::string::npos);
  CHECK(single.substr(single.size() - 1) == "c");
  auto e7 = line_with(out, "h1 -> h2");
  CHECK(e7.find("fwd") != std::string::npos);
  CHECK(e7.find("a -> b") != std::string::npos);
  CHECK(e7.find("64.0 KiB") != std::string::npos);
  CHECK(e7.find("none") != std::string::npos);
  CHECK(line_with(out, "h2 -> h1").find("bwd") != std::string::npos);

  out = render("placement", json::parse(R"({"policy": "one-process", "ops": [{"op": "x", "node": "local"}], "edges": []})"));
  CHECK(out.find("edges: none") != std::string::npos);
}

TEST_CASE("apps/admin-shell: ops keep the order they came in, with milliseconds") {
  auto out = render("ops", json::parse(sample_ops));
  INFO(out);
  CHECK(lines_of(out).at(0) == "step 42");
  CHECK(out.find("zeta") < out.find("alpha"));
  auto alpha = line_with(out, "alpha");
  CHECK(alpha.find("12.13") != std::string::npos);  // 12.126 at two decimals
  CHECK(alpha.find("30") != std::string::npos);
  CHECK(line_with(out, "zeta").find("3.25") != std::string::npos);
  CHECK(line_with(out, "op").find("fwd ms") != std::string::npos);
  CHECK(render("ops", json::parse(R"({"step": 0, "ops": []})")).find("no op timings yet") != std::string::npos);
}

TEST_CASE("apps/admin-shell: links show each edge's bytes and Mbit/s") {
  auto out = render("links", json::parse(sample_links));
  INFO(out);
  auto row = line_with(out, "h1 -> h2");
  CHECK(row.find("a -> b") != std::string::npos);
  CHECK(row.find("3.0 MiB") != std::string::npos);
  CHECK(row.find("100.7") != std::string::npos);
  CHECK(line_with(out, "edge").find("Mbit/s") != std::string::npos);
  CHECK(render("links", json::parse(R"({"step": 3, "edges": []})")).find("no cross-process traffic") !=
        std::string::npos);
}

TEST_CASE("apps/admin-shell: other replies print as key/value lines, missing fields as '-'") {
  auto out = render("compress", json::parse(R"({"edge": 7, "codec": "none"})"));
  CHECK(line_with(out, "edge") == "edge   7");
  CHECK(line_with(out, "codec") == "codec  none");
  // pause and resume answer with the status object: rendered like status.
  auto paused = json::parse(sample_status);
  paused["phase"] = "paused";
  out = render("pause", paused);
  CHECK(line_with(out, "phase") == "phase     paused");
  CHECK(line_with(out, "step") == "step      120/300");
  CHECK(render("resume", json::object()) == "ok\n");
  out = render("nodes", json::parse(R"({"nodes": [{"name": "x"}]})"));
  CHECK(line_with(out, "x").find("-") != std::string::npos);
  // Not measured (the coordinator's own process): "-" rather than 0.
  out = render("nodes", json::parse(R"({"nodes": [{"name": "local", "gflops": 0, "memory_bytes": 0}]})"));
  CHECK(line_with(out, "local").find("0.0") == std::string::npos);
  CHECK_NOTHROW(render("status", json::parse("[1, 2]")));
  CHECK_NOTHROW(render("placement", json::parse(R"({"ops": 3, "edges": null})")));
}
