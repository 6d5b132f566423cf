// The coordinator's profiling phase (docs/scheduler.md, section 1): once every node has joined
// and before anything is placed, the cluster profile comes from a profile file of an earlier run
// or is measured: every node times the run's distinct ops on its device (all nodes at once),
// then one node pair per site pair probes the link between them, in rounds in which no site
// takes part in two probes (so no link carries two probes at once). Everything is asynchronous:
// requests with timeouts whose failure fails the run naming the node; a link that cannot be
// probed keeps the cluster file's rate as a hint, and the log says why.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "actors/coordinator_state.hpp"
#include "core/log.hpp"
#include "scheduler/op_timing.hpp"

namespace fusion {

namespace {

// Timing a dozen ops takes about a second on one core; a large model on a slow CPU may take
// far longer, but a node that says nothing for this long is stuck.
constexpr auto profile_timeout = std::chrono::seconds(120);
// Each probe: a warm-up (TCP slow start, a token bucket's burst) and the measured window, so a
// round lasts about 0.8 s and six sites (five rounds) are probed within about 4 s.
constexpr uint32_t probe_warmup_ms = 200;
constexpr uint32_t probe_window_ms = 500;
// Connect (3 s) and a stalled ack (5 s) are the node's own limits; this is the backstop.
constexpr auto probe_timeout = std::chrono::seconds(15);

bool phase_failed(coord_ptr self) { return self->state.phase == run_phase::failed; }

std::string site_name(const coordinator_state& st, int site) { return st.in->cluster.sites[site].name; }

std::string mib_or_gib(uint64_t bytes) {
  char buf[32];
  if (bytes == 0) return "-";
  if (bytes >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / double(uint64_t{1} << 30));
  else
    std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / double(1 << 20));
  return buf;
}

std::string millis(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, seconds < 0.01 ? "%.3f ms" : "%.1f ms", seconds * 1e3);
  return buf;
}

// Pairs of sites per round, by the circle method: with k sites (one dummy added when k is odd)
// k-1 rounds, and in each round every site is in at most one pair.
std::vector<std::vector<std::pair<int, int>>> probe_rounds(std::vector<int> sites) {
  if (sites.size() < 2) return {};
  if (sites.size() % 2) sites.push_back(-1);
  const size_t k = sites.size();
  std::vector<std::vector<std::pair<int, int>>> rounds;
  for (size_t r = 0; r + 1 < k; ++r) {
    std::vector<std::pair<int, int>> round;
    for (size_t i = 0; i < k / 2; ++i) {
      int a = sites[i], b = sites[k - 1 - i];
      if (a >= 0 && b >= 0) round.emplace_back(std::min(a, b), std::max(a, b));
    }
    rounds.push_back(std::move(round));
    std::rotate(sites.begin() + 1, sites.end() - 1, sites.end());  // site 0 stays, the rest turn
  }
  return rounds;
}

link_profile& link_of(cluster_profile& p, int a, int b) {
  for (auto& l : p.links)
    if ((l.site_a == a && l.site_b == b) || (l.site_a == b && l.site_b == a)) return l;
  link_profile l;
  l.site_a = a;
  l.site_b = b;
  p.links.push_back(l);
  return p.links.back();
}

// The node that probes for a site: its first joined node in cluster-file order (spares that
// have not joined are profiled when they do, actors/coordinator_join.cpp).
int first_node_of(const coordinator_state& st, int site) {
  const auto& nodes = st.in->cluster.nodes;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].site_index == site && st.members.nodes[i]) return static_cast<int>(i);
  return -1;
}

void print_profile(coord_ptr self) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  const graph& g = st.in->model;
  std::string out = "  node            site        device    fwd+bwd per micro-batch  update per step  CPU share    "
                    "free memory\n";
  char line[256];
  for (auto& n : st.exec.profile.nodes) {
    double pass = 0, update = 0;
    size_t missing = 0;
    for (int id : st.exec.compute_nodes) {
      auto it = n.ops.find(op_key(g, id));
      if (it == n.ops.end()) {
        ++missing;
        continue;
      }
      pass += it->second.forward_s + it->second.backward_s;
      update += it->second.update_s;
    }
    std::string times = n.ops.empty() ? "not measured" : millis(pass);
    if (!n.ops.empty() && missing) times += " (" + std::to_string(missing) + " ops untimed)";
    char share[24] = "-";
    if (n.quota.binds())
      std::snprintf(share, sizeof share, "quota %.2f", n.quota.cores);
    else if (n.cpu_share > 0)
      std::snprintf(share, sizeof share, "%.2f", n.cpu_share);
    std::snprintf(line, sizeof line, "  %-15s %-11s %-9s %-24s %-16s %-12s %s\n", n.name.c_str(), n.site.c_str(),
                  n.device.c_str(), times.c_str(), n.ops.empty() ? "-" : millis(update).c_str(), share,
                  mib_or_gib(n.memory_bytes).c_str());
    out += line;
  }
  if (!st.exec.profile.links.empty())
    out += "  link                        measured          round trip   cluster file\n";
  for (auto& l : st.exec.profile.links) {
    std::string pair = site_name(st, l.site_a) + " - " + site_name(st, l.site_b);
    double hint = c.link_mbit(site_name(st, l.site_a), site_name(st, l.site_b));
    std::string hint_text = std::isinf(hint) ? "unshaped" : format_number(hint) + " Mbit/s";
    char rate[48];
    std::snprintf(rate, sizeof rate, "%.1f Mbit/s", l.mbit);
    std::snprintf(line, sizeof line, "  %-27s %-17s %-12s %s\n", pair.c_str(), l.measured ? rate : "not probed",
                  l.measured ? millis(l.rtt_s).c_str() : "-", hint_text.c_str());
    out += line;
  }
  std::fprintf(stderr, "%s", out.c_str());
}

