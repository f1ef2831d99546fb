#pragma once

// The HTTP/1.1 server of every Tandem listener, the OpenAI API (router/http) and each process's
// Prometheus /metrics (common/metrics/metrics_server.h), on Boost.Beast and Boost.Asio:
// connections are multiplexed on a few event-loop threads, so a slow, idle or non-reading client
// holds a socket and a bounded buffer, never a thread. Handlers run on a separate small pool and
// answer through an HttpResponder whose every call is queued onto the connection's event loop;
// nothing a handler calls blocks on the network.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/http_hooks.h"

namespace tandem {

// Limits of the transport; for the OpenAI API every one is a flag of `tandem serve` / `tandem
// router` (router/http_api.h).
struct HttpTransportOptions {
  std::string name = "http";  // what errors and logs call this listener, e.g. "metrics"
  std::string host = "127.0.0.1";
  int port = 0;                 // 0: a free port
  int32_t io_threads = 2;       // event-loop threads (they only move bytes)
  int32_t handler_threads = 4;  // threads that parse and convert requests (streams hold none)
  int64_t max_body_bytes = 4 << 20;
  int64_t max_header_bytes = 16 << 10;  // request line and headers together
  int32_t max_headers = 100;
  // A new connection must complete its request headers (and TLS handshake) within this; a
  // kept-alive one within this of its first byte.
  double header_timeout_s = 5;
  // The body must arrive within body_timeout_s plus its length at body_min_rate bytes/s.
  double body_timeout_s = 10;
  int64_t body_min_rate = 4096;
  double idle_timeout_s = 60;  // between requests on a kept-alive connection
  // A response write that makes no progress for this long closes the connection.
  double write_timeout_s = 30;
  // Response bytes queued for one connection beyond what the socket took: a client that stops
  // reading a stream is disconnected when this overflows (and its request cancelled).
  int64_t max_buffered_bytes = 1 << 20;
  int32_t max_connections = 10000;
  int32_t max_connections_per_client = 1024;  // per remote IP address; 0: no limit
  int32_t max_requests_per_connection = 1000;
  // HTTPS when tls_cert is set; with tls_client_ca, clients must present a certificate it signed.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  HttpHooks* hooks = nullptr;  // metrics; may be null
};

// A parsed request. Header lookups are case-insensitive.
struct HttpRequest {
  std::string method;
  std::string path;  // the target without the query
  std::string body;
  std::string remote_address;
  std::vector<std::pair<std::string, std::string>> headers;

  bool has_header(std::string_view name) const;
  std::string get_header_value(std::string_view name) const;  // "" when absent
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

class HttpConnectionBase;

// The response side of one request, handed to its handler. Thread-safe; every call is queued in
// order onto the connection's event loop and returns at once. A response is either Send (a whole
// body), or StartChunked, Write..., Finish. Calls after the connection closed do nothing.
class HttpResponder {
 public:
  using Poster = std::function<void(std::function<void()>)>;
  // Made by the transport: `post` queues onto the connection's event loop.
  HttpResponder(std::weak_ptr<HttpConnectionBase> connection, uint64_t serial, Poster post);

  void Send(int status, std::string content_type, std::string body, HttpHeaders headers = {});
  // Commits the status; the body follows in chunks (Transfer-Encoding: chunked).
  void StartChunked(int status, std::string content_type, HttpHeaders headers = {});
  void Write(std::string data);
  void Finish();
  // Runs `fn` on the connection's event loop, in order with the calls above (also when the
  // connection is gone).
  void Post(std::function<void()> fn);
  // Calls `fn` on the event loop every `interval` until the response ends or the connection
  // closes.
  void SetTicker(absl::Duration interval, std::function<void()> fn);
  // Calls `fn` once on the event loop if the connection closes before the response ended
  // (client gone, timeout, buffer overflow, server stop); at once if it already did.
  void SetOnClose(std::function<void()> fn);

 private:
  std::weak_ptr<HttpConnectionBase> connection_;
  uint64_t serial_;
  Poster post_;
};

// The JSON error body of the API layer for a transport-level refusal (404, 413, 431, ...).
using HttpErrorPage = std::function<std::string(int status, const std::string& message)>;
using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

// A request turned away on its headers alone: answered with `status` and the error page of
// `message`, counted as rejected for `reason`, and the connection closed (its body never read).
struct HttpRefusal {
  int status = 401;
  std::string message;
  std::string reason;  // metrics label: unauthenticated, permission_denied, rate_limited
};
// Runs on the connection's event loop when a request's headers are in, before its body is read
// (the HttpRequest has no body): an API key check, which must be quick and never block.
using HttpAdmission = std::function<std::optional<HttpRefusal>(const HttpRequest& head)>;

struct HttpRoute {
  std::string method;
  std::string path;
  HttpHandler handler;
  HttpAdmission admission;  // may be empty: every request is read and handled
};

// The listener: accepts, enforces the limits, parses requests and runs their routes' handlers.
class HttpTransport {
 public:
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Start(const HttpTransportOptions& options,
                                                              std::vector<HttpRoute> routes,
                                                              HttpErrorPage error_page);
  ~HttpTransport();
  int port() const;
  // Stops accepting and closes every connection (their responders' on-close callbacks run).
  void Stop();

  class Impl;

 private:
  explicit HttpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
