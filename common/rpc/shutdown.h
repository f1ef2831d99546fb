#pragma once

#include <csignal>
#include <cstdint>
#include <functional>

#include "absl/time/time.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tandem {

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and returns the first two; call it first
// thing in a command, so that every thread started later inherits the mask and only sigwait sees
// the signals (SIGHUP reloads the router's API keys, router/http_api.h).
sigset_t BlockTerminationSignals();
// Waits for SIGTERM or SIGINT and returns it.
int WaitForTerminationSignal(const sigset_t& signals);

// The drain of every serving process: waits for SIGTERM or SIGINT, calls `start_drain` (new
// calls get UNAVAILABLE), turns `server`'s health to NOT_SERVING and gives the running calls
// (`active` counts them) up to `timeout` to end. The caller stops its services afterwards.
void DrainOnSignal(const sigset_t& signals, grpc::Server* server, absl::Duration timeout,
                   const std::function<int64_t()>& active,
                   const std::function<void()>& start_drain);

}  // namespace tandem
