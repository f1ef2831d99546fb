#include "common/config/default_model.h"

#include <cstdlib>
#include <filesystem>

namespace tandem {

std::string DefaultModelDir() {
  if (const char* env = std::getenv("TANDEM_MODEL"); env != nullptr && *env != '\0') return env;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // build/bin/tandem -> ../../models ; <prefix>/bin/tandem -> ../share/tandem/models
    for (const fs::path& candidate : {exe.parent_path() / "../../models/stories260k",
                                      exe.parent_path() / "../share/tandem/models/stories260k"}) {
      if (fs::exists(candidate / "config.json", ec)) return fs::weakly_canonical(candidate, ec);
    }
  }
  return std::string(TANDEM_SOURCE_DIR) + "/models/stories260k";
}

}  // namespace tandem
