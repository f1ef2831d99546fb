#include "common/rpc/tls.h"

#include <grpc/grpc_security.h>
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/rpc/call_auth.h"

namespace tandem {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  if (s.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not PEM"));
  }
  return s.str();
}

// Logs refused calls, at most one line per 10 s (a flood of refusals must not flood the log),
// counting the ones it did not log.
void LogRefusal(absl::string_view method, const grpc::Status& status) {
  static std::mutex mu;
  static absl::Time last = absl::InfinitePast();
  static int64_t unlogged = 0;
  std::lock_guard<std::mutex> lock(mu);
  const absl::Time now = absl::Now();
  if (now - last < absl::Seconds(10)) {
    ++unlogged;
    return;
  }
  TLOG(WARNING) << "refused a call to " << method << ": " << status.error_message()
                << (unlogged > 0 ? absl::StrCat(" (and ", unlogged, " more refusals before it)")
                                 : std::string());
  last = now;
  unlogged = 0;
}

// Runs the CallPolicy in gRPC's server auth filter. Non-blocking: it answers inline.
void ProcessCall(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                 size_t num_md, grpc_process_auth_metadata_done_cb done, void* user_data) {
  const auto* policy = static_cast<const std::shared_ptr<const CallPolicy>*>(state);
  CallMetadata metadata;
  absl::string_view path;
  for (size_t i = 0; i < num_md; ++i) {
    absl::string_view key(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].key)),
                          GRPC_SLICE_LENGTH(md[i].key));
    absl::string_view value(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                            GRPC_SLICE_LENGTH(md[i].value));
    if (key == ":path") path = value;
    metadata.emplace(key, value);
  }
  const grpc::Status st = path.empty()
                              ? grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "no method named")
                              : (*policy)->Check(path, metadata);
  if (!st.ok()) LogRefusal(path, st);
  done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(st.error_code()),
       st.ok() ? nullptr : st.error_message().c_str());
}

void DestroyPolicy(void* state) { delete static_cast<std::shared_ptr<const CallPolicy>*>(state); }

// Core server credentials (plaintext or TLS) with the policy as their auth metadata processor:
// grpc::InsecureServerCredentials() cannot carry a processor, the core's insecure credentials
// can.
class PolicyServerCredentials final : public grpc::ServerCredentials {
 public:
  PolicyServerCredentials(grpc_server_credentials* core, std::shared_ptr<const CallPolicy> policy)
      : core_(core) {
    grpc_auth_metadata_processor p;
    p.process = ProcessCall;
    p.destroy = DestroyPolicy;
    p.state = new std::shared_ptr<const CallPolicy>(std::move(policy));
    grpc_server_credentials_set_auth_metadata_processor(core_, p);
  }
  ~PolicyServerCredentials() override { grpc_server_credentials_release(core_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    std::abort();  // the policy is the processor
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), core_);
  }
  grpc_server_credentials* core_;
};

}  // namespace

std::vector<std::string> TlsOptions::ToArgs() const {
  std::vector<std::string> a;
  if (!cert.empty()) a.push_back("--tls-cert=" + cert);
  if (!key.empty()) a.push_back("--tls-key=" + key);
  if (!ca.empty()) a.push_back("--tls-ca=" + ca);
  if (client_auth) a.push_back("--tls-client-auth");
  return a;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls, std::shared_ptr<const CallPolicy> policy) {
  if (policy == nullptr) return absl::InternalError("a listener needs a call policy");
  if (tls.cert.empty()) {
    if (!tls.key.empty() || tls.client_auth) {
      return absl::InvalidArgumentError("--tls-key and --tls-client-auth need --tls-cert");
    }
    return std::make_shared<PolicyServerCredentials>(grpc_insecure_server_credentials_create(),
                                                     std::move(policy));
  }
  auto cert = ReadPem(tls.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls.key, "--tls-key");
  if (!key.ok()) return key.status();
  std::string ca;
  if (tls.client_auth) {
    if (tls.ca.empty()) return absl::InvalidArgumentError("--tls-client-auth needs --tls-ca");
    auto pem = ReadPem(tls.ca, "--tls-ca");
    if (!pem.ok()) return pem.status();
    ca = *std::move(pem);
  }
  grpc_ssl_pem_key_cert_pair pair = {key->c_str(), cert->c_str()};
  grpc_server_credentials* core = grpc_ssl_server_credentials_create_ex(
      tls.client_auth ? ca.c_str() : nullptr, &pair, 1,
      tls.client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                      : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      nullptr);
  if (core == nullptr) return absl::InvalidArgumentError("--tls-cert/--tls-key: not usable");
  return std::make_shared<PolicyServerCredentials>(core, std::move(policy));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls) {
  if (tls.ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  auto ca = ReadPem(tls.ca, "--tls-ca");
  if (!ca.ok()) return ca.status();
  o.pem_root_certs = *ca;
  if (!tls.cert.empty()) {
    auto cert = ReadPem(tls.cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(tls.key, "--tls-key");
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *cert;
    o.pem_private_key = *key;
  }
  return grpc::SslCredentials(o);
}

}  // namespace tandem
