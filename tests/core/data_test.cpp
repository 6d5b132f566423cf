// Tests of the character tokenizer, the vocabulary file, the dataset split and batching.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/data.hpp"
#include "core/data_source.hpp"

using namespace fusion;
namespace fs = std::filesystem;

namespace {

// A per-process scratch file name: several engineers run the suite on one machine at once.
fs::path scratch_path(const std::string& name) {
  return fs::temp_directory_path() / ("fusion_data_test_" + std::to_string(::getpid()) + "_" + name);
}

void write_file(const fs::path& p, const std::string& content) {
  std::ofstream f(p, std::ios::binary);
  f << content;
}

// The message of the std::runtime_error `fn` throws, or "" when it does not throw.
template <class F> std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

}  // namespace

TEST_CASE("core/data: tokenizer ids follow sorted distinct bytes and round-trip") {
  char_tokenizer tok;
  tok.build("hello world\n");
  // Distinct bytes sorted by value: '\n' ' ' 'd' 'e' 'h' 'l' 'o' 'r' 'w'.
  CHECK(tok.size() == 9);
  auto ids = tok.encode("held\n");
  CHECK(ids == std::vector<int32_t>{4, 3, 5, 2, 0});
  CHECK(tok.decode(ids) == "held\n");
  CHECK(tok.encode("").empty());
}

TEST_CASE("core/data: tokenizer names unknown characters and bad ids") {
  char_tokenizer tok;
  tok.build("abc");
  auto msg = error_of([&] { tok.encode("abxc"); });
  CHECK(contains(msg, "'x'"));
  CHECK(contains(msg, "offset 2"));
  msg = error_of([&] { tok.encode(std::string("a\x01", 2)); });
  CHECK(contains(msg, "byte 1"));
  CHECK(contains(msg, "offset 1"));
  std::vector<int32_t> bad{0, 1, 3};
  msg = error_of([&] { tok.decode(bad); });
  CHECK(contains(msg, "token id 3"));
  CHECK(contains(msg, "position 2"));
  std::vector<int32_t> negative{-1};
  CHECK_THROWS_AS(tok.decode(negative), std::runtime_error);
}

