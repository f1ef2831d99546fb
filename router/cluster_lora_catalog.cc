#include "router/cluster_lora_catalog.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {
namespace {

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 256 || name.find_first_of(" \t\r\n=") != std::string::npos) {
    return absl::InvalidArgumentError(
        "lora_name: must be 1 to 256 characters without whitespace or '='");
  }
  return absl::OkStatus();
}

}  // namespace

ClusterLoraCatalog::ClusterLoraCatalog(WorkerRegistry* registry, std::function<bool()> allowed,
                                       absl::Duration rpc_timeout)
    : registry_(registry), allowed_(std::move(allowed)), rpc_timeout_(rpc_timeout) {}

absl::Status ClusterLoraCatalog::AddModules(const std::vector<std::string>& modules) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& m : modules) {
    const size_t eq = m.find('=');
    if (eq == std::string::npos || eq + 1 == m.size()) {
      return absl::InvalidArgumentError(absl::StrCat("--lora-modules: '", m, "' is not name=path"));
    }
    const std::string name = m.substr(0, eq);
    if (absl::Status st = CheckName(name); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--lora-modules: ", st.message()));
    }
    if (!paths_.emplace(name, m.substr(eq + 1)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lora-modules: '", name, "' is named twice"));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> ClusterLoraCatalog::Known() const {
  std::map<std::string, std::string> out;
  std::set<std::string> unloaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = paths_;
    unloaded = unloaded_;
  }
  // Adapters a worker was started with (its own --lora-modules) that the router was not told of;
  // never one unloaded through the router (a worker's report may lag or the worker missed it).
  for (const auto& w : LoraWorkers()) {
    std::lock_guard<std::mutex> lock(w->mu);
    for (const v1::LoraAdapterState& a : w->stats.lora_adapters()) {
      if (unloaded.count(a.name()) == 0) out.emplace(a.name(), a.path());
    }
  }
  return out;
}

std::vector<LoraCatalog::Entry> ClusterLoraCatalog::List() const {
  std::vector<Entry> out;
  for (const auto& [name, path] : Known()) out.push_back({name, path});
  return out;
}

bool ClusterLoraCatalog::Has(const std::string& name) const { return Known().count(name) != 0; }

std::string ClusterLoraCatalog::Path(const std::string& name) const {
  const auto known = Known();
  auto it = known.find(name);
  return it == known.end() ? "" : it->second;
}

std::vector<std::shared_ptr<Worker>> ClusterLoraCatalog::LoraWorkers() const {
  std::vector<std::shared_ptr<Worker>> out;
  for (const char* role : {"decode", "prefill"}) {
    for (auto& w : registry_->Healthy(role)) {
      if (std::find(out.begin(), out.end(), w) != out.end()) continue;
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->stats.max_cpu_loras() > 0) out.push_back(w);
    }
  }
  return out;
}

absl::Status ClusterLoraCatalog::CallWorker(Worker& worker, bool load, const std::string& name,
                                            const std::string& path, int64_t* in_use) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  v1::WorkerLoraRequest request;
  request.set_lora_name(name);
  request.set_lora_path(path);
  v1::LoraAdapterState response;
  const grpc::Status st = load ? worker.stub->LoadLoraAdapter(&context, request, &response)
                               : worker.stub->UnloadLoraAdapter(&context, request, &response);
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("worker ", worker.address, ": ", st.error_message()));
  }
  if (in_use != nullptr) *in_use = response.in_use();
  return absl::OkStatus();
}

absl::Status ClusterLoraCatalog::Load(const std::string& name, const std::string& path) {
  if (!allowed_()) {
    return absl::FailedPreconditionError(
        "runtime LoRA loading is off: serve with API keys (then an admin key loads) or with "
        "--allow-runtime-lora-updating");
  }
  if (absl::Status st = CheckName(name); !st.ok()) return st;
  if (path.empty()) return absl::InvalidArgumentError("lora_path: empty");
  if (Has(name)) {
    return absl::AlreadyExistsError(absl::StrCat("LoRA adapter '", name, "' is already loaded"));
  }
  const std::vector<std::shared_ptr<Worker>> workers = LoraWorkers();
  if (workers.empty()) {
    return absl::FailedPreconditionError(
        "LoRA is not enabled on any healthy worker (--enable-lora)");
  }
  std::vector<std::shared_ptr<Worker>> loaded;
  absl::Status failed;
  for (const auto& w : workers) {
    absl::Status st = CallWorker(*w, /*load=*/true, name, path, nullptr);
    if (st.ok()) {
      loaded.push_back(w);
    } else if (st.code() != absl::StatusCode::kResourceExhausted) {
      failed = st;
      break;
    }
  }
  if (failed.ok() && loaded.empty()) {
    failed = absl::ResourceExhaustedError(
        absl::StrCat("cannot load LoRA adapter '", name, "': every worker's adapters are in use"));
  }
  if (!failed.ok()) {
    for (const auto& w : loaded) CallWorker(*w, /*load=*/false, name, "", nullptr).IgnoreError();
    TLOG(INFO) << "load LoRA adapter '" << name << "' from " << path << ": " << failed;
    return failed;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    unloaded_.erase(name);
    if (!paths_.emplace(name, path).second) {
      return absl::AlreadyExistsError(absl::StrCat("LoRA adapter '", name, "' is already loaded"));
    }
  }
  TLOG(INFO) << "load LoRA adapter '" << name << "' from " << path << " on " << loaded.size()
             << " of " << workers.size() << " workers";
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ClusterLoraCatalog::Unload(const std::string& name) {
  if (!allowed_()) {
    return absl::FailedPreconditionError(
        "runtime LoRA loading is off: serve with API keys (then an admin key loads) or with "
        "--allow-runtime-lora-updating");
  }
  if (!Has(name)) {
    return absl::NotFoundError(absl::StrCat("LoRA adapter '", name, "' is not loaded"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.erase(name);
    unloaded_.insert(name);
  }
  int64_t in_use = 0;
  for (const auto& w : LoraWorkers()) {
    int64_t n = 0;
    absl::Status st = CallWorker(*w, /*load=*/false, name, "", &n);
    if (st.ok()) {
      in_use += n;
    } else if (st.code() != absl::StatusCode::kNotFound) {
      TLOG(WARNING) << "unload LoRA adapter '" << name << "': " << st;
    }
  }
  TLOG(INFO) << "unload LoRA adapter '" << name << "': " << in_use << " requests still use it";
  return in_use;
}

}  // namespace tandem
