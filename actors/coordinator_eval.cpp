// The coordinator's evaluation and sampling passes: batches from the data source (or a sampling
// window) fed through the op actors in evaluation or inference mode, losses and loss-op metrics
// summed (and turned into bits per byte), logits read back one token at a time.
#include <algorithm>
#include <cmath>
#include <random>

#include "actors/coordinator_state.hpp"

namespace fusion {

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
  auto prev = st.act;
  // The continuation holds the pass; the pass holds itself only weakly, or the two would keep
  // each other alive after the pass (LeakSanitizer, scripts/sanitize.sh).
  auto batch = std::make_shared<std::function<void()>>();
  std::weak_ptr<std::function<void()>> weak_batch = batch;
  *batch = [=] {
    auto& s = self->state;
    const int64_t BB = s.in->cfg.batch, M = s.in->cfg.micro_batches;
    if (s.train.pass.index == s.train.pass.count) {
      s.act = prev;
      ++s.timer;
      eval_result r;
      r.loss = s.train.pass.total / static_cast<double>(s.train.pass.count * M);
      try {
        r.bits_per_byte = r.loss / (std::log(2.0) * s.in->data->eval_bytes_per_token(s.train.pass.count, BB));
      } catch (const std::exception&) {
        r.bits_per_byte = NAN;  // the batches were just read: this does not happen
      }
      const auto names = s.in->model.nodes[s.in->model.loss_node].impl->metric_names();
      for (size_t k = 0; k < names.size() && 2 * k + 1 < s.train.pass.metrics.size(); ++k)
        if (names[k] == "accuracy" && s.train.pass.metrics[2 * k + 1] > 0)
          r.accuracy = s.train.pass.metrics[2 * k] / s.train.pass.metrics[2 * k + 1];
      return done(r);
    }
    std::vector<tensor> rows = make_batch(s, BB);
    s.in->data->eval_batch(s.train.pass.index, tensor_pointers(rows));
    s.train.pass.losses.assign(M, NAN);
    s.train.pass.got = 0;
    s.train.after_pass = [=, batch = weak_batch.lock()] {
      auto& s2 = self->state;
      for (double l : s2.train.pass.losses) s2.train.pass.total += l;
      ++s2.train.pass.index;
      (*batch)();
    };
    arm_timeout(self, s.in->cfg.step_timeout_s);
    feed(self, static_cast<uint64_t>(s.train.step), pass_mode::eval, rows, s.exec.micro_rows);
  };
  st.act = activity::eval;
  (*batch)();
}

void begin_sample(coord_ptr self, int count, std::string prompt, double temperature, uint64_t seed,
                  std::function<void(std::string)> done) {
  auto& st = self->state;
  st.train.pass = pass_ctx{};
  st.train.pass.count = count;
  st.train.pass.temperature = temperature;
  st.train.pass.context = encode_text(*st.in, prompt.empty() ? std::string("\n") : prompt);
  st.train.sample_rng.seed(seed);
  st.act = activity::sample;
  // As in begin_eval: only the continuation holds the pass strongly.
  auto next = std::make_shared<std::function<void()>>();
  std::weak_ptr<std::function<void()>> weak_next = next;
  *next = [=] {
    auto& s = self->state;
    if (s.train.pass.index == s.train.pass.count) {
      s.act = activity::idle;
      ++s.timer;
      return done(std::move(s.train.pass.text));
    }
    const int64_t T = s.in->model.context;
    int64_t t = std::min<int64_t>(T, static_cast<int64_t>(s.train.pass.context.size()));
    std::vector<int32_t> window(s.train.pass.context.end() - t, s.train.pass.context.end());
    s.train.pass.got = static_cast<size_t>(t);  // the window length, read back in on_output
    s.train.after_pass = [next = weak_next.lock()] { (*next)(); };
    arm_timeout(self, s.in->cfg.step_timeout_s);
    feed(self, static_cast<uint64_t>(s.train.step), pass_mode::infer, {tensor::from_i32({1, t}, window)}, 1);
  };
  (*next)();
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
  std::function<void()>(st.train.after_pass)();  // a copy: it installs the next continuation
}

}  // namespace fusion
