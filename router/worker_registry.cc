#include "router/worker_registry.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/log.h"
#include "common/cluster/proto/cluster_proto.h"
#include "common/rpc/call_auth.h"
#include "common/rpc/callback_cq.h"
#include "router/routing_policy.h"

namespace tandem {

// The WatchStats stream of one worker: applies stats and prefix-cache events as they come.
class WatchStream : public grpc::ClientReadReactor<v1::WorkerStats> {
 public:
  WatchStream(WorkerRegistry* registry, std::shared_ptr<Worker> worker, uint64_t generation)
      : registry_(registry), worker_(std::move(worker)), generation_(generation) {}

  void Start(std::shared_ptr<WatchStream> self) {
    self_ = std::move(self);
    worker_->stub->async()->WatchStats(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      std::lock_guard<std::mutex> lock(worker_->mu);
      if (message_.snapshot()) {
        worker_->cached.clear();
        worker_->pending.clear();
        for (auto& t : worker_->tiered) t.clear();
      }
      for (v1::KvTierEvents& e : *message_.mutable_tier_events()) {
        if (e.medium() != v1::KV_MEDIUM_HOST && e.medium() != v1::KV_MEDIUM_DISK) continue;
        auto& tier = worker_->tiered[e.medium() == v1::KV_MEDIUM_HOST ? 0 : 1];
        for (uint64_t h : e.stored_block_hashes()) tier.insert(h);
        for (uint64_t h : e.removed_block_hashes()) tier.erase(h);
        e.clear_stored_block_hashes();
        e.clear_removed_block_hashes();
      }
      for (uint64_t h : message_.stored_block_hashes()) {
        worker_->cached.insert(h);
        worker_->pending.erase(h);
      }
      for (uint64_t h : message_.removed_block_hashes()) {
        worker_->cached.erase(h);
        worker_->pending.erase(h);
      }
      message_.clear_stored_block_hashes();
      message_.clear_removed_block_hashes();
      worker_->stats = message_;
      registry_->SetHealthyLocked(worker_.get(), true);
    }
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    registry_->OnWatchEnded(worker_.get(), generation_);
    self_.reset();  // may delete this
  }

 private:
  WorkerRegistry* registry_;
  std::shared_ptr<Worker> worker_;
  uint64_t generation_;
  grpc::ClientContext context_;
  v1::StatsRequest request_;
  v1::WorkerStats message_;
  std::shared_ptr<WatchStream> self_;
};

int64_t Worker::CachedPrefix(const std::vector<uint64_t>& hashes, absl::Time now) const {
  std::lock_guard<std::mutex> lock(mu);
  int64_t n = 0;
  for (; n < static_cast<int64_t>(hashes.size()); ++n) {
    if (cached.count(hashes[n]) != 0) continue;
    auto it = pending.find(hashes[n]);
    if (it == pending.end() || it->second <= now) break;
  }
  return n;
}

void Worker::TieredPrefix(const std::vector<uint64_t>& hashes, RouteCandidate* c) const {
  std::lock_guard<std::mutex> lock(mu);
  for (const v1::KvTierEvents& e : stats.tier_events()) {
    if (e.medium() == v1::KV_MEDIUM_HOST) c->tier_load_seconds[0] = e.load_seconds_per_block();
    if (e.medium() == v1::KV_MEDIUM_DISK) c->tier_load_seconds[1] = e.load_seconds_per_block();
  }
  c->prefill_seconds_per_block = stats.prefill_seconds_per_block();
  if (tiered[0].empty() && tiered[1].empty()) return;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(0, c->cached_blocks)); i < hashes.size();
       ++i) {
    if (tiered[0].count(hashes[i]) != 0) {
      ++c->tier_blocks[0];
    } else if (tiered[1].count(hashes[i]) != 0) {
      ++c->tier_blocks[1];
    } else {
      break;
    }
  }
}

void Worker::NoteLoraRouted(const std::string& name, absl::Time expiry) {
  if (name.empty()) return;
  std::lock_guard<std::mutex> lock(mu);
  lora_pending[name] = expiry;
}

void Worker::NoteRouted(const std::vector<uint64_t>& hashes, absl::Time expiry) {
  constexpr size_t kPruneAbove = 1 << 16;
  std::lock_guard<std::mutex> lock(mu);
  if (pending.size() > kPruneAbove) {
    const absl::Time now = absl::Now();
    std::erase_if(pending, [now](const auto& e) { return e.second <= now; });
  }
  for (uint64_t h : hashes) {
    if (cached.count(h) == 0) pending[h] = expiry;
  }
}

WorkerRegistry::WorkerRegistry(RegistryOptions options) : options_(std::move(options)) {
  // Legs and watch streams may drop the last reference to a worker's channel in a callback.
  PinCallbackCompletionQueue();
}

