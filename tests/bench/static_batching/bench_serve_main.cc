// tandem_bench_serve: `tandem serve` with the benchmark-only scheduling policies registered
// (--scheduling-policy static | static-compact, static_batching.h). The batching benchmark
// (scripts/bench/batching.sh) runs its servers with it; `tandem` itself knows no such policy.

#include "serve/serve_main.h"
#include "tests/bench/static_batching/static_batching.h"

int main(int argc, char** argv) {
  tandem::RegisterStaticBaselines();
  return tandem::RunServe(argc, argv);
}
