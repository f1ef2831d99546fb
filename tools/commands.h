#pragma once

#include <string>

namespace tandem {

// Subcommands of the `tandem` executable. Each parses its own flags (argv[0] is the
// subcommand name) and returns the process exit code.
int RunGenerate(int argc, char** argv);
int RunMakeModel(int argc, char** argv);
int RunServe(int argc, char** argv);
int RunRouter(int argc, char** argv);
int RunWorker(int argc, char** argv);
int RunPrefillWorker(int argc, char** argv);
int RunDecodeWorker(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunClient(int argc, char** argv);

// The bundled default model directory: $TANDEM_MODEL, else models/stories260k next to the
// build or install tree of this executable, else the source tree it was built from.
std::string DefaultModelDir();

}  // namespace tandem
