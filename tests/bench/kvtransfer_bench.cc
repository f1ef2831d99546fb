// KV transfer throughput: whole prompts (every layer of N blocks) pushed layer by layer from a
// sender to a receiver in this process, over TCP on 127.0.0.1 (and loopback for reference),
// with and without the CRC32C checksum. Realistic region sizes:
//   llama-110m: 12 layers, 12 kv heads, head_dim 64, block 16, bf16 -> 48 KiB regions
//   llama-1b:   16 layers,  8 kv heads, head_dim 64, block 16, bf16 -> 32 KiB regions
//
// usage: kvtransfer_bench [--seconds=S] [--blocks=N] [--transport=tcp|loopback|all]
//        kvtransfer_bench --auth-compare [--reps=R] [--connects=K] [--seconds=S] [--blocks=N]
//
// --auth-compare: tcp without and with the shared-secret handshake (kvtransfer/auth.h), side by
// side in this process, R repetitions interleaved (alternating which goes first): connection setup
// (a fresh sender's Begin: TCP connect + handshake, median of K) and llama-1b throughput (crc32c);
// medians over the reps.

#include <sys/resource.h>

#include <algorithm>
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

constexpr char kBenchSecret[] = "kvtransfer-bench-shared-secret-0123456789";

struct RunResult {
  double gbps = 0;
  double latency_ms = 0;
  double cpu_s_per_gb = 0;
};

RunResult RunOne(const Model& m, const std::string& transport, bool checksum, int32_t blocks,
                 double seconds, bool print = true, const std::string& secret = "") {
  Pool src(m.layout, blocks), dst(m.layout, blocks);
  ReceiverOptions ro;
  ro.transport = transport;
  ro.layout = m.layout;
  ro.faults_from_env = false;
  ro.secret = secret;
  auto receiver = CreateReceiver(ro, &dst, [](const CompletedTransfer&) {});
  SenderOptions so;
  so.transport = transport;
  so.layout = m.layout;
  so.checksum = checksum;
  so.faults_from_env = false;
  so.secret = secret;
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
  RunResult r{gb / elapsed, absl::ToDoubleMilliseconds(latency_sum) / transfers,
              (CpuSeconds() - cpu_start) / gb};
  if (!print) return r;
  std::printf("%-11s %-9s %-8s %6zu KiB %6d %9.2f MiB %8.2f GB/s %9.2f ms %8.3f\n", m.name,
              transport.c_str(), checksum ? "crc32c" : "none", m.layout.region_bytes() >> 10,
              blocks, bytes_per_transfer / 1048576.0, gb / elapsed, r.latency_ms, r.cpu_s_per_gb);
  std::fflush(stdout);
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

// Median microseconds of a fresh sender's first Begin (TCP connect + handshake), K times.
double ConnectMicros(const Model& m, const std::string& secret, int connects) {
  Pool src(m.layout, 1), dst(m.layout, 1);
  ReceiverOptions ro;
  ro.layout = m.layout;
  ro.faults_from_env = false;
  ro.secret = secret;
  auto receiver = CreateReceiver(ro, &dst, [](const CompletedTransfer&) {});
  if (!receiver.ok()) std::exit(1);
  std::vector<double> micros;
  for (int i = 0; i < connects; ++i) {
    SenderOptions so;
    so.layout = m.layout;
    so.faults_from_env = false;
    so.secret = secret;
    auto sender = CreateSender(so, &src);
    if (!sender.ok()) std::exit(1);
    const uint64_t id = static_cast<uint64_t>(i) + 1;
    (*receiver)->Expect({id, {0}});
    TransferTarget t{(*receiver)->endpoint(), (*receiver)->incarnation(), id, 0, {0}};
    const absl::Time t0 = absl::Now();
    auto h = (*sender)->Begin(t, {0});
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    if (!h.ok()) {
      std::fprintf(stderr, "begin: %s\n", std::string(h.status().message()).c_str());
      std::exit(1);
    }
    for (int64_t l = 0; l < m.layout.num_layers; ++l) (*sender)->SendLayer(*h, l);
    std::promise<absl::Status> done;
    (*sender)->Finish(*h, "", [&](absl::Status s) { done.set_value(s); });
    if (!done.get_future().get().ok()) std::exit(1);
  }
  return Median(micros);
}

void AuthCompare(int reps, int connects, double seconds, int32_t blocks) {
  const Model m = MakeModel("llama-1b", 16, 8);
  std::vector<double> connect[2], gbps[2], cpu[2];
  std::printf(
      "rep  handshake  connect us (median of %d)  GB/s (llama-1b, %d blocks, crc32c)  "
      "cpu s/GB\n",
      connects, blocks);
  for (int rep = 0; rep < reps; ++rep) {
    for (int k = 0; k < 2; ++k) {
      const int auth = (rep + k) % 2;  // alternate which goes first: no order bias
      const std::string secret = auth ? kBenchSecret : "";
      connect[auth].push_back(ConnectMicros(m, secret, connects));
      RunResult r = RunOne(m, "tcp", /*checksum=*/true, blocks, seconds, /*print=*/false, secret);
      gbps[auth].push_back(r.gbps);
      cpu[auth].push_back(r.cpu_s_per_gb);
      std::printf("%3d  %-9s  %24.1f  %34.3f  %8.3f\n", rep + 1, auth ? "hmac" : "none",
                  connect[auth].back(), r.gbps, r.cpu_s_per_gb);
      std::fflush(stdout);
    }
  }
  std::printf("median  none: connect %.1f us, %.3f GB/s, %.3f cpu s/GB\n", Median(connect[0]),
              Median(gbps[0]), Median(cpu[0]));
  std::printf("median  hmac: connect %.1f us, %.3f GB/s, %.3f cpu s/GB\n", Median(connect[1]),
              Median(gbps[1]), Median(cpu[1]));
  std::printf("ratio   hmac/none: connect %.2fx, throughput %.3fx\n",
              Median(connect[1]) / Median(connect[0]), Median(gbps[1]) / Median(gbps[0]));
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
  bool auth_compare = false;
  int reps = 5, connects = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--auth-compare") == 0) auth_compare = true;
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--connects=", 11) == 0) connects = std::atoi(argv[i] + 11);
    if (std::strncmp(argv[i], "--seconds=", 10) == 0) seconds = std::atof(argv[i] + 10);
    if (std::strncmp(argv[i], "--blocks=", 9) == 0) blocks = std::atoi(argv[i] + 9);
    if (std::strncmp(argv[i], "--transport=", 12) == 0) transport = argv[i] + 12;
  }
  if (auth_compare) {
    AuthCompare(reps, connects, seconds, blocks);
    return 0;
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
