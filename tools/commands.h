#pragma once

namespace tandem {

// The developer commands of the `tandem` executable (the serving roles' commands live with their
// roles: router/router_main.h, prefill_worker/prefill_main.h, decode_worker/decode_main.h,
// serve/serve_main.h). Each parses its own flags (argv[0] is the subcommand name) and returns
// the process exit code.
int RunGenerate(int argc, char** argv);
int RunMakeModel(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunClient(int argc, char** argv);

}  // namespace tandem
