// Tests of the byte-level BPE tokenizer: GPT-2's pre-tokenization, the byte map, loading and
// writing vocab.json + merges.txt, encoding and decoding (round trips over any bytes, the two
// merge loops agreeing, parallel encoding equal to serial) and the errors of mismatched files.
#include <doctest/doctest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/bpe.hpp"
#include "tokenizer/bpe_train.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/pretokenize.hpp"
#include "tests/support/error_text.hpp"

namespace fusion::tok {
// Reaches the two merge loops, which must agree.
struct bpe_test_access {
  static std::vector<int32_t> merge(const bpe_tokenizer& t, std::vector<int32_t> syms, bool long_loop) {
    long_loop ? t.merge_long(syms) : t.merge_short(syms);
    return syms;
  }
};
}  // namespace fusion::tok

using namespace fusion::tok;
using fusion::test::contains;
using fusion::test::error_of;

namespace {

std::string random_bytes(std::mt19937& rng, size_t n, bool ascii_heavy) {
  std::string s(n, '\0');
  for (auto& c : s) {
    unsigned r = rng();
    if (ascii_heavy && r % 4 != 0) {
      static const char pool[] = "ab c'sd\n\t  ,.01é";
      c = pool[(r >> 4) % (sizeof pool - 1)];
    } else {
      c = static_cast<char>(r >> 8);
    }
  }
  return s;
}

const char* corpus =
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    "And God said, Let there be light: and there was light.\n"
    "And God saw the light, that it was good: and God divided the light from the darkness.\n";

}  // namespace

TEST_CASE("tokenizer: GPT-2's pre-tokenization pieces") {
  pretokenizer pre;
  CHECK(pre.jit());
  using v = std::vector<std::string>;
  CHECK(pre.pieces("Hello world") == v{"Hello", " world"});
  CHECK(pre.pieces("I'm here, they'll see") == v{"I", "'m", " here", ",", " they", "'ll", " see"});
  CHECK(pre.pieces("hello   world") == v{"hello", "  ", " world"});
  CHECK(pre.pieces("a\n\nThe") == v{"a", "\n", "\n", "The"});
  CHECK(pre.pieces("trailing  ") == v{"trailing", "  "});
  CHECK(pre.pieces("x 123 4567!?") == v{"x", " 123", " 4567", "!?"});
  CHECK(pre.pieces("héllo wörld 日本語") == v{"héllo", " wörld", " 日本語"});
  // Bytes that are not UTF-8 match nothing: each run between matches is a piece of its own.
  CHECK(pre.pieces("ab\xff\xfe cd\x80") == v{"ab", "\xff\xfe", " cd", "\x80"});
  CHECK(pre.pieces("").empty());
}

TEST_CASE("tokenizer: chunk cuts and PCRE2's interpreter keep the pieces of the whole text") {
  std::mt19937 rng(7);
  pretokenizer pre, interpreter(gpt2_pattern, false);
  CHECK_FALSE(interpreter.jit());
  for (int round = 0; round < 20; ++round) {
    std::string text;
    for (int k = 0; k < 400; ++k) text += random_bytes(rng, rng() % 12, true) + (rng() % 3 ? "\n" : "\n\n");
    auto whole = pre.pieces(text);
    std::vector<std::string> cut;
    size_t from = 0;
    auto ends = chunk_ends(text, 97);
    CHECK(ends.size() > 3);
    for (size_t end : ends) {
      for (auto& p : pre.pieces(std::string_view(text).substr(from, end - from))) cut.push_back(p);
      from = end;
    }
    REQUIRE(cut == whole);
    // The interpreter matches in growing windows (pretokenize.cpp): the same pieces.
    REQUIRE(interpreter.pieces(text) == whole);
  }
  std::string spaces = "a" + std::string(5000, ' ') + "b\xff\xfe" + std::string(3000, 'x') + "\xc3";
  CHECK(interpreter.pieces(spaces) == pre.pieces(spaces));
}

TEST_CASE("tokenizer: GPT-2's byte map") {
  CHECK(byte_to_char(' ') == 0x120);  // 'Ġ'
  CHECK(byte_to_char('\n') == 0x10A); // 'Ċ'
  CHECK(byte_to_char('A') == 'A');
  CHECK(gpt2_byte_order()[0] == '!');
  CHECK(gpt2_byte_order()[255] == 0xAD);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  CHECK(text_to_bytes(bytes_to_text(all)) == all);
  size_t bad = 0;
  CHECK_FALSE(text_to_bytes("ab\xc4", &bad));  // cut UTF-8
  CHECK(bad == 2);
  CHECK_FALSE(text_to_bytes("a\xc1\x81"));     // overlong 'A'
  CHECK_FALSE(text_to_bytes(" "));             // ' ' is written 'Ġ', never itself
}

