// Runs a libFuzzer entry point without libFuzzer (the regular test build): every file of the
// seed corpus directories given on the command line, then a bounded number of deterministic
// mutations of them (byte flips, truncations, splices). A crash or sanitizer report fails the
// test. The libFuzzer build links the same entry point with -fsanitize=fuzzer instead.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream in(entry.path(), std::ios::binary);
      std::stringstream s;
      s << in.rdbuf();
      seeds.push_back(s.str());
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no seeds\n");
    return 1;
  }
  auto run = [](const std::string& s) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  for (const std::string& s : seeds) run(s);
  std::mt19937 rng(12345);
  const char kInteresting[] = "{}[]\",:\\0-9eE.{%}|'\n \xff\xc3";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = kInteresting[rng() % (sizeof kInteresting - 1)];
          break;
        case 1:
          s.resize(at);
          break;
        case 2:
          s.insert(at, seeds[rng() % seeds.size()].substr(0, 64));
          break;
        default:
          s[at] = static_cast<char>(rng());
      }
    }
    run(s);
  }
  std::printf("replayed %zu seeds and 3000 mutations\n", seeds.size());
  return 0;
}