void finish_measuring(coord_ptr self, clock_type::time_point t0, std::shared_ptr<std::vector<std::string>> not_probed,
                      std::function<void()> done) {
  auto& st = self->state;
  const auto& cfg = st.in->cfg;
  const graph& g = st.in->model;
  st.exec.profile.model = g.name;
  st.exec.profile.micro_batch = g.batch;
  // Probes finish in any order: list the links by site pair (lookups go by site, not position).
  for (auto& l : st.exec.profile.links)
    if (l.site_a > l.site_b) std::swap(l.site_a, l.site_b);
  std::sort(st.exec.profile.links.begin(), st.exec.profile.links.end(), [](const link_profile& a, const link_profile& b) {
    return std::pair{a.site_a, a.site_b} < std::pair{b.site_a, b.site_b};
  });
  size_t probed = 0;
  for (auto& l : st.exec.profile.links) probed += l.measured;
  if (cfg.progress) {
    std::fprintf(stderr,
                 "fusion-train: measured the cluster in %.1f s: ops of %s at micro-batch %lld on %zu node(s) "
                 "(CPU time / CPU share; CPU time under a quota below one core), %zu link(s) probed:\n",
                 seconds_between(t0, clock_type::now()), g.name.c_str(), static_cast<long long>(g.batch),
                 st.exec.profile.nodes.size(), probed);
    print_profile(self);
  }
  // Said whether or not progress lines are on: the plan then rests on the cluster file's rate.
  for (auto& why : *not_probed) log_warn("fusion-train", why);
  if (!cfg.profile_file.empty()) {
    try {
      save_profile(cfg.profile_file, st.exec.profile);
      if (cfg.progress) std::fprintf(stderr, "fusion-train: profile saved to %s\n", cfg.profile_file.c_str());
    } catch (const std::exception& e) {
      // The run itself does not need the file: say so and go on.
      log_warn("fusion-train", std::string("the profile was not saved: ") + e.what());
    }
  }
  done();
}

// Probes the site pairs of rounds[r], then of the next round, and so on.
void probe_round(coord_ptr self, std::shared_ptr<std::vector<std::vector<std::pair<int, int>>>> rounds, size_t r,
                 std::shared_ptr<std::vector<std::string>> not_probed, std::function<void()> next) {
  if (phase_failed(self)) return;
  if (r >= rounds->size()) return next();
  auto& st = self->state;
  auto left = std::make_shared<size_t>((*rounds)[r].size());
  auto one_done = [=] {
    if (--*left == 0) probe_round(self, rounds, r + 1, not_probed, next);
  };
  if (*left == 0) return probe_round(self, rounds, r + 1, not_probed, next);
  for (auto [sa, sb] : (*rounds)[r]) {
    int a = first_node_of(st, sa), b = first_node_of(st, sb);
    // The prober connects to the other node's data channel; a node without one, or behind a
    // firewall (accept_inbound: false), cannot be probed towards, so try the pair the other way.
    auto reachable = [&](int n) {
      return st.members.hellos[n].data_port != 0 && st.in->cluster.nodes[n].accept_inbound;
    };
    if (!reachable(b)) std::swap(a, b);
    const std::string pair = site_name(st, sa) + " - " + site_name(st, sb);
    if (!reachable(b)) {
      not_probed->push_back("link " + pair + " not probed: neither node '" + st.members.hellos[a].name + "' nor node '" +
                            st.members.hellos[b].name +
                            "' accepts inbound data channel connections; the cluster file's rate stands");
      one_done();
      continue;
    }
    const auto& peer = st.members.hellos[b];
    self->request(st.members.nodes[a], probe_timeout, probe_atom::value, peer.name, peer.host, peer.data_port,
                  probe_warmup_ms, probe_window_ms)
        .then(
            [=](double mbit, double rtt_s) {
              if (phase_failed(self)) return;
              auto& l = link_of(self->state.exec.profile, sa, sb);
              l.mbit = mbit;
              l.rtt_s = rtt_s;
              l.measured = true;
              one_done();
            },
            [=](caf::error& e) {
              if (phase_failed(self)) return;
              not_probed->push_back("link " + pair + " not probed (" + describe(e) +
                                    "); the cluster file's rate stands");
              one_done();
            });
  }
}