WorkerRegistry::~WorkerRegistry() { Stop(); }

void WorkerRegistry::Start() {
  DiscoverOnce();
  discovery_ = std::thread([this] { DiscoveryLoop(); });
}

void WorkerRegistry::Stop() {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    workers = workers_;
  }
  cv_.notify_all();
  if (discovery_.joinable()) discovery_.join();
  for (auto& w : workers) {
    std::shared_ptr<WatchStream> watch;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      watch = w->watch;
    }
    if (watch) watch->Cancel();
  }
  // Let the cancelled streams finish before the workers (and their stubs) go away.
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    bool any = false;
    for (auto& w : workers) {
      std::lock_guard<std::mutex> lock(w->mu);
      any |= w->watch != nullptr;
    }
    if (!any) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

void WorkerRegistry::DiscoveryLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.resolve_interval));
    if (stop_) break;
    lock.unlock();
    DiscoverOnce();
    lock.lock();
  }
}

namespace {

std::vector<std::string> Resolve(const std::string& name_port) {
  std::vector<std::string> out;
  auto pos = name_port.rfind(':');
  if (pos == std::string::npos) return out;
  std::string host = name_port.substr(0, pos), port = name_port.substr(pos + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return out;
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    char buf[NI_MAXHOST];
    if (getnameinfo(p->ai_addr, p->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    std::string ip = buf;
    std::string addr = p->ai_family == AF_INET6 ? "[" + ip + "]:" + port : ip + ":" + port;
    if (std::find(out.begin(), out.end(), addr) == out.end()) out.push_back(addr);
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> WorkerRegistry::CurrentAddresses() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& a : options_.prefill_addresses) out.emplace_back(a, "prefill");
  for (const auto& a : options_.decode_addresses) out.emplace_back(a, "decode");
  if (!options_.prefill_dns.empty()) {
    for (const auto& a : Resolve(options_.prefill_dns)) out.emplace_back(a, "prefill");
  }
  if (!options_.decode_dns.empty()) {
    for (const auto& a : Resolve(options_.decode_dns)) out.emplace_back(a, "decode");
  }
  return out;
}

void WorkerRegistry::DiscoverOnce() {
  const auto current = CurrentAddresses();
  for (const auto& [address, role] : current) {
    std::shared_ptr<Worker> known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      for (auto& w : workers_) {
        if (w->address == address) known = w;
      }
    }
    if (known) {
      std::lock_guard<std::mutex> lock(known->mu);
      if (known->watch != nullptr) continue;  // alive
    }
    Register(address, role);
  }
  ForgetVanished(current);
}

void WorkerRegistry::ForgetVanished(
    const std::vector<std::pair<std::string, std::string>>& current) {
  std::vector<std::shared_ptr<Worker>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto vanished = [&](const std::shared_ptr<Worker>& w) {
      if (std::any_of(current.begin(), current.end(),
                      [&](const auto& a) { return a.first == w->address; })) {
        return false;
      }
      std::lock_guard<std::mutex> wlock(w->mu);
      return w->watch == nullptr;  // still streaming: keep it until the stream ends
    };
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (vanished(*it)) {
        gone.push_back(*it);
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& w : gone) {
    TLOG(INFO) << "forgetting " << w->info.role() << " worker " << w->address
               << " (no longer discovered)";
    if (options_.hooks != nullptr) options_.hooks->RemoveWorker(w->address, w->info.role());
  }
}

void WorkerRegistry::Register(const std::string& address, const std::string& expected_role) {
  auto worker = std::make_shared<Worker>();
  worker->address = address;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  if (!options_.tls_server_name.empty()) args.SetSslTargetNameOverride(options_.tls_server_name);
  worker->channel =
      CreateInternalChannel(address, options_.channel_credentials, args, options_.cluster_secret);
  worker->stub = v1::Worker::NewStub(worker->channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status st = worker->stub->GetInfo(&context, v1::InfoRequest(), &worker->info);
  if (!st.ok()) {  // not up (yet), or a TLS handshake it failed; discovery retries
    if (LogEnabled(LogLevel::kDebug)) {
      TLOG(DEBUG) << "worker " << address << " not registered: " << st.error_message();
    }
    return;
  }
  const std::string& role = worker->info.role();
  const bool role_ok = role == "both" || role == expected_role;
  std::string refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    if (!role_ok) {
      refusal = absl::StrCat("role '", role, "' listed as a ", expected_role, " worker");
    } else if (absl::StatusOr<KvLayout> theirs = KvLayoutFromInfo(worker->info.layout());
               !theirs.ok()) {
      refusal = absl::StrCat("KV layout: ", theirs.status().message());
    } else if (layout_.has_value()) {
      // The cluster's layout was read when its first worker was admitted: it converts.
      absl::Status compat = CheckKvLayoutCompatible(*KvLayoutFromInfo(*layout_), *theirs);
      if (!compat.ok()) refusal = absl::StrCat("not the cluster's KV layout: ", compat.message());
    } else {
      layout_ = worker->info.layout();
    }
    if (refusal.empty()) refusal = TransportRefusalLocked(address, worker->info);
    if (!refusal.empty()) {
      const std::string entry = address + ": " + refusal;
      if (std::find(refused_.begin(), refused_.end(), entry) == refused_.end()) {
        refused_.push_back(entry);
        TLOG(WARNING) << "refusing worker " << entry;
      }
      return;
    }
    // Replace a previous registration of the same address (restarted worker): never reuse its
    // stale state (incarnation, cached hashes).
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [&](const auto& w) { return w->address == address; });
    if (it != workers_.end()) {
      (*it)->healthy.store(false);
      if (options_.hooks != nullptr && (*it)->info.role() != role) {
        options_.hooks->RemoveWorker(address, (*it)->info.role());
      }
      *it = worker;
    } else {
      workers_.push_back(worker);
    }
    // Known to the router, not healthy until its stats stream is up.
    if (options_.hooks != nullptr) options_.hooks->SetWorkerHealthy(address, role, false);
  }
  TLOG(INFO) << "registered " << role << " worker " << address << " (incarnation "
             << worker->info.incarnation() << ")";
  StartWatch(worker);
}

void WorkerRegistry::StartWatch(const std::shared_ptr<Worker>& worker) {
  std::shared_ptr<WatchStream> watch;
  {
    std::lock_guard<std::mutex> lock(worker->mu);
    watch = std::make_shared<WatchStream>(this, worker, ++worker->watch_generation);
    worker->watch = watch;
  }
  watch->Start(watch);
}

void WorkerRegistry::OnWatchEnded(Worker* worker, uint64_t generation) {
  std::lock_guard<std::mutex> lock(worker->mu);
  if (worker->watch_generation != generation) return;
  if (worker->healthy.load()) {
    TLOG(WARNING) << "worker " << worker->address << " is unreachable";
  }
  SetHealthyLocked(worker, false);
  worker->watch.reset();
  worker->cached.clear();
  worker->pending.clear();
  cv_.notify_all();
}

void WorkerRegistry::ReportFailure(const std::shared_ptr<Worker>& worker) {
  std::shared_ptr<WatchStream> watch;
  {
    std::lock_guard<std::mutex> lock(worker->mu);
    SetHealthyLocked(worker.get(), false);
    watch = worker->watch;
  }
  if (watch) watch->Cancel();
}

void WorkerRegistry::SetHealthyLocked(Worker* worker, bool healthy) {
  if (worker->healthy.exchange(healthy) == healthy || options_.hooks == nullptr) return;
  options_.hooks->SetWorkerHealthy(worker->address, worker->info.role(), healthy);
}

std::vector<std::shared_ptr<Worker>> WorkerRegistry::Healthy(const std::string& role) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Worker>> out;
  for (const auto& w : workers_) {
    if (!w->healthy.load()) continue;
    if ((role == "prefill" && w->is_prefill()) || (role == "decode" && w->is_decode())) {
      out.push_back(w);
    }
  }
  return out;
}

