// Certificates and identities (security/): make_cluster_certs writes a CA and one certificate
// per holder with the right names, roles and file modes; credentials refuse mixed-up files; a
// peer certificate of another CA, and a signature by the wrong key, are refused.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <stdexcept>

#include "security/admission.hpp"
#include "security/certs.hpp"
#include "security/identity.hpp"

namespace fusion::security {
namespace {

namespace fs = std::filesystem;

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("fusion-certs-" + random_nonce().substr(0, 12));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

std::string load_error(const identity_files& f) {
  try {
    credentials::load(f);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("security: make_cluster_certs issues one identity per holder, keys 0600") {
  temp_dir dir;
  auto written = make_cluster_certs(dir.str(), {"a1", "b1"});
  CHECK(written.size() == 2 + 2 * 4);
  for (const auto& w : written) {
    struct stat st {};
    REQUIRE(::stat(w.path.c_str(), &st) == 0);
    bool is_key = w.path.size() > 4 && w.path.substr(w.path.size() - 4) == ".key";
    CHECK((st.st_mode & 0777) == (is_key ? 0600u : 0644u));
  }
  auto coord = credentials::load(files_in(dir.str(), role::coordinator));
  CHECK(coord->self().name == "coordinator");
  CHECK(coord->self().r == role::coordinator);
  auto admin = credentials::load(files_in(dir.str(), role::admin));
  CHECK(admin->self().r == role::admin);
  auto node = credentials::load(files_in(dir.str(), role::node, "b1"));
  CHECK(node->self().name == "b1");
  CHECK(node->self().r == role::node);

  // A second run refuses to replace the CA unless told to.
  CHECK_THROWS_WITH_AS(make_cluster_certs(dir.str(), {"a1"}), doctest::Contains("--force"), std::runtime_error);
  cert_options force;
  force.overwrite = true;
  CHECK_NOTHROW(make_cluster_certs(dir.str(), {"a1"}, force));
}

TEST_CASE("security: a proof signed by the holder verifies, another key, CA or message does not") {
  temp_dir one, two;
  make_cluster_certs(one.str(), {"a1", "b1"});
  make_cluster_certs(two.str(), {"a1"});
  auto coord = credentials::load(files_in(one.str(), role::coordinator));
  auto a1 = credentials::load(files_in(one.str(), role::node, "a1"));
  auto b1 = credentials::load(files_in(one.str(), role::node, "b1"));
  auto stranger = credentials::load(files_in(two.str(), role::node, "a1"));

  auto challenge = random_nonce(), own = random_nonce();
  CHECK(challenge.size() == 64);
  CHECK(challenge != own);
  auto message = proof_message("join", challenge, own, "a1");
  auto sig = a1->sign(message);

  auto who = coord->verify_peer(a1->certificate_pem());
  REQUIRE(who);
  CHECK(who->name == "a1");
  CHECK(credentials::verify_signature(a1->certificate_pem(), message, sig));
  // b1's key cannot speak for a1, and a1's signature does not cover another name or nonce.
  CHECK_FALSE(credentials::verify_signature(a1->certificate_pem(), message, b1->sign(message)));
  CHECK_FALSE(credentials::verify_signature(a1->certificate_pem(), proof_message("join", challenge, own, "b1"), sig));
  CHECK_FALSE(credentials::verify_signature(a1->certificate_pem(), proof_message("join", own, challenge, "a1"), sig));
  CHECK_FALSE(credentials::verify_signature("garbage", message, sig));

  // Same name, other cluster's CA: refused by the chain check.
  auto foreign = coord->verify_peer(stranger->certificate_pem());
  CHECK_FALSE(foreign);
  CHECK(foreign.error().find("not issued by this cluster's CA") != std::string::npos);
  auto garbled = coord->verify_peer("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  CHECK_FALSE(garbled);
  CHECK(garbled.error().find("not a PEM certificate") != std::string::npos);
}

TEST_CASE("security: mixed-up identity files fail at load, naming the file") {
  temp_dir one, two;
  make_cluster_certs(one.str(), {"a1"});
  make_cluster_certs(two.str(), {"a1"});
  auto good = files_in(one.str(), role::node, "a1");

  auto wrong_ca = good;
  wrong_ca.ca = files_in(two.str(), role::node, "a1").ca;
  auto e = load_error(wrong_ca);
  CHECK(e.find("does not fit the CA " + wrong_ca.ca) != std::string::npos);

  auto wrong_key = good;
  wrong_key.key = files_in(one.str(), role::coordinator).key;
  e = load_error(wrong_key);
  CHECK(e.find("does not belong to the certificate") != std::string::npos);

  auto missing = good;
  missing.certificate = one.str() + "/nodes/zz.pem";
  e = load_error(missing);
  CHECK(e.find("cannot open certificate '" + missing.certificate + "'") != std::string::npos);

  auto not_pem = good;
  not_pem.ca = good.key;  // a key where the CA certificate belongs
  e = load_error(not_pem);
  CHECK(e.find("holds no PEM certificate (security.ca)") != std::string::npos);

  CHECK(load_error({}).find("must all be set") != std::string::npos);
  CHECK_THROWS_WITH_AS(make_cluster_certs(one.str() + "/x", {"../evil"}), doctest::Contains("cannot name a certificate"),
                       std::runtime_error);
}

}  // namespace
}  // namespace fusion::security

namespace fusion::security {
namespace {

TEST_CASE("security: check_proof admits the right holder only, challenges are single use and bounded") {
  temp_dir dir;
  make_cluster_certs(dir.str(), {"n0", "n1"});
  auto coord = credentials::load(files_in(dir.str(), role::coordinator));
  auto n0 = credentials::load(files_in(dir.str(), role::node, "n0"));
  auto admin = credentials::load(files_in(dir.str(), role::admin));
  challenge_book book(4);
  auto challenge = book.issue();
  auto p = make_proof(*n0, challenge);
  auto who = check_proof(*coord, p, role::node, "n0");
  REQUIRE(who);
  CHECK(who->name == "n0");
  // The node's proof does not make it n1, nor an admin.
  auto other_name = check_proof(*coord, p, role::node, "n1");
  CHECK_FALSE(other_name);
  CHECK(other_name.error().find("says it is 'n1' but its certificate names 'n0'") != std::string::npos);
  auto other_role = check_proof(*coord, p, role::admin, {});
  CHECK_FALSE(other_role);
  CHECK(other_role.error().find("certificate of node 'n0', not an admin certificate") != std::string::npos);
  CHECK(check_proof(*coord, make_proof(*admin, challenge), role::admin, {}));
  // A signature over another challenge, or none at all, is refused.
  auto forged = p;
  forged.challenge = book.issue();
  auto forged_check = check_proof(*coord, forged, role::node, "n0");
  CHECK_FALSE(forged_check);
  CHECK(forged_check.error().find("signature does not match") != std::string::npos);
  auto empty_check = check_proof(*coord, proof{}, role::node, "n0");
  CHECK_FALSE(empty_check);
  CHECK(empty_check.error().find("presented no certificate") != std::string::npos);

  CHECK(book.redeem(challenge));
  CHECK_FALSE(book.redeem(challenge));  // replayed
  CHECK_FALSE(book.redeem("not issued"));
  for (int i = 0; i < 100; ++i) book.issue();
  CHECK(book.outstanding() <= 4);
  auto t0 = challenge_book::clock::now();
  auto old = book.issue(t0);
  CHECK_FALSE(book.redeem(old, t0 + std::chrono::minutes(2)));  // expired
}

}  // namespace
}  // namespace fusion::security
