#include "common/engine/kv_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "common/engine/kv/tiers/tier_block.h"

namespace tandem {
namespace {

constexpr int kTierFormat = 1;
constexpr int kSamples = 16;
constexpr size_t kSampleBytes = 4096;

uint64_t Fold(uint64_t h, const std::string& s) {
  return TierChecksum(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()), h);
}

// Size, header and samples of one safetensors file.
absl::StatusOr<uint64_t> FoldWeights(uint64_t h, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::NotFoundError(absl::StrCat("cannot stat ", path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  h = Fold(h, absl::StrCat(std::filesystem::path(path).filename().string(), ":", size));
  std::vector<uint8_t> buf;
  auto read_at = [&](uint64_t offset, size_t n) {
    buf.resize(n);
    const ssize_t r = ::pread(fd, buf.data(), n, static_cast<off_t>(offset));
    buf.resize(r > 0 ? static_cast<size_t>(r) : 0);
    h = TierChecksum(buf, h);
  };
  uint64_t header = 0;
  if (size >= 8 && ::pread(fd, &header, 8, 0) == 8) {
    read_at(0, static_cast<size_t>(std::min<uint64_t>(8 + header, size)));
  }
  for (int i = 0; i < kSamples; ++i) {
    const uint64_t offset = size > kSampleBytes ? (size - kSampleBytes) * i / (kSamples - 1) : 0;
    read_at(offset, kSampleBytes);
  }
  ::close(fd);
  return h;
}

}  // namespace

absl::StatusOr<uint64_t> KvTierFingerprint(
    const std::string& model_dir, const KvCacheSpec& spec,
    const std::vector<std::pair<std::string, std::string>>& settings) {
  uint64_t h = Fold(0, absl::StrCat("tandem-kv-tier-format-", kTierFormat));
  std::ifstream config(model_dir + "/config.json", std::ios::binary);
  if (!config) return absl::NotFoundError(absl::StrCat("no config.json in ", model_dir));
  std::stringstream ss;
  ss << config.rdbuf();
  h = Fold(h, ss.str());
  std::vector<std::string> weights;
  for (const auto& e : std::filesystem::directory_iterator(model_dir)) {
    if (e.path().extension() == ".safetensors") weights.push_back(e.path().string());
  }
  std::sort(weights.begin(), weights.end());
  for (const std::string& w : weights) {
    auto folded = FoldWeights(h, w);
    if (!folded.ok()) return folded.status();
    h = *folded;
  }
  for (const auto& [name, value] : settings) h = Fold(h, absl::StrCat(name, "=", value));
  h = Fold(h, absl::StrCat("layers=", spec.num_layers, " kv_heads=", spec.num_kv_heads,
                           " head_dim=", spec.head_dim, " block_size=", spec.block_size, " dtype=",
                           std::string(DTypeName(spec.dtype)), " windowed=", spec.windowed()));
  return h == 0 ? 1 : h;
}

}  // namespace tandem
