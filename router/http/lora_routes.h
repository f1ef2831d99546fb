#pragma once

#include <memory>
#include <vector>

#include "common/http/http_transport.h"
#include "router/http/openai_request.h"
#include "tandem/v1/router_admin.grpc.pb.h"

namespace tandem {

// vLLM's runtime LoRA endpoints, onto RouterAdmin (whose admin scope the gRPC policy enforces
// with the forwarded Authorization header):
//   POST /v1/load_lora_adapter   {"lora_name": "...", "lora_path": "..."}
//   POST /v1/unload_lora_adapter {"lora_name": "..."}
// 200 with vLLM's "Success: ..." text; errors as OpenAI error objects: 400 (bad input, a bad
// adapter, a name already loaded, --max-cpu-loras reached, runtime loading off), 401 / 403
// (without an admin key), 404 (unloading a name not loaded). `admin` must outlive the routes.
std::vector<HttpRoute> LoraAdapterRoutes(v1::RouterAdmin::Stub* admin, const OpenAiLimits& limits);

}  // namespace tandem
