// The `tandem` executable: one binary, many subcommands (like `vllm serve`).

#include <cstdio>
#include <cstring>
#include <string>

#include "decode_worker/decode_main.h"
#include "kvtransfer/transport.h"
#include "prefill_worker/prefill_main.h"
#include "router/router_main.h"
#include "serve/serve_main.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"generate", tandem::RunGenerate, "generate a continuation of a prompt in this process"},
    {"serve", tandem::RunServe, "serve the gRPC API: router and one worker in this process"},
    {"router", tandem::RunRouter, "run the router of a disaggregated cluster"},
    {"prefill", tandem::RunPrefillWorker, "run a prefill worker"},
    {"decode", tandem::RunDecodeWorker, "run a decode worker"},
    {"worker", tandem::RunWorker, "run a worker with --role prefill, decode or both"},
    {"bench", tandem::RunBench, "drive a server with load and report throughput and latency"},
    {"client", tandem::RunClient, "send one Generate request to a server and stream the text"},
    {"make-model", tandem::RunMakeModel, "write a random-initialised model at a real shape"},
};

void PrintUsage() {
  std::printf("Usage: tandem <command> [flags]\n\nCommands:\n");
  for (const Command& c : kCommands) std::printf("  %-12s %s\n", c.name, c.summary);
  std::printf("\nRun `tandem <command> --help` for a command's flags.\n");
}

void PrintVersion() {
  std::printf("tandem %s\nkv transports: tcp%s%s\n", TANDEM_VERSION_STRING,
              tandem::kvtransfer::NcclBuilt() ? ", nccl" : "",
              tandem::kvtransfer::CudaIpcBuilt() ? ", cuda-ipc" : "");
#if defined(TANDEM_CUDA_EMULATION)
  std::printf(
      "GPU EMULATION BUILD (tests only): CUDA (with CUDA IPC) and NCCL are CPU emulators; not "
      "for serving\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0) {
    PrintVersion();
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
  PrintUsage();
  return 2;
}
