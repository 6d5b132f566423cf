// Owning handles for OpenSSL objects and the few helpers the security code and the TLS data
// channel share: PEM parsing from memory and the error queue as a sentence.
#pragma once

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <memory>
#include <string>
#include <string_view>

namespace fusion::security {

template <auto Free>
struct openssl_deleter {
  template <class T>
  void operator()(T* p) const noexcept {
    Free(p);
  }
};

using bio_ptr = std::unique_ptr<BIO, openssl_deleter<BIO_free_all>>;
using x509_ptr = std::unique_ptr<X509, openssl_deleter<X509_free>>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, openssl_deleter<EVP_PKEY_free>>;
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, openssl_deleter<EVP_MD_CTX_free>>;
using x509_store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, openssl_deleter<X509_STORE_CTX_free>>;
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, openssl_deleter<SSL_CTX_free>>;
using ssl_ptr = std::unique_ptr<SSL, openssl_deleter<SSL_free>>;

/// The oldest entry of OpenSSL's error queue as text (the queue is cleared), or "unknown error".
inline std::string last_openssl_error() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

/// The first certificate in `pem`, or null.
inline x509_ptr parse_certificate(std::string_view pem) {
  bio_ptr bio{BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))};
  x509_ptr cert{bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr};
  if (!cert) ERR_clear_error();
  return cert;
}

/// The private key in `pem` (unencrypted), or null.
inline pkey_ptr parse_private_key(std::string_view pem) {
  bio_ptr bio{BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))};
  pkey_ptr key{bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr};
  if (!key) ERR_clear_error();
  return key;
}

}  // namespace fusion::security
