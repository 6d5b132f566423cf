#include "security/identity.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cstdio>
#include <stdexcept>

#include "base/file_text.hpp"
#include "security/openssl_util.hpp"

namespace fusion::security {

namespace {

std::string read_file(const std::string& path, const char* what) {
  auto text = read_file_text(path, what);
  if (!text) throw std::runtime_error(text.error() + " (security.*)");
  return std::move(*text);
}

std::string name_entry(const X509_NAME* name, int nid) {
  int at = X509_NAME_get_index_by_NID(name, nid, -1);
  if (at < 0) return {};
  auto* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at));
  unsigned char* utf8 = nullptr;
  int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) return {};
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

// Verifies `cert` against `store` now.
status verify_against(X509_STORE* store, X509* cert) {
  x509_store_ctx_ptr ctx{X509_STORE_CTX_new()};
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store, cert, nullptr) != 1) return fail("out of memory");
  if (X509_verify_cert(ctx.get()) == 1) return {};
  int code = X509_STORE_CTX_get_error(ctx.get());
  switch (code) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      return fail("it was not issued by this cluster's CA");
    case X509_V_ERR_CERT_HAS_EXPIRED: return fail("it has expired");
    case X509_V_ERR_CERT_NOT_YET_VALID: return fail("it is not valid yet (check the clocks)");
    default: return fail(X509_verify_cert_error_string(code));
  }
}

}  // namespace

const char* to_string(role r) {
  switch (r) {
    case role::coordinator: return "coordinator";
    case role::node: return "node";
    case role::admin: return "admin";
  }
  return "?";
}

std::optional<role> role_from_string(std::string_view text) {
  for (auto r : {role::coordinator, role::node, role::admin})
    if (text == to_string(r)) return r;
  return std::nullopt;
}

result<identity> identity_of(const x509_st* cert) {
  const X509_NAME* subject = X509_get_subject_name(cert);
  identity id;
  id.name = name_entry(subject, NID_commonName);
  auto ou = name_entry(subject, NID_organizationalUnitName);
  if (id.name.empty()) return fail("the certificate names no holder (no CN in its subject)");
  auto r = role_from_string(ou);
  if (!r)
    return fail("the certificate of '" + id.name + "' carries no FusionLLM role (its OU is '" + ou +
                "', expected coordinator, node or admin)");
  id.r = *r;
  return id;
}

std::shared_ptr<const credentials> credentials::load(const identity_files& files) {
  if (files.ca.empty() || files.certificate.empty() || files.key.empty())
    throw std::runtime_error("security.ca, security.certificate and security.key must all be set");
  std::shared_ptr<credentials> c{new credentials};
  c->files_ = files;
  auto ca_pem = read_file(files.ca, "CA certificate");
  c->cert_pem_ = read_file(files.certificate, "certificate");
  auto key_pem = read_file(files.key, "private key");
  auto ca = parse_certificate(ca_pem);
  if (!ca) throw std::runtime_error(files.ca + " holds no PEM certificate (security.ca)");
  auto cert = parse_certificate(c->cert_pem_);
  if (!cert) throw std::runtime_error(files.certificate + " holds no PEM certificate (security.certificate)");
  c->key_ = parse_private_key(key_pem).release();
  if (!c->key_) throw std::runtime_error(files.key + " holds no PEM private key (security.key)");
  c->store_ = X509_STORE_new();
  if (!c->store_ || X509_STORE_add_cert(c->store_, ca.get()) != 1)
    throw std::runtime_error("cannot use " + files.ca + " as a CA: " + last_openssl_error());
  if (auto fits = verify_against(c->store_, cert.get()); !fits)
    throw std::runtime_error("the certificate " + files.certificate + " does not fit the CA " + files.ca + ": " +
                             fits.error());
  if (X509_check_private_key(cert.get(), c->key_) != 1)
    throw std::runtime_error("the private key " + files.key + " does not belong to the certificate " +
                             files.certificate);
  auto id = identity_of(cert.get());
  if (!id) throw std::runtime_error(files.certificate + ": " + id.error());
  c->self_ = *id;
  return c;
}

credentials::~credentials() {
  EVP_PKEY_free(key_);
  X509_STORE_free(store_);
}

std::string credentials::sign(std::string_view message) const {
  md_ctx_ptr ctx{EVP_MD_CTX_new()};
  size_t n = 0;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key_) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &n, reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1)
    throw std::runtime_error("cannot sign with " + files_.key + ": " + last_openssl_error());
  std::string out(n, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1)
    throw std::runtime_error("cannot sign with " + files_.key + ": " + last_openssl_error());
  out.resize(n);
  return out;
}

result<identity> credentials::verify_peer(std::string_view cert_pem) const {
  auto cert = parse_certificate(cert_pem);
  if (!cert) return fail("what it sent is not a PEM certificate");
  if (auto valid = verify_against(store_, cert.get()); !valid)
    return fail("its certificate is refused: " + valid.error());
  return identity_of(cert.get());
}

bool credentials::verify_signature(std::string_view cert_pem, std::string_view message, std::string_view signature) {
  auto cert = parse_certificate(cert_pem);
  if (!cert) return false;
  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  md_ctx_ptr ctx{EVP_MD_CTX_new()};
  if (!key || !ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) != 1) return false;
  bool ok = EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                             reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  ERR_clear_error();  // a failed check leaves entries that would confuse a later error message
  return ok;
}

std::string random_nonce() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof(raw)) != 1) throw std::runtime_error("the system's random generator failed");
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : raw) out += digits[b >> 4], out += digits[b & 15];
  return out;
}

std::string proof_message(std::string_view purpose, std::string_view challenger_nonce, std::string_view prover_nonce,
                          std::string_view name) {
  std::string out = "fusionllm-proof-v1";
  for (auto part : {purpose, challenger_nonce, prover_nonce, name}) {
    out += '\n';
    out += std::to_string(part.size());
    out += ':';
    out += part;
  }
  return out;
}

}  // namespace fusion::security