void measure(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  std::vector<size_t> present;
  for (size_t i = 0; i < st.in->cluster.nodes.size(); ++i)
    if (st.members.nodes[i]) present.push_back(i);
  const size_t n_nodes = present.size();
  const auto t0 = clock_type::now();
  if (st.in->cfg.progress)
    std::fprintf(stderr, "fusion-train: measuring %zu node(s) and the links between their sites\n", n_nodes);
  auto ops = op_signatures(st.in->model);
  auto left = std::make_shared<size_t>(n_nodes);
  auto failed = std::make_shared<bool>(false);
  for (size_t i : present) {
    self->request(st.members.nodes[i], profile_timeout, profile_atom::value, ops)
        .then(
            [=](device_timing& t) {
              if (*failed || phase_failed(self)) return;
              const auto& c = self->state.in->cluster;
              auto& n = self->state.exec.profile.nodes[i];
              const uint64_t free = t.memory_bytes;
              take_measured(n, std::move(t));
              // A rate or memory the cluster file states describes the device for planning; a
              // measurement fills in what it leaves out.
              if (c.nodes[i].memory_gib <= 0 && free > 0) n.memory_bytes = free;
              if (--*left > 0) return;
              std::vector<int> sites;
              for (size_t s = 0; s < c.sites.size(); ++s)
                if (first_node_of(self->state, static_cast<int>(s)) >= 0) sites.push_back(static_cast<int>(s));
              auto rounds = std::make_shared<std::vector<std::vector<std::pair<int, int>>>>(probe_rounds(sites));
              auto not_probed = std::make_shared<std::vector<std::string>>();
              probe_round(self, rounds, 0, not_probed, [=] { finish_measuring(self, t0, not_probed, done); });
            },
            [=](caf::error& e) {
              if (*failed) return;
              *failed = true;
              auto& s = self->state;
              const bool timed_out = e.category() == caf::atom("system") &&
                                     e.code() == static_cast<uint8_t>(caf::sec::request_timeout);
              std::string why = timed_out ? "it did not answer within " +
                                                format_seconds(static_cast<double>(profile_timeout.count()))
                                          : describe(e);
              fail(self, make_error(code_of(e) == fusion_errc::none ? fusion_errc::timeout : code_of(e),
                                    "profiling " + node_label(s, i) + " failed: " + why));
            });
  }
}

}  // namespace

void prepare_profile(coord_ptr self, std::function<void()> done) {
  auto& st = self->state;
  const auto& c = st.in->cluster;
  const auto& cfg = st.in->cfg;
  const auto micro_batches = static_cast<int>(cfg.micro_batches);
  st.act = activity::profiling;
  std::error_code ec;
  if (!cfg.profile_file.empty() && std::filesystem::exists(cfg.profile_file, ec)) {
    try {
      st.exec.profile = load_profile(cfg.profile_file, c);
    } catch (const std::exception& e) {
      return fail(self, make_error(fusion_errc::bad_config, std::string("cluster.profile: ") + e.what()));
    }
    st.exec.profile.micro_batches = micro_batches;
    if (cfg.progress) {
      size_t probed = 0;
      for (auto& l : st.exec.profile.links) probed += l.measured;
      std::fprintf(stderr, "fusion-train: profile from %s (measured for %s at micro-batch %lld; %zu link(s) probed)\n",
                   cfg.profile_file.c_str(), st.exec.profile.model.empty() ? "an unnamed model" : st.exec.profile.model.c_str(),
                   static_cast<long long>(st.exec.profile.micro_batch), probed);
      print_profile(self);
    }
    const graph& g = st.in->model;
    if (st.exec.profile.model != g.name || st.exec.profile.micro_batch != g.batch)
      log_warn("fusion-train", "profile " + cfg.profile_file + " was measured for model '" + st.exec.profile.model +
                                   "' at micro-batch " + std::to_string(st.exec.profile.micro_batch) + ", this run trains '" +
                                   g.name + "' at micro-batch " + std::to_string(g.batch) +
                                   ": ops without a timing are estimated from their FLOPs (delete the file to "
                                   "measure again)");
    return done();
  }
  st.exec.profile = profile_from_cluster(c);
  st.exec.profile.micro_batches = micro_batches;
  // What the nodes reported when they joined, where the cluster file states nothing.
  for (size_t i = 0; i < st.members.hellos.size(); ++i) {
    if (c.nodes[i].gflops <= 0) st.exec.profile.nodes[i].gflops = st.members.hellos[i].gflops;
    if (c.nodes[i].memory_gib <= 0) st.exec.profile.nodes[i].memory_bytes = st.members.hellos[i].memory_bytes;
  }
  measure(self, std::move(done));
}

}  // namespace fusion
