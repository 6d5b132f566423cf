// Cluster file loader tests: a valid file, link lookup, the shipped configs, and one test per
// validation error, each checking the file name, the line and the message.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/cluster.hpp"

namespace fusion {
namespace {

std::string src(const std::string& rel) { return std::string(FUSION_SOURCE_DIR) + "/" + rel; }

// Lines 1-6 of every test file; tests append from line 7 on.
const std::string head =
    "name: \"t\"\n"                                 // 1
    "site { name: \"alpha\" }\n"                    // 2
    "site { name: \"beta\" }\n"                     // 3
    "site { name: \"gamma\" }\n"                    // 4
    "node { name: \"a1\" site: \"alpha\" }\n"       // 5
    "node { name: \"b1\" site: \"beta\" device: \"cuda:1\" }\n";  // 6

std::string error_of(const std::string& text) {
  try {
    parse_cluster(text, "c.pbtxt");
  } catch (const cluster_error& e) {
    return e.what();
  }
  return "(no error)";
}

// The error names c.pbtxt, the line, and contains every fragment.
void check_error(const std::string& text, int line, std::initializer_list<const char*> fragments) {
  std::string e = error_of(text);
  INFO("error: " << e);
  CHECK(e.rfind("c.pbtxt:" + std::to_string(line) + ":", 0) == 0);
  for (auto* f : fragments) CHECK(e.find(f) != std::string::npos);
}

TEST_CASE("core/cluster: a valid file keeps file order, lines, devices and defaults") {
  auto c = parse_cluster(head + "link { a: \"alpha\" b: \"beta\" mbit: 8 }\n"
                                "coordinator { host: \"10.0.0.1\" port: 7700 }\n",
                         "c.pbtxt");
  CHECK(c.name == "t");
  CHECK(c.file == "c.pbtxt");
  REQUIRE(c.sites.size() == 3);
  CHECK(c.sites[2].name == "gamma");
  CHECK(c.sites[2].line == 4);
  REQUIRE(c.nodes.size() == 2);
  CHECK(c.nodes[0].device == "cpu");
  CHECK(c.nodes[0].cuda_device == -1);
  CHECK(c.nodes[1].device == "cuda:1");
  CHECK(c.nodes[1].cuda_device == 1);
  CHECK(c.nodes[1].site_index == 1);
  CHECK(c.nodes[1].line == 6);
  REQUIRE(c.links.size() == 1);
  CHECK(c.links[0].line == 7);
  CHECK(c.coordinator_host == "10.0.0.1");
  CHECK(c.coordinator_port == 7700);
  CHECK(c.placement.policy == placement_policy::opfence);  // the default without a placement section
  CHECK(c.find_node("b1") == 1);
  CHECK(c.find_site("delta") == -1);

  auto d = parse_cluster(head, "d.pbtxt");
  CHECK(d.coordinator_host == "127.0.0.1");
  CHECK(d.coordinator_port == 0);
}

TEST_CASE("core/cluster: link lookup is symmetric, unshaped is infinity") {
  auto c = parse_cluster(head + "link { a: \"alpha\" b: \"beta\" mbit: 1000 }\n"
                                "link { a: \"gamma\" b: \"beta\" mbit: 8.5 }\n",
                         "c.pbtxt");
  CHECK(c.link_mbit("alpha", "beta") == 1000);
  CHECK(c.link_mbit("beta", "alpha") == 1000);
  CHECK(c.link_mbit("beta", "gamma") == 8.5);
  CHECK(std::isinf(c.link_mbit("alpha", "gamma")));  // no link: unshaped
  CHECK(std::isinf(c.link_mbit("beta", "beta")));    // inside a site: unshaped
  CHECK(c.node_link_mbit(0, 1) == 1000);
  CHECK_THROWS_AS(c.link_mbit("alpha", "delta"), cluster_error);
}

TEST_CASE("core/cluster: the shipped cluster files load") {
  auto l3 = load_cluster(src("configs/clusters/local-3.pbtxt"));
  CHECK(l3.nodes.size() == 3);
  CHECK(l3.coordinator_port > 0);
  auto l2 = load_cluster(src("configs/clusters/local-2.pbtxt"));
  CHECK(l2.nodes.size() == 2);
  auto s3 = load_cluster(src("configs/clusters/sites-3.pbtxt"));
  CHECK(s3.links.size() == 3);
  CHECK(s3.link_mbit("a", "c") == 8);
  CHECK(s3.link_mbit("c", "b") == 100);
}

TEST_CASE("core/cluster: missing file") {
  CHECK_THROWS_WITH_AS(load_cluster("/nonexistent/x.pbtxt"), doctest::Contains("/nonexistent/x.pbtxt"), cluster_error);
}

TEST_CASE("core/cluster: parse error gives protobuf's line:column") {
  check_error(head + "site { name: \"d\" \n", 8, {"c.pbtxt:8:1: parse error"});
  check_error(head + "sight { name: \"d\" }\n", 7, {"parse error", "sight"});
}

// Protobuf's own wording ("Message type \"fusion.pb.cluster_node\" has no field named ...") never
// reaches the user: the field, where it stands and what was expected, in plain words.
TEST_CASE("core/cluster: parse errors in plain words, naming the field") {
  auto plain = [](const std::string& e) {
    INFO("error: " << e);
    for (const char* internal : {"Message type", "fusion.pb", "Expected", "Non-repeated", "identifier"})
      CHECK(e.find(internal) == std::string::npos);
  };
  check_error(head + "node { name: \"c1\" sitte: \"gamma\" }\n", 7,
              {"c.pbtxt:7:19: parse error: unknown field 'sitte' in 'node { }' (did you mean 'site'?); it takes name, "
               "site, device, cpu_share, gflops, memory_gib, accept_inbound"});
  plain(error_of(head + "node { name: \"c1\" sitte: \"gamma\" }\n"));
  check_error(head + "nodes { name: \"c1\" }\n", 7,
              {"c.pbtxt:7:1: parse error: unknown field 'nodes' at the top level of the cluster file (did you mean "
               "'node'?)"});
  check_error(head + "coordinator { port: abc }\n", 7,
              {"parse error: field 'port': expected a whole number, got 'abc'"});
  plain(error_of(head + "coordinator { port: abc }\n"));
  check_error(head + "node { name: c1 site: \"gamma\" }\n", 7,
              {"parse error: field 'name': expected a text in double quotes, got 'c1'"});
  check_error(head + "node { name: \"c1\" site: \"gamma\" gflops: fast }\n", 7,
              {"parse error: field 'gflops': expected a number, got 'fast'"});
  check_error(head + "name: \"again\"\n", 7, {"parse error: field 'name' is given twice: it takes one value"});
  check_error(head + "coordinator { port: 99999999999 }\n", 7, {"field 'port': the number 99999999999 is out of range"});
  check_error(head + "site { name: \"d\" \n", 8, {"the file ends inside a block: a '}' is missing"});
  plain(error_of(head + "site { name: \"d\" \n"));
  // Bytes that are not text (a binary file given as the cluster file) are shown in hex, never
  // printed raw to the terminal.
  const char* not_text = "that is not text (a binary file, or another encoding?)";
  check_error(head + "\x7f" "ELF\x02\x01\n", 7, {"c.pbtxt:7:1: parse error: expected a field name, got a byte 0x7f", not_text});
  check_error(head + "\x80\x81 site\n", 7, {"c.pbtxt:7:1: parse error: a byte 0x80 ", not_text, "outside a quoted text"});
  check_error(head + "site { name: \x01 }\n", 7, {"c.pbtxt:7:14: parse error: a byte 0x01 ", not_text});
  // UTF-8 in a quoted text is text: quoted back as it is.
  check_error(head + "node { name: \"c1\" site: \"gamma\" gflops: \"caf\xc3\xa9\" }\n", 7,
              {"field 'gflops': expected a number, got '\"caf\xc3\xa9\"'"});
  for (const char* bytes : {"\x7f" "ELF\n", "\x80\x81\n", "site { name: \x01 }\n"}) {
    const std::string e = error_of(head + bytes);
    plain(e);
    CHECK_MESSAGE(std::none_of(e.begin(), e.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f; }), e);
  }
}

TEST_CASE("core/cluster: accept_inbound defaults to true, false marks a node behind a firewall") {
  auto c = parse_cluster(head + "node { name: \"c1\" site: \"gamma\" accept_inbound: false }\n"
                                "node { name: \"c2\" site: \"gamma\" accept_inbound: true }\n",
                         "c.pbtxt");
  CHECK(c.nodes[0].accept_inbound);
  CHECK(c.nodes[1].accept_inbound);
  CHECK_FALSE(c.nodes[2].accept_inbound);
  CHECK(c.nodes[3].accept_inbound);
  CHECK(c.firewalled_nodes() == std::vector<std::string>{"c1"});
  check_error(head + "node { name: \"c1\" site: \"gamma\" accept_inbound: maybe }\n", 7,
              {"parse error: field 'accept_inbound' is true or false, got 'maybe'"});
  check_error(head + "node { name: \"c1\" site: \"gamma\" accept_inbound: true accept_inbound: false }\n", 7,
              {"'accept_inbound' is given twice"});
}

TEST_CASE("core/cluster: no sites, no nodes") {
  check_error("name: \"x\"\n", 1, {"no sites"});
  check_error("site { name: \"a\" }\n", 1, {"no nodes"});
}

TEST_CASE("core/cluster: bad and duplicate site names") {
  check_error(head + "site { name: \"beta\" }\n", 7, {"site 'beta' defined twice", "first at line 3"});
  check_error(head + "site { name: \"1x\" }\n", 7, {"site '1x': bad name"});
  check_error(head + "site { }\n", 7, {"site: missing 'name'"});
}

TEST_CASE("core/cluster: bad and duplicate node names") {
  check_error(head + "node { name: \"a1\" site: \"gamma\" }\n", 7, {"node 'a1' defined twice", "first at line 5"});
  check_error(head + "node { name: \"c 1\" site: \"gamma\" }\n", 7, {"node 'c 1': bad name"});
}

TEST_CASE("core/cluster: node on an unknown site suggests the closest") {
  check_error(head + "node {\n  name: \"c1\"\n  site: \"gama\"\n}\n", 9,
              {"node 'c1': site: unknown site 'gama'", "did you mean 'gamma'?", "sites: alpha, beta, gamma"});
  check_error(head + "node { name: \"c1\" }\n", 7, {"node 'c1': site: missing site name"});
}

TEST_CASE("core/cluster: bad device") {
  for (const char* d : {"gpu", "cuda", "cuda:", "cuda:x", "cuda:-1", "CPU"})
    check_error(head + "node { name: \"c1\" site: \"gamma\" device: \"" + d + "\" }\n", 7,
                {"node 'c1': bad device", "\"cuda:N\""});
}

TEST_CASE("core/cluster: link to an unknown site") {
  check_error(head + "link {\n  a: \"alpha\"\n  b: \"betta\"\n  mbit: 8\n}\n", 9,
              {"link: b: unknown site 'betta'", "did you mean 'beta'?"});
  check_error(head + "link { b: \"beta\" mbit: 8 }\n", 7, {"link: a: missing site name"});
}

TEST_CASE("core/cluster: link to itself") {
  check_error(head + "link { a: \"beta\" b: \"beta\" mbit: 8 }\n", 7, {"link from site 'beta' to itself"});
}

TEST_CASE("core/cluster: duplicate link, either order") {
  std::string one = "link { a: \"alpha\" b: \"beta\" mbit: 8 }\n";
  check_error(head + one + "link { a: \"beta\" b: \"alpha\" mbit: 9 }\n", 8, {"defined twice", "first at line 7"});
  check_error(head + one + one, 8, {"link between 'alpha' and 'beta' defined twice"});
}

TEST_CASE("core/cluster: mbit must be given and from 1 kbit/s to 10 Tbit/s") {
  check_error(head + "link { a: \"alpha\" b: \"beta\" }\n", 7, {"missing 'mbit'"});
  const std::string range = "mbit must be from 0.001 (1 kbit/s) to 10000000, got ";
  check_error(head + "link { a: \"alpha\" b: \"beta\"\n mbit: 0 }\n", 8, {(range + "0").c_str()});
  check_error(head + "link { a: \"alpha\" b: \"beta\" mbit: -5 }\n", 7, {(range + "-5").c_str()});
  check_error(head + "link { a: \"alpha\" b: \"beta\" mbit: 1e-300 }\n", 7, {(range + "1e-300").c_str()});
  check_error(head + "link { a: \"alpha\" b: \"beta\" mbit: 1e300 }\n", 7, {(range + "1e+300").c_str()});
  check_error(head + "link { a: \"alpha\" b: \"beta\" mbit: inf }\n", 7, {(range + "inf").c_str()});
  for (const char* fine : {"0.001", "10000000", "8"})
    CHECK_NOTHROW(parse_cluster(head + "link { a: \"alpha\" b: \"beta\" mbit: " + fine + " }\n", "c.pbtxt"));
}

TEST_CASE("core/cluster: bad coordinator") {
  check_error(head + "coordinator {\n host: \"h\"\n port: 70000\n}\n", 9, {"coordinator port", "70000"});
  check_error(head + "coordinator { host: \"a b\" }\n", 7, {"coordinator host 'a b' contains white space"});
}

TEST_CASE("core/cluster: unknown placement policy suggests the closest") {
  check_error(head + "placement {\n  policy: \"evn\"\n}\n", 8,
              {"unknown placement policy 'evn'", "did you mean 'even'?", "known: opfence, even, explicit"});
}

TEST_CASE("core/cluster: explicit assignments") {
  auto c = parse_cluster(head + "placement { policy: \"explicit\"\n"
                                "  assign { node: \"b1\" ops: \"h1.*\" ops: \"lnf\" }\n"
                                "  assign { node: \"a1\" ops: \"*\" }\n}\n",
                         "c.pbtxt");
  CHECK(c.placement.policy == placement_policy::explicit_ops);
  REQUIRE(c.placement.assigns.size() == 2);
  CHECK(c.placement.assigns[0].node_index == 1);
  CHECK(c.placement.assigns[0].line == 8);
  CHECK(c.placement.assigns[0].ops == std::vector<std::string>{"h1.*", "lnf"});
  CHECK(c.placement.assigns[1].op_lines == std::vector<int>{9});

  check_error(head + "placement { policy: \"explicit\"\n  assign { node: \"b2\" ops: \"x\" }\n}\n", 8,
              {"assign: unknown node 'b2'", "did you mean 'b1'?", "nodes: a1, b1"});
  check_error(head + "placement { policy: \"explicit\"\n  assign { node: \"b1\" ops: \"x\" }\n"
                     "  assign { node: \"b1\" ops: \"y\" }\n}\n",
              9, {"node 'b1' already has an assign at line 8"});
  check_error(head + "placement { policy: \"explicit\"\n  assign { node: \"b1\" }\n}\n", 8, {"has no ops"});
  check_error(head + "placement { policy: \"explicit\" }\n", 7, {"needs assign"});
  check_error(head + "placement { policy: \"even\"\n  assign { node: \"b1\" ops: \"x\" }\n}\n", 8,
              {"'assign' entries need policy: \"explicit\""});
}

TEST_CASE("core/cluster: spare nodes are not waited for at start, bad spare entries name their line") {
  auto c = parse_cluster(head + "node { name: \"c1\" site: \"gamma\" }\n"  // 7
                                "spare: \"c1\"\n",                          // 8
                         "c.pbtxt");
  REQUIRE(c.nodes.size() == 3);
  CHECK(!c.nodes[0].spare);
  CHECK(c.nodes[2].spare);
  CHECK(c.nodes[2].spare_line == 8);
  CHECK(c.required_nodes() == 2);
  CHECK(parse_cluster(head, "c.pbtxt").required_nodes() == 2);

  check_error(head + "spare: \"c2\"\n", 7, {"spare: unknown node 'c2'", "nodes: a1, b1"});
  check_error(head + "spare: \"b2\"\n", 7, {"spare: unknown node 'b2'", "did you mean 'b1'?"});
  check_error(head + "spare: \"\"\n", 7, {"spare: empty node name"});
  check_error(head + "spare: \"b1\"\nspare: \"b1\"\n", 8, {"spare: node 'b1' listed twice", "first at line 7"});
  check_error(head + "spare: \"a1\"\nspare: \"b1\"\n", 7, {"every node is a spare"});
  check_error(head + "placement { policy: \"explicit\"\n  assign { node: \"b1\" ops: \"x\" }\n}\nspare: \"b1\"\n", 10,
              {"spare: node 'b1' is named by the explicit assign at line 8"});
}

}  // namespace
}  // namespace fusion

