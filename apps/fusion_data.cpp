// fusion-data: makes the data of language models: trains a byte-level BPE tokenizer on a corpus
// (train-bpe), tokenizes text into token shards in llm.c's format (tokenize), and checks shards
// (check). Formats and commands: docs/data.md. Plain main() without CAF.
// Exit codes (docs/training.md's): 0 done, 1 an input that does not load or cannot be written,
// 2 a mistake in the command line (message on stderr).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli.hpp"
#include "apps/progress_line.hpp"
#include "core/data.hpp"
#include "core/token_shard.hpp"
#include "core/token_source.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/bpe_train.hpp"

namespace {

using namespace fusion;
namespace fs = std::filesystem;

constexpr const char* usage_text =
    R"(usage: fusion-data train-bpe CORPUS... --vocab-size N --out DIR [--threads T]
       fusion-data tokenize --tokenizer DIR TEXT... --out DIR [--val-fraction F]
                            [--shard-tokens N] [--name NAME] [--threads T]
       fusion-data check SHARD|DIR... [--tokenizer DIR]
       fusion-data --help | --version

train-bpe  learns a byte-level BPE tokenizer of N tokens (at least 257) from the text files
           CORPUS...: the 256 bytes, N - 257 merges of the most frequent pairs of tokens within
           GPT-2's pre-tokenization pieces, and <|endoftext|> last. Writes DIR/vocab.json and
           DIR/merges.txt in GPT-2's format. Deterministic: the same corpus and N give the same
           files.
tokenize   encodes the files TEXT... (one document each, preceded by <|endoftext|> when the
           tokenizer has it, as llm.c does) with the tokenizer of DIR (vocab.json and
           merges.txt: GPT-2's own or one from train-bpe) and writes token shards in llm.c's
           format to --out: NAME_val_000000.bin, ... holding the last fraction F of the text
           (default 0.1, cut at a line start; 0: no validation shard) and NAME_train_000000.bin,
           ... holding the rest, N tokens per shard at most (default 100000000). NAME defaults
           to the first TEXT's name without extension. Shards of NAME already in --out are
           replaced. Tokens are uint16 for vocabularies up to 65,536 tokens, uint32 above.
check      reads shards (or every *.bin of a directory), checks their headers and lengths and
           prints their token counts and largest token; with --tokenizer also that every token
           is in its vocabulary, and the text of the first tokens.

--threads T  encode on T threads (default: one per core).

examples:
  fusion-data train-bpe data/kjv.txt --vocab-size 8192 --out data/kjv-bpe/tokenizer
  fusion-data tokenize --tokenizer data/kjv-bpe/tokenizer data/kjv.txt --out data/kjv-bpe/shards

exit codes: 0 done; 1 an input that does not load (a corpus, tokenizer or shard; errors name the
file and the line or byte offset) or an output that cannot be written; 2 a mistake in the
command line.
)";

struct command_args {
  std::vector<std::string> inputs;
  std::string out, tokenizer, name;
  std::string vocab_size, threads, shard_tokens, val_fraction;
};

int64_t parse_count(const std::string& flag, const std::string& v, int64_t min) {
  char* end = nullptr;
  long long b = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || b < min)
    throw usage_error(flag + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return b;
}

int thread_count(const command_args& a) {
  if (a.threads.empty()) return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<int64_t>(parse_count("--threads", a.threads, 1), 256));
}

