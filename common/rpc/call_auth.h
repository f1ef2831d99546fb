#pragma once

// Who may call what on a gRPC listener, enforced before any handler runs.
//
// Every listener of a serving process gets a CallPolicy: a check per service (by full name,
// e.g. "tandem.v1.Generation") and a fallback check for every service it does not name, so a
// method added to a service later is covered by its service's rule without further code, and a
// service nobody named falls to the fallback (deny by default). gRPC's health and reflection
// services are always open. The policy runs in gRPC's server auth filter (an
// AuthMetadataProcessor installed on the listener's credentials, plaintext or TLS alike): a
// refused call ends with the check's status (UNAUTHENTICATED, PERMISSION_DENIED) and never
// reaches a handler. In-process channels (the HTTP API's) do not pass the filter; they reach
// only what their own handlers check.
//
// Internal calls (router -> workers) prove the cluster secret (`--cluster-secret-file`) with a
// token in metadata `x-tandem-internal`:
//   v1.<unix milliseconds>.<16 random bytes, hex>.<hex HMAC-SHA256(secret, label, method,
//   milliseconds, nonce)>
// bound to the full method ("/tandem.v1.Worker/Decode") and its time: a worker accepts it only
// for that method, within `window` of its own clock (compared in constant time) and once, so a
// token seen on the wire cannot call another method, nor be replayed to the same worker.

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

inline constexpr char kInternalTokenKey[] = "x-tandem-internal";
inline constexpr size_t kMinClusterSecretBytes = 16;

// The metadata a check sees (keys lowercase, as received).
using CallMetadata = std::multimap<absl::string_view, absl::string_view>;
// Decides one call to `method` ("/package.Service/Method"): OK lets it through.
using CallCheck = std::function<grpc::Status(absl::string_view method, const CallMetadata& md)>;

struct CallPolicy {
  // By full service name; a null check lets every call of the service through (its handlers
  // check what they need, e.g. API keys).
  absl::flat_hash_map<std::string, CallCheck> services;
  // Every other service; null: PERMISSION_DENIED.
  CallCheck fallback;

  // The decision for a call (health and reflection are always open).
  grpc::Status Check(absl::string_view method, const CallMetadata& md) const;
};

// The tokens a worker accepted within their window, so each passes once. Thread-safe.
class TokenReplayCache {
 public:
  explicit TokenReplayCache(absl::Duration window, size_t max_entries = 1 << 20)
      : window_(window), max_entries_(max_entries) {}
  // False when `token` was seen before (within twice the window, the cap permitting).
  bool FirstUse(absl::string_view token, absl::Time now);

 private:
  const absl::Duration window_;
  const size_t max_entries_;
  std::mutex mu_;
  std::deque<std::pair<absl::Time, std::string>> order_;
  absl::flat_hash_set<std::string> seen_;
};

// A check that lets everything through.
CallCheck AllowAll();
// A check that requires a token of `secret` bound to the called method, minted within `window`
// of now and not used before (UNAUTHENTICATED otherwise, naming why).
CallCheck RequireInternalToken(std::string secret, absl::Duration window = absl::Seconds(60));

// Reads a secret file (trailing newlines ignored; at least kMinClusterSecretBytes bytes).
absl::StatusOr<std::string> ReadClusterSecretFile(const std::string& path);
// A fresh random secret (hex), for a cluster that makes its own.
absl::StatusOr<std::string> NewClusterSecret();

// The token for a call to `method` at `now` with `nonce` (16 bytes; random when empty).
std::string MintInternalToken(absl::string_view secret, absl::string_view method, absl::Time now,
                              absl::string_view nonce = {});
// OK when `token` is a token of `secret` for `method` minted within `window` of `now`.
absl::Status VerifyInternalToken(absl::string_view secret, absl::string_view method,
                                 absl::string_view token, absl::Time now, absl::Duration window);

// A client interceptor that puts a fresh token of `secret` on every call of the channel.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> InternalTokenInterceptor(
    std::string secret);

// A channel for internal calls (router -> worker, worker -> worker): `credentials` (null:
// plaintext), and a fresh token of `secret` on every call when it is not empty.
std::shared_ptr<grpc::Channel> CreateInternalChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
    const grpc::ChannelArguments& args, const std::string& secret);

}  // namespace tandem
