// A four-op chain model shared by the scheduler tests: tokens -> wte -> fc -> lm_head -> loss
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

/// The profile of `c` (the chain model `g` at `micro_batches`) with every link at `mbit` and
/// `rtt_s`, every op timed {forward, backward, update} the same on every node: wte {1, 1, 0.5},
/// fc {1, 2, 0.5}, lm_head {2, 2, 1}, loss {1, 1, 0} seconds.
inline cluster_profile chain_timed_profile(const graph& g, const cluster_spec& c, int micro_batches, double mbit,
                                           double rtt_s = 0) {
  cluster_profile p = profile_from_cluster(c);
  p.micro_batches = micro_batches;
  for (auto& l : p.links) l.mbit = mbit, l.rtt_s = rtt_s;
  const std::vector<std::pair<std::string, op_timing>> times = {
      {"wte", {1, 1, 0.5}}, {"fc", {1, 2, 0.5}}, {"lm_head", {2, 2, 1}}, {"loss", {1, 1, 0}}};
  for (auto& n : p.nodes)
    for (auto& [name, t] : times) n.ops[op_key(g, g.find(name))] = t;
  return p;
}

}  // namespace fusion
