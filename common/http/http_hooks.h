#pragma once

#include <string_view>

namespace tandem {

// What the HTTP transport (http_transport.h) reports to metrics (HttpMetrics implements it), so the
// transport calls metrics without linking them. Thread-safe.
class HttpHooks {
 public:
  virtual ~HttpHooks() = default;
  virtual void ConnectionOpened() = 0;
  virtual void ConnectionClosed() = 0;
  // A connection or request turned away: max_connections, per_client, header_too_large,
  // too_many_headers, body_too_large, malformed, accept_failed.
  virtual void Rejected(std::string_view reason) = 0;
  // A connection closed for a limit of time or space: header, body, idle, write,
  // buffer_overflow.
  virtual void TimedOut(std::string_view kind) = 0;
};

}  // namespace tandem
