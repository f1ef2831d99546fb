#pragma once

#include <csignal>
#include <string>

#include "common/rpc/server.h"
#include "router/http_api.h"
#include "router/router_runtime.h"

namespace tandem {

// Serves `router`'s Generation API (GenerationFront: API keys, gRPC, HTTP) until SIGTERM or
// SIGINT, drains it and stops the router. `label` names it in the log. Returns the exit code.
int ServeRouterUntilSignal(RouterRuntime* router, const sigset_t& signals,
                           const ServerOptions& server, const HttpFlags& http,
                           const ApiKeyFlags& keys, const std::string& label);

// `tandem router`: the client-facing router of a disaggregated cluster. Returns the exit code.
int RunRouter(int argc, char** argv);

}  // namespace tandem
