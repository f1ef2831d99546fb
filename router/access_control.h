#pragma once

// API keys and per-tenant limits at the router (both the gRPC and the HTTP API: the HTTP API
// forwards its Authorization header as gRPC metadata).
//
// Key file (`--api-keys`), reloaded on SIGHUP; keys are stored as SHA-256 hex digests only:
//   # comment (also after a line's fields)
//   tenant <name> [requests_per_minute=N] [tokens_per_minute=N] [max_streams=N]
//   key <sha256 hex of the key> <tenant name> [scopes=generate,admin]
// A key names a declared tenant; 0 or an absent limit means unlimited. `echo -n KEY | sha256sum`
// gives a key's digest. Removing a key's line and sending SIGHUP revokes it. Scopes: `generate`
// (the Generation API: Generate, Tokenize, ListModels) and `admin` (RouterAdmin: cluster
// status, worker addresses); a key without `scopes=` has `generate` only. Tenant names are
// letters, digits and `._-`.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

struct TenantLimits {
  int64_t requests_per_minute = 0;
  int64_t tokens_per_minute = 0;  // prompt + generated tokens
  int64_t max_streams = 0;        // requests in flight at once
};

// What a key may do (bits).
enum ApiScope : uint32_t {
  kScopeGenerate = 1,
  kScopeAdmin = 2,
};

struct Tenant {
  std::string name;
  TenantLimits limits;
};

// The parsed key file.
struct ApiKeySet {
  absl::flat_hash_map<std::string, std::shared_ptr<const Tenant>> by_digest;  // hex SHA-256
  absl::flat_hash_map<std::string, uint32_t> scopes;  // by digest: ApiScope bits
  absl::flat_hash_map<std::string, std::shared_ptr<const Tenant>> tenants;
};
// INVALID_ARGUMENT naming the line for a malformed file.
absl::StatusOr<std::shared_ptr<const ApiKeySet>> ParseApiKeyFile(const std::string& text);
// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(const std::string& data);

// Thread-safe.
class AccessControl {
 public:
  // Loads `path`; fails when it cannot be read or parsed.
  static absl::StatusOr<std::unique_ptr<AccessControl>> Load(const std::string& path);

  // Re-reads the file; on failure keeps the keys it had and returns the error.
  absl::Status Reload();

  // The tenant of a call's "authorization: Bearer <key>" metadata, else UNAUTHENTICATED; a key
  // without `scope` gets PERMISSION_DENIED.
  absl::StatusOr<std::shared_ptr<const Tenant>> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
      ApiScope scope = kScopeGenerate) const;
  absl::StatusOr<std::shared_ptr<const Tenant>> AuthenticateHeader(
      const std::string& authorization, ApiScope scope = kScopeGenerate) const;

  // RESOURCE_EXHAUSTED naming the limit when the tenant is already at one, without counting a
  // request: checked before any of a request's body is parsed, rendered or tokenized, so a
  // tenant past its limits costs the server no body work.
  absl::Status CheckLimits(const Tenant& tenant);
  // Admits a request of `prompt_tokens` (RESOURCE_EXHAUSTED naming the limit otherwise); every
  // admitted request ends with one Release.
  absl::Status Admit(const Tenant& tenant, int64_t prompt_tokens);
  void Release(const Tenant& tenant, int64_t generated_tokens);

  // Within the last minute (for tests and logs).
  int64_t streams(const std::string& tenant) const;

 private:
  struct Usage {
    std::deque<absl::Time> requests;
    std::deque<std::pair<absl::Time, int64_t>> tokens;
    int64_t token_sum = 0;
    int64_t streams = 0;
  };
  explicit AccessControl(std::string path) : path_(std::move(path)) {}
  void Expire(Usage& u, absl::Time now) const;
  // Why a request of `tenant` is refused now (OK: admitted). Requires mu_.
  absl::Status RefusalLocked(const Tenant& tenant, Usage& u, absl::Time now) const;

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const ApiKeySet> keys_;
  absl::flat_hash_map<std::string, Usage> usage_;
};

}  // namespace tandem
