#include "router/access_control.h"

#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

constexpr absl::Duration kWindow = absl::Minutes(1);

absl::Status LineError(int line, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("api key file line ", line, ": ", message));
}

bool IsHexDigest(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool IsTenantName(const std::string& s) {
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return !s.empty();
}

// "scopes=generate,admin" -> bits; 0 for a malformed field.
uint32_t ParseScopes(const std::string& field) {
  absl::string_view v = field;
  if (!absl::ConsumePrefix(&v, "scopes=")) return 0;
  uint32_t bits = 0;
  for (absl::string_view s : absl::StrSplit(v, ',')) {
    if (s == "generate") {
      bits |= kScopeGenerate;
    } else if (s == "admin") {
      bits |= kScopeAdmin;
    } else {
      return 0;
    }
  }
  return bits;
}

}  // namespace

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const ApiKeySet>> ParseApiKeyFile(const std::string& text) {
  auto set = std::make_shared<ApiKeySet>();
  std::vector<std::pair<int, std::vector<std::string>>> keys;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f[0] == "tenant") {
      if (f.size() < 2) return LineError(line_no, "tenant needs a name");
      auto t = std::make_shared<Tenant>();
      t->name = f[1];
      if (!IsTenantName(t->name)) {
        return LineError(line_no, "a tenant name is letters, digits and ._- only");
      }
      for (size_t i = 2; i < f.size(); ++i) {
        std::pair<std::string, std::string> kv = absl::StrSplit(f[i], absl::MaxSplits('=', 1));
        int64_t v = 0;
        if (!absl::SimpleAtoi(kv.second, &v) || v < 0) {
          return LineError(line_no, absl::StrCat("'", f[i], "': expected name=non-negative int"));
        }
        if (kv.first == "requests_per_minute") {
          t->limits.requests_per_minute = v;
        } else if (kv.first == "tokens_per_minute") {
          t->limits.tokens_per_minute = v;
        } else if (kv.first == "max_streams") {
          t->limits.max_streams = v;
        } else {
          return LineError(line_no, absl::StrCat("unknown limit '", kv.first, "'"));
        }
      }
      if (!set->tenants.emplace(t->name, t).second) {
        return LineError(line_no, absl::StrCat("tenant '", t->name, "' declared twice"));
      }
    } else if (f[0] == "key") {
      if (f.size() != 3 && f.size() != 4) {
        return LineError(line_no, "expected: key <sha256 hex> <tenant> [scopes=generate,admin]");
      }
      keys.emplace_back(line_no, std::move(f));
    } else {
      return LineError(line_no, absl::StrCat("expected 'tenant' or 'key', got '", f[0], "'"));
    }
  }
  for (auto& [line, f] : keys) {
    const std::string digest = absl::AsciiStrToLower(f[1]);
    if (!IsHexDigest(digest)) return LineError(line, "the key must be a SHA-256 hex digest");
    auto t = set->tenants.find(f[2]);
    if (t == set->tenants.end()) return LineError(line, absl::StrCat("no tenant '", f[2], "'"));
    const uint32_t scopes = f.size() == 4 ? ParseScopes(f[3]) : kScopeGenerate;
    if (scopes == 0) {
      return LineError(line, absl::StrCat("'", f[3], "': expected scopes=generate,admin"));
    }
    if (!set->by_digest.emplace(digest, t->second).second) {
      return LineError(line, "the same key twice");
    }
    set->scopes[digest] = scopes;
  }
  return std::shared_ptr<const ApiKeySet>(std::move(set));
}

absl::StatusOr<std::unique_ptr<AccessControl>> AccessControl::Load(const std::string& path) {
  std::unique_ptr<AccessControl> ac(new AccessControl(path));
  if (auto st = ac->Reload(); !st.ok()) return st;
  return ac;
}

absl::Status AccessControl::Reload() {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the api key file ", path_));
  std::stringstream text;
  text << in.rdbuf();
  auto set = ParseApiKeyFile(text.str());
  if (!set.ok()) return set.status();
  std::lock_guard<std::mutex> lock(mu_);
  keys_ = std::move(set).value();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Tenant>> AccessControl::AuthenticateHeader(
    const std::string& authorization, ApiScope scope) const {
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  if (v.empty()) {
    return absl::UnauthenticatedError("missing API key (Authorization: Bearer <key>)");
  }
  if (!absl::ConsumePrefix(&v, "Bearer ") && !absl::ConsumePrefix(&v, "bearer ")) {
    return absl::UnauthenticatedError("the Authorization header must be 'Bearer <key>'");
  }
  const std::string digest = Sha256Hex(std::string(absl::StripAsciiWhitespace(v)));
  std::shared_ptr<const ApiKeySet> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys = keys_;
  }
  auto it = keys->by_digest.find(digest);
  if (it == keys->by_digest.end()) return absl::UnauthenticatedError("invalid API key");
  auto bits = keys->scopes.find(digest);
  if (bits == keys->scopes.end() || (bits->second & scope) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this API key lacks the '", scope == kScopeAdmin ? "admin" : "generate", "' scope"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<const Tenant>> AccessControl::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata, ApiScope scope) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return AuthenticateHeader("", scope);
  return AuthenticateHeader(std::string(it->second.data(), it->second.size()), scope);
}

void AccessControl::Expire(Usage& u, absl::Time now) const {
  while (!u.requests.empty() && now - u.requests.front() >= kWindow) u.requests.pop_front();
  while (!u.tokens.empty() && now - u.tokens.front().first >= kWindow) {
    u.token_sum -= u.tokens.front().second;
    u.tokens.pop_front();
  }
}

absl::Status AccessControl::RefusalLocked(const Tenant& tenant, Usage& u, absl::Time now) const {
  const TenantLimits& l = tenant.limits;
  Expire(u, now);
  if (l.max_streams > 0 && u.streams >= l.max_streams) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant.name, "': ", l.max_streams,
                                                     " concurrent requests at most"));
  }
  if (l.requests_per_minute > 0 &&
      static_cast<int64_t>(u.requests.size()) >= l.requests_per_minute) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant.name, "': rate limit of ",
                                                     l.requests_per_minute,
                                                     " requests per minute reached"));
  }
  if (l.tokens_per_minute > 0 && u.token_sum >= l.tokens_per_minute) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant.name, "': rate limit of ",
                                                     l.tokens_per_minute,
                                                     " tokens per minute reached"));
  }
  return absl::OkStatus();
}

absl::Status AccessControl::CheckLimits(const Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = usage_.find(tenant.name);
  if (it == usage_.end()) return absl::OkStatus();
  return RefusalLocked(tenant, it->second, absl::Now());
}

absl::Status AccessControl::Admit(const Tenant& tenant, int64_t prompt_tokens) {
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  Usage& u = usage_[tenant.name];
  if (absl::Status refused = RefusalLocked(tenant, u, now); !refused.ok()) return refused;
  ++u.streams;
  u.requests.push_back(now);
  u.tokens.emplace_back(now, prompt_tokens);
  u.token_sum += prompt_tokens;
  return absl::OkStatus();
}

void AccessControl::Release(const Tenant& tenant, int64_t generated_tokens) {
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  Usage& u = usage_[tenant.name];
  --u.streams;
  u.tokens.emplace_back(now, generated_tokens);
  u.token_sum += generated_tokens;
}

int64_t AccessControl::streams(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = usage_.find(tenant);
  return it == usage_.end() ? 0 : it->second.streams;
}

}  // namespace tandem
