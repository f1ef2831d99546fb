#pragma once

// Helpers shared by the model tests: scratch directories and file surgery.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem::testing_util {

inline std::string SourcePath(const std::string& relative) {
  return tandem::TestSourceDir() + "/" + relative;
}

// A fresh directory under the test temp dir, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string unique = name;
    if (info != nullptr)
      unique = std::string(info->test_suite_name()) + "." + info->name() + "." + name;
    path_ = std::filesystem::path(::testing::TempDir()) / ("tandem_model_" + unique);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline uint64_t HeaderLength(const std::string& file_bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file_bytes[i]);
  return n;
}

inline std::string EncodeLength(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// Rewrites the JSON header of a safetensors file in place (data region unchanged).
inline void EditHeader(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = ReadFile(path);
  const uint64_t n = HeaderLength(bytes);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  const std::string text = header.dump();
  WriteFile(path, EncodeLength(text.size()) + text + bytes.substr(8 + n));
}

}  // namespace tandem::testing_util
