#include "common/engine/model/safetensors.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/config/json_fields.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

absl::Status Corrupt(const std::string& path, const std::string& message) {
  return absl::DataLossError(absl::StrCat(path, ": ", message));
}

absl::Status BadTensor(const std::string& path, const std::string& name,
                       const std::string& message) {
  return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': ", message));
}

bool ParseDType(const std::string& s, DType* out) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kF8E4M3}) {
    if (s == SafetensorsDTypeName(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

// A non-negative JSON integer.
bool ToUint(const nlohmann::json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const nlohmann::json& v,
                                            uint64_t data_size, const std::string& path) {
  SafetensorsEntry e;
  e.name = name;
  if (!v.is_object()) return BadTensor(path, name, "header entry is not an object");
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) return BadTensor(path, name, "missing 'dtype'");
  if (!ParseDType(dtype->get<std::string>(), &e.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": tensor '", name, "' has unsupported dtype '",
                     dtype->get<std::string>(), "' (supported: F32, BF16, F16, I32, F8_E4M3)"));
  }
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) return BadTensor(path, name, "missing 'shape'");
  uint64_t numel = 1;
  for (const nlohmann::json& d : *shape) {
    uint64_t dim;
    if (!ToUint(d, &dim) || dim > (uint64_t{1} << 62)) {
      return BadTensor(path, name, absl::StrCat("invalid shape ", shape->dump()));
    }
    if (dim != 0 && numel > (uint64_t{1} << 62) / dim) {
      return BadTensor(path, name, absl::StrCat("shape ", shape->dump(), " is too large"));
    }
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !ToUint((*offsets)[0], &e.begin) || !ToUint((*offsets)[1], &e.end)) {
    return BadTensor(path, name, "'data_offsets' must be two non-negative integers");
  }
  if (e.begin > e.end) {
    return BadTensor(path, name, absl::StrCat("invalid data_offsets [", e.begin, ", ", e.end, "]"));
  }
  if (e.end > data_size) {
    return BadTensor(
        path, name,
        absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] extend beyond the data region of ",
                     data_size, " bytes (truncated file?)"));
  }
  const uint64_t elem = DTypeSize(e.dtype);
  if (numel > UINT64_MAX / elem || numel * elem != e.end - e.begin) {
    return BadTensor(path, name,
                     absl::StrCat("shape ", shape->dump(), " of ", dtype->get<std::string>(),
                                  " does not match the ", e.end - e.begin,
                                  " bytes of data_offsets [", e.begin, ", ", e.end, "]"));
  }
  return e;
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kF8E4M3:
      return "F8_E4M3";
    default:
      return nullptr;
  }
}

const SafetensorsEntry* SafetensorsHeader::Find(const std::string& name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &entries[it->second];
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(const uint8_t* data, size_t size,
                                                   const std::string& path) {
  if (size < 8) {
    return Corrupt(path,
                   absl::StrCat("file of ", size, " bytes is too short for a safetensors header"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxSafetensorsHeaderBytes) {
    return Corrupt(path, absl::StrCat("header length ", n, " exceeds the limit of ",
                                      kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > size - 8) {
    return Corrupt(path, absl::StrCat("header length ", n, " extends beyond the file size of ",
                                      size, " bytes (truncated file?)"));
  }
  SafetensorsHeader header;
  header.json = std::string_view(reinterpret_cast<const char*>(data + 8), n);
  header.data_start = 8 + n;
  const uint64_t data_size = size - header.data_start;

  absl::StatusOr<nlohmann::json> doc = ParseJsonDocument(header.json, path + " (header)");
  if (!doc.ok()) return absl::DataLossError(doc.status().message());
  if (!doc->is_object()) return Corrupt(path, "header is not a JSON object");

  for (auto it = doc->begin(); it != doc->end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        header.metadata[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      }
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(it.key(), *it, data_size, path));
    e.data = data + header.data_start + e.begin;
    header.entries.push_back(std::move(e));
  }

  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  const SafetensorsEntry* prev = nullptr;
  for (size_t i = 0; i < header.entries.size(); ++i) {
    const SafetensorsEntry& e = header.entries[i];
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes
    if (prev != nullptr && e.begin < prev->end) {
      return BadTensor(path, e.name,
                       absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] overlap tensor '",
                                    prev->name, "' [", prev->begin, ", ", prev->end, "]"));
    }
    prev = &e;
  }
  for (size_t i = 0; i < header.entries.size(); ++i) {
    header.by_name[header.entries[i].name] = i;
  }
  return header;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  TANDEM_ASSIGN_OR_RETURN(SafetensorsHeader header,
                          ParseSafetensors(file->data(), file->size(), path));
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(file), std::move(header)));
}

}  // namespace tandem
