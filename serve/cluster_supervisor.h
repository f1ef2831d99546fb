#pragma once

#include <sys/types.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct ClusterSupervisorOptions {
  std::string state_dir;  // port files of the children
  // Each child serves /metrics on a free port (the same one again after a restart), on
  // metrics_host (empty: the child's --host, loopback).
  bool metrics = false;
  std::string metrics_host;
  // Environment variables ("NAME=value") a child gets on top of this process's, by role and
  // index (unset: none).
  std::function<std::vector<std::string>(const std::string& role, int index)> child_env;
  // Arguments a child gets after the role's, by role and index (unset: none); a restarted child
  // gets the same ones (e.g. its own --kv-offload-dir, whose blocks it then finds again).
  std::function<std::vector<std::string>(const std::string& role, int index)> child_args;
};

// Runs the worker processes of a local cluster (`tandem serve --prefill-workers N
// --decode-workers M`) on loopback: starts each as a child `tandem prefill|decode` on a free
// port, restarts one that dies on the same port (the router re-registers it and never reuses
// its stale state), and stops them all with SIGTERM (drain) on Stop. Children die with the
// supervisor (PR_SET_PDEATHSIG).
class ClusterSupervisor {
 public:
  struct Child {
    std::string role;  // "prefill" or "decode"
    int index = 0;     // among the children of its role
    std::vector<std::string> args;
    int port = 0;
    int metrics_port = -1;  // -1: any free port (first start), 0: no /metrics
    pid_t pid = -1;
    int restarts = 0;
  };

  explicit ClusterSupervisor(ClusterSupervisorOptions options) : options_(std::move(options)) {}
  ~ClusterSupervisor();

  // Starts `count` workers of `role` with `args` and waits until each serves.
  absl::Status Launch(const std::string& role, int count, const std::vector<std::string>& args,
                      absl::Duration timeout);
  std::vector<std::string> Addresses(const std::string& role) const;
  // "role host:port" of each child's /metrics, one per line (empty without metrics); host is
  // metrics_host, or 127.0.0.1 for a wildcard or none.
  std::string MetricsTargets() const;
  // Restarts children that died, until Stop.
  void StartMonitor();
  // SIGTERM to every child, then waits (SIGKILL after `timeout`).
  void Stop(absl::Duration timeout);

 private:
  absl::Status Spawn(Child& child, absl::Duration timeout);
  void MonitorLoop();

  ClusterSupervisorOptions options_;
  mutable std::mutex mu_;
  std::vector<Child> children_;
  bool stopping_ = false;
  std::thread monitor_;
};

}  // namespace tandem
