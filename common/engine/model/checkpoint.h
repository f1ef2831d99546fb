#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mapped_file.h"
#include "common/engine/model/safetensors.h"

namespace tandem {

inline constexpr char kSafetensorsFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";

// The safetensors files of one model directory: either model.safetensors or
// model.safetensors.index.json plus the shards its weight_map names (model.safetensors wins when
// both exist, as in transformers).
class Checkpoint {
 public:
  struct TensorRef {
    const SafetensorsFile* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };

  // Opens and validates every file. Errors name the file (and tensor): a missing checkpoint, bad
  // index JSON, a weight_map entry naming a missing or unsafe shard path, corrupt shard headers.
  // When show_progress, logs one line per opened shard.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir,
                                                          bool show_progress);

  bool Has(const std::string& name) const;
  // NotFound naming the file that should hold it when absent; DataLoss when the index maps it to a
  // shard that does not contain it.
  absl::StatusOr<TensorRef> Get(const std::string& name) const;

  // model.safetensors, or the index for sharded checkpoints: the file errors about missing
  // tensors name.
  const std::string& source() const { return source_; }
  bool sharded() const { return sharded_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  size_t total_bytes() const;

  // Moves the mappings out (to the Model); TensorRefs' data stays valid while they live.
  std::vector<std::unique_ptr<MappedFile>> ReleaseMappings();

 private:
  Checkpoint() = default;
  absl::Status OpenSharded(const std::string& dir, bool show_progress);
  absl::Status OpenShard(const std::string& path, size_t index, size_t count, bool show_progress);

  std::string source_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> shard_of_;  // sharded: tensor name -> index into files_
};

// "[a, b, c]": a tensor shape as the loaders' errors print it.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace tandem