TEST_CASE("tokenizer: GPT-2 style files load and encode by merge rank") {
  // A vocabulary in GPT-2's form: the 256 bytes, then merged tokens, then <|endoftext|>.
  std::vector<std::string> tokens;
  for (uint8_t b : gpt2_byte_order()) tokens.emplace_back(1, static_cast<char>(b));
  std::string vocab = "{";
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string key = bytes_to_text(tokens[i]);
    if (key == "\"" || key == "\\") key = "\\" + key;
    vocab += (i ? ", \"" : "\"") + key + "\": " + std::to_string(i);
  }
  vocab += ", \"Ġt\": 256, \"he\": 257, \"Ġthe\": 258, \"Ġth\": 259, \"<|endoftext|>\": 260}";
  const std::string merges = "#version: 0.2\nĠ t\nh e\nĠt he\nĠt h\n";
  auto t = bpe_tokenizer::parse(vocab, merges);
  CHECK(t.size() == 261);
  CHECK(t.eot() == 260);
  CHECK(t.merge_count() == 4);
  // " the": "Ġ t" (rank 0) first, then "h e" (rank 1), then "Ġt he" (rank 2); "Ġt h" (rank 3)
  // finds no "h" left. " th" has no "he", so "Ġt h" applies.
  CHECK(t.encode(" the") == std::vector<int32_t>{258});
  CHECK(t.encode(" th") == std::vector<int32_t>{259});
  CHECK(t.encode(" t") == std::vector<int32_t>{256});
  CHECK(t.encode("th") == std::vector<int32_t>{83, 71});  // 't' and 'h' in GPT-2's byte order
  CHECK(t.decode(t.encode(" the theme")) == " the theme");
  // What is written is what was read.
  auto again = bpe_tokenizer::parse(t.vocab_json(), t.merges_txt());
  CHECK(again.fingerprint() == t.fingerprint());
  CHECK(again.encode(corpus) == t.encode(corpus));
}

TEST_CASE("tokenizer: round trips over any bytes, invalid UTF-8 included") {
  std::vector<std::string_view> texts = {corpus};
  auto t = train_bpe(texts, 400);
  std::mt19937 rng(3);
  for (int k = 0; k < 200; ++k) {
    std::string s = random_bytes(rng, rng() % 300, k % 2 == 0);
    auto ids = t.encode(s);
    REQUIRE(t.decode(ids) == s);
    for (int32_t id : ids) REQUIRE((id >= 0 && id < t.size()));
  }
  // A piece long enough for the heap loop (a run of punctuation, a run of spaces).
  std::string long_piece(3000, ' ');
  long_piece += std::string(500, '.') + "and and and";
  CHECK(t.decode(t.encode(long_piece)) == long_piece);
  CHECK(t.encode("").empty());
  std::vector<int32_t> bad = {1, t.size()};
  CHECK(contains(error_of([&] { t.decode(bad); }), "token id " + std::to_string(t.size()) + " at position 1"));
}

TEST_CASE("tokenizer: the rescanning and the heap merge loops agree") {
  std::vector<std::string_view> texts = {corpus};
  auto t = train_bpe(texts, 500);
  std::mt19937 rng(11);
  pretokenizer pre;
  for (int k = 0; k < 300; ++k) {
    std::string s = random_bytes(rng, 2 + rng() % 200, true);
    std::vector<int32_t> syms;
    for (unsigned char c : s) syms.push_back(t.encode(std::string(1, static_cast<char>(c))).at(0));
    REQUIRE(bpe_test_access::merge(t, syms, false) == bpe_test_access::merge(t, syms, true));
  }
}

TEST_CASE("tokenizer: parallel encoding equals serial encoding") {
  std::string big;
  for (int k = 0; k < 3000; ++k) big += corpus;
  std::vector<std::string_view> texts = {corpus};
  auto t = train_bpe(texts, 600);
  auto serial = t.encode(big);
  std::vector<std::string_view> docs = {big, corpus, ""};
  size_t last = 0;
  auto par = t.encode_parallel(docs, 2, [&](size_t d) { last = d; });
  CHECK(par.size() == 3);
  CHECK(par[0] == serial);
  CHECK(par[1] == t.encode(corpus));
  CHECK(par[2].empty());
  CHECK(last == big.size() + std::string_view(corpus).size());
  CHECK(t.decode(serial) == big);
}

