#include "common/rpc/call_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/secret_file.h"

namespace tandem {
namespace {

constexpr char kTokenVersion[] = "v1";
constexpr char kTokenLabel[] = "tandem internal rpc v1";
constexpr size_t kNonceBytes = 16;

// "/pkg.Service/Method" -> "pkg.Service".
absl::string_view ServiceOf(absl::string_view method) {
  if (!method.empty() && method.front() == '/') method.remove_prefix(1);
  const size_t slash = method.find('/');
  return slash == absl::string_view::npos ? method : method.substr(0, slash);
}

bool AlwaysOpen(absl::string_view service) {
  return service == "grpc.health.v1.Health" ||
         service == "grpc.reflection.v1alpha.ServerReflection" ||
         service == "grpc.reflection.v1.ServerReflection";
}

std::string Mac(absl::string_view secret, absl::string_view method, absl::string_view millis,
                absl::string_view nonce_hex) {
  const std::string message =
      absl::StrCat(kTokenLabel, "\n", method, "\n", millis, "\n", nonce_hex);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), len));
}

grpc::Status Unauthenticated(absl::string_view why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat("internal call refused: ", why));
}

}  // namespace

grpc::Status CallPolicy::Check(absl::string_view method, const CallMetadata& md) const {
  const absl::string_view service = ServiceOf(method);
  if (AlwaysOpen(service)) return grpc::Status::OK;
  auto it = services.find(service);
  if (it != services.end()) return it->second ? it->second(method, md) : grpc::Status::OK;
  if (fallback) return fallback(method, md);
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat("'", service, "' is not offered to callers on this listener"));
}

CallCheck AllowAll() {
  return [](absl::string_view, const CallMetadata&) { return grpc::Status::OK; };
}

bool TokenReplayCache::FirstUse(absl::string_view token, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  // Tokens older than twice the window (the farthest apart two acceptable times can be) can no
  // longer pass the time check: forget them, and the oldest ones past the cap.
  while (!order_.empty() &&
         (now - order_.front().first > 2 * window_ || order_.size() > max_entries_)) {
    seen_.erase(order_.front().second);
    order_.pop_front();
  }
  if (!seen_.insert(std::string(token)).second) return false;
  order_.emplace_back(now, std::string(token));
  return true;
}

CallCheck RequireInternalToken(std::string secret, absl::Duration window) {
  auto replays = std::make_shared<TokenReplayCache>(window);
  return [secret = std::move(secret), window, replays](absl::string_view method,
                                                       const CallMetadata& md) {
    auto it = md.find(kInternalTokenKey);
    if (it == md.end()) {
      return Unauthenticated("no cluster token (this service takes calls from the router only)");
    }
    const absl::Time now = absl::Now();
    absl::Status st = VerifyInternalToken(secret, method, it->second, now, window);
    if (!st.ok()) return Unauthenticated(st.message());
    if (!replays->FirstUse(it->second, now)) {
      return Unauthenticated("the cluster token was used before (a replay)");
    }
    return grpc::Status::OK;
  };
}

absl::StatusOr<std::string> ReadClusterSecretFile(const std::string& path) {
  return ReadSecretFromFile(path, "cluster secret", kMinClusterSecretBytes);
}

absl::StatusOr<std::string> NewClusterSecret() {
  std::string bytes(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), 32) != 1) {
    return absl::InternalError("the random number generator failed");
  }
  return absl::BytesToHexString(bytes);
}

std::string MintInternalToken(absl::string_view secret, absl::string_view method, absl::Time now,
                              absl::string_view nonce) {
  std::string fresh;
  if (nonce.empty()) {
    fresh.assign(kNonceBytes, '\0');
    RAND_bytes(reinterpret_cast<unsigned char*>(fresh.data()), kNonceBytes);
    nonce = fresh;
  }
  const std::string millis = absl::StrCat(absl::ToUnixMillis(now));
  const std::string nonce_hex = absl::BytesToHexString(nonce);
  return absl::StrCat(kTokenVersion, ".", millis, ".", nonce_hex, ".",
                      Mac(secret, method, millis, nonce_hex));
}

absl::Status VerifyInternalToken(absl::string_view secret, absl::string_view method,
                                 absl::string_view token, absl::Time now, absl::Duration window) {
  std::vector<absl::string_view> parts = absl::StrSplit(token, '.');
  int64_t millis = 0;
  if (parts.size() != 4 || parts[0] != kTokenVersion || !absl::SimpleAtoi(parts[1], &millis) ||
      parts[2].size() != 2 * kNonceBytes || parts[3].size() != 2 * EVP_MD_size(EVP_sha256())) {
    return absl::UnauthenticatedError("malformed cluster token");
  }
  // The MAC first, in constant time, so that nothing about a forged token depends on the secret.
  const std::string want = Mac(secret, method, parts[1], parts[2]);
  if (CRYPTO_memcmp(want.data(), parts[3].data(), want.size()) != 0) {
    return absl::UnauthenticatedError(
        "the cluster token does not match this worker's secret and this method");
  }
  const absl::Duration skew = now - absl::FromUnixMillis(millis);
  if (skew > window || skew < -window) {
    return absl::UnauthenticatedError(
        absl::StrCat("the cluster token is ", absl::FormatDuration(absl::AbsDuration(skew)),
                     " away from this worker's clock (window ", absl::FormatDuration(window), ")"));
  }
  return absl::OkStatus();
}

namespace {

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(const std::string* secret, std::string method)
      : secret_(secret), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kInternalTokenKey,
                                                 MintInternalToken(*secret_, method_, absl::Now()));
    }
    methods->Proceed();
  }

 private:
  const std::string* secret_;
  std::string method_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new TokenInterceptor(&secret_, info->method() != nullptr ? info->method() : "");
  }

 private:
  const std::string secret_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> InternalTokenInterceptor(
    std::string secret) {
  return std::make_unique<TokenInterceptorFactory>(std::move(secret));
}

}  // namespace tandem

namespace tandem {

std::shared_ptr<grpc::Channel> CreateInternalChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
    const grpc::ChannelArguments& args, const std::string& secret) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!secret.empty()) interceptors.push_back(InternalTokenInterceptor(secret));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args,
      std::move(interceptors));
}

}  // namespace tandem
