#include "actors/data_channel.hpp"

#include "actors/messages.hpp"
#include "net/frame_channel.hpp"

namespace fusion {

void route_table::set(uint64_t edge, edge_route r) {
  std::lock_guard<std::mutex> guard(mutex_);
  routes_[edge] = std::move(r);
}

bool route_table::erase(uint64_t edge) {
  std::lock_guard<std::mutex> guard(mutex_);
  return routes_.erase(edge) > 0;
}

std::optional<edge_route> route_table::find(uint64_t edge) const {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = routes_.find(edge);
  if (it == routes_.end()) return std::nullopt;
  return it->second;
}

result<accepted_chunk> accept_chunk(std::string_view header, uint64_t payload_bytes, const route_table& routes,
                                    wire_assembler& assembler) {
  auto h = decode_wire_header(header, payload_bytes);
  if (!h) return h.failed();
  auto found = routes.find(h->edge);
  if (!found) return fail("no edge " + std::to_string(h->edge) + " ends at this node");
  auto dst = assembler.begin_chunk(*h);
  if (!dst) return dst.failed();
  return accepted_chunk{std::move(*h), std::move(*found), *dst};
}

void finish_chunk(const edge_route& r, const wire_header& h, std::optional<tensor> whole) {
  caf::anon_send(r.sender, credit_atom::value, h.edge, uint32_t{1});
  if (!whole) return;
  if (h.dir == wire_direction::forward)
    caf::anon_send(r.target, forward_atom::value, h.step, h.micro_batch, h.slot, h.mode, std::move(*whole));
  else if (h.dir == wire_direction::backward)
    caf::anon_send(r.target, backward_atom::value, h.step, h.micro_batch, h.slot, std::move(*whole));
  else
    caf::anon_send(r.target, reduce_atom::value, h.step, h.micro_batch, std::move(*whole));
}

struct data_channel_server::impl {
  node_actor node;
  std::shared_ptr<route_table> routes;
  std::mutex mutex;                                   // guards assemblers
  std::map<uint64_t, wire_assembler> assemblers;      // per connection: chunks of one sender
  std::unique_ptr<net::frame_server> server;

  net::frame_target on_frame(net::incoming_frame& f) {
    auto accepted = [&] {
      std::lock_guard<std::mutex> guard(mutex);
      return accept_chunk(f.meta, f.payload_size, *routes, assemblers[f.connection_id]);
    }();
    if (!accepted) return net::frame_target::refuse(accepted.error() + " (from " + f.peer + ")");
    static std::byte empty_payload;
    auto conn = f.connection_id;
    const wire_header h = accepted->header;
    const edge_route r = accepted->route;
    std::byte* dst = accepted->dst;
    return net::frame_target::into(dst ? dst : &empty_payload, [this, h, r, conn](const status& received) {
      if (!received) {
        caf::anon_send(node, wire_atom::value,
                       "payload of edge " + std::to_string(h.edge) + " lost: " + received.error(), false);
        return;
      }
      auto whole = [&] {
        std::lock_guard<std::mutex> guard(mutex);
        return assemblers[conn].end_chunk(h);
      }();
      if (!whole) caf::anon_send(node, wire_atom::value, whole.error(), false);
      finish_chunk(r, h, whole ? std::move(*whole) : std::nullopt);
    });
  }
};

data_channel_server::data_channel_server(const std::string& host, uint16_t port, node_actor node,
                                         std::shared_ptr<route_table> routes, std::shared_ptr<const net::tls_context> tls)
    : impl_(std::make_unique<impl>()) {
  impl_->node = node;
  impl_->routes = std::move(routes);
  net::frame_server_options opts;
  opts.host = host;
  opts.port = port;
  opts.tls = std::move(tls);
  opts.peer = {security::role::node, {}};  // any node of the run: the coordinator admitted them
  auto* self = impl_.get();
  auto started = net::frame_server::start(
      opts, [self](net::incoming_frame& f) { return self->on_frame(f); },
      [node](const net::channel_error& e) {
        // A peer closing its connection at the end of a run is not an error worth a report.
        if (e.kind == net::channel_error_kind::io_error && e.message.find("closed") != std::string::npos) return;
        // A connection that never delivered a frame is a stranger: refused and logged by the
        // node, while the run goes on (bool: stray). One that did is a peer of the run whose
        // tensor is now lost: the run fails, as for a bad chunk over CAF.
        caf::anon_send(node, wire_atom::value, e.message, !e.established);
      });
  if (!started) throw std::runtime_error("cannot start the data channel on " + host + ":" + std::to_string(port) + ": " +
                                         started.error());
  impl_->server = std::move(*started);
}

data_channel_server::~data_channel_server() {
  if (impl_->server) impl_->server->stop();
}

uint16_t data_channel_server::port() const { return impl_->server->port(); }

namespace {

class tcp_link : public data_link {
 public:
  tcp_link(std::unique_ptr<net::frame_sender> sender, node_actor node) : sender_(std::move(sender)), node_(node) {}
  ~tcp_link() override { sender_->close(std::chrono::seconds(2)); }

  void send(std::string header, std::shared_ptr<const std::byte> source, uint64_t offset, uint64_t length) override {
    const std::byte* data = source ? source.get() + offset : nullptr;
    auto node = node_;
    auto peer = sender_->peer();
    auto st = sender_->try_send(std::move(header), data, length, source, [node, peer](const status& sent) {
      if (!sent)
        caf::anon_send(
            node, fail_atom::value,
            make_error(fusion_errc::connect_failed, "data channel: sending to " + peer + ": " + sent.error()));
    });
    if (st != net::send_status::queued)
      caf::anon_send(node_, fail_atom::value,
                     make_error(fusion_errc::connect_failed,
                                "data channel: cannot queue a chunk for " + peer + ": " + net::to_string(st)));
  }

 private:
  std::unique_ptr<net::frame_sender> sender_;
  node_actor node_;
};

}  // namespace

result<std::shared_ptr<data_link>> connect_data_link(const std::string& host, uint16_t port,
                                                     const std::string& peer_node,
                                                     std::shared_ptr<const net::tls_context> tls, node_actor node) {
  net::frame_sender_options opts;
  opts.tls = std::move(tls);
  opts.peer = {security::role::node, peer_node};
  opts.max_queued_frames = 4096;  // edges bound what is in flight with their credit windows
  auto s = net::frame_sender::connect(host, port, opts);
  if (!s) return s.failed();
  return std::shared_ptr<data_link>(std::make_shared<tcp_link>(std::move(*s), std::move(node)));
}

}  // namespace fusion
