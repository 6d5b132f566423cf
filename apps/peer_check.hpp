// Why a connection to a FusionLLM service failed, found out by connecting again by hand. CAF 0.17
// reports "cannot connect" alike whether nothing listens on the port, a program answers there
// that speaks no TLS, or a TLS peer holds (or wants) certificates of another CA; fusion-admin
// says which (docs/admin.md). No CAF here: plain sockets and net/tls.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "security/identity.hpp"

namespace fusion {

/// What is wrong at host:port for a client that speaks TLS with `tls` (null: plaintext), in
/// plain words naming `address` and, for a CA mismatch, the CA file: "nothing listens on ADDRESS
/// (connection refused)", "ADDRESS cannot be reached: ...", "the program at ADDRESS does not speak
/// TLS ...", "the TLS peer at ADDRESS holds a certificate that CA does not sign ...", "the TLS peer
/// at ADDRESS refused this program's certificate ...", or for a plaintext client "... sends nothing:
/// it may require TLS ...". Empty when the TCP and TLS levels look fine (the problem is above them).
std::string diagnose_connect(const std::string& address, const std::string& host, uint16_t port,
                             const security::identity_files* tls, std::chrono::milliseconds timeout);

}  // namespace fusion
