#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/engine/engine_builder.h"

namespace tandem {

// The engine flags of every command that runs an engine (serve, prefill, decode, worker). Most
// register straight onto `options`, whose defaults they show; the few that take another form on
// the command line (a byte size, a policy name, a negation) start from `options` too and are
// folded into it by ToBuildOptions.
struct EngineFlags {
  EngineBuildOptions options;      // model_dir: DefaultModelDir()
  std::string kv_memory;           // kv_cache_bytes as a size ("1GiB")
  std::string policy;              // options.engine.scheduler.policy by name
  std::string speculative_method;  // options.engine.spec.method by name
  // KV cache tiers (options.engine.kv_tiers) as sizes.
  std::string kv_offload_host_memory;
  std::string kv_offload_disk_size;
  std::string kv_offload_write_bandwidth;
  std::string kv_offload_queue;
  bool no_prefix_cache = false;
  bool no_adaptive_speculation = false;

  EngineFlags();
  void Register(FlagSet* flags);
  absl::StatusOr<EngineBuildOptions> ToBuildOptions() const;
  // The same settings as command-line arguments (to start worker processes with them).
  std::vector<std::string> ToArgs() const;
};

}  // namespace tandem
