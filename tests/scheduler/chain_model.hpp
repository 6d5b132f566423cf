// A four-op chain model shared by the scheduler tests, its op times, and the profiles and the
// two-site cluster the estimator tests time it on: tokens -> wte -> fc -> lm_head -> loss
// (targets into the loss). Graph node ids: tokens 0, targets 1, wte 2, fc 3, lm_head 4, loss 5.
// Parameters: wte V x C, fc C x C, lm_head C x V (f32); activations between wte and lm_head
// T x C per row.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/cluster.hpp"
#include "core/graph.hpp"
#include "scheduler/profile.hpp"

namespace fusion {

/// The chain model's text with vocabulary `vocab`, context `tokens` and width `dim`.
inline std::string chain_model_text(int vocab, int tokens, int dim) {
  return "name: \"chain\"\n"
         "const { name: \"V\" value: " + std::to_string(vocab) + " }\n"
         "const { name: \"T\" value: " + std::to_string(tokens) + " }\n"
         "const { name: \"C\" value: " + std::to_string(dim) + " }\n"
         R"(input { name: "tokens"  shape: "B,T" dtype: I32 }
input { name: "targets" shape: "B,T" dtype: I32 }
node { name: "wte" op: "token_embedding" in: "tokens" attr { key: "vocab" value: "V" } attr { key: "dim" value: "C" } }
node { name: "fc" op: "linear" in: "wte" attr { key: "out" value: "C" } attr { key: "bias" value: "false" } }
node { name: "lm_head" op: "linear" in: "fc" attr { key: "out" value: "V" } attr { key: "bias" value: "false" } }
node { name: "loss" op: "cross_entropy" in: "lm_head" in: "targets" }
tokens: "tokens"  targets: "targets"  logits: "lm_head"  loss: "loss"
)";
}

/// The chain model's op times {forward, backward, update} in seconds, by graph node name.
inline const std::vector<std::pair<std::string, op_timing>> chain_times = {
    {"wte", {1, 1, 0.5}}, {"fc", {1, 2, 0.5}}, {"lm_head", {2, 2, 1}}, {"loss", {1, 1, 0}}};

/// The profile of `c` with every link at `mbit` and `rtt_s` and every op of `g` timed the same
/// on every node: `times` is {forward, backward, update} by graph node name.
inline cluster_profile timed_profile(const graph& g, const cluster_spec& c, int micro_batches, double mbit,
                                     const std::vector<std::pair<std::string, op_timing>>& times, double rtt_s = 0) {
  cluster_profile p = profile_from_cluster(c);
  p.micro_batches = micro_batches;
  for (auto& l : p.links) l.mbit = mbit, l.rtt_s = rtt_s;
  for (auto& n : p.nodes)
    for (auto& [name, t] : times) n.ops[op_key(g, g.find(name))] = t;
  return p;
}

/// The profile of `c` (the chain model `g` at `micro_batches`) with the chain's op times.
inline cluster_profile chain_timed_profile(const graph& g, const cluster_spec& c, int micro_batches, double mbit,
                                           double rtt_s = 0) {
  return timed_profile(g, c, micro_batches, mbit, chain_times, rtt_s);
}

/// Nodes a0 (site a) and b0 (site b) joined by a 100 Mbit/s link; with `same_site` also a1 on
/// site a and c0 on an unlinked site c.
inline cluster_spec estimator_sites(bool same_site = false) {
  std::string text = "name: \"two\"\nsite { name: \"a\" }\nsite { name: \"b\" }\nsite { name: \"c\" }\n"
                     "node { name: \"a0\" site: \"a\" }\nnode { name: \"b0\" site: \"b\" }\n";
  if (same_site) text += "node { name: \"a1\" site: \"a\" }\nnode { name: \"c0\" site: \"c\" }\n";
  return parse_cluster(text + "link { a: \"a\" b: \"b\" mbit: 100 }\n", "two.pbtxt");
}

}  // namespace fusion