TEST_CASE("core/data: vocabulary file round-trips control and high bytes") {
  std::string all;
  for (int b : {0, 9, 10, 13, 32, 65, 127, 200, 255}) all.push_back(static_cast<char>(b));
  char_tokenizer tok;
  tok.build(all);
  auto path = scratch_path("vocab_ok.txt");
  tok.save(path.string());
  char_tokenizer back;
  back.load(path.string());
  CHECK(back.chars() == tok.chars());
  CHECK(back.decode(back.encode(all)) == all);
  // The documented format, byte for byte.
  std::ifstream f(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(text == "fusion-char-vocab 1\n9\n0\n9\n10\n13\n32\n65\n127\n200\n255\n");
  fs::remove(path);
}

TEST_CASE("core/data: bad vocabulary files name the file and the line") {
  auto path = scratch_path("vocab_bad.txt");
  const std::string p = path.string();
  struct bad_case {
    std::string content;
    std::string where;
    std::string what;
  };
  std::vector<bad_case> cases = {
      {"fusion-char-vocab 2\n1\n65\n", ":1:", "header"},
      {"fusion-char-vocab 1\nabc\n65\n", ":2:", "vocabulary size"},
      {"fusion-char-vocab 1\n3\n65\n66\n", ":5:", "end of file"},
      {"fusion-char-vocab 1\n2\n65\n256\n", ":4:", "[0, 255]"},
      {"fusion-char-vocab 1\n2\n66\n65\n", ":4:", "strictly increasing"},
      {"fusion-char-vocab 1\n1\n65\n66\n", ":4:", "after 1 entries"},
      {"", ":1:", "end of file"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.content);
    write_file(path, c.content);
    char_tokenizer tok;
    auto msg = error_of([&] { tok.load(p); });
    CHECK(contains(msg, p + c.where));
    CHECK(contains(msg, c.what));
  }
  // CRLF line endings are tolerated.
  write_file(path, "fusion-char-vocab 1\r\n2\r\n65\r\n66\r\n");
  char_tokenizer tok;
  tok.load(p);
  CHECK(tok.decode(std::vector<int32_t>{1, 0}) == "BA");
  fs::remove(path);
  CHECK(contains(error_of([&] { tok.load(p); }), p));
}

TEST_CASE("core/data: split keeps the first 90% for training and the rest for validation") {
  text_dataset ds(iota_tokens(1005));
  // floor(1005 * 0.1) = 100 validation tokens.
  REQUIRE(ds.train_tokens().size() == 905);
  REQUIRE(ds.val_tokens().size() == 100);
  CHECK(ds.train_tokens().front() == 0);
  CHECK(ds.train_tokens().back() == 904);
  CHECK(ds.val_tokens().front() == 905);
  CHECK(ds.val_tokens().back() == 1004);
  text_dataset all_train(iota_tokens(10), 0.0);
  CHECK(all_train.val_tokens().empty());
  CHECK_THROWS_AS(text_dataset(iota_tokens(10), 1.0), std::invalid_argument);
  CHECK_THROWS_AS(text_dataset(iota_tokens(10), -0.1), std::invalid_argument);
}

TEST_CASE("core/data: train batches are next-token windows that depend only on seed and step") {
  // Tokens equal their position, so each row must read start, start+1, ... and y = x + 1.
  const int n = 400;  // train split: 360 tokens
  text_dataset ds(iota_tokens(n));
  const int64_t B = 4, T = 16;
  std::vector<int32_t> x(B * T), y(B * T), x2(B * T), y2(B * T);
  ds.train_batch(7, 3, B, T, x.data(), y.data());
  for (int64_t r = 0; r < B; ++r) {
    int32_t start = x[r * T];
    CHECK(start >= 0);
    CHECK(start + T < 360);  // the last target stays inside the training split
    for (int64_t t = 0; t < T; ++t) {
      CHECK(x[r * T + t] == start + t);
      CHECK(y[r * T + t] == start + t + 1);
    }
  }
  // Same (seed, step) after other calls: the same batch (resume needs no cursor).
  ds.train_batch(7, 4, B, T, x2.data(), y2.data());
  CHECK(x2 != x);
  ds.train_batch(8, 3, B, T, x2.data(), y2.data());
  CHECK(x2 != x);
  ds.train_batch(7, 3, B, T, x2.data(), y2.data());
  CHECK(x2 == x);
  CHECK(y2 == y);
  // A different batch size keeps the rows it shares: row r depends on (seed, step, r) only.
  std::vector<int32_t> xb(2 * T), yb(2 * T);
  ds.train_batch(7, 3, 2, T, xb.data(), yb.data());
  CHECK(std::equal(xb.begin(), xb.end(), x.begin()));
}

TEST_CASE("core/data: train batch starts cover every valid start and nothing else") {
  // 12 training tokens, T = 4: valid starts are 0..7 (the y window ends at start + 4 <= 11).
  text_dataset ds(iota_tokens(12), 0.0);
  const int64_t T = 4;
  std::set<int32_t> seen;
  std::vector<int32_t> x(T), y(T);
  for (uint64_t step = 0; step < 500; ++step) {
    ds.train_batch(1, step, 1, T, x.data(), y.data());
    seen.insert(x[0]);
  }
  CHECK(seen == std::set<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("core/data: validation batches are fixed non-overlapping windows") {
  text_dataset ds(iota_tokens(1000));  // val = tokens 900..999 (100 tokens)
  const int64_t B = 4, T = 8;
  // (100 - 1) / 8 = 12 windows, 3 full batches of 4.
  REQUIRE(ds.val_batches(B, T) == 3);
  std::vector<int32_t> x(B * T), y(B * T);
  std::set<int32_t> used;
  for (int64_t i = 0; i < 3; ++i) {
    ds.val_batch(i, B, T, x.data(), y.data());
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        CHECK(x[r * T + t] == 900 + (i * B + r) * T + t);
        CHECK(y[r * T + t] == x[r * T + t] + 1);
        CHECK(used.insert(x[r * T + t]).second);  // no x token appears twice
      }
  }
  CHECK(*used.rbegin() == 995);
  CHECK_THROWS_AS(ds.val_batch(3, B, T, x.data(), y.data()), std::out_of_range);
  CHECK_THROWS_AS(ds.val_batch(-1, B, T, x.data(), y.data()), std::out_of_range);
}

TEST_CASE("core/data: splits shorter than T+1 are reported") {
  text_dataset ds(iota_tokens(100));  // train 90, val 10
  std::vector<int32_t> x(200), y(200);
  auto msg = error_of([&] { ds.train_batch(0, 0, 1, 90, x.data(), y.data()); });
  CHECK(contains(msg, "training split has 90 tokens"));
  CHECK_NOTHROW(ds.train_batch(0, 0, 1, 89, x.data(), y.data()));
  msg = error_of([&] { ds.val_batches(1, 10); });
  CHECK(contains(msg, "validation split has 10 tokens"));
  CHECK(ds.val_batches(1, 9) == 1);
  CHECK(ds.val_batches(3, 3) == 1);  // 9 / 3 = 3 windows
  CHECK_THROWS_AS(ds.val_batches(4, 3), std::runtime_error);
  CHECK_THROWS_AS(ds.train_batch(0, 0, 0, 4, x.data(), y.data()), std::invalid_argument);
  CHECK_THROWS_AS(ds.val_batches(1, 0), std::invalid_argument);
}

TEST_CASE("core/data: an empty or too short corpus is said before the first step, naming the file") {
  auto shared = [](std::vector<int32_t> tokens) { return std::make_shared<const text_dataset>(std::move(tokens)); };
  CHECK(error_of([&] { text_source(shared({}), 8, "c.txt"); }) ==
        "corpus c.txt: the corpus is empty: name a text file with data.file");
  CHECK(contains(error_of([&] { text_source(shared(iota_tokens(5)), 8, "c.txt"); }),
                 "corpus c.txt: training split has 5 tokens (the corpus less its data.val-fraction tail), fewer than the 9"));
  CHECK_NOTHROW(text_source(shared(iota_tokens(10)), 8, "c.txt"));  // train 9 = T + 1
}

TEST_CASE("core/data: unigram entropy in nats") {
  std::vector<int32_t> uniform{0, 1, 2, 3, 3, 2, 1, 0};
  CHECK(unigram_entropy(uniform, 4) == doctest::Approx(std::log(4.0)));
  // p = 1/4, 1/2, 1/4: H = 1.5 ln 2. Symbol 3 is unused and must not contribute.
  std::vector<int32_t> skewed{0, 1, 1, 2};
  CHECK(unigram_entropy(skewed, 4) == doctest::Approx(1.5 * std::log(2.0)));
  std::vector<int32_t> one{5, 5, 5};
  CHECK(unigram_entropy(one, 6) == doctest::Approx(0.0));
  CHECK(unigram_entropy({}, 3) == 0.0);
  CHECK(contains(error_of([&] { unigram_entropy(one, 5); }), "token 5"));
}

TEST_CASE("core/data: read_text_file reads bytes and explains a missing corpus") {
  auto path = scratch_path("corpus.txt");
  std::string content("line one\nzero\0byte\n", 19);
  write_file(path, content);
  CHECK(read_text_file(path.string()) == content);
  fs::remove(path);
  auto msg = error_of([&] { read_text_file(path.string()); });
  // A user's own file: no advice to fetch the shipped corpus.
  CHECK(contains(msg, "corpus file " + path.string() + " not found: check data.file (or --data.file)"));
  msg = error_of([&] { read_text_file("/nonexistent/data/kjv.txt"); });
  CHECK(contains(msg, "corpus file /nonexistent/data/kjv.txt not found: run scripts/get-data.sh"));
}

TEST_CASE("core/data: the KJV corpus, when present, matches its documented statistics") {
  const fs::path corpus = fs::path(FUSION_SOURCE_DIR) / "data" / "kjv.txt";
  if (!fs::exists(corpus)) {
    MESSAGE("skipped: " << corpus.string() << " not present (scripts/get-data.sh writes it)");
    return;
  }
  std::string text = read_text_file(corpus.string());
  CHECK(text.size() == 4137850);
  char_tokenizer tok;
  tok.build(text);
  CHECK(tok.size() == 63);
  auto ids = tok.encode(text);
  CHECK(unigram_entropy(ids, tok.size()) == doctest::Approx(3.02).epsilon(0.005));
}

TEST_CASE("core/data: messages a user sees use plain words and option names") {
  auto msg = error_of([] { (void)text_dataset(iota_tokens(10), 1.0); });
  CHECK(contains(msg, "data.val-fraction"));
  CHECK(contains(msg, "got 1"));
  CHECK_FALSE(contains(msg, "1.000000"));
  text_dataset ds(iota_tokens(100));  // train 90, val 10
  std::vector<int32_t> x(200), y(200);
  char_tokenizer tok;
  tok.build("abc");
  std::vector<int32_t> bad_id{7};
  for (const std::string& m :
       {msg, error_of([&] { ds.train_batch(0, 0, 1, 90, x.data(), y.data()); }),
        error_of([&] { ds.val_batches(1, 10); }),
        error_of([&] { ds.val_batches(0, 4); }), error_of([&] { ds.val_batch(5, 1, 4, x.data(), y.data()); }),
        error_of([&] { tok.encode("abz"); }), error_of([&] { tok.decode(bad_id); }),
        error_of([&] { unigram_entropy(bad_id, 3); }), error_of([&] { unigram_entropy(bad_id, 0); })}) {
    CAPTURE(m);
    CHECK_FALSE(m.empty());
    for (const char* internal : {"text_dataset", "char_tokenizer", "unigram_entropy", "val_fraction", "B*T"})
      CHECK_FALSE(contains(m, internal));
  }
  // What to change, in option names.
  CHECK(contains(error_of([&] { ds.val_batches(1, 10); }), "train.eval-batches=0"));
  CHECK(contains(error_of([&] { ds.train_batch(0, 0, 1, 90, x.data(), y.data()); }), "data.val-fraction"));
}

TEST_CASE("core/data: the vocabulary file follows the corpus") {
  CHECK(default_vocab_path("data/kjv.txt") == "data/kjv.vocab");
  CHECK(default_vocab_path("/x/y/notes") == "/x/y/notes.vocab");
  CHECK(default_vocab_path("my.corpus.txt") == "my.corpus.vocab");

  const auto dir = scratch_path("vocab_dir");
  fs::remove_all(dir);
  const std::string vocab = (dir / "sub" / "c.vocab").string();
  char_tokenizer tok;

  // No file: built from the corpus and written (directories included), no note.
  auto r = prepare_vocabulary(vocab, "abc", tok);
  CHECK(r.what == vocab_outcome::action::created);
  CHECK(r.note.empty());
  CHECK(tok.size() == 3);
  REQUIRE(fs::exists(vocab));

  // A corpus the file covers: loaded as it is (a larger vocabulary stays, ids unchanged).
  r = prepare_vocabulary(vocab, "cab", tok);
  CHECK(r.what == vocab_outcome::action::loaded);
  r = prepare_vocabulary(vocab, "a", tok);
  CHECK(r.what == vocab_outcome::action::loaded);
  CHECK(tok.size() == 3);

  // A corpus with characters the file lacks (a user's own text, the file built from another
  // corpus): rebuilt from this corpus and rewritten, with a one-line note naming them.
  r = prepare_vocabulary(vocab, "abxyz\n", tok);
  CHECK(r.what == vocab_outcome::action::rebuilt);
  CHECK(contains(r.note, vocab));
  CHECK(contains(r.note, "4 characters"));
  CHECK(contains(r.note, "'x'"));
  CHECK(contains(r.note, "'\\n'"));
  CHECK(r.note.find('\n') == std::string::npos);
  CHECK(tok.size() == 6);
  CHECK_NOTHROW(tok.encode("abxyz\n"));
  char_tokenizer again;
  again.load(vocab);
  CHECK(again.chars() == tok.chars());

  // Written atomically: no temporary file is left next to it.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir / "sub")) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);

  // A malformed file is an error naming it, not silently replaced.
  write_file(vocab, "not a vocabulary\n");
  CHECK(contains(error_of([&] { prepare_vocabulary(vocab, "abc", tok); }), vocab + ":1:"));

  // A place that cannot be written (below a regular file): built, not saved, said so.
  write_file(dir / "plain", "x");
  r = prepare_vocabulary((dir / "plain" / "c.vocab").string(), "hello", tok);
  CHECK(r.what == vocab_outcome::action::not_saved);
  CHECK(contains(r.note, "without saving"));
  CHECK(tok.size() == 4);
  fs::remove_all(dir);
}
