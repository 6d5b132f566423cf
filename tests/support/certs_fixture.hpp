// The certificates of the tests' multi-process runs: one set per test process (made in
// milliseconds), so every cluster and admin test runs with mutual TLS and admission by
// certificate, the default of the programs.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "security/certs.hpp"
#include "tests/support/fixtures.hpp"

namespace fusion::test {

/// A directory made by make_cluster_certs with nodes n0..n9, w0, sig1, a1..d1 and "stranger", a
/// node no test cluster file names.
inline const std::string& certs_dir() {
  static const std::string dir = [] {
    auto d = temp_path("certs", "dir");
    std::filesystem::remove_all(d);
    std::vector<std::string> names = {"w0", "sig1", "a1", "b1", "c1", "d1", "stranger"};
    for (int i = 0; i < 10; ++i) {
      std::string name = "n";  // (operator+ on a literal trips a GCC 12 -Wrestrict false positive)
      name += std::to_string(i);
      names.push_back(name);
    }
    security::make_cluster_certs(d, names);
    return d;
  }();
  return dir;
}

/// The option that points a fusion-* program at certs_dir().
inline std::string certs_arg() { return "--security.certs=" + certs_dir(); }

/// The coordinator's identity in certs_dir(), for a train_config run in the test process.
inline std::shared_ptr<const security::credentials> coordinator_credentials() {
  static const auto creds =
      security::load_credentials({"tls", certs_dir(), {}}, security::role::coordinator);
  return creds;
}

/// The admin shell's identity in certs_dir().
inline std::shared_ptr<const security::credentials> admin_credentials() {
  static const auto creds = security::load_credentials({"tls", certs_dir(), {}}, security::role::admin);
  return creds;
}

}  // namespace fusion::test
