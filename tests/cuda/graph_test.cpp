// Whole-model check: forward and backward of configs/models/gpt-char-tiny.pbtxt run op by op on
// the CPU backend and on the CUDA backend (same parameters from init_param, same tokens), then
// the losses and every parameter gradient are compared. Tolerances: loss 1e-4 relative;
// gradients 5e-3 relative to each tensor's largest magnitude (two layers of fp32 GEMMs,
// reductions and atomics summed in a different order than on the CPU).
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>

#include "core/graph.hpp"
#include "core/param_init.hpp"
#include "tests/cuda/cuda_test_util.hpp"

namespace fusion::test {

namespace {

struct graph_run {
  float loss = 0;
  std::map<std::string, tensor> grads;  ///< "node/param" -> CPU copy of the gradient
};

// Runs one training micro-step of `gr` on backend `b` the way an op actor would: every tensor
// on b's device, every op from b, output gradients summed with b.add_inplace.
graph_run run_graph(backend& b, const graph& gr, const tensor& tokens, const tensor& targets, uint64_t seed) {
  const size_t n = gr.nodes.size();
  std::vector<std::unique_ptr<op>> ops(n);
  std::vector<std::vector<tensor>> params(n), grads(n), saved(n);
  std::vector<tensor> out(n), dout(n);
  for (const graph_node& node : gr.nodes) {
    const int id = node.id;
    if (node.is_input()) {
      out[id] = b.upload(id == gr.tokens_node ? tokens : targets);
      continue;
    }
    ops[id] = b.make_op(node.kind, node.attrs);
    std::vector<shape_t> shapes;
    std::vector<dtype> types;
    std::vector<const tensor*> in;
    for (int p : node.inputs) shapes.push_back(out[p].shape()), types.push_back(out[p].type()), in.push_back(&out[p]);
    for (const param_spec& ps : ops[id]->params(shapes)) {
      tensor host(ps.shape, dtype::f32);
      init_param(host, ps, seed, node.name + "/" + ps.name);
      params[id].push_back(b.upload(std::move(host)));
      grads[id].push_back(b.zeros(ps.shape, dtype::f32));
    }
    out[id] = b.empty(ops[id]->infer_shape(shapes, types), dtype::f32);
    ops[id]->forward({in, ptrs(params[id]), &out[id], &saved[id], b.context()});
  }
  graph_run r;
  r.loss = b.download(out[gr.loss_node]).f32()[0];
  dout[gr.loss_node] = b.upload(tensor::from({}, std::vector<float>{1.0f}));
  for (size_t k = n; k-- > 0;) {
    const graph_node& node = gr.nodes[k];
    if (node.is_input() || dout[k].empty()) continue;
    std::vector<const tensor*> in;
    std::vector<tensor> din(node.inputs.size());
    std::vector<tensor*> din_p(node.inputs.size(), nullptr), g_p;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      in.push_back(&out[node.inputs[i]]);
      if (gr.nodes[node.inputs[i]].is_input() || !ops[k]->input_has_grad(i)) continue;
      din[i] = b.zeros(out[node.inputs[i]].shape(), dtype::f32);
      din_p[i] = &din[i];
    }
    for (auto& g : grads[k]) g_p.push_back(&g);
    ops[k]->backward({in, ptrs(params[k]), &dout[k], &saved[k], din_p, g_p, b.context()});
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!din_p[i]) continue;
      tensor& target = dout[node.inputs[i]];
      if (target.empty())
        target = std::move(din[i]);
      else
        b.add_inplace(target, din[i]);
    }
  }
  b.synchronize();
  for (const graph_node& node : gr.nodes) {
    if (node.is_input()) continue;
    const auto specs = ops[node.id]->params([&] {
      std::vector<shape_t> s;
      for (int p : node.inputs) s.push_back(out[p].shape());
      return s;
    }());
    for (size_t i = 0; i < specs.size(); ++i)
      r.grads[node.name + "/" + specs[i].name] = b.download(grads[node.id][i]);
  }
  return r;
}

}  // namespace

TEST_CASE("cuda gpt-char-tiny forward and backward match the CPU op by op") {
  FUSION_GPU_OR_SKIP(g);
  const graph gr = load_graph(std::string(FUSION_SOURCE_DIR) + "/configs/models/gpt-char-tiny.pbtxt", 3);
  std::mt19937 rng(5);
  const tensor tokens = random_ids({gr.batch, gr.context}, static_cast<int>(gr.vocab), rng);
  const tensor targets = random_ids({gr.batch, gr.context}, static_cast<int>(gr.vocab), rng);
  auto cpu = make_backend("cpu");
  const graph_run want = run_graph(*cpu, gr, tokens, targets, 1234);
  const graph_run got = run_graph(g, gr, tokens, targets, 1234);
  MESSAGE("loss cpu " << want.loss << ", cuda " << got.loss);
  CHECK(std::abs(got.loss - want.loss) <= 1e-4 * std::abs(want.loss));
  REQUIRE(got.grads.size() == want.grads.size());
  CHECK(want.grads.size() > 10);
  for (const auto& [name, ref] : want.grads) {
    INFO("gradient " << name);
    const double e = rel_to_max(got.grads.at(name), ref);
    CHECK_MESSAGE(e <= 5e-3, name << " differs from the CPU by " << e << " (relative to its max)");
    CHECK(count_nan(got.grads.at(name)) == 0);
  }
}

}  // namespace fusion::test
