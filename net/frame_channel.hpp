// Bulk data channel: length-prefixed frames over one TCP connection per sender.
//
// A frame is a 20-byte preamble, `meta` bytes (opaque here; the actor layer puts a serialized
// header there) and `payload` bytes (tensor contents). The sender writes the payload straight
// from the caller's memory and the receiver reads it straight into memory the caller supplies,
// so a tensor crosses the process boundary with no user-space copy on either side. Control
// messages stay on CAF; see docs/transport.md.
//
// Threads: a frame_sender owns one writer thread; a frame_server owns one accept thread and one
// reader thread per connection. All callbacks run on those threads and must not block for long
// (forward to an actor, e.g. caf::anon_send, and return). Nothing here throws across threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "net/socket.hpp"
#include "net/stream.hpp"
#include "net/tls.hpp"

namespace fusion::net {

// ---- wire format ------------------------------------------------------------------------------

/// "FLNK" as the first four bytes on the wire (little-endian u32).
inline constexpr uint32_t frame_magic = 0x4B4E4C46;
/// Bumped on any incompatible change of the preamble or of the ack/probe rules.
inline constexpr uint8_t frame_version = 1;
inline constexpr size_t preamble_size = 20;
/// Protocol limits; a preamble above them is rejected before anything is allocated.
inline constexpr uint32_t max_meta_bytes = 64 * 1024;
inline constexpr uint64_t max_payload_bytes = uint64_t{1} << 31;

/// Preamble flag bits.
enum frame_flag : uint8_t {
  /// Link probe: the server reads and discards the payload, the user never sees it.
  flag_probe = 1,
  /// The server answers with an ack frame once the whole frame has been read.
  flag_ack_request = 2,
  /// Server -> client acknowledgement; meta = u64 LE payload bytes read on the connection so far.
  flag_ack = 4,
  /// Reverse hello (connection reversal, docs/transport.md): the connecting side asks the server
  /// to send frames to it over this connection. Alone (no other flag), payload 0, meta a
  /// reverse_hello_meta; only as a connection's first frame.
  flag_reverse = 8,
};
inline constexpr uint8_t known_flags = flag_probe | flag_ack_request | flag_ack | flag_reverse;
/// The largest meta of a reverse hello: two length bytes and at most 255 bytes each.
inline constexpr uint32_t max_reverse_meta = 2 + 2 * 255;

/// Decoded preamble (magic and version are implied).
struct preamble {
  uint8_t flags = 0;
  uint32_t meta_size = 0;
  uint64_t payload_size = 0;
};

/// Writes the 20-byte preamble: u32 magic, u8 version, u8 flags, u16 reserved (0),
/// u32 meta_size, u64 payload_size, all little-endian.
void encode_preamble(const preamble& p, std::byte* out);

/// Checks magic, version, flags, reserved bits and limits (and that a reverse hello carries no
/// other flag, no payload and at most max_reverse_meta bytes of meta); the error names the bad
/// field.
result<preamble> decode_preamble(const std::byte* in, uint32_t max_meta = max_meta_bytes,
                                 uint64_t max_payload = max_payload_bytes);

/// What a reverse hello says: the node that dialed and the token the server's side gave it (over
/// the control channel) when it asked to be dialed.
struct reverse_hello_meta {
  std::string node;
  std::string token;
};

/// u8 length, node name, u8 length, token; names and tokens of 1..255 bytes.
std::string encode_reverse_hello(const reverse_hello_meta& m);
/// Fails saying what is wrong unless `meta` is exactly one encoded reverse hello.
result<reverse_hello_meta> decode_reverse_hello(std::string_view meta);

// ---- sender -----------------------------------------------------------------------------------

/// Completion of one send, on the writer thread: ok = every byte handed to the kernel.
using send_done = std::function<void(const status& sent)>;

/// Outcome of enqueueing. Anything but `queued` means the frame was dropped and `done` will not
/// be called.
enum class send_status { queued, queue_full, closed, too_large };
const char* to_string(send_status s);

struct frame_sender_options {
  /// Frames waiting for the writer; the payload memory stays the caller's, so this bounds
  /// pinned memory only through the caller's own credit scheme.
  size_t max_queued_frames = 64;
  /// 0 keeps the kernel's buffer auto-tuning (measured best on loopback).
  int socket_buffer_bytes = 0;
  /// Connect and (with TLS) handshake within this time.
  std::chrono::milliseconds connect_timeout{5000};
  /// TLS 1.3 with these credentials; null: plaintext.
  std::shared_ptr<const tls_context> tls;
  /// With TLS: the certificate the server must hold.
  peer_rule peer;
};

/// One outgoing connection with a writer thread and a bounded queue.
class frame_sender {
 public:
  /// Connects to a frame_server (with options.tls: and completes the TLS handshake) and queues
  /// an empty probe frame as its greeting, so that the server keeps the connection however long
  /// the first real frame takes; the error reads "cannot connect to HOST:PORT: reason" or "TLS
  /// connection to HOST:PORT: reason".
  static result<std::unique_ptr<frame_sender>> connect(const std::string& host, uint16_t port,
                                                       frame_sender_options options = {});
  /// A sender over a connection the peer opened (connection reversal): `io` is `sock`'s stream,
  /// with TLS already established; `peer` names the peer in errors. options.tls and .peer are
  /// not used (the handshake is done).
  static std::unique_ptr<frame_sender> adopt(socket sock, stream io, std::string peer,
                                             frame_sender_options options = {});
  /// Aborts (does not flush): call close() first to deliver what is queued.
  ~frame_sender();
  frame_sender(const frame_sender&) = delete;
  frame_sender& operator=(const frame_sender&) = delete;

