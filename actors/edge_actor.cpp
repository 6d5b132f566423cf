#include "actors/edge_actor.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "compression/codec_cuda.hpp"
#include "core/wire.hpp"

namespace fusion {

namespace {

using clock_type = std::chrono::steady_clock;

struct outgoing {
  std::shared_ptr<const std::byte> bytes;  // raw tensor bytes or the encoded payload
  std::vector<wire_header> chunks;
  size_t sent = 0, acked = 0;
  double encode_s = 0;
  double keep_ratio = 1;  // of the codec that encoded it (1: sent raw)
  clock_type::time_point first_sent;
};

struct edge_state {
  uint64_t edge = 0;
  node_inbox peer, reporter;  // the receiving node, and this node
  edge_config cfg;
  std::shared_ptr<data_link> link;
  edge_encoder encoder;
  std::deque<outgoing> queue;  // tensors not yet fully acknowledged, in send order
  uint32_t in_flight = 0;
  clock_type::time_point last_done;  // when the previous tensor's last chunk was acknowledged
  static inline const char* name = "edge_sender";
};

using edge_ptr = edge_sender_actor::stateful_pointer<edge_state>;

// Sends chunks while the window has room, oldest tensor first (order matters: the receiver
// acknowledges in arrival order and the consumer expects micro-batches in order per edge).
void pump(edge_ptr self) {
  auto& st = self->state;
  for (auto& t : st.queue) {
    while (t.sent < t.chunks.size()) {
      if (st.in_flight >= st.cfg.window) return;
      const wire_header& h = t.chunks[t.sent];
      if (t.sent == 0) t.first_sent = clock_type::now();
      if (st.link) {
        st.link->send(encode_wire_header(h), t.bytes, h.offset, h.chunk_bytes);
      } else {
        wire_chunk c;
        c.header = encode_wire_header(h);
        c.source = t.bytes;
        c.offset = h.offset;
        c.length = h.chunk_bytes;
        self->send(st.peer, wire_atom::value, std::move(c));
      }
      ++t.sent;
      ++st.in_flight;
    }
  }
}

void report_failure(edge_ptr self, const std::string& what) {
  auto& st = self->state;
  if (st.reporter)
    self->send(st.reporter, fail_atom::value,
               make_error(fusion_errc::op_failed, "edge " + std::to_string(st.edge) + ": " + what));
}

void enqueue(edge_ptr self, wire_header base, tensor value) {
  auto& st = self->state;
  const codec_settings& codec = st.encoder.settings();
  const auto n = static_cast<uint64_t>(value.numel());
  const bool compress = value.type() == dtype::f32 && st.encoder.encodes(n);
  // A GPU producer's tensor is encoded on its device where the codec has a GPU encoder: only
  // the payload crosses PCIe. Error feedback keeps its residual on the host, so such an edge
  // encodes there.
  const device_encode_fn device =
      compress && value.is_cuda() && !codec.error_feedback ? device_encoder(codec.kind) : nullptr;
  const bool on_device = device != nullptr;
  // Otherwise the wire carries host bytes whatever the producer's device; the chunks reference
  // `value`, so it is downloaded once, here, rather than per chunk.
  if (value.is_cuda() && !on_device) {
    try {
      value = std::move(value).to_cpu();
    } catch (const std::exception& e) {
      return report_failure(self, std::string("cannot copy a CUDA tensor to the host: ") + e.what());
    }
  }
  base.edge = st.edge;
  base.type = value.type();
  base.shape = value.shape();
  base.total_bytes = value.empty() ? 0 : value.nbytes();
  outgoing o;
  if (compress) {
    auto start = clock_type::now();
    auto payload = std::make_shared<std::vector<std::byte>>();
    try {
      if (on_device)
        device(value.f32(), n, codec, *payload);
      else
        st.encoder.encode(std::span<const float>(value.f32(), n), base.micro_batch, *payload);
    } catch (const std::exception& e) {
      return report_failure(self, std::string("cannot compress a tensor: ") + e.what());
    }
    o.encode_s = std::chrono::duration<double>(clock_type::now() - start).count();
    o.keep_ratio = codec.keep_ratio;
    base.encoding = codec_of(codec.kind).wire_encoding();
    base.payload_bytes = payload->size();
    o.bytes = std::shared_ptr<const std::byte>(payload, payload->data());
  } else {
    auto owner = std::make_shared<const tensor>(std::move(value));
    o.bytes = std::shared_ptr<const std::byte>(owner, owner->empty() ? nullptr : owner->bytes());
  }
  o.chunks = split_into_chunks(base, st.cfg.chunk_bytes);
  st.queue.push_back(std::move(o));
  pump(self);
}

void acknowledge(edge_ptr self, uint32_t n) {
  auto& st = self->state;
  st.in_flight -= std::min(n, st.in_flight);
  while (n > 0 && !st.queue.empty()) {
    auto& t = st.queue.front();
    uint32_t take = static_cast<uint32_t>(std::min<size_t>(n, t.sent - t.acked));
    if (take == 0) break;  // more credits than chunks sent: ignore the excess
    t.acked += take;
    n -= take;
    if (t.acked == t.chunks.size()) {
      edge_stat s;
      s.edge = st.edge;
      s.bytes = t.chunks.front().wire_bytes();
      s.dense_bytes = t.chunks.front().total_bytes;
      s.tensors = 1;
      s.encode_s = t.encode_s;
      s.keep_ratio = t.keep_ratio;
      // The link's time for this tensor: from its first chunk, or from the previous tensor's
      // completion if that came later. Micro-batches sent back to back share the link in FIFO
      // order; timed from their own first chunk, the later ones would also count the earlier
      // ones' transfer, and the estimator, which models that queueing itself, would learn a
      // link slower than it is (sites-2x3 at 8 Mbit/s: a step predicted 21% too long).
      const auto now = clock_type::now();
      s.seconds = std::chrono::duration<double>(now - std::max(t.first_sent, st.last_done)).count();
      s.idle_starts = t.first_sent >= st.last_done ? 1 : 0;
      st.last_done = now;
      if (st.reporter) self->send(st.reporter, stats_atom::value, s);
      st.queue.pop_front();
    }
  }
  pump(self);
}

edge_sender_actor::behavior_type edge_sender_fn(edge_ptr self, uint64_t edge, node_inbox peer, edge_config cfg, node_inbox reporter,
                             std::shared_ptr<data_link> link, codec_settings codec) {
  auto& st = self->state;
  st.encoder.set(codec);
  st.edge = edge;
  st.peer = std::move(peer);
  st.reporter = std::move(reporter);
  st.cfg = cfg.clamped();
  st.link = std::move(link);
  return {
      [=](forward_atom, uint64_t step, uint32_t mb, uint32_t slot, uint8_t mode, tensor& value) {
        wire_header h;
        h.dir = wire_direction::forward;
        h.step = step;
        h.micro_batch = mb;
        h.slot = slot;
        h.mode = mode;
        enqueue(self, std::move(h), std::move(value));
      },
      [=](backward_atom, uint64_t step, uint32_t mb, uint32_t consumer, tensor& grad) {
        wire_header h;
        h.dir = wire_direction::backward;
        h.step = step;
        h.micro_batch = mb;
        h.slot = consumer;
        enqueue(self, std::move(h), std::move(grad));
      },
      [=](reduce_atom, uint64_t step, uint32_t k, tensor& chunk) {
        wire_header h;
        h.dir = wire_direction::reduce;
        h.step = step;
        h.micro_batch = k;  // the ring step: the assembler keys on it, so steps never mix
        enqueue(self, std::move(h), std::move(chunk));
      },
      [=](credit_atom, uint64_t, uint32_t n) { acknowledge(self, n); },
      [=](compress_atom, const codec_settings& codec) { self->state.encoder.set(codec); },
  };
}

}  // namespace

edge_sender_actor spawn_edge_sender(caf::actor_system& sys, uint64_t edge, node_inbox peer, edge_config cfg,
                                    node_inbox reporter, std::shared_ptr<data_link> link, codec_settings codec) {
  return sys.spawn(edge_sender_fn, edge, std::move(peer), cfg, std::move(reporter), std::move(link), codec);
}

}  // namespace fusion
