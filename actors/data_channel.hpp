// The TCP data channel of a node (net/frame_channel.hpp) wired to the actors: the bytes of
// cross-process tensors bypass CAF's serialization, which reaches only a fraction of raw TCP
// speed (bench/RESULTS.md), while credits and every control message stay on CAF.
//
// Receiving: a frame's meta is a wire header (core/wire.hpp); the payload is read straight into
// the tensor being reassembled, then the chunk is acknowledged to the edge sender and the whole
// tensor handed to the local op actor, exactly as for a wire_chunk that came over CAF.
// Sending: a data_link per peer node over one frame_sender, shared by all edges to that node.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "actors/edge_actor.hpp"
#include "actors/messages.hpp"
#include "base/result.hpp"
#include "core/wire.hpp"
#include "net/socket.hpp"
#include "net/stream.hpp"

namespace fusion {

namespace net {
class frame_server;
class tls_context;
struct reverse_hello;
}

/// Where the tensors of an edge ending at this node go.
struct edge_route {
  tensor_sink target;        ///< the local op actor
  edge_sender_actor sender;  ///< the edge sender that gets the credits
};

/// Routes by edge id, shared by the node actor (which sets them) and the channel's reader
/// threads (which look them up).
class route_table {
 public:
  void set(uint64_t edge, edge_route r);
  /// Removes the route of `edge` (its chunks are refused from now on); false if there was none.
  bool erase(uint64_t edge);
  std::optional<edge_route> find(uint64_t edge) const;
  /// Whether `edge` had a route here that was removed (edge ids are never reused).
  bool removed(uint64_t edge) const;
  /// How many routes were removed so far: a reader that saw the same count has nothing new to
  /// forget.
  size_t removed_count() const;

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, edge_route> routes_;
  std::set<uint64_t> removed_;
};

/// A chunk accepted by accept_chunk: its header, its edge's route and where its payload goes.
struct accepted_chunk {
  wire_header header;
  edge_route route;
  std::byte* dst = nullptr;  ///< null for an empty tensor
};

/// The receiving side of a chunk, whichever way it came (CAF wire_chunk or data channel):
/// decodes and validates its header against the `payload_bytes` that arrived, finds the edge's
/// route and reserves the chunk's place in `assembler`. Fails saying why the chunk is refused.
result<accepted_chunk> accept_chunk(std::string_view header, uint64_t payload_bytes, const route_table& routes,
                                    wire_assembler& assembler);

/// The edge of a chunk accept_chunk refused when that edge's route was removed (a plan given
/// up): the chunk is late, not wrong, and is dropped, wherever it came from. Nothing otherwise.
std::optional<uint64_t> late_chunk_edge(std::string_view header, uint64_t payload_bytes, const route_table& routes);

/// Once the chunk's bytes are in place: acknowledges it to the edge sender and, when `whole`
/// holds the completed tensor (wire_assembler::end_chunk), hands it to the route's op actor.
void finish_chunk(const edge_route& r, const wire_header& h, std::optional<tensor> whole);

/// Connection reversal (docs/transport.md) for one node, shared by its node actor and its
/// data_channel_server. A node that accepts inbound connections is asked by a receiver that
/// does not: it expects() that node with a fresh token, the receiver dials its data channel, and
/// the server hands the adopted connection over as a data_link that take() returns. A node that
/// accepts none dial()s the senders that ask it to and reads their frames on those connections.
class reversal {
 public:
  /// `host`: the address peers reach this node's data channel on.
  reversal(bool accept_inbound, std::string host);
  bool accepts_inbound() const noexcept { return accept_inbound_; }
  const std::string& host() const noexcept { return host_; }
  /// The data channel's port (0 while it listens nowhere); set once the server listens.
  uint16_t port() const;
  void set_port(uint16_t port);

  // ---- the sending node ----
  /// A fresh token for a reverse connection from `node`; its reverse hello must bring it.
  std::string expect(const std::string& node);
  /// Whether a reverse hello may hand its connection over: a node that was expected, with its
  /// token, and (with TLS) whose certificate names that node. Fails saying why not.
  status check(const net::reverse_hello& hello, bool tls) const;
  /// The adopted connection's link (from the server's thread).
  void adopted(const std::string& node, std::shared_ptr<data_link> link);
  /// The link adopted from `node` since expect(), or null; forgets the expectation. The node's
  /// answer can overtake the server's hand-over (its ack goes out first): waits up to `wait`.
  std::shared_ptr<data_link> take(const std::string& node,
                                  std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  /// Drops links nobody took and the reader (the data channel is closing; a link must not
  /// outlive the actor system its node actor belongs to).
  void close();

  // ---- the node behind a firewall ----
  /// Set by its data_channel_server: hands a dialed connection to the server's readers.
  void set_reader(std::function<status(net::socket, net::stream, std::string)> reader);
  /// Dials the data channel of `sender` (the node of that name at host:port) as node `me`,
  /// says the reverse hello with `token` and gives the connection to the reader. Blocks up to
  /// `timeout` (connect, TLS, the sender's ack); fails saying why, naming both ends.
  status dial(const std::string& me, const std::string& sender, const std::string& host, uint16_t port,
              const std::string& token, std::shared_ptr<const net::tls_context> tls,
              std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  const bool accept_inbound_;
  const std::string host_;
  mutable std::mutex mutex_;
  std::condition_variable adopted_cv_;
  uint16_t port_ = 0;
  std::map<std::string, std::string> expected_;  // node -> token
  std::map<std::string, std::shared_ptr<data_link>> adopted_;
  std::function<status(net::socket, net::stream, std::string)> reader_;
};

/// The receiving side of a node's data channel. Refused frames are reported to `node` as
/// wire_atom(std::string reason), where they are counted like refused CAF wire chunks. With
/// `tls`, only holders of a node certificate of the run's CA get past the TLS handshake; others
/// are refused and logged as strangers.
class data_channel_server {
 public:
  /// Listens on host:port (0: any free port); throws std::runtime_error when it cannot. With
  /// `reverse`: takes reverse hellos it expects, and listens nowhere (port 0) when the node
  /// accepts no inbound connection, reading only the connections it dials.
  data_channel_server(const std::string& host, uint16_t port, node_actor node, std::shared_ptr<route_table> routes,
                      std::shared_ptr<const net::tls_context> tls = nullptr,
                      std::shared_ptr<reversal> reverse = nullptr);
  ~data_channel_server();
  /// The bound port; 0 when it listens nowhere.
  uint16_t port() const;
  /// Connections accepted so far (0 for a node that accepts none) and reversed ones read.
  uint64_t accepted() const;
  uint64_t adopted() const;
  /// Tensors partly received over the connections still open (a connection's go when it ends).
  size_t partial_tensors() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Connects a data_link to the data channel of node `peer_node` at host:port (with `tls`, the
/// server must hold that node's certificate). Send failures are reported to `node` as
/// fail_atom. Fails when it cannot connect.
result<std::shared_ptr<data_link>> connect_data_link(const std::string& host, uint16_t port,
                                                     const std::string& peer_node,
                                                     std::shared_ptr<const net::tls_context> tls, node_actor node);

/// True when connect_data_link failed to open a TCP connection at all (timed out, refused,
/// unreachable), as opposed to a connection that was refused later (TLS, the peer's identity):
/// the peer may be behind a firewall nobody declared, and may still dial this node.
bool data_link_unreachable(const std::string& error);

}  // namespace fusion
