// A four-op chain model shared by the scheduler tests: tokens -> wte -> fc -> lm_head -> loss
// (targets into the loss). Graph node ids: tokens 0, targets 1, wte 2, fc 3, lm_head 4, loss 5.
// Parameters: wte V x C, fc C x C, lm_head C x V (f32); activations between wte and lm_head
// T x C per row.
#pragma once

#include <string>

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

}  // namespace fusion
