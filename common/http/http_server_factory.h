#pragma once

// One place that makes the cpp-httplib listeners of a process (the router's OpenAI API and
// every process's /metrics): plaintext, or TLS only from PEM files, optionally requiring client
// certificates (mTLS).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tandem {

struct HttpTlsOptions {
  std::string cert;       // PEM certificate (chain); empty: plaintext HTTP
  std::string key;        // PEM private key of `cert`
  std::string client_ca;  // non-empty: clients must present a certificate it signed (mTLS)
};

// An httplib::Server, or an httplib::SSLServer when tls.cert is set. INVALID_ARGUMENT (prefixed
// with `what`, e.g. "metrics") when the certificate or key cannot be loaded, or a client CA is
// given without a certificate.
absl::StatusOr<std::unique_ptr<httplib::Server>> NewHttpServer(const HttpTlsOptions& tls,
                                                               absl::string_view what);

}  // namespace tandem
