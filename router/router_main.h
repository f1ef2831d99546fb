#pragma once

namespace tandem {

// `tandem router`: the client-facing router of a disaggregated cluster. Returns the exit code.
int RunRouter(int argc, char** argv);

}  // namespace tandem
