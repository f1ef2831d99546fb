// Fuzzes the receiver's bookkeeping (kvtransfer/receiver_core.h), which every transport feeds with
// what senders claim: the input is a sequence of operations (expectations, BEGIN, DATA for any
// layer and blocks, FINISH, ABORT, cancellations, lost connections) on a few transfer ids.
// Checked: only regions of expected blocks are ever written, never a byte outside a region, and
// once every transfer is cancelled nothing is left in flight.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "common/cluster/transfer_key.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/receiver_core.h"

namespace kvt = tandem::kvtransfer;

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

namespace {

constexpr int kLayers = 2;
constexpr int kBlocks = 8;
constexpr size_t kGuard = 16;
constexpr uint8_t kGuardByte = 0xa5;

kvt::KvLayout Layout() {
  kvt::KvLayout l;
  l.model_id = "fuzz";
  l.num_layers = kLayers;
  l.num_kv_heads = 1;
  l.head_dim = 2;
  l.block_size = 2;
  l.kv_dtype = tandem::DType::kF32;  // region: 2 * 1 * 2 * 2 * 4 = 32 bytes
  return l;
}

// [guard][region][guard][region]...[guard]; every region starts zeroed.
class Pool : public kvt::KvRegionAccess {
 public:
  explicit Pool(size_t region)
      : region_(region), bytes_(kGuard + kLayers * kBlocks * (region + kGuard), kGuardByte) {
    for (int l = 0; l < kLayers; ++l) {
      for (int b = 0; b < kBlocks; ++b) std::memset(Region(l, b), 0, region_);
    }
  }
  uint8_t* Region(int64_t layer, int32_t block) override {
    FUZZ_CHECK(layer >= 0 && layer < kLayers && block >= 0 && block < kBlocks);
    return bytes_.data() + kGuard + (layer * kBlocks + block) * (region_ + kGuard);
  }
  int64_t num_blocks() const override { return kBlocks; }
  bool Written(int l, int b) {
    const uint8_t* r = Region(l, b);
    for (size_t i = 0; i < region_; ++i) {
      if (r[i] != 0) return true;
    }
    return false;
  }
  bool GuardsIntact() {
    for (int l = 0; l < kLayers; ++l) {
      for (int b = 0; b < kBlocks; ++b) {
        const uint8_t* g = Region(l, b) - kGuard;
        for (size_t i = 0; i < kGuard; ++i) {
          if (g[i] != kGuardByte) return false;
        }
      }
    }
    for (size_t i = bytes_.size() - kGuard; i < bytes_.size(); ++i) {
      if (bytes_[i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  size_t region_;
  std::vector<uint8_t> bytes_;
};

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kvt::KvLayout layout = Layout();
  Pool pool(layout.region_bytes());
  std::set<int32_t> expected_blocks;
  std::vector<std::vector<int32_t>> expectations(4);
  {
    kvt::ReceiverCore core(
        layout, &pool, [](const kvt::CompletedTransfer&) {}, absl::Milliseconds(5),
        absl::Seconds(10), "fuzz-recv");
    // No write holds a transfer's I/O mutex between operations here: every Cancel is released
    // before it returns, exactly once.
    int cancels = 0;
    int released = 0;
    auto cancel = [&](uint64_t id) {
      ++cancels;
      core.Cancel(id, nullptr, [&released] { ++released; });
      FUZZ_CHECK(released == cancels);
    };
    Input in(data, size);
    for (int ops = 0; !in.empty() && ops < 64; ++ops) {
      const uint8_t op = in.Byte();
      const uint64_t id = in.Byte() % 4;
      const uint32_t attempt = in.Byte() % 4;
      switch (op % 7) {
        case 0: {  // the engine reserved blocks: distinct, valid ids
          std::vector<int32_t> blocks;
          const int n = 1 + in.Byte() % 4;
          for (int i = 0; i < n; ++i) {
            const int32_t b = in.Byte() % kBlocks;
            if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
          }
          expectations[id] = blocks;
          expected_blocks.insert(blocks.begin(), blocks.end());
          kvt::Expectation e{id, blocks};
          // Windowed layers (some out of range or repeated, and window_first past the blocks,
          // which the expectation must refuse).
          const uint8_t window = in.Byte();
          if (window % 2 == 1) {
            for (int i = 0; i < window % 4; ++i) e.window_layers.push_back((window >> (2 * i)) % 3);
            e.window_first = static_cast<int32_t>(in.Byte() % 6);
          }
          if (window & 0x40) e.transfer_key = std::string(32, 'k');  // only its prover begins
          core.Expect(e);
          break;
        }
        case 1: {  // BEGIN with the expected blocks or others
          kvt::ReceiverCore::AttemptStart s;
          s.transfer_id = id;
          s.attempt = attempt;
          s.owner = 1 + in.Byte() % 2;
          const uint8_t how = in.Byte();
          if (how % 4 != 0) {
            s.dst_blocks = expectations[id];
          } else {
            for (int i = 0; i < how % 5; ++i)
              s.dst_blocks.push_back(static_cast<int8_t>(in.Byte()));
          }
          if (how & 0x80) s.deadline = absl::Now() + absl::Milliseconds(how % 3);
          if (how & 0x40) {  // the key's proof (right when the expectation has that key)
            s.proof = kvt::BeginProof(tandem::TransferAttemptKey(std::string(32, 'k'), attempt), "",
                                      id, attempt, s.dst_blocks);
          }
          (void)core.Begin(std::move(s), [](const absl::Status&) {}).ok();
          break;
        }
        case 2: {  // DATA for any layer and blocks; layer byte 0xff: every region (cuda-ipc)
          const uint8_t layer_byte = in.Byte();
          const int64_t layer = static_cast<int8_t>(layer_byte) % 4;
          std::vector<int32_t> blocks;
          const int n = in.Byte() % 4;
          for (int i = 0; i < n; ++i) blocks.push_back(static_cast<int8_t>(in.Byte()) % 10);
          bool reported = false;
          const uint64_t owner = 1 + in.Byte() % 2;
          auto ticket = layer_byte == 0xff
                            ? core.AdmitAll(owner, id, attempt)
                            : core.AdmitData(owner, id, attempt, layer, blocks, &reported);
          if (!ticket.ok()) break;
          FUZZ_CHECK(layer_byte == 0xff || ticket->regions.size() == blocks.size());
          FUZZ_CHECK(ticket->regions.size() == ticket->cells.size());
          {
            std::lock_guard<std::mutex> lock(*core.io_mutex(*ticket));
            if (core.Writable(*ticket)) {
              for (uint8_t* r : ticket->regions) std::memset(r, 0x11, layout.region_bytes());
            }
          }
          core.EndData(*ticket,
                       in.Byte() % 5 == 0 ? absl::DataLossError("checksum") : absl::OkStatus(),
                       layer_byte == 0xff ? 1 + in.Byte() % 4 : 1);
          break;
        }
        case 3: {
          const uint64_t frames = in.Byte() % 8;
          (void)core
              .Finish(1 + in.Byte() % 2, id, attempt, frames,
                      frames * layout.region_bytes() * (1 + in.Byte() % 2), "trailer")
              .ok();
          break;
        }
        case 4:
          core.Abort(1 + in.Byte() % 2, id, attempt, absl::AbortedError("fuzz"));
          break;
        case 5:
          cancel(id);
          break;
        default:
          core.FailOwner(1 + in.Byte() % 2, absl::UnavailableError("connection lost"));
          break;
      }
    }
    for (uint64_t id = 0; id < 4; ++id) cancel(id);
    FUZZ_CHECK(core.num_in_flight() == 0);
  }
  FUZZ_CHECK(pool.GuardsIntact());
  for (int l = 0; l < kLayers; ++l) {
    for (int b = 0; b < kBlocks; ++b) {
      if (pool.Written(l, b)) FUZZ_CHECK(expected_blocks.count(b) != 0);
    }
  }
  return 0;
}
