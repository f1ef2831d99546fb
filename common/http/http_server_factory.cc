#include "common/http/http_server_factory.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<httplib::Server>> NewHttpServer(const HttpTlsOptions& tls,
                                                               absl::string_view what) {
  const std::string w(what);
  if (tls.cert.empty()) {
    if (!tls.client_ca.empty() || !tls.key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(w, ": a TLS key or client CA needs a server certificate"));
    }
    return std::make_unique<httplib::Server>();
  }
  auto ssl = std::make_unique<httplib::SSLServer>(
      tls.cert.c_str(), tls.key.c_str(), tls.client_ca.empty() ? nullptr : tls.client_ca.c_str());
  if (!ssl->is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        w, ": cannot load the TLS certificate/key (", tls.cert, ", ", tls.key,
        tls.client_ca.empty() ? "" : absl::StrCat(", client CA ", tls.client_ca), ")"));
  }
  return std::unique_ptr<httplib::Server>(std::move(ssl));
}

}  // namespace tandem