TEST_CASE("cluster: a directory given as the cluster file is said to be one") {
  // Once: "/tmp:1: no sites".
  CHECK_THROWS_WITH_AS(fusion::load_cluster("/tmp"), "cluster file '/tmp' is a directory", fusion::cluster_error);
}

TEST_CASE("cluster: HOST:PORT addresses are split and checked") {
  CHECK(fusion::parse_host_port("10.77.0.1:7720", "node.coordinator") == std::pair<std::string, uint16_t>{"10.77.0.1", 7720});
  CHECK(fusion::parse_host_port("127.0.0.1:0", "cluster.listen").second == 0);
  CHECK(fusion::parse_host_port("[::1]:7700", "coordinator address") == std::pair<std::string, uint16_t>{"::1", 7700});
  CHECK(fusion::parse_host_port("[fe80::1%eth0]:80", "x").first == "fe80::1%eth0");
  const std::pair<const char*, const char*> bad[] = {
      {"nohost", "expected HOST:PORT, got 'nohost'"},
      {":7700", "no host before the port in ':7700'"},
      {"host:", "no port after the host in 'host:'"},
      {"host:70000", "bad port '70000' in 'host:70000': expected a number from 0 to 65535"},
      {"host:12ab", "bad port '12ab'"},
      {"host:123456", "bad port '123456'"},
      {"::1:7700", "an IPv6 address takes brackets before its port, e.g. [::1]:7700"},
      {"[::1]", "expected [IPV6]:PORT"},
      {"[::1]7700", "expected [IPV6]:PORT"},
      {"[]:7700", "no host before the port"},
      {"[::1]:", "no port after the host"},
  };
  // Not a structured binding: clang (the sanitizer build) cannot capture one in CAPTURE's lambda.
  for (const auto& b : bad) {
    const char* text = b.first;
    CAPTURE(text);
    const std::string expected = std::string("cluster.listen: ") + b.second;
    CHECK_THROWS_WITH(fusion::parse_host_port(text, "cluster.listen"), doctest::Contains(expected.c_str()));
  }
}
