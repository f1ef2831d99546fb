// main() for the replay form of a fuzz target (tests/fuzz/CMakeLists.txt): runs
// LLVMFuzzerTestOneInput once on every file named on the command line or inside a directory named
// there (sorted), like a libFuzzer binary given files; then, with --mutations=N, N deterministic
// mutations of those inputs (byte flips to syntax characters, truncations, splices), so the
// regular build explores a little beyond the seeds. A crash or sanitizer report fails the test.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Run(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::string Mutate(const std::vector<std::string>& inputs, std::mt19937& rng) {
  static constexpr std::string_view kInteresting = "{}[]\",:\\0-9eE.{%}|'\n \xff\xc3";
  std::string s = inputs[rng() % inputs.size()];
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng() % s.size();
    switch (rng() % 4) {
      case 0:
        s[at] = kInteresting[rng() % kInteresting.size()];
        break;
      case 1:
        s.resize(at);
        break;
      case 2:
        s.insert(at, inputs[rng() % inputs.size()].substr(0, 64));
        break;
      default:
        s[at] = static_cast<char>(rng());
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 0;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.rfind("--mutations=", 0) == 0) {
      mutations = std::strtol(argv[i] + 12, nullptr, 10);
      continue;
    }
    const std::filesystem::path path(arg);
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(path);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no inputs\n");
    return 1;
  }
  std::vector<std::string> inputs;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    Run(bytes);
    inputs.push_back(std::move(bytes));
  }
  std::mt19937 rng(12345);
  for (long i = 0; i < mutations; ++i) Run(Mutate(inputs, rng));
  std::printf("replayed %zu inputs and %ld mutations\n", inputs.size(), mutations);
  return 0;
}
