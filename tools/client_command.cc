// `tandem client`: calls a running server's Generate API and streams the text (a real gRPC
// client, handy from a shell and in the README).

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>

#include "common/base/flags.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tools/commands.h"

namespace tandem {

int RunClient(int argc, char** argv) {
  std::string address = "127.0.0.1:50051", prompt = "Once upon a time", stop;
  int32_t max_tokens = 64, n = 1;
  float temperature = 0.0f, top_p = 1.0f;
  int64_t seed = -1;
  bool show_usage = false;
  FlagSet flags("client", "Sends one Generate request to a Tandem server and streams the text.");
  flags.String("address", &address, "server host:port");
  flags.String("prompt", &prompt, "prompt text");
  flags.Int32("max-tokens", &max_tokens, "new tokens at most");
  flags.Float("temperature", &temperature, "sampling temperature; 0 is greedy");
  flags.Float("top-p", &top_p, "nucleus sampling mass");
  flags.Int("seed", &seed, "sampling seed (-1: server's choice)");
  flags.Int32("n", &n, "samples (printed one after the other)");
  flags.String("stop", &stop, "a stop string");
  flags.Bool("usage", &show_usage, "print usage and timings after the text");
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  v1::GenerateRequest request;
  request.set_text(prompt);
  request.set_n(n);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(temperature);
  s->set_top_p(top_p);
  s->set_max_tokens(max_tokens);
  if (seed >= 0) s->set_seed(static_cast<uint64_t>(seed));
  if (!stop.empty()) s->add_stop(stop);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  std::vector<std::string> texts(n);
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      if (n == 1) {
        std::fputs(response.chunk().text().c_str(), stdout);
        std::fflush(stdout);
      } else if (response.chunk().index() < n) {
        texts[response.chunk().index()] += response.chunk().text();
      }
    } else if (response.has_final() && show_usage) {
      const auto& f = response.final();
      std::fprintf(stderr,
                   "\n[sample %d] finish=%s prompt_tokens=%d completion_tokens=%d "
                   "cached_tokens=%d ttft=%.3fs total=%.3fs\n",
                   f.index(), v1::FinishReason_Name(f.finish_reason()).c_str(),
                   f.usage().prompt_tokens(), f.usage().completion_tokens(),
                   f.usage().cached_tokens(), f.timings().time_to_first_token_s(),
                   f.timings().total_s());
    }
  }
  grpc::Status status = reader->Finish();
  if (n > 1) {
    for (int i = 0; i < n; ++i) std::printf("--- sample %d ---\n%s\n", i, texts[i].c_str());
  } else {
    std::fputs("\n", stdout);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "error: status %d: %s\n", static_cast<int>(status.error_code()),
                 status.error_message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace tandem
