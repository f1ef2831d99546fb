// KV transfer throughput: whole prompts (every layer of N blocks) pushed layer by layer from a
// sender to a receiver in this process, over TCP on 127.0.0.1 (and loopback for reference),
// with and without the CRC32C checksum. Realistic region sizes:
//   llama-110m: 12 layers, 12 kv heads, head_dim 64, block 16, bf16 -> 48 KiB regions
//   llama-1b:   16 layers,  8 kv heads, head_dim 64, block 16, bf16 -> 32 KiB regions
//
// usage: kvtransfer_bench [--seconds=S] [--blocks=N] [--transport=tcp|loopback|all]

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {
namespace {

class Pool : public KvRegionAccess {
 public:
  Pool(const KvLayout& l, int64_t blocks)
      : region_(l.region_bytes()), blocks_(blocks), bytes_(region_ * l.num_layers * blocks) {
    for (size_t i = 0; i < bytes_.size(); i += 4096) bytes_[i] = static_cast<uint8_t>(i >> 12);
  }
  uint8_t* Region(int64_t layer, int32_t block) override {
    return bytes_.data() + (layer * blocks_ + block) * region_;
  }
  int64_t num_blocks() const override { return blocks_; }

 private:
  size_t region_;
  int64_t blocks_;
  std::vector<uint8_t> bytes_;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Model {
  const char* name;
  KvLayout layout;
};

Model MakeModel(const char* name, int64_t layers, int64_t kv_heads) {
  KvLayout l;
  l.model_id = name;
  l.num_layers = layers;
  l.num_kv_heads = kv_heads;
  l.head_dim = 64;
  l.block_size = 16;
  l.kv_dtype = DType::kBF16;
  return {name, l};
}

void RunOne(const Model& m, const std::string& transport, bool checksum, int32_t blocks,
            double seconds) {
  Pool src(m.layout, blocks), dst(m.layout, blocks);
  ReceiverOptions ro;
  ro.transport = transport;
  ro.layout = m.layout;
  ro.faults_from_env = false;
  auto receiver = CreateReceiver(ro, &dst, [](const CompletedTransfer&) {});
  SenderOptions so;
  so.transport = transport;
  so.layout = m.layout;
  so.checksum = checksum;
  so.faults_from_env = false;
  auto sender = CreateSender(so, &src);
  if (!receiver.ok() || !sender.ok()) {
    std::fprintf(stderr, "setup failed\n");
    std::exit(1);
  }
  std::vector<int32_t> ids(blocks);
  for (int32_t i = 0; i < blocks; ++i) ids[i] = i;
  const size_t bytes_per_transfer = m.layout.region_bytes() * m.layout.num_layers * blocks;
  uint64_t id = 0, transfers = 0;
  absl::Duration latency_sum;
  const double cpu_start = CpuSeconds();
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds) || transfers < 3) {
    (*receiver)->Expect({++id, ids});
    TransferTarget t{(*receiver)->endpoint(), (*receiver)->incarnation(), id, 0, ids};
    const absl::Time t0 = absl::Now();
    auto h = (*sender)->Begin(t, ids);
    if (!h.ok()) {
      std::fprintf(stderr, "begin: %s\n", std::string(h.status().message()).c_str());
      std::exit(1);
    }
    for (int64_t l = 0; l < m.layout.num_layers; ++l) (*sender)->SendLayer(*h, l);
    std::promise<absl::Status> done;
    (*sender)->Finish(*h, "", [&](absl::Status s) { done.set_value(s); });
    absl::Status s = done.get_future().get();
    if (!s.ok()) {
      std::fprintf(stderr, "transfer: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
    latency_sum += absl::Now() - t0;
    ++transfers;
  }
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  const double gb = static_cast<double>(bytes_per_transfer) * transfers / 1e9;
  std::printf("%-11s %-9s %-8s %6zu KiB %6d %9.2f MiB %8.2f GB/s %9.2f ms %8.3f\n", m.name,
              transport.c_str(), checksum ? "crc32c" : "none", m.layout.region_bytes() >> 10,
              blocks, bytes_per_transfer / 1048576.0, gb / elapsed,
              absl::ToDoubleMilliseconds(latency_sum) / transfers, (CpuSeconds() - cpu_start) / gb);
  std::fflush(stdout);
}

void CrcSpeed() {
  std::vector<uint8_t> buf(48 << 10);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7);
  for (bool hw : {true, false}) {
    if (hw && !Crc32cIsHardware()) continue;
    uint32_t crc = 0;
    int iters = 0;
    const absl::Time start = absl::Now();
    while (absl::Now() - start < absl::Milliseconds(300)) {
      for (int i = 0; i < 64; ++i) {
        crc =
            hw ? Crc32c(crc, buf.data(), buf.size()) : Crc32cPortable(crc, buf.data(), buf.size());
      }
      iters += 64;
    }
    const double s = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("crc32c %-9s %8.2f GB/s (48 KiB buffers, crc %08x)\n", hw ? "sse4.2x3" : "portable",
                buf.size() * static_cast<double>(iters) / s / 1e9, crc);
  }
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  using namespace tandem::kvtransfer;
  double seconds = 2;
  int blocks = 128;  // a 2048-token prompt
  std::string transport = "all";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--seconds=", 10) == 0) seconds = std::atof(argv[i] + 10);
    if (std::strncmp(argv[i], "--blocks=", 9) == 0) blocks = std::atoi(argv[i] + 9);
    if (std::strncmp(argv[i], "--transport=", 12) == 0) transport = argv[i] + 12;
  }
  CrcSpeed();
  std::printf("%-11s %-9s %-8s %10s %6s %13s %13s %12s %8s\n", "model", "transport", "checksum",
              "region", "blocks", "per transfer", "throughput", "latency", "cpu s/GB");
  const Model models[] = {MakeModel("llama-110m", 12, 12), MakeModel("llama-1b", 16, 8)};
  for (const Model& m : models) {
    for (const char* t : {"tcp", "loopback"}) {
      if (transport != "all" && transport != t) continue;
      for (bool checksum : {true, false}) RunOne(m, t, checksum, blocks, seconds);
    }
  }
  return 0;
}