std::vector<std::string> read_all(const std::vector<std::string>& paths, size_t& total) {
  std::vector<std::string> texts;
  total = 0;
  for (auto& p : paths) {
    texts.push_back(read_text_file(p));
    total += texts.back().size();
  }
  return texts;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_train_bpe(const command_args& a) {
  if (a.inputs.empty()) throw usage_error("train-bpe needs at least one CORPUS file");
  if (a.vocab_size.empty()) throw usage_error("train-bpe needs --vocab-size N");
  if (a.out.empty()) throw usage_error("train-bpe needs --out DIR");
  const int64_t vocab = parse_count("--vocab-size", a.vocab_size, 257);
  if (vocab > 1 << 24) throw usage_error("--vocab-size " + a.vocab_size + " is more than 16,777,216 tokens");
  const int threads = thread_count(a);
  size_t total = 0;
  auto texts = read_all(a.inputs, total);
  std::vector<std::string_view> views(texts.begin(), texts.end());
  const auto t0 = std::chrono::steady_clock::now();
  progress_line counting("train-bpe: counting pieces", static_cast<double>(total), 1e6, "MB");
  progress_line merging("train-bpe: merging", static_cast<double>(vocab - 257), 1, "merges");
  std::string stage;
  auto tok = tok::train_bpe(views, static_cast<int32_t>(vocab), threads, [&](const tok::train_progress& p) {
    if (stage != p.stage && stage == "counting") counting.finish();
    stage = p.stage;
    (stage == "counting" ? counting : merging).update(static_cast<double>(p.done));
  });
  merging.finish();
  const double train_s = seconds_since(t0);
  tok.save(a.out);
  size_t tokens = 0;
  for (auto& ids : tok.encode_parallel(views, threads)) tokens += ids.size();
  std::printf("train-bpe: %d tokens (%zu merges%s) from %zu bytes in %.1f s, written to %s/vocab.json and merges.txt; "
              "the corpus encodes to %zu tokens, %.2f bytes per token\n",
              tok.size(), tok.merge_count(), tok.size() < vocab ? ", fewer than asked: no pair occurs twice more" : "",
              total, train_s, a.out.c_str(), tokens, tokens ? static_cast<double>(total) / static_cast<double>(tokens) : 0.0);
  return 0;
}

// Removes the shards of `name` a previous run left in `dir`: a shorter corpus must not leave
// old training shards behind.
void remove_old_shards(const std::string& dir, const std::string& name) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (e.path().extension() == ".bin" && (f.rfind(name + "_train_", 0) == 0 || f.rfind(name + "_val_", 0) == 0))
      fs::remove(e.path(), ec);
  }
}

// Writes `tokens` as shards NAME_KIND_000000.bin, ...; returns how many.
size_t write_shards(const std::string& dir, const std::string& name, const char* kind, const std::vector<int32_t>& tokens,
                    int64_t per_shard, int width) {
  size_t count = 0;
  for (size_t from = 0; from < tokens.size(); ++count) {
    const size_t n = std::min<size_t>(static_cast<size_t>(per_shard), tokens.size() - from);
    char file[64];
    std::snprintf(file, sizeof file, "_%s_%06zu.bin", kind, count);
    write_token_shard((fs::path(dir) / (name + file)).string(), std::span<const int32_t>(tokens.data() + from, n), width);
    from += n;
  }
  return count;
}

int run_tokenize(const command_args& a) {
  if (a.tokenizer.empty()) throw usage_error("tokenize needs --tokenizer DIR (vocab.json and merges.txt)");
  if (a.inputs.empty()) throw usage_error("tokenize needs at least one TEXT file");
  if (a.out.empty()) throw usage_error("tokenize needs --out DIR");
  double val_fraction = 0.1;
  if (!a.val_fraction.empty()) {
    char* end = nullptr;
    val_fraction = std::strtod(a.val_fraction.c_str(), &end);
    if (*end != '\0' || !(val_fraction >= 0 && val_fraction < 1))
      throw usage_error("--val-fraction must be at least 0 and below 1, got '" + a.val_fraction + "'");
  }
  const int64_t per_shard = a.shard_tokens.empty() ? 100000000 : parse_count("--shard-tokens", a.shard_tokens, 1);
  if (per_shard > shard_max_tokens) throw usage_error("--shard-tokens is at most " + std::to_string(shard_max_tokens));
  const int threads = thread_count(a);
  const std::string name = a.name.empty() ? fs::path(a.inputs.front()).stem().string() : a.name;
  if (name.empty() || name.find('/') != std::string::npos) throw usage_error("--name must be a plain file name prefix");
  auto tok = tok::bpe_tokenizer::load(a.tokenizer);
  size_t total = 0;
  auto texts = read_all(a.inputs, total);

  // The validation text is the tail of the concatenated documents, as data.val-fraction holds
  // out the tail of a character corpus; the cut moves forward to the next line start.
  std::vector<std::string_view> train_docs, val_docs;
  size_t cut = total - static_cast<size_t>(std::floor(static_cast<double>(total) * val_fraction)), seen = 0;
  for (auto& t : texts) {
    std::string_view v = t;
    if (val_fraction == 0 || seen + v.size() <= cut) {
      train_docs.push_back(v);
    } else if (seen >= cut) {
      val_docs.push_back(v);
    } else {
      size_t at = v.find('\n', cut - seen);
      at = at == std::string_view::npos ? v.size() : at + 1;
      if (at > 0) train_docs.push_back(v.substr(0, at));
      if (at < v.size()) val_docs.push_back(v.substr(at));
    }
    seen += v.size();
  }
  std::vector<std::string_view> all(train_docs);
  all.insert(all.end(), val_docs.begin(), val_docs.end());
  const auto t0 = std::chrono::steady_clock::now();
  progress_line bar("tokenize: encoding", static_cast<double>(total), 1e6, "MB");
  auto encoded = tok.encode_parallel(all, threads, [&](size_t d) { bar.update(static_cast<double>(d)); });
  bar.finish();
  const double encode_s = seconds_since(t0);
  std::vector<int32_t> train, val;
  for (size_t k = 0; k < encoded.size(); ++k) {
    auto& dst = k < train_docs.size() ? train : val;
    if (tok.eot() >= 0) dst.push_back(tok.eot());
    dst.insert(dst.end(), encoded[k].begin(), encoded[k].end());
  }
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) throw std::runtime_error(a.out + ": cannot create the shard directory: " + ec.message());
  remove_old_shards(a.out, name);
  const int width = shard_width_for(tok.size());
  size_t n_val = write_shards(a.out, name, "val", val, per_shard, width);
  size_t n_train = write_shards(a.out, name, "train", train, per_shard, width);
  std::printf("tokenize: %zu bytes in %zu file%s -> %zu training tokens in %zu shard%s and %zu validation tokens in %zu "
              "shard%s (uint%d) in %s; %.2f bytes per token, encoded at %.1f MB/s on %d thread%s\n",
              total, texts.size(), texts.size() == 1 ? "" : "s", train.size(), n_train, n_train == 1 ? "" : "s", val.size(),
              n_val, n_val == 1 ? "" : "s", width * 8, a.out.c_str(),
              train.size() + val.size() ? static_cast<double>(total) / static_cast<double>(train.size() + val.size()) : 0.0,
              encode_s > 0 ? static_cast<double>(total) / 1e6 / encode_s : 0.0, threads, threads == 1 ? "" : "s");
  return 0;
}

