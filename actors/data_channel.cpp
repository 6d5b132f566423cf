#include "actors/data_channel.hpp"

#include "actors/messages.hpp"
#include "core/log.hpp"
#include "net/frame_channel.hpp"
#include "security/identity.hpp"

namespace fusion {

void route_table::set(uint64_t edge, edge_route r) {
  std::lock_guard<std::mutex> guard(mutex_);
  routes_[edge] = std::move(r);
}

bool route_table::erase(uint64_t edge) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (routes_.erase(edge) == 0) return false;
  removed_.insert(edge);
  return true;
}

bool route_table::removed(uint64_t edge) const {
  std::lock_guard<std::mutex> guard(mutex_);
  return removed_.count(edge) > 0;
}

size_t route_table::removed_count() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return removed_.size();
}

std::optional<edge_route> route_table::find(uint64_t edge) const {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = routes_.find(edge);
  if (it == routes_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> late_chunk_edge(std::string_view header, uint64_t payload_bytes, const route_table& routes) {
  auto h = decode_wire_header(header, payload_bytes);
  if (h && routes.removed(h->edge)) return h->edge;
  return std::nullopt;
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

namespace {

class tcp_link : public data_link {
 public:
  tcp_link(std::unique_ptr<net::frame_sender> sender, node_actor node) : sender_(std::move(sender)), node_(node) {}
  ~tcp_link() override { sender_->close(std::chrono::seconds(2)); }
  void abort() override { sender_->abort(); }

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

reversal::reversal(bool accept_inbound, std::string host) : accept_inbound_(accept_inbound), host_(std::move(host)) {}

uint16_t reversal::port() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return port_;
}

void reversal::set_port(uint16_t port) {
  std::lock_guard<std::mutex> guard(mutex_);
  port_ = port;
}

std::string reversal::expect(const std::string& node) {
  auto token = security::random_nonce();
  std::lock_guard<std::mutex> guard(mutex_);
  expected_[node] = token;
  adopted_.erase(node);
  return token;
}

status reversal::check(const net::reverse_hello& hello, bool tls) const {
  const auto& node = hello.meta.node;
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = expected_.find(node);
  if (it == expected_.end()) return fail("this node asked no node '" + node + "' to dial it");
  if (it->second != hello.meta.token) return fail("node '" + node + "' brought a token this node did not give it");
  if (tls && hello.certificate_name != node)
    return fail("it says it is node '" + node + "' but holds the certificate of node '" + hello.certificate_name + "'");
  if (adopted_.count(node)) return fail("node '" + node + "' has dialed already");
  return {};
}

void reversal::adopted(const std::string& node, std::shared_ptr<data_link> link) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    adopted_[node] = std::move(link);
  }
  adopted_cv_.notify_all();
}

std::shared_ptr<data_link> reversal::take(const std::string& node, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  adopted_cv_.wait_for(lock, wait, [&] { return adopted_.count(node) > 0; });
  expected_.erase(node);
  auto it = adopted_.find(node);
  if (it == adopted_.end()) return nullptr;
  auto link = std::move(it->second);
  adopted_.erase(it);
  return link;
}

void reversal::close() {
  std::map<std::string, std::shared_ptr<data_link>> dropped;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    dropped.swap(adopted_);
    expected_.clear();
    reader_ = nullptr;
  }
  // `dropped` closes its links here, outside the lock.
}

void reversal::set_reader(std::function<status(net::socket, net::stream, std::string)> reader) {
  std::lock_guard<std::mutex> guard(mutex_);
  reader_ = std::move(reader);
}

status reversal::dial(const std::string& me, const std::string& sender, const std::string& host, uint16_t port,
                      const std::string& token, std::shared_ptr<const net::tls_context> tls,
                      std::chrono::milliseconds timeout) {
  const std::string what = "node '" + me + "' (accept_inbound: false) cannot open the data channel to node '" +
                           sender + "': ";
  net::reverse_options o;
  o.connect_timeout = timeout;
  o.tls = std::move(tls);
  o.peer = {security::role::node, sender};
  auto conn = net::dial_reverse(host, port, {me, token}, o);
  if (!conn) return fail(what + conn.error());
  // Under the lock: the data channel's destructor clears the reader before it goes, and must
  // not go while the reader is handing a connection to it (adopt() does not block).
  std::lock_guard<std::mutex> guard(mutex_);
  if (!reader_) return fail(what + "its data channel is closed");
  auto st = reader_(std::move(conn->sock), std::move(conn->io), conn->peer);
  if (!st) return fail(what + st.error());
  return {};
}

struct data_channel_server::impl {
  node_actor node;
  std::shared_ptr<route_table> routes;
  std::shared_ptr<reversal> reverse;
  struct connection {
    wire_assembler assembler;  // chunks of one sender
    size_t removed_seen = 0;   // routes->removed_count() when its partial tensors were last checked
  };
  std::mutex mutex;                                   // guards connections
  std::map<uint64_t, connection> connections;
  std::set<uint64_t> stale_edges;                     // removed edges whose late chunks were logged
  std::unique_ptr<net::frame_server> server;

  // Partial tensors of edges whose route was removed (a plan given up mid-tensor) would never be
  // completed: their sender gave up the rest, or its late chunks are dropped. A sender that
  // survives keeps its connection, so they would stay until the run ends, each counting against
  // wire_max_partial_tensors. Forgotten here, on the connection's own reader thread between two
  // frames: no payload of this connection is being written into them then.
  void forget_removed(connection& c) {
    const size_t removed = routes->removed_count();
    if (removed == c.removed_seen) return;
    c.removed_seen = removed;
    for (uint64_t edge : c.assembler.partial_edges())
      if (routes->removed(edge)) c.assembler.drop_edge(edge);
  }

  net::frame_target on_frame(net::incoming_frame& f) {
    auto accepted = [&] {
      std::lock_guard<std::mutex> guard(mutex);
      auto& c = connections[f.connection_id];
      forget_removed(c);
      return accept_chunk(f.meta, f.payload_size, *routes, c.assembler);
    }();
    if (!accepted) {
      // A chunk of an edge whose route this node removed (a plan given up) is late, not wrong:
      // after a cut link a lost node's kernel delivers what it had queued once the link is back,
      // long after the recovery. Read and dropped; refused, it would fail the run.
      if (auto edge = late_chunk_edge(f.meta, f.payload_size, *routes)) {
        {
          std::lock_guard<std::mutex> guard(mutex);
          if (!stale_edges.insert(*edge).second) return net::frame_target::skip();
        }
        log_info("fusion-node data channel", "dropped a late chunk of edge " + std::to_string(*edge) + " from " +
                                                 f.peer + ": its route was removed (a plan given up); later ones of "
                                                 "that edge are dropped silently");
        return net::frame_target::skip();
      }
      return net::frame_target::refuse(accepted.error() + " (from " + f.peer + ")");
    }
    static std::byte empty_payload;
    auto conn = f.connection_id;
    const wire_header h = accepted->header;
    const edge_route r = accepted->route;
    std::byte* dst = accepted->dst;
    return net::frame_target::into(dst ? dst : &empty_payload, [this, h, r, conn](const status& received) {
      if (!received) {
        // Cut off mid-tensor: a sender that stopped answering (keepalive, as in the error
        // handler below) or one whose edge is gone was lost, and the recovery has seen to it.
        if (!net::timed_out(received.error()) && !routes->removed(h.edge))
          caf::anon_send(node, wire_atom::value,
                         "payload of edge " + std::to_string(h.edge) + " lost: " + received.error(), false);
        return;
      }
      auto whole = [&] {
        std::lock_guard<std::mutex> guard(mutex);
        return connections[conn].assembler.end_chunk(h);
      }();
      if (!whole) caf::anon_send(node, wire_atom::value, whole.error(), false);
      finish_chunk(r, h, whole ? std::move(*whole) : std::nullopt);
    });
  }
};

data_channel_server::data_channel_server(const std::string& host, uint16_t port, node_actor node,
                                         std::shared_ptr<route_table> routes, std::shared_ptr<const net::tls_context> tls,
                                         std::shared_ptr<reversal> reverse)
    : impl_(std::make_unique<impl>()) {
  impl_->node = node;
  impl_->routes = std::move(routes);
  impl_->reverse = reverse;
  net::frame_server_options opts;
  opts.host = host;
  opts.port = port;
  opts.tls = tls;
  opts.peer = {security::role::node, {}};  // any node of the run: the coordinator admitted them
  if (reverse) {
    opts.listen = reverse->accepts_inbound();
    const bool secured = tls != nullptr;
    opts.accept_reverse = [reverse, secured](const net::reverse_hello& h) { return reverse->check(h, secured); };
    opts.adopt_reverse = [reverse, node](const net::reverse_hello& h, net::socket sock, net::stream io) {
      net::frame_sender_options o;
      o.max_queued_frames = 4096;  // as connect_data_link's
      auto sender = net::frame_sender::adopt(std::move(sock), std::move(io), h.meta.node + " (" + h.peer + ")", o);
      reverse->adopted(h.meta.node, std::make_shared<tcp_link>(std::move(sender), node));
    };
  }
  auto* self = impl_.get();
  // A sender that broke off mid-tensor (killed, cut off) leaves chunks that will never be
  // completed; they held memory for the life of the node.
  opts.on_closed = [self](uint64_t connection) {
    std::lock_guard<std::mutex> guard(self->mutex);
    self->connections.erase(connection);
  };
  auto started = net::frame_server::start(
      opts, [self](net::incoming_frame& f) { return self->on_frame(f); },
      [node](const net::channel_error& e) {
        // A peer closing its connection at the end of a run is not an error worth a report.
        if (e.kind == net::channel_error_kind::io_error && e.message.find("closed") != std::string::npos) return;
        // A peer that stopped answering (TCP keepalive, net/socket.hpp) vanished: a lost node,
        // which the heartbeat reports and a recovery handles. What it was sending belongs to the
        // plan given up by then (keepalive takes minutes, the heartbeat seconds): not a failure.
        if (net::timed_out(e.message)) {
          log_warn("fusion-node data channel", e.message + ": the sending node stopped answering");
          return;
        }
        // A connection that never delivered a frame is a stranger: refused and logged by the
        // node, while the run goes on (bool: stray). One that did is a peer of the run whose
        // tensor is now lost: the run fails, as for a bad chunk over CAF.
        caf::anon_send(node, wire_atom::value, e.message, !e.established);
      });
  if (!started) throw std::runtime_error("cannot start the data channel on " + host + ":" + std::to_string(port) + ": " +
                                         started.error());
  impl_->server = std::move(*started);
  if (reverse) {
    reverse->set_port(impl_->server->port());
    reverse->set_reader([self](net::socket sock, net::stream io, std::string peer) {
      return self->server->adopt(std::move(sock), std::move(io), std::move(peer));
    });
  }
}

data_channel_server::~data_channel_server() {
  if (impl_->reverse) impl_->reverse->set_reader(nullptr);
  if (impl_->server) impl_->server->stop();
  // Links adopted after their edge was given up (a failed run) would otherwise live on in the
  // node's identity past the actor system.
  if (impl_->reverse) impl_->reverse->close();
}

uint16_t data_channel_server::port() const { return impl_->server->port(); }
uint64_t data_channel_server::accepted() const { return impl_->server->stats().connections; }
uint64_t data_channel_server::adopted() const { return impl_->server->stats().adopted; }

size_t data_channel_server::partial_tensors() const {
  std::lock_guard<std::mutex> guard(impl_->mutex);
  size_t n = 0;
  for (const auto& [id, c] : impl_->connections) n += c.assembler.partial_count();
  return n;
}


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

bool data_link_unreachable(const std::string& error) {
  // net::connect_tcp's failure, before any byte was exchanged (net/socket.cpp).
  return error.rfind("cannot connect to ", 0) == 0;
}

}  // namespace fusion
