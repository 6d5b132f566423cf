// "HOST:PORT" and "[IPV6]:PORT", the one way every program and config field reads an address
// (node.coordinator, cluster.listen, fusion-admin's and fusion-probe's arguments).
//
// The ground floor: no project includes, no CAF, no CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "base/result.hpp"

namespace fusion {

/// Splits "HOST:PORT" or "[IPV6]:PORT" into the host (brackets removed) and a port of 0..65535;
/// the failure says what is wrong with `text` in plain words.
inline result<std::pair<std::string, uint16_t>> split_host_port(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return fail("expected [IPV6]:PORT, e.g. [::1]:7700, got '" + text + "'");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) return fail("expected HOST:PORT, got '" + text + "'");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    // "::1:7700" could be ::1 port 7700 or ::1:7700 with no port: brackets say which.
    if (host.find(':') != std::string::npos)
      return fail("an IPv6 address takes brackets before its port, e.g. [::1]:7700, got '" + text + "'");
  }
  if (host.empty()) return fail("no host before the port in '" + text + "'");
  if (port.empty()) return fail("no port after the host in '" + text + "'");
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535)
    return fail("bad port '" + port + "' in '" + text + "': expected a number from 0 to 65535");
  return std::make_pair(std::move(host), static_cast<uint16_t>(std::stoi(port)));
}

}  // namespace fusion