  /// Enqueues a frame without copying the payload: [data, data + n) is written from the
  /// caller's memory and must stay valid until `done` runs; `keep_alive` (e.g. the tensor) is
  /// held until then. Blocks while the queue is full. Returns closed after close()/abort() or a
  /// write failure, too_large when meta or payload exceed the protocol limits.
  send_status send(std::string meta, const std::byte* data, size_t n,
                   std::shared_ptr<const void> keep_alive, send_done done = {});
  /// As send(), but returns queue_full instead of blocking.
  send_status try_send(std::string meta, const std::byte* data, size_t n,
                       std::shared_ptr<const void> keep_alive, send_done done = {});

  /// Flushes the queue (waits up to `flush_timeout`, then aborts) and closes. Idempotent.
  void close(std::chrono::milliseconds flush_timeout = std::chrono::seconds(30));
  /// Stops now: a write in progress is cut off, every pending frame gets done("... aborted").
  void abort();

  /// First write error (empty while healthy).
  std::string error() const;
  /// "host:port" of the server.
  const std::string& peer() const noexcept { return peer_; }
  /// Frames (the caller's: not the greeting) and payload bytes fully written.
  uint64_t frames_sent() const noexcept { return frames_sent_.load(); }
  uint64_t bytes_sent() const noexcept { return bytes_sent_.load(); }
  /// Frames queued and not yet completed.
  size_t pending() const;

 private:
  struct item {
    std::byte preamble[preamble_size];
    std::string meta;
    const std::byte* data;
    size_t size;
    std::shared_ptr<const void> keep_alive;
    send_done done;
    bool greeting = false;  // not counted in frames_sent()
  };
  frame_sender(socket sock, stream io, std::string peer, frame_sender_options options);
  send_status enqueue(std::string meta, const std::byte* data, size_t n,
                      std::shared_ptr<const void> keep_alive, send_done done, bool block);
  /// Queues the greeting (connect()).
  void greet();
  void writer_loop();
  void fail_all(std::deque<item>& items, const std::string& error);

