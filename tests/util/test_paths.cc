#include "tests/util/test_paths.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tandem {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "test paths: %s\n", what.c_str());
  std::abort();
}

std::string FromEnv(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

// The value of `key:TYPE=value` in a CMakeCache.txt, or "".
std::string CacheEntry(const fs::path& cache, const std::string& key) {
  std::ifstream in(cache);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    const size_t eq = line.find('=');
    if (eq != std::string::npos) return line.substr(eq + 1);
  }
  return "";
}

std::string FindBinaryDir() {
  if (std::string env = FromEnv("TANDEM_BINARY_DIR"); !env.empty()) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) Die("cannot read /proc/self/exe: " + ec.message() + "; set TANDEM_BINARY_DIR");
  return exe.parent_path().parent_path().string();
}

std::string FindSourceDir() {
  if (std::string env = FromEnv("TANDEM_SOURCE_DIR"); !env.empty()) return env;
  const fs::path build = TestBinaryDir();
  std::error_code ec;
  const std::string recorded = CacheEntry(build / "CMakeCache.txt", "CMAKE_HOME_DIRECTORY");
  if (!recorded.empty() && fs::exists(fs::path(recorded) / "CMakeLists.txt", ec)) return recorded;
  const fs::path parent = build.parent_path();
  if (fs::exists(parent / "CMakeLists.txt", ec)) return parent.string();
  Die("no checkout found from " + build.string() + "; set TANDEM_SOURCE_DIR");
}

}  // namespace

std::string TestSourceDir() {
  static const std::string dir = FindSourceDir();
  return dir;
}

std::string TestBinaryDir() {
  static const std::string dir = FindBinaryDir();
  return dir;
}

}  // namespace tandem