TEST_CASE("tokenizer: training is deterministic, frequent words become tokens, files round-trip") {
  std::vector<std::string_view> texts = {corpus, "the the the light light\n"};
  size_t merges_seen = 0;
  auto a = train_bpe(texts, 280, 1, [&](const train_progress& p) {
    if (std::string(p.stage) == "merging") merges_seen = p.done;
  });
  auto b = train_bpe(texts, 280, 2);
  CHECK(a.fingerprint() == b.fingerprint());
  CHECK(a.size() == 280);
  CHECK(a.eot() == 279);
  CHECK(merges_seen == 279 - 256);
  CHECK(a.encode(" the").size() == 1);
  CHECK(a.encode(" light").size() == 1);
  auto c = bpe_tokenizer::parse(a.vocab_json(), a.merges_txt());
  CHECK(c.fingerprint() == a.fingerprint());
  CHECK(contains(error_of([&] { train_bpe(texts, 256); }), "at least 257"));
  // A tiny corpus stops early: no pair occurs twice.
  std::vector<std::string_view> tiny = {"abcd"};
  CHECK(train_bpe(tiny, 1000).size() == 257);
}

TEST_CASE("tokenizer: mismatched or malformed files are named with the line or offset") {
  std::vector<std::string_view> texts = {corpus};
  auto t = train_bpe(texts, 300);
  const std::string vocab = t.vocab_json(), merges = t.merges_txt();
  // A merges file from another vocabulary: a token it names is missing here.
  std::string other = merges + "zq xw\n";
  auto msg = error_of([&] { bpe_tokenizer::parse(vocab, other, "tok/vocab.json", "tok/merges.txt"); });
  CHECK(contains(msg, "tok/merges.txt:"));
  CHECK(contains(msg, "does not belong to this vocabulary"));
  // Known parts whose result is not in the vocabulary.
  msg = error_of([&] { bpe_tokenizer::parse(vocab, merges + "z q\n", "v.json", "m.txt"); });
  CHECK(contains(msg, "m.txt:" + std::to_string(t.merge_count() + 2) + ": the merge \"z q\" makes \"zq\""));
  msg = error_of([&] { bpe_tokenizer::parse(vocab, "#version: 0.2\na b c\n", "v.json", "m.txt"); });
  CHECK(contains(msg, "m.txt:2: expected two tokens separated by one space"));
  std::string first_line = merges.substr(merges.find('\n') + 1);
  first_line = first_line.substr(0, first_line.find('\n') + 1);
  msg = error_of([&] { bpe_tokenizer::parse(vocab, merges + first_line, "v.json", "m.txt"); });
  CHECK(contains(msg, "repeats the merge of line 2"));
  msg = error_of([&] { bpe_tokenizer::parse("{\"a\": 0,", "", "v.json", "m.txt"); });
  CHECK(contains(msg, "v.json: byte offset"));
  // A number beyond a double's range (the fuzzer's tokenizer/vocab-number-overflow): a plain
  // error, not the JSON library's own exception escaping.
  msg = error_of([&] { bpe_tokenizer::parse("{\"a\": 4e2951}", "", "v.json", "m.txt"); });
  CHECK(contains(msg, "v.json: a number in it is too large"));
  msg = error_of([&] { bpe_tokenizer::parse("{\"a\": 0, \"b\": 0}", "", "v.json", "m.txt"); });
  CHECK(contains(msg, "id 0 is given to two tokens"));
  msg = error_of([&] { bpe_tokenizer::parse("{\"a\": 0, \"b\": 7}", "", "v.json", "m.txt"); });
  CHECK(contains(msg, "\"b\" has id 7"));
  msg = error_of([&] { bpe_tokenizer::parse("{\"a\": 0, \"b\": 1}", "", "v.json", "m.txt"); });
  CHECK(contains(msg, "v.json: no token for byte 0"));
  msg = error_of([&] { bpe_tokenizer::parse("{\"a b\": 0}", "", "v.json", "m.txt"); });
  CHECK(contains(msg, "not one of GPT-2's byte characters"));
  CHECK(contains(error_of([] { bpe_tokenizer::load("/nonexistent-tokenizer-dir"); }), "/nonexistent-tokenizer-dir not found"));
}

TEST_CASE("tokenizer: the piece cache grows past its first table and gives the uncached ids") {
  std::vector<std::string_view> texts = {corpus};
  auto t = train_bpe(texts, 400);
  // 50,000 distinct words: more than the cache's first table holds at half load (32,768).
  std::string text;
  for (int i = 0; i < 50000; ++i) {
    std::string w = " ";
    for (int v = i; v > 0 || w.size() == 1; v /= 26) w += static_cast<char>('a' + v % 26);
    text += w;
  }
  text += text;  // the second half hits the cache
  std::vector<int32_t> expected;
  pretokenizer pre;
  for (auto& p : pre.pieces(text)) {
    auto ids = t.encode_piece(p);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(t.encode(text) == expected);
}