int run_check(const command_args& a) {
  if (a.inputs.empty()) throw usage_error("check needs at least one SHARD file or directory");
  std::vector<std::string> files;
  for (auto& in : a.inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file() && e.path().extension() == ".bin") found.push_back(e.path().string());
      if (found.empty()) throw std::runtime_error(in + ": no *.bin token shard in this directory");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  std::unique_ptr<tok::bpe_tokenizer> tok;
  if (!a.tokenizer.empty()) tok = std::make_unique<tok::bpe_tokenizer>(tok::bpe_tokenizer::load(a.tokenizer));
  int64_t total = 0;
  for (auto& f : files) {
    token_shard s(f);
    std::printf("%s: %lld tokens, uint%d, largest token %lld\n", f.c_str(), static_cast<long long>(s.size()), s.width() * 8,
                static_cast<long long>(s.max_token()));
    if (tok) {
      std::vector<int32_t> ids(static_cast<size_t>(s.size()));
      s.read(0, s.size(), ids.data(), tok->size());  // throws at the first token beyond the vocabulary
      ids.resize(std::min<size_t>(ids.size(), 24));
      std::string text = tok->decode(ids);
      for (auto& c : text)
        if (c == '\n') c = ' ';
      std::printf("  begins: %s\n", text.c_str());
    }
    total += s.size();
  }
  std::printf("check: %zu shard%s, %lld tokens, all well-formed%s\n", files.size(), files.size() == 1 ? "" : "s",
              static_cast<long long>(total), tok ? " and within the tokenizer's vocabulary" : "");
  return 0;
}

int run(int argc, char** argv) {
  cli::command_program program(usage_text, "fusion-data " FUSION_VERSION);
  command_args a;
  CLI::App* train_bpe = program.command("train-bpe");
  CLI::App* tokenize = program.command("tokenize");
  CLI::App* check = program.command("check");
  for (auto* cmd : {train_bpe, tokenize, check}) cmd->add_option("inputs", a.inputs);
  program.option(train_bpe, "--vocab-size", a.vocab_size);
  for (auto* cmd : {train_bpe, tokenize}) {
    program.option(cmd, "--out", a.out);
    program.option(cmd, "--threads", a.threads);
  }
  for (auto* cmd : {tokenize, check}) program.option(cmd, "--tokenizer", a.tokenizer);
  program.option(tokenize, "--val-fraction", a.val_fraction);
  program.option(tokenize, "--shard-tokens", a.shard_tokens);
  program.option(tokenize, "--name", a.name);
  const std::string cmd = program.parse(argc, argv);
  if (cmd == "train-bpe") return run_train_bpe(a);
  if (cmd == "tokenize") return run_tokenize(a);
  if (cmd == "check") return run_check(a);
  return 0;  // --help, help or --version
}

}  // namespace

int main(int argc, char** argv) {
  return fusion::cli::run_main("fusion-data", [&] { return run(argc, argv); },
                       "the input text and its tokens are held in memory");
}
