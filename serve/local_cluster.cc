// `tandem serve --prefill-workers N --decode-workers M`: a local disaggregated cluster. The
// workers run as child `tandem prefill|decode` processes on loopback (ClusterSupervisor); the
// router runs in this process.

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/log.h"
#include "common/metrics/router_metrics.h"
#include "common/rpc/call_auth.h"
#include "common/worker/worker_main.h"
#include "kvtransfer/auth.h"
#include "router/router_main.h"
#include "serve/cluster_supervisor.h"
#include "serve/serve_modes.h"

namespace tandem {
namespace {

// A fresh secret (64 hex characters from the CSPRNG) in `path`, readable by this user only.
absl::Status WriteFreshSecret(const std::string& path) {
  absl::StatusOr<std::string> secret = NewClusterSecret();
  if (!secret.ok()) return secret.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  out << *secret;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

int ServeCluster(const sigset_t& signals, ServeFlags flags, ProcessMetrics* metrics) {
  ClusterSupervisorOptions supervisor_options;
  // A fresh directory only this user can enter (mkdtemp: 0700, never one that already
  // existed), since the cluster's secrets are written there.
  std::string state_template =
      (std::filesystem::temp_directory_path() / absl::StrCat("tandem-serve-", getpid(), "-XXXXXX"))
          .string();
  if (mkdtemp(state_template.data()) == nullptr) {
    TLOG(ERROR) << "cannot make a state directory " << state_template << ": "
                << std::strerror(errno);
    return 1;
  }
  supervisor_options.state_dir = state_template;
  // Removed (secrets included) however this returns, after the supervisor stopped the workers.
  struct RemoveOnExit {
    std::string dir;
    ~RemoveOnExit() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } remove_state_dir{state_template};
  // With /metrics on, every worker serves its own on a free port.
  supervisor_options.metrics = metrics->port() != 0;
  supervisor_options.metrics_host = flags.server.metrics.host;
#if defined(TANDEM_CUDA_EMULATION)
  // NCCL refuses two ranks on one GPU; this test build gives every worker of an nccl cluster an
  // emulated GPU of its own, as a machine with one GPU per worker would (a real build refuses
  // nccl here: serve_main.cc).
  if (flags.kv_transport == "nccl") {
    const char* base = std::getenv("TANDEM_EMULATED_GPU");
    const std::string prefix = base != nullptr ? base : "0";
    supervisor_options.child_env = [prefix](const std::string& role, int index) {
      return std::vector<std::string>{
          absl::StrCat("TANDEM_EMULATED_GPU=", prefix, "-", role, "-", index)};
    };
  }
#endif
  // Each worker keeps its KV offload tier in a directory of its own under --kv-offload-dir
  // (DIR/prefill-0, DIR/decode-1, ...): a disk tier serves one process (its lock refuses a
  // second), and a restarted worker finds its own blocks again. Sizes are per worker.
  const std::string offload_dir = flags.engine.options.engine.kv_tiers.disk_dir;
  if (!offload_dir.empty()) {
    if (::mkdir(offload_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      TLOG(ERROR) << "cannot create --kv-offload-dir " << offload_dir << ": "
                  << std::strerror(errno);
      return 1;
    }
    struct stat st;
    if (::stat(offload_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      TLOG(ERROR) << "--kv-offload-dir " << offload_dir
                  << " must be a directory of this user that others cannot write";
      return 2;
    }
    supervisor_options.child_args = [offload_dir](const std::string& role, int index) {
      return std::vector<std::string>{
          absl::StrCat("--kv-offload-dir=", offload_dir, "/", role, "-", index)};
    };
    flags.engine.options.engine.kv_tiers.disk_dir.clear();
  }
  ClusterSupervisor supervisor(supervisor_options);
  std::vector<std::string> args = flags.engine.ToArgs();
  if (flags.server.log_json) args.push_back("--log-json");
  args.push_back("--kv-transport=" + flags.kv_transport);
  // The workers serve with the same certificate; the router dials them with it (mTLS).
  for (std::string& a : flags.server.tls.ToArgs()) args.push_back(std::move(a));
  // The KV data path between them authenticates with the shared secret: the operator's, or a
  // fresh one for this cluster (the path, not the secret, goes on their command lines).
  if (flags.kv_secret_file.empty()) {
    flags.kv_secret_file = supervisor_options.state_dir + "/kv.secret";
    if (absl::Status st = WriteFreshSecret(flags.kv_secret_file); !st.ok()) {
      TLOG(ERROR) << "KV secret: " << st;
      return 1;
    }
  } else if (auto secret = kvtransfer::ReadSecretFile(flags.kv_secret_file); !secret.ok()) {
    TLOG(ERROR) << "--kv-secret-file: " << secret.status();
    return 2;
  }
  args.push_back("--kv-secret-file=" + flags.kv_secret_file);
  // Every call to a worker proves the cluster secret, so nothing but this router drives them
  // (common/rpc/call_auth.h): the operator's, or a fresh one for this cluster.
  if (flags.cluster_secret_file.empty()) {
    flags.cluster_secret_file = supervisor_options.state_dir + "/cluster.secret";
    if (absl::Status st = WriteFreshSecret(flags.cluster_secret_file); !st.ok()) {
      TLOG(ERROR) << "cluster secret: " << st;
      return 1;
    }
  } else if (auto secret = ReadClusterSecretFile(flags.cluster_secret_file); !secret.ok()) {
    TLOG(ERROR) << "--cluster-secret-file: " << secret.status();
    return 2;
  }
  args.push_back("--cluster-secret-file=" + flags.cluster_secret_file);
  auto credentials = MakeChannelCredentials(flags.server.tls);
  if (!credentials.ok()) {
    TLOG(ERROR) << credentials.status();
    return 2;
  }
  RouterFlags& router_flags = flags.router;
  router_flags.channel_credentials = *credentials;
  router_flags.cluster_secret_file = flags.cluster_secret_file;
  // The workers load --lora-modules at start (their engine flags); the router lets clients
  // select them and loads them on demand on a worker that evicted one.
  router_flags.lora_modules = flags.engine.options.lora.modules;
  router_flags.allow_runtime_lora_updating = flags.allow_runtime_lora_updating;
  std::vector<std::string> prefill_args = args;
  if (flags.no_layerwise_push) prefill_args.push_back("--no-layerwise-push");
  if (!flags.kv_zero_copy.empty()) {
    if (absl::Status st = ParseKvZeroCopy(flags.kv_zero_copy).status(); !st.ok()) {
      TLOG(ERROR) << st;
      return 2;
    }
    prefill_args.push_back("--kv-zero-copy=" + flags.kv_zero_copy);
  }
  const int prefill_workers = static_cast<int>(flags.prefill_workers);
  const int decode_workers = static_cast<int>(flags.decode_workers);
  if (auto st = supervisor.Launch("prefill", prefill_workers, prefill_args, absl::Seconds(120));
      !st.ok()) {
    TLOG(ERROR) << st;
    return 1;
  }
  if (auto st = supervisor.Launch("decode", decode_workers, args, absl::Seconds(120)); !st.ok()) {
    TLOG(ERROR) << st;
    return 1;
  }
  supervisor.StartMonitor();
  if (supervisor_options.metrics && !flags.server.metrics.port_file.empty()) {
    // Scrape targets of the workers, next to this process's own metrics port file.
    WriteFileAtomically(flags.server.metrics.port_file + ".workers", supervisor.MetricsTargets());
  }
  router_flags.prefill_addresses = absl::StrJoin(supervisor.Addresses("prefill"), ",");
  router_flags.decode_addresses = absl::StrJoin(supervisor.Addresses("decode"), ",");
  RouterMetrics router_metrics(metrics->registry());
  auto router =
      RouterRuntime::Create(router_flags, flags.engine.options.model_dir, &router_metrics);
  if (!router.ok()) {
    TLOG(ERROR) << router.status();
    return 1;
  }
  (*router)->registry().WaitForWorkers(prefill_workers, decode_workers, absl::Seconds(60));
  if (int rc = ServeRouterUntilSignal(router->get(), signals, flags.server, flags.http, flags.keys,
                                      absl::StrCat("cluster of ", prefill_workers, " prefill and ",
                                                   decode_workers, " decode workers"));
      rc != 0) {
    return rc;
  }
  supervisor.Stop(absl::Seconds(30));
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace tandem
