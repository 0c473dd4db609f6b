// Tokenizer throughput: MB/s of deg's encode over a JSON Lines corpus (each line a string or an
// object with "text" or "document"), one encode per document as the engine does it. The HF
// peer for the same corpus and machine is bench/tokenize_bench_hf.js; docs/tokenizer.md has
// the figures. Not a test.
//
// usage: tokenize_bench --model DIR|tokenizer.json --corpus FILE.jsonl [--repeat 5]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/json.h"
#include "text/tokenizer.h"

namespace {

std::vector<std::string> read_corpus(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> docs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    deg::Json j = deg::json_parse(line, path);
    if (j.is_string()) {
      docs.push_back(j.get<std::string>());
    } else if (j.contains("text")) {
      docs.push_back(j["text"].get<std::string>());
    } else {
      docs.push_back(j.at("document").get<std::string>());
    }
  }
  return docs;
}

template <class Fn>
double best_seconds(int repeat, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, corpus;
  int repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    if (a == "--corpus") corpus = argv[i + 1];
    if (a == "--repeat") repeat = std::stoi(argv[i + 1]);
  }
  if (model.empty() || corpus.empty()) {
    std::fprintf(stderr, "usage: tokenize_bench --model DIR --corpus FILE.jsonl [--repeat N]\n");
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  const deg::text::Tokenizer tok = deg::text::Tokenizer::load(model);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<std::string> docs = read_corpus(corpus);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  size_t tokens = 0;
  for (const auto& d : docs) tokens += tok.encode(d).ids.size();  // warm-up (word cache)

  const double serial = best_seconds(repeat, [&] {
    for (const auto& d : docs) tok.encode(d, {.parallel = false});
  });
  const double threads = best_seconds(repeat, [&] {
    deg::parallel_for(static_cast<int64_t>(docs.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) tok.encode(docs[size_t(i)], {.parallel = false});
    });
  });
  const double mb = double(bytes) / 1e6;
  fmt::print("deg  load {:.2f}s  docs {}  {:.2f} MB  {} tokens\n", load_s, docs.size(), mb, tokens);
  fmt::print("deg  1 thread : {:8.2f} MB/s  {:10.0f} tokens/s\n", mb / serial, tokens / serial);
  fmt::print("deg  {} threads: {:8.2f} MB/s  {:10.0f} tokens/s\n", deg::thread_pool().size(),
             mb / threads, tokens / threads);
  return 0;
}
