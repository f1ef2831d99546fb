// Fuzzes config.json parsing (ParseModelConfig). Checked for every document it accepts: the
// config passes ValidateModelConfig, and ModelConfigToJson writes a document that parses back to
// an equal config (as model_config.h promises).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/config/model_config.h"

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = tandem::ParseModelConfig(text, "fuzz/config.json");
  if (!config.ok()) return 0;
  FUZZ_CHECK(tandem::ValidateModelConfig(*config, "fuzz/config.json").ok());
  const std::string json = tandem::ModelConfigToJson(*config);
  auto again = tandem::ParseModelConfig(json, "fuzz/written.json");
  if (!again.ok()) {
    std::fprintf(stderr, "written config does not parse: %s\n%s\n",
                 std::string(again.status().message()).c_str(), json.c_str());
    std::abort();
  }
  if (!(*again == *config)) {
    std::fprintf(stderr, "written config parses to another config:\n%s\n", json.c_str());
    std::abort();
  }
  return 0;
}
