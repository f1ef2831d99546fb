#include "kvtransfer/loopback/registry.h"

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::loopback {

Registry& Registry::Get() {
  static Registry* r = new Registry;
  return *r;
}

absl::Status Registry::Add(const std::string& name, std::shared_ptr<Peer> peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!peers_.emplace(name, std::move(peer)).second) {
    return absl::AlreadyExistsError(absl::StrCat("loopback endpoint '", name, "' is taken"));
  }
  return absl::OkStatus();
}

void Registry::Remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_.erase(name);
}

std::shared_ptr<Peer> Registry::Find(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(name);
  return it == peers_.end() ? nullptr : it->second;
}

std::string Registry::UniqueName() {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::StrCat("loopback-", ++counter_);
}

}  // namespace tandem::kvtransfer::loopback