  socket socket_;
  stream stream_;  // the writer's, through TLS or not
  std::string peer_;
  frame_sender_options options_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;      // writer waits for frames or close
  std::condition_variable space_cv_;     // senders wait for queue space; close waits for drain
  std::deque<item> queue_;
  size_t in_flight_ = 0;                 // frames taken by the writer, not yet completed
  bool closing_ = false;
  bool aborted_ = false;
  bool failed_ = false;
  std::string error_;
  std::atomic<uint64_t> frames_sent_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::thread writer_;
};

// ---- connection reversal ----------------------------------------------------------------------

/// How a node that accepts no inbound connection dials the data channel of a node that will
/// send to it.
struct reverse_options {
  std::chrono::milliseconds connect_timeout{5000};  ///< connect, handshake and the server's ack
  int socket_buffer_bytes = 0;
  /// TLS 1.3 with these credentials; null: plaintext.
  std::shared_ptr<const tls_context> tls;
  /// With TLS: the certificate the server (the sending node) must hold.
  peer_rule peer;
};

/// A connection this side opened and the far side accepted as reversed: hand it to a
/// frame_server with adopt() to read the frames that will come on it.
struct reversed_connection {
  socket sock;
  stream io;
  std::string peer;  ///< "host:port" of the server
};

/// Connects to the frame_server at host:port (with TLS: handshake and the server's certificate
/// checked against options.peer), sends a reverse hello saying `hello` and waits for the
/// server's ack. Errors read "reverse connection to HOST:PORT: reason".
result<reversed_connection> dial_reverse(const std::string& host, uint16_t port, const reverse_hello_meta& hello,
                                         reverse_options options = {});

// ---- server -----------------------------------------------------------------------------------

/// Completion of one received payload: ok = all bytes are in the destination.
using receive_done = std::function<void(const status& received)>;

/// A frame whose preamble and meta have arrived; the payload has not been read yet.
struct incoming_frame {
  uint64_t connection_id = 0;
  std::string peer;          // "host:port" of the sender
  std::string meta;          // may be moved out by the handler
  uint64_t payload_size = 0;
};

/// The handler's answer: where the payload goes, or why it is refused.
struct frame_target {
  /// Payload goes to [data, data + payload_size); `done` runs exactly once, after the last byte
  /// or with an error if the connection breaks first. The memory must stay valid until then.
  static frame_target into(std::byte* data, receive_done done) { return {data, std::move(done), {}, false, false}; }
  /// The payload is read and discarded; counted as rejected and reported with `reason`.
  static frame_target refuse(std::string reason) { return {nullptr, {}, std::move(reason), true, false}; }
  /// The payload is read and discarded without a report: a frame the handler expected and has no
  /// use for (a late chunk of a tensor given up).
  static frame_target skip() { return {nullptr, {}, {}, false, true}; }

  std::byte* data = nullptr;
  receive_done done;
  std::string refusal;
  bool refused = false;
  bool skipped = false;
};

/// Why a frame or connection failed.
enum class channel_error_kind { refused, bad_preamble, truncated, io_error };
const char* to_string(channel_error_kind k);

struct channel_error {
  channel_error_kind kind;
  uint64_t connection_id;
  std::string peer;
  std::string message;  // complete sentence naming the peer, e.g. "frame from 127.0.0.1:4321 ..."
  /// The connection had delivered a frame (a sender's greeting, an empty probe, does not count)
  /// before this error. A connection that never did is a stranger (a port scanner, a misdirected
  /// program, an attacker): its errors are its own.
  bool established = false;
};

using frame_handler = std::function<frame_target(incoming_frame& frame)>;
using error_handler = std::function<void(const channel_error& error)>;

/// A reverse hello that arrived as the first frame of an accepted connection.
struct reverse_hello {
  uint64_t connection_id = 0;
  std::string peer;              ///< "host:port" of the dialing side
  reverse_hello_meta meta;       ///< who it says it is
  /// With TLS: the holder (CN) of the certificate the dialing side presented; empty in plaintext.
  std::string certificate_name;
};

/// Decides on a reverse hello (reader thread): ok = the server's side takes the connection.
using reverse_check = std::function<status(const reverse_hello& hello)>;
/// Receives a connection whose reverse hello was accepted and acknowledged: from now on the
/// connection is the callee's (typically frame_sender::adopt), not the server's.
using reverse_adopt = std::function<void(const reverse_hello& hello, socket sock, stream io)>;

struct frame_server_options {
  std::string host = "127.0.0.1";  // "" or "0.0.0.0" for all interfaces
  uint16_t port = 0;               // 0 = any free port, see frame_server::port()
  int backlog = 64;
  int socket_buffer_bytes = 0;     // 0 keeps kernel auto-tuning
  uint32_t max_meta = max_meta_bytes;
  uint64_t max_payload = max_payload_bytes;
  /// madvise(MADV_HUGEPAGE) on destinations of >= 4 MiB before receiving into them: fresh
  /// allocations then fault in 2 MiB pages instead of 4 KiB ones (see docs/transport.md).
  bool hugepage_advice = true;
  /// Connections open at once; one more is closed at once and reported as refused. Bounds the
  /// threads, descriptors and buffers that peers who never send a frame can hold.
  size_t max_connections = 64;
  /// A new connection must deliver its first frame's preamble and meta within this time, or it
  /// is closed (0: no limit). The whole read counts, not each byte.
  std::chrono::milliseconds first_frame_timeout{10000};
  /// TLS 1.3 with these credentials: a connection must complete the handshake with a
  /// certificate that fits `peer`, within first_frame_timeout (10 s when that is 0), or it is
  /// refused. Null: plaintext.
  std::shared_ptr<const tls_context> tls;
  peer_rule peer;
  /// False: bind nothing; the server only reads connections handed to it by adopt() (a node
  /// that accepts no inbound connection, whose peers' connections it opens itself).
  bool listen = true;
  /// Connection reversal (docs/transport.md): without both, a reverse hello is refused.
  reverse_check accept_reverse;
  reverse_adopt adopt_reverse;
  /// Called on the connection's reader thread once it has read its last frame, however it ended
  /// (the peer left, broke off mid-frame, the server stopped), with its connection_id: what the
  /// handler kept for the connection (half-received tensors) can go. Not for a connection handed
  /// over by a reverse hello.
  std::function<void(uint64_t connection_id)> on_closed;
  /// TCP keepalive of every connection it reads, accepted or adopted: a peer gone without a FIN
  /// (a cut link) ends its reader, and on_closed frees what it held, within idle + interval x
  /// probes (2 minutes by default) instead of at the end of the run.
  keepalive_options keepalive;
};

/// Snapshot of the server's counters.
struct frame_server_stats {
  uint64_t frames = 0;              // frames delivered to a handler's destination
  uint64_t bytes = 0;               // their payload bytes
  uint64_t rejected = 0;            // refused by the handler or with a bad preamble
  uint64_t broken_connections = 0;  // closed on a bad preamble, mid-frame drop or I/O error
  uint64_t connections = 0;         // accepted so far
  uint64_t turned_away = 0;         // closed at once: max_connections were open
  uint64_t tls_refused = 0;         // failed the TLS handshake or the certificate check
  uint64_t reversed = 0;            // accepted, then handed over by a reverse hello
  uint64_t adopted = 0;             // opened by this side and handed in with adopt()
  uint64_t probe_frames = 0;
  uint64_t probe_bytes = 0;
};

/// Listens, accepts connections and reads frames, one reader thread per connection.
class frame_server {
 public:
  /// Binds and starts accepting. `on_frame` is required; `on_error` may be empty.
  static result<std::unique_ptr<frame_server>> start(frame_server_options options, frame_handler on_frame,
                                                     error_handler on_error = {});
  /// Calls stop().
  ~frame_server();
  frame_server(const frame_server&) = delete;
  frame_server& operator=(const frame_server&) = delete;

