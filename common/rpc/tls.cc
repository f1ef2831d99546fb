#include "common/rpc/tls.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

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
    const TlsOptions& tls) {
  if (tls.cert.empty()) {
    if (!tls.key.empty() || tls.client_auth) {
      return absl::InvalidArgumentError("--tls-key and --tls-client-auth need --tls-cert");
    }
    return grpc::InsecureServerCredentials();
  }
  auto cert = ReadPem(tls.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls.key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o(
      tls.client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                      : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (tls.client_auth) {
    if (tls.ca.empty()) return absl::InvalidArgumentError("--tls-client-auth needs --tls-ca");
    auto ca = ReadPem(tls.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
  }
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
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
