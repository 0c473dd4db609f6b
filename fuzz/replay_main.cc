// Replay driver for fuzz targets when libFuzzer is not linked: runs LLVMFuzzerTestOneInput on
// every file of a corpus directory, then on `rounds` deterministic mutations of those files
// (bit flips, byte overwrites with boundary values, truncations, splices). Under the sanitizer
// build this is how every `make test` checks that damaged input never crashes a parser.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [ROUNDS]\n", argv[0]);
    return 2;
  }
  std::vector<std::string> corpus;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream in(e.path(), std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    corpus.push_back(ss.str());
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "empty corpus %s\n", argv[1]);
    return 2;
  }
  for (const auto& c : corpus)
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(c.data()), c.size());
  const long rounds = argc > 2 ? std::atol(argv[2]) : 10000;
  std::mt19937_64 rng(12345);
  const uint8_t boundary[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '"', '{',
                              '}',  '[',  ']',  ',',  ':',  '-', '9'};
  for (long r = 0; r < rounds; ++r) {
    std::string s = corpus[rng() % corpus.size()];
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[pos] = char(uint8_t(s[pos]) ^ uint8_t(1u << (rng() % 8))); break;
        case 1: s[pos] = char(boundary[rng() % sizeof(boundary)]); break;
        case 2: s.resize(pos); break;
        case 3: s.insert(pos, corpus[rng() % corpus.size()].substr(0, 1 + rng() % 16)); break;
        case 4: s.erase(pos, 1 + rng() % 8); break;
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("replayed %zu corpus files and %ld mutations without a crash\n", corpus.size(),
              rounds);
  return 0;
}
