// Making a run's certificates with the OpenSSL API (no shell-out): a cluster CA and one key and
// certificate for the coordinator, every node of a cluster file and the admin shell.
//
// Layout of the output directory (docs/security.md):
//   ca.pem  ca.key                      the cluster CA (keep ca.key offline once issued)
//   coordinator.pem  coordinator.key    role coordinator, CN "coordinator"
//   admin.pem  admin.key                role admin, CN "admin"
//   nodes/NAME.pem  nodes/NAME.key      role node, CN NAME, one per node of the cluster file
// Keys are P-256 EC keys in PKCS#8 PEM, written with mode 0600; certificates with 0644.
#pragma once

#include <string>
#include <vector>

#include "security/identity.hpp"

namespace fusion::security {

/// Options of make_cluster_certs.
struct cert_options {
  /// Validity of every certificate, from one hour before now (clock skew between sites).
  int days = 365;
  /// Replace an existing CA in the directory (all certificates it signed stop working).
  bool overwrite = false;
};

/// One file written by make_cluster_certs.
struct written_file {
  std::string path;
  std::string what;  ///< "CA certificate", "key of node 'a1'", ...
};

/// Writes the CA, the coordinator's, the admin's and one certificate per name in `node_names`
/// into `dir` (created if missing). Throws std::runtime_error naming the file on any failure,
/// and when `dir` already holds a CA and `overwrite` is false.
std::vector<written_file> make_cluster_certs(const std::string& dir, const std::vector<std::string>& node_names,
                                             const cert_options& options = {});

/// The files of one holder in a directory laid out by make_cluster_certs.
identity_files files_in(const std::string& dir, role r, const std::string& node_name = {});

/// A process's `[security]` settings, the same keys in every program (docs/security.md).
struct security_settings {
  /// "tls" (the default: mutual TLS, admission by certificate) or "off" (plaintext; warned).
  std::string mode = "tls";
  /// Directory made by `fusion-cluster certs`; the process takes its own files from it.
  std::string certs;
  /// Explicit files; each one set overrides the one taken from `certs`.
  identity_files files;
};

/// The credentials of holder (r, name) under `s`: null when the mode is off, else loaded from the
/// explicit files or the certs directory. Throws std::runtime_error in plain words naming the
/// setting or file (a bad mode, no files given, unreadable or mismatched files, a certificate
/// that names another holder or role).
std::shared_ptr<const credentials> load_credentials(const security_settings& s, role r, const std::string& name = {});

/// The warning every program prints when security.mode is off.
std::string plaintext_warning(const std::string& program);

}  // namespace fusion::security
