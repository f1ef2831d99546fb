#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster/kv_transfer_layout.h"
#include "common/cluster/kv_transport_pair.h"
#include "common/metrics/request_hooks.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class WatchStream;
struct RouteCandidate;  // routing_policy.h

// A worker as the router sees it. Immutable after registration except where noted.
struct Worker {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::Stub> stub;
  v1::WorkerInfo info;

  bool is_prefill() const { return info.role() == "prefill" || info.role() == "both"; }
  bool is_decode() const { return info.role() == "decode" || info.role() == "both"; }

  std::atomic<bool> healthy{false};           // its stats stream is up
  std::atomic<int64_t> inflight_requests{0};  // router-side load estimate
  std::atomic<int64_t> inflight_blocks{0};    // KV blocks of those requests (estimate)
  std::atomic<int64_t> routed_requests{0};    // total, for tests and metrics

  // Latest stats and the hashes of its cached prefix blocks (from WatchStats).
  mutable std::mutex mu;
  v1::WorkerStats stats;
  std::unordered_set<uint64_t> cached;
  // Blocks it holds in the KV cache tiers below its pool (index: host memory, local disk), from
  // the same stream; `stats` keeps the tiers' measured costs (tier_events without hashes).
  std::array<std::unordered_set<uint64_t>, 2> tiered;
  // Blocks of requests routed here whose KV events have not arrived yet (hash -> expiry). They
  // count as cached so that a burst of requests sharing a new prefix follows the first one
  // instead of spreading before the worker reports the blocks; a stored or removed event, a
  // snapshot or the end of the stream drops them.
  std::unordered_map<uint64_t, absl::Time> pending;
  // LoRA adapters requests were routed here for (name -> expiry): they count as held
  // (lora_routing.h) until the worker's stats list them or the time passes.
  std::unordered_map<std::string, absl::Time> lora_pending;
  std::shared_ptr<WatchStream> watch;
  uint64_t watch_generation = 0;

  // Leading blocks of `hashes` this worker holds in its prefix cache, counting pending blocks
  // that have not expired by `now`.
  int64_t CachedPrefix(const std::vector<uint64_t>& hashes, absl::Time now) const;
  // Fills `c`'s tier fields: the blocks of `hashes` from c->cached_blocks on that its tiers hold
  // (up to the first no tier holds, as a load stops there; a block in both counts as host) and
  // the measured costs.
  void TieredPrefix(const std::vector<uint64_t>& hashes, RouteCandidate* c) const;
  // Marks `hashes` pending until `expiry` (a request with these prompt blocks was routed here).
  void NoteRouted(const std::vector<uint64_t>& hashes, absl::Time expiry);
  // Marks adapter `name` pending until `expiry` (a request for it was routed here; nothing for
  // an empty name).
  void NoteLoraRouted(const std::string& name, absl::Time expiry);
};

struct RegistryOptions {
  std::vector<std::string> prefill_addresses;  // static lists, host:port
  std::vector<std::string> decode_addresses;
  std::string prefill_dns;  // "name:port", re-resolved every resolve_interval (e.g. a
  std::string decode_dns;   // Kubernetes headless Service)
  absl::Duration resolve_interval = absl::Seconds(2);
  absl::Duration rpc_timeout = absl::Seconds(2);
  // Told each worker's health (0 at registration, 1 once its stats stream is up, 0 when it
  // fails) and when it leaves discovery. May be null; must outlive the registry.
  RouterHooks* hooks = nullptr;
  // How the router dials workers: TLS (verifying the worker's certificate, presenting the
  // router's own for mTLS) when set, else plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  // With TLS: the name workers' certificates must carry (empty: the address dialed).
  std::string tls_server_name;
  // The cluster secret: every call to a worker carries a token of it (common/rpc/call_auth.h).
  // Empty: none (workers without --cluster-secret-file).
  std::string cluster_secret;
};

// Discovers workers (static lists and DNS names), checks that each speaks the cluster's KV
// layout before it may take requests (refusing it at registration otherwise), and keeps a
// WatchStats stream per worker for load and prefix-cache events. A worker that is no longer
// discovered (its DNS record went away) is forgotten once its stream has ended. Thread-safe.
class WorkerRegistry {
 public:
  explicit WorkerRegistry(RegistryOptions options);
  ~WorkerRegistry();
  void Start();
  void Stop();

  // Healthy workers that can take the role ("prefill" or "decode").
  std::vector<std::shared_ptr<Worker>> Healthy(const std::string& role) const;
  std::vector<std::shared_ptr<Worker>> All() const;
  // Waits until at least this many healthy workers of each role are registered.
  bool WaitForWorkers(int prefill, int decode, absl::Duration timeout) const;
  // The cluster's KV layout (of the first worker admitted), if known.
  std::optional<v1::KvLayoutInfo> layout() const;
  // "address: reason" of every worker refused at registration.
  std::vector<std::string> refused() const;
  // Marks a worker unhealthy at once (a call to it failed); discovery re-registers it.
  void ReportFailure(const std::shared_ptr<Worker>& worker);

 private:
  friend class WatchStream;
  void DiscoveryLoop();
  void DiscoverOnce();
  std::vector<std::pair<std::string, std::string>> CurrentAddresses() const;  // (address, role)
  void Register(const std::string& address, const std::string& expected_role);
  void StartWatch(const std::shared_ptr<Worker>& worker);
  // Why a worker's KV transport cannot talk to the cluster's ("" when it can). Requires mu_.
  std::string TransportRefusalLocked(const std::string& address, const v1::WorkerInfo& info);
  void OnWatchEnded(Worker* worker, uint64_t generation);
  // Sets worker->healthy and, on a change, tells the hooks. Requires worker->mu, so that the
  // hooks see one worker's changes in order.
  void SetHealthyLocked(Worker* worker, bool healthy);
  // Forgets workers that discovery no longer lists and whose stream has ended.
  void ForgetVanished(const std::vector<std::pair<std::string, std::string>>& current);

  RegistryOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::shared_ptr<Worker>> workers_;
  std::vector<std::string> refused_;
  std::optional<v1::KvLayoutInfo> layout_;
  bool stop_ = false;
  std::thread discovery_;
};

}  // namespace tandem