  /// The bound port (useful with options.port = 0); 0 when options.listen is false.
  uint16_t port() const noexcept { return port_; }
  /// Reads frames from a connection this side opened (the far side sends on it, connection
  /// reversal) exactly as from an accepted one, with no first-frame deadline: `io` is `sock`'s
  /// stream, TLS already established. Fails when the server is stopping or full.
  status adopt(socket sock, stream io, std::string peer);
  /// Stops accepting, cuts every connection (a payload being received gets done(error)) and
  /// joins all threads. Idempotent; must not be called from a callback.
  void stop();
  frame_server_stats stats() const;

 private:
  struct connection {
    uint64_t id = 0;
    socket sock;
    stream io;  // set up by the connection's thread (after the handshake, with TLS)
    std::string peer;
    std::thread thread;
    std::atomic<bool> finished{false};
    bool adopted = false;  // opened by this side: no handshake, no first-frame deadline
  };
  frame_server(frame_server_options options, socket listener, frame_handler on_frame, error_handler on_error);
  void accept_loop();
  void read_loop(connection& c);
  bool secure(connection& c, std::chrono::steady_clock::time_point deadline);
  bool hand_over(connection& c, const std::string& meta);
  bool discard(connection& c, uint64_t n);
  void report(channel_error_kind kind, const connection& c, std::string message, bool established = false);
  void reap_finished();

  frame_server_options options_;
  socket listener_;
  uint16_t port_ = 0;
  frame_handler on_frame_;
  error_handler on_error_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;
  std::mutex mutex_;
  std::list<std::unique_ptr<connection>> connections_;
  uint64_t next_id_ = 1;
  std::thread acceptor_;
  std::atomic<uint64_t> frames_{0}, bytes_{0}, rejected_{0}, broken_{0}, accepted_{0}, turned_away_{0}, tls_refused_{0};
  std::atomic<uint64_t> reversed_{0}, adopted_{0};
  std::atomic<uint64_t> probe_frames_{0}, probe_bytes_{0};
};

}  // namespace fusion::net
