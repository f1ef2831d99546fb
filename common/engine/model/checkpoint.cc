#include "common/engine/model/checkpoint.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/config/json_fields.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// A shard must be a plain file name inside the model directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir,
                                                             bool show_progress) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  const std::filesystem::path root(dir);
  const std::string single = (root / kSafetensorsFile).string();
  const std::string index = (root / kSafetensorsIndexFile).string();
  std::error_code ec;
  if (std::filesystem::exists(single, ec)) {
    ckpt->source_ = single;
    TANDEM_RETURN_IF_ERROR(ckpt->OpenShard(single, 0, 1, show_progress));
    return ckpt;
  }
  if (std::filesystem::exists(index, ec)) {
    ckpt->source_ = index;
    ckpt->sharded_ = true;
    TANDEM_RETURN_IF_ERROR(ckpt->OpenSharded(dir, show_progress));
    return ckpt;
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": no ", kSafetensorsFile, " or ", kSafetensorsIndexFile, " found"));
}

absl::Status Checkpoint::OpenShard(const std::string& path, size_t index, size_t count,
                                   bool show_progress) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  if (show_progress) {
    TLOG(INFO) << "opened shard " << index + 1 << "/" << count << " " << path << " ("
               << file->header().entries.size() << " tensors, " << file->size() / (1 << 20)
               << " MiB)";
  }
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

absl::Status Checkpoint::OpenSharded(const std::string& dir, bool show_progress) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(source_));
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, source_));
  auto map = doc.is_object() ? doc.find("weight_map") : doc.end();
  if (!doc.is_object() || map == doc.end() || !map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": index has no 'weight_map' object"));
  }
  // Shards sorted by file name, so the order is stable.
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor it should hold
  std::map<std::string, std::string> tensor_shard;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string() || !IsPlainFileName(it->get<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": tensor '", it.key(),
                                                     "' maps to an invalid shard file name ",
                                                     it->dump().substr(0, 128)));
    }
    const std::string shard = it->get<std::string>();
    tensor_shard[it.key()] = shard;
    first_tensor.emplace(shard, it.key());
  }
  if (first_tensor.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": 'weight_map' is empty"));
  }
  std::map<std::string, size_t> shard_index;
  for (const auto& [shard, tensor] : first_tensor) {
    const std::string path = (std::filesystem::path(dir) / shard).string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return absl::NotFoundError(absl::StrCat(source_, ": shard '", shard, "' (holding tensor '",
                                              tensor, "') not found at ", path));
    }
    shard_index[shard] = files_.size();
    TANDEM_RETURN_IF_ERROR(OpenShard(path, files_.size(), first_tensor.size(), show_progress));
  }
  for (const auto& [tensor, shard] : tensor_shard) shard_of_[tensor] = shard_index[shard];
  return absl::OkStatus();
}

bool Checkpoint::Has(const std::string& name) const {
  if (sharded_) return shard_of_.count(name) > 0;
  return files_[0]->Find(name) != nullptr;
}

absl::StatusOr<Checkpoint::TensorRef> Checkpoint::Get(const std::string& name) const {
  const SafetensorsFile* file = nullptr;
  if (sharded_) {
    auto it = shard_of_.find(name);
    if (it == shard_of_.end()) {
      return absl::NotFoundError(absl::StrCat(source_, ": missing tensor '", name, "'"));
    }
    file = files_[it->second].get();
  } else {
    file = files_[0].get();
  }
  const SafetensorsEntry* entry = file->Find(name);
  if (entry == nullptr) {
    if (!sharded_) {
      return absl::NotFoundError(absl::StrCat(file->path(), ": missing tensor '", name, "'"));
    }
    return absl::DataLossError(absl::StrCat(file->path(), ": missing tensor '", name,
                                            "' (the index ", source_, " says it is here)"));
  }
  return TensorRef{file, entry};
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& f : files_) total += f->size();
  return total;
}

std::vector<std::unique_ptr<MappedFile>> Checkpoint::ReleaseMappings() {
  std::vector<std::unique_ptr<MappedFile>> out;
  for (auto& f : files_) out.push_back(f->ReleaseMapping());
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace tandem
