#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/base/mapped_file.h"

namespace tandem {

// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the data region; offsets are relative to its start.

// Headers longer than this are rejected (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// "F32", "BF16", "F16", "I32" for those dtypes; nullptr for dtypes this loader does not read.
// I32 holds packed int4 checkpoints (AWQ / GPTQ qweight, qzeros, g_idx).
const char* SafetensorsDTypeName(DType dtype);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data region
  uint64_t end = 0;
  const uint8_t* data = nullptr;  // points into the file's bytes

  size_t nbytes() const { return static_cast<size_t>(end - begin); }
};

struct SafetensorsHeader {
  std::string_view json;                  // the raw header bytes (points into the file's bytes)
  uint64_t data_start = 0;                // 8 + header length
  std::vector<SafetensorsEntry> entries;  // in data order
  std::map<std::string, size_t> by_name;  // name -> index into entries
  std::map<std::string, std::string> metadata;

  const SafetensorsEntry* Find(const std::string& name) const;
};

// Parses and validates the header of a safetensors file held in memory. Rejects, with errors
// naming `path` and (where it applies) the tensor: a file too short for its header, header lengths
// beyond the file or the size limit, bad JSON, dtypes other than F32/BF16/F16/I32, shapes whose
// size disagrees with data_offsets, offsets beyond the data region (truncated files), reversed or
// overlapping ranges. Entries' data pointers point into `data`.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(const uint8_t* data, size_t size,
                                                   const std::string& path);

// A memory-mapped safetensors file with its parsed header.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* Find(const std::string& name) const { return header_.Find(name); }

  // Hands the mapping to a new owner (the Model); entries' data pointers stay valid for as long as
  // that owner keeps it. The header's string views also point into the mapping.
  std::unique_ptr<MappedFile> ReleaseMapping() { return std::move(file_); }

 private:
  SafetensorsFile(std::unique_ptr<MappedFile> file, SafetensorsHeader header)
      : path_(file->path()),
        size_(file->size()),
        file_(std::move(file)),
        header_(std::move(header)) {}
  std::string path_;
  size_t size_;
  std::unique_ptr<MappedFile> file_;
  SafetensorsHeader header_;
};

}  // namespace tandem
