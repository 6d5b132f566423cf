// base/file_text.hpp: reading a user's file whole, and every loader that reads one through it
// saying the same plain words for a missing file, a directory and an empty path.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "base/file_text.hpp"
#include "core/cluster.hpp"
#include "core/data.hpp"
#include "core/graph_loader.hpp"
#include "scheduler/profile.hpp"
#include "security/identity.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/fixtures.hpp"
#include "tokenizer/bpe.hpp"

using fusion::test::contains;
using fusion::test::error_of;

TEST_CASE("base/file_text: a file's bytes whole, or why not in words that name it") {
  fusion::test::scratch_dir dir("file_text", "read");
  const std::string bytes = std::string("line one\r\n\0binary\xff", 19) + std::string(200000, 'x');
  fusion::test::write_file(dir / "f.txt", bytes);
  auto r = fusion::read_file_text((dir / "f.txt").string(), "model file");
  REQUIRE(r.ok());
  CHECK(*r == bytes);  // NUL, CR and high bytes kept; longer than one read buffer

  fusion::test::write_file(dir / "empty.txt", "");
  r = fusion::read_file_text((dir / "empty.txt").string(), "model file");
  REQUIRE(r.ok());
  CHECK(r->empty());

  const std::string missing = (dir / "missing.txt").string();
  r = fusion::read_file_text(missing, "model file");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() == "cannot open model file '" + missing + "': No such file or directory");

  r = fusion::read_file_text(dir.path.string(), "cluster file");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() == "cluster file '" + dir.path.string() + "' is a directory");

  r = fusion::read_file_text("", "vocabulary file");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() == "no vocabulary file named (an empty path)");
}

TEST_CASE("base/file_text: every loader of a user's file says a directory is a directory") {
  fusion::test::scratch_dir dir("file_text", "loaders");
  const std::string d = dir.path.string();
  // The BPE tokenizer is named by its directory; its vocab.json is the file read.
  const std::string bpe_vocab = (dir / "tok/vocab.json").string();
  std::filesystem::create_directories(bpe_vocab);
  auto cluster = fusion::parse_cluster("site { name: \"a\" }\nnode { name: \"a1\" site: \"a\" }\n", "c.pbtxt");
  fusion::security::identity_files certs{d, d, d};
  struct loader {
    const char* what;
    std::string path;
    std::string message;
  };
  const loader loaders[] = {
      {"model file", d, error_of([&] { fusion::load_graph(d, 1); })},
      {"cluster file", d, error_of([&] { fusion::load_cluster(d); })},
      {"vocabulary file", d, error_of([&] { fusion::char_tokenizer().load(d); })},
      {"corpus file", d, error_of([&] { fusion::read_text_file(d); })},
      {"profile", d, error_of([&] { fusion::load_profile(d, cluster); })},
      {"CA certificate", d, error_of([&] { fusion::security::credentials::load(certs); })},
      {"tokenizer vocabulary", bpe_vocab, error_of([&] { fusion::tok::bpe_tokenizer::load((dir / "tok").string()); })},
  };
  for (const auto& l : loaders) {
    INFO(l.what, ": ", l.message);
    CHECK(contains(l.message, std::string(l.what) + " '" + l.path + "' is a directory"));
  }
}
