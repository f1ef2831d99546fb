#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/rpc/server.h"
#include "common/worker/engine_flags.h"
#include "common/worker/handlers.h"
#include "kvtransfer/transfer_hooks.h"
#include "kvtransfer/transport.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

class AsyncEngine;

// The flags of every worker command (`tandem prefill`, `tandem decode`, `tandem worker`).
struct WorkerFlags {
  EngineFlags engine;
  ServerOptions server;    // --port: 50061
  std::string role;        // prefill, decode or both: fixed by the command, or --role
  std::string model_name;  // reported to the router; empty: the model directory's name
  // --kv-transport (both roles: tcp, nccl, cuda-ipc or auto; resolved once at startup by
  // kvtransfer::ResolveTransport to what the worker runs), --kv-host and --kv-port (decode
  // role: where KV arrives; nccl: its control service).
  // --kv-max-connections, --kv-max-connections-per-peer, --kv-memory-budget (decode role, tcp:
  // kv.limits).
  kvtransfer::ReceiverOptions kv;
  std::string kv_secret_file;
  // Without --kv-secret-file a worker refuses to start unless this is set (then it warns).
  bool allow_unauthenticated_kv = false;
  // Every call of the Worker API must carry a token of this secret (common/rpc/call_auth.h);
  // empty: any caller that reaches the port may call it.
  std::string cluster_secret_file;
  bool no_layerwise_push = false;  // prefill role
  // Prefill role, --kv-zero-copy: auto writes a cuda-ipc target's KV straight into the decode
  // worker's blocks (kvtransfer/README.md "Zero-copy on one GPU") where the transport allows
  // it, off always copies (ParseKvZeroCopy).
  std::string kv_zero_copy = "auto";

  WorkerFlags();
  // `role_flag`: register --role (default both) for the command that does not fix it.
  void Register(FlagSet* flags, bool role_flag);
};

// Whether a --kv-zero-copy value turns zero-copy on: auto (true) or off (false); anything else
// is INVALID_ARGUMENT.
absl::StatusOr<bool> ParseKvZeroCopy(const std::string& value);

// What a worker process gives its roles to start on. Everything outlives the roles.
struct WorkerContext {
  const WorkerFlags* flags = nullptr;
  AsyncEngine* engine = nullptr;
  kvtransfer::KvRegionAccess* regions = nullptr;  // the engine's KV pool
  kvtransfer::KvLayout layout;                    // of that pool
  int cuda_device = 0;                            // of the engine, when on a GPU
  int64_t block_size = 0;
  std::string kv_secret;  // the contents of --kv-secret-file (empty: none)
  // The contents of --cluster-secret-file (empty: none): what calls to other workers prove
  // (CreateInternalChannel, common/rpc/call_auth.h).
  std::string cluster_secret;
  TransferHooks* transfer_hooks = nullptr;
  // A worker of several transports: the hooks of each (SenderOptions::transport_hooks).
  std::function<TransferHooks*(const std::string& transport)> transport_hooks;
};

// One role of a worker process (prefill_worker/, decode_worker/): what it serves behind the
// Worker API once started. Owned by the process; destroyed before the engine.
class WorkerRole {
 public:
  virtual ~WorkerRole() = default;
  // Starts the role on the process's engine (its KV sender or receiver). An error ends the
  // process.
  virtual absl::Status Start(const WorkerContext& context) = 0;
  virtual DecodeHandler* decode_handler() { return nullptr; }
  virtual PrefillHandler* prefill_handler() { return nullptr; }
  // Adds what the role advertises through GetInfo (the decode role: its KV endpoint).
  virtual void Describe(v1::WorkerInfo* info) const {}
};

// The roles a worker process runs for a --role value (prefill, decode or both), in start order.
using WorkerRoleFactory =
    std::function<std::vector<std::unique_ptr<WorkerRole>>(const std::string& role)>;

// The entry point of a worker command: parses WorkerFlags (argv[0] is `command`), builds and
// starts the engine, starts the roles `make_roles` gives for the role (`role`, or --role when
// empty), serves tandem.v1.Worker until SIGTERM/SIGINT and drains. Returns the exit code.
int RunWorkerProcess(int argc, char** argv, const std::string& command, const std::string& role,
                     const WorkerRoleFactory& make_roles);

// The entry point of a command that runs one role, `Role`, named `role` (`tandem prefill`,
// `tandem decode`).
template <class Role>
int RunSingleRoleWorker(int argc, char** argv, const std::string& role) {
  return RunWorkerProcess(argc, argv, role, role, [](const std::string&) {
    std::vector<std::unique_ptr<WorkerRole>> roles;
    roles.push_back(std::make_unique<Role>());
    return roles;
  });
}

}  // namespace tandem
