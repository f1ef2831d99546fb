#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// The LoRA adapters clients may select by name (GenerateRequest.model, the OpenAI `model` field)
// and their runtime loading (RouterAdmin's LoadLoraAdapter / UnloadLoraAdapter). The router links
// no engine code: `tandem serve` implements it over its engine's registry, a cluster's router
// over its workers (ClusterLoraCatalog). Thread-safe.
class LoraCatalog {
 public:
  struct Entry {
    std::string name;
    std::string path;  // the directory it was loaded from
  };

  virtual ~LoraCatalog() = default;
  virtual std::vector<Entry> List() const = 0;
  virtual bool Has(const std::string& name) const = 0;
  // Where workers load `name` from on demand (DecodeRequest.lora_path); empty: they must hold
  // it already (`tandem serve`'s one engine).
  virtual std::string Path(const std::string& name) const { return ""; }
  // Runtime loading: FAILED_PRECONDITION where the server does not allow it.
  virtual absl::Status Load(const std::string& name, const std::string& path) = 0;
  // Returns how many requests still run with the adapter (they finish with it).
  virtual absl::StatusOr<int64_t> Unload(const std::string& name) = 0;
};

}  // namespace tandem
