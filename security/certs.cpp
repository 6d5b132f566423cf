#include "security/certs.hpp"

#include <fcntl.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "security/openssl_util.hpp"

namespace fusion::security {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + ": " + last_openssl_error()); }

pkey_ptr make_key() {
  pkey_ptr key{EVP_EC_gen("P-256")};
  if (!key) fail("cannot generate a P-256 key");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext || X509_add_ext(cert, ext, -1) != 1) {
    X509_EXTENSION_free(ext);
    fail(std::string("cannot add the extension ") + OBJ_nid2sn(nid));
  }
  X509_EXTENSION_free(ext);
}

// A certificate for `key` naming (cn, ou), signed by issuer_key; issuer == null makes it
// self-signed (the CA).
x509_ptr make_certificate(EVP_PKEY* key, const std::string& cn, const std::string& ou, X509* issuer,
                          EVP_PKEY* issuer_key, int days) {
  x509_ptr cert{X509_new()};
  if (!cert) fail("out of memory");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) fail("the random generator failed");
  serial[0] &= 0x7f;  // a positive serial number
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  bool ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto add = [&](const char* field, const std::string& value) {
    return X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(value.c_str()),
                                      -1, -1, 0) == 1;
  };
  ok = ok && X509_set_version(cert.get(), X509_VERSION_3) && add("O", "FusionLLM cluster") && add("OU", ou) &&
       add("CN", cn) && X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) &&
       X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400L * days) && X509_set_pubkey(cert.get(), key) == 1 &&
       X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name) == 1;
  if (!ok) fail("cannot fill the certificate of '" + cn + "'");
  X509* signer = issuer ? issuer : cert.get();
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  if (!issuer) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyAgreement");
    // Every holder is a TLS server (data port, published actors) and a client at once.
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) fail("cannot sign the certificate of '" + cn + "'");
  return cert;
}

std::string to_pem(X509* cert) {
  bio_ptr bio{BIO_new(BIO_s_mem())};
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) fail("cannot encode a certificate");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string to_pem(EVP_PKEY* key) {
  bio_ptr bio{BIO_new(BIO_s_mem())};
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("cannot encode a private key");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// Writes through a descriptor opened with `mode`, and fchmods it too: an existing file keeps its
// old mode under O_TRUNC, and a key must never stay world-readable.
void write_file(const std::string& path, const std::string& text, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  int err = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
}

}  // namespace

identity_files files_in(const std::string& dir, role r, const std::string& node_name) {
  fs::path base(dir);
  std::string stem = r == role::node ? (fs::path("nodes") / node_name).string() : std::string(to_string(r));
  return {(base / "ca.pem").string(), (base / (stem + ".pem")).string(), (base / (stem + ".key")).string()};
}

std::vector<written_file> make_cluster_certs(const std::string& dir, const std::vector<std::string>& node_names,
                                             const cert_options& options) {
  if (options.days < 1) throw std::runtime_error("certificates must be valid for at least one day");
  for (const auto& name : node_names)
    if (name.empty() || name.size() > 64 || name.find('/') != std::string::npos || name == "." || name == "..")
      throw std::runtime_error("node name '" + name + "' cannot name a certificate (1-64 characters, no '/')");
  fs::path base(dir);
  std::error_code ec;
  fs::create_directories(base / "nodes", ec);
  if (ec) throw std::runtime_error("cannot create " + (base / "nodes").string() + ": " + ec.message());
  if (!options.overwrite && fs::exists(base / "ca.pem"))
    throw std::runtime_error((base / "ca.pem").string() +
                             " exists: its certificates would stop working; pass --force to replace the CA");
  std::vector<written_file> out;
  auto ca_key = make_key();
  auto ca = make_certificate(ca_key.get(), "FusionLLM cluster CA", "ca", nullptr, ca_key.get(), options.days);
  auto emit = [&](const std::string& path, const std::string& text, mode_t mode, std::string what) {
    write_file(path, text, mode);
    out.push_back({path, std::move(what)});
  };
  emit((base / "ca.key").string(), to_pem(ca_key.get()), 0600, "CA key (keep it offline)");
  emit((base / "ca.pem").string(), to_pem(ca.get()), 0644, "CA certificate");
  auto issue = [&](role r, const std::string& name, const std::string& what) {
    auto key = make_key();
    auto cert = make_certificate(key.get(), name, to_string(r), ca.get(), ca_key.get(), options.days);
    auto files = files_in(dir, r, name);
    emit(files.key, to_pem(key.get()), 0600, "key of " + what);
    emit(files.certificate, to_pem(cert.get()), 0644, "certificate of " + what);
  };
  issue(role::coordinator, "coordinator", "the coordinator");
  issue(role::admin, "admin", "the admin shell");
  for (const auto& name : node_names) issue(role::node, name, "node '" + name + "'");
  return out;
}

std::shared_ptr<const credentials> load_credentials(const security_settings& s, role r, const std::string& name) {
  if (s.mode == "off") return nullptr;
  if (s.mode != "tls")
    throw std::runtime_error("security.mode is '" + s.mode + "': use tls (the default) or off (plaintext)");
  identity_files files = s.certs.empty() ? identity_files{} : files_in(s.certs, r, name);
  if (!s.files.ca.empty()) files.ca = s.files.ca;
  if (!s.files.certificate.empty()) files.certificate = s.files.certificate;
  if (!s.files.key.empty()) files.key = s.files.key;
  if (files.ca.empty() || files.certificate.empty() || files.key.empty())
    throw std::runtime_error(
        "security.mode is tls but no certificate is given: make the run's certificates with `fusion-cluster certs "
        "CLUSTER --out DIR` and set security.certs=DIR (or security.ca, security.certificate and security.key), or "
        "set security.mode=off to run in plaintext");
  auto c = credentials::load(files);
  if (c->self().r != r || (r == role::node && c->self().name != name))
    throw std::runtime_error("the certificate " + files.certificate + " belongs to " + to_string(c->self().r) + " '" +
                             c->self().name + "', not to " + to_string(r) + (name.empty() ? "" : " '" + name + "'"));
  return c;
}

std::string plaintext_warning(const std::string& program) {
  return program + ": WARNING: security.mode=off: connections are plaintext and unauthenticated; anyone who "
                   "can reach this process's ports can join the run, read its tensors or inject their own";
}

}  // namespace fusion::security
