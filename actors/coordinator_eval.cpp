// The coordinator's evaluation and sampling passes: batches from the data source (or a sampling
// window) fed through the op actors in evaluation or inference mode, losses and loss-op metrics
// summed (and turned into bits per byte), logits read back one token at a time.
#include <algorithm>
#include <cmath>
#include <random>

#include "actors/coordinator_state.hpp"

namespace fusion {

namespace {

// Feeds evaluation batch pass.index, or ends the pass when every batch is in.
void next_eval_batch(coord_ptr self) {
  auto& s = self->state;
  auto& p = s.train.pass;
  const int64_t B = s.in->cfg.batch, M = s.in->cfg.micro_batches;
  if (p.index == p.count) {
    s.act = p.resume_as;
    ++s.timer;
    eval_result r;
    r.loss = p.total / static_cast<double>(p.count * M);
    try {
      r.bits_per_byte = r.loss / (std::log(2.0) * s.in->data->eval_bytes_per_token(p.count, B));
    } catch (const std::exception&) {
      r.bits_per_byte = NAN;  // the batches were just read: this does not happen
    }
    const auto names = s.in->model.nodes[s.in->model.loss_node].impl->metric_names();
    for (size_t k = 0; k < names.size() && 2 * k + 1 < p.metrics.size(); ++k)
      if (names[k] == "accuracy" && p.metrics[2 * k + 1] > 0) r.accuracy = p.metrics[2 * k] / p.metrics[2 * k + 1];
    auto done = std::move(p.eval_done);  // it may start another pass
    return done(r);
  }
  std::vector<tensor> rows = make_batch(s, B);
  s.in->data->eval_batch(p.index, tensor_pointers(rows));
  p.losses.assign(M, NAN);
  p.got = 0;
  arm_timeout(self, s.in->cfg.step_timeout_s);
  feed(self, static_cast<uint64_t>(s.train.step), pass_mode::eval, rows, s.exec.micro_rows);
}

// Feeds the sampling window for character pass.index, or ends the pass.
void next_sample(coord_ptr self) {
  auto& s = self->state;
  auto& p = s.train.pass;
  if (p.index == p.count) {
    s.act = activity::idle;
    ++s.timer;
    auto done = std::move(p.sample_done);
    return done(std::move(p.text));
  }
  const int64_t T = s.in->model.context;
  int64_t t = std::min<int64_t>(T, static_cast<int64_t>(p.context.size()));
  std::vector<int32_t> window(p.context.end() - t, p.context.end());
  p.got = static_cast<size_t>(t);  // the window length, read back in on_output
  arm_timeout(self, s.in->cfg.step_timeout_s);
  feed(self, static_cast<uint64_t>(s.train.step), pass_mode::infer, {tensor::from_i32({1, t}, window)}, 1);
}

}  // namespace

void begin_eval(coord_ptr self, std::function<void(eval_result)> done) {
  auto& st = self->state;
  const int64_t B = st.in->cfg.batch;
  st.train.pass = pass_ctx{};
  try {
    st.train.pass.count = std::min(st.in->cfg.eval_batches, st.in->data->eval_batches(B));
  } catch (const std::exception&) {
    st.train.pass.count = 0;  // the session checked this before training; a caller asking anyway gets NaN
  }
  if (st.train.pass.count <= 0) return done({});
  st.train.pass.resume_as = st.act;
  st.train.pass.eval_done = std::move(done);
  st.act = activity::eval;
  next_eval_batch(self);
}

void end_eval_batch(coord_ptr self) {
  auto& p = self->state.train.pass;
  for (double l : p.losses) p.total += l;
  ++p.index;
  next_eval_batch(self);
}

void begin_sample(coord_ptr self, int count, std::string prompt, double temperature, uint64_t seed,
                  std::function<void(std::string)> done) {
  auto& st = self->state;
  st.train.pass = pass_ctx{};
  st.train.pass.count = count;
  st.train.pass.temperature = temperature;
  st.train.pass.context = encode_text(*st.in, prompt.empty() ? std::string("\n") : prompt);
  st.train.pass.sample_done = std::move(done);
  st.train.sample_rng.seed(seed);
  st.act = activity::sample;
  next_sample(self);
}

void on_output(coord_ptr self, tensor& logits) {
  auto& st = self->state;
  if (st.act != activity::sample) return;
  auto& p = st.train.pass;
  const int64_t V = st.in->model.vocab, t = static_cast<int64_t>(p.got);
  const float* row = logits.f32() + (t - 1) * V;
  int vocab = tokenizer_size(*st.in);  // model rows beyond the tokenizer's vocabulary are never sampled
  int next = 0;
  if (p.temperature <= 0) {
    next = static_cast<int>(std::max_element(row, row + vocab) - row);
  } else {
    float mx = *std::max_element(row, row + vocab);
    std::vector<double> w(vocab);
    for (int k = 0; k < vocab; ++k) w[k] = std::exp((row[k] - mx) / p.temperature);
    next = std::discrete_distribution<int>(w.begin(), w.end())(st.train.sample_rng);
  }
  p.context.push_back(next);
  p.text += decode_tokens(*st.in, std::span<const int32_t>(&p.context.back(), 1));
  ++p.index;
  next_sample(self);
}

}  // namespace fusion
