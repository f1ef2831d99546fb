#pragma once

#include <string>

namespace tandem {

// The bundled default model directory: $TANDEM_MODEL, else models/stories260k next to the
// build or install tree of this executable, else the source tree it was built from.
std::string DefaultModelDir();

}  // namespace tandem