std::vector<std::shared_ptr<Worker>> WorkerRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_;
}

bool WorkerRegistry::WaitForWorkers(int prefill, int decode, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (static_cast<int>(Healthy("prefill").size()) >= prefill &&
        static_cast<int>(Healthy("decode").size()) >= decode) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::string WorkerRegistry::TransportRefusalLocked(const std::string& address,
                                                   const v1::WorkerInfo& info) {
  // Every prefill worker may send to every decode worker, so each such pair needs a transport
  // both speak that works between their devices (kv_transport_pair.h). A worker re-registering
  // at its address is not compared with itself.
  const KvTransportPeer self = KvTransportPeerFromInfo(address, info);
  const bool sends = info.role() == "prefill" || info.role() == "both";
  const bool receives = info.role() == "decode" || info.role() == "both";
  for (const auto& w : workers_) {
    if (w->address == address) continue;
    const KvTransportPeer other = KvTransportPeerFromInfo(w->address, w->info);
    absl::StatusOr<std::string> pair = std::string();
    if (sends && w->is_decode()) pair = PairKvTransport(self, other);
    if (pair.ok() && receives && w->is_prefill()) pair = PairKvTransport(other, self);
    if (!pair.ok()) return std::string(pair.status().message());
  }
  return "";
}

std::optional<v1::KvLayoutInfo> WorkerRegistry::layout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return layout_;
}

std::vector<std::string> WorkerRegistry::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

}  // namespace tandem
