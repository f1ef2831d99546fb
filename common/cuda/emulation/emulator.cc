#include "common/cuda/emulation/emulator.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace tandem::cuda_emu {
namespace {

constexpr size_t kStackBytes = 128 * 1024;
constexpr int kMaxThreads = 1024;

enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

// Context switches: a few instructions on x86-64 (callee-saved registers and the stack
// pointer); ucontext elsewhere and under sanitizers, which track stacks through it.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TANDEM_EMU_FAST_SWITCH 1
#endif

#if defined(TANDEM_EMU_FAST_SWITCH)
extern "C" void tandem_cuda_emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl tandem_cuda_emu_switch
.hidden tandem_cuda_emu_switch
.type tandem_cuda_emu_switch,@function
tandem_cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size tandem_cuda_emu_switch,.-tandem_cuda_emu_switch
)");
struct Context {
  void* sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context context;
  Dim3 thread_idx;
  State state = State::kRunnable;
  int shuffles = 0;  // shuffle exchanges so far: their parity picks the exchange buffer
};

struct Run {
  Context scheduler;
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<unsigned char> smem;
  std::vector<uint64_t> warp_slots;
  // Shuffles (WarpExchange, ShuffleXorN) alternate between two buffers, so one barrier per
  // shuffle is enough: a lane that writes the next shuffle's buffer cannot clobber the one the
  // others may still read, and it reaches the one after only once every lane has read.
  std::vector<uint64_t> exchange[2];
  std::vector<float> exchange_n[2];
  // WarpSum's butterfly, computed once per warp by the first lane to resume after the exchange
  // (not by each of the 32 lanes: it was most of an emulated model step), read by all of them.
  std::vector<float> warp_sums;
  std::vector<char> warp_sum_ready;
  // WarpSumGroups: kMaxGroupSumValues values per lane in and out, each lane's (n, width), and
  // whether the warp's sums are computed.
  std::vector<float> group_in, group_out;
  std::vector<int> group_shape;
  std::vector<char> group_ready;
  // MmaBf16_16816: each lane's fragments (4 a, 2 b, 4 d words) and results, whether computed.
  std::vector<uint32_t> mma_in;
  std::vector<float> mma_out;
  std::vector<char> mma_ready;
  Dim3 block_idx, block_dim, grid_dim;
  const std::function<void()>* body = nullptr;
  int current = -1;
};

std::mutex g_mutex;  // one grid at a time, process-wide
Run* g_run = nullptr;

[[noreturn]] void Fail(const char* what) {
  if (g_run == nullptr) {
    std::fprintf(stderr, "CUDA emulator: %s\n", what);
  } else {
    std::fprintf(stderr, "CUDA emulator: %s (block %u,%u,%u thread %d)\n", what, g_run->block_idx.x,
                 g_run->block_idx.y, g_run->block_idx.z, g_run->current);
  }
  std::abort();
}

// Saves the running context into `from` and resumes `to`.
void Switch(Context& from, Context& to) {
#if defined(TANDEM_EMU_FAST_SWITCH)
  tandem_cuda_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

[[noreturn]] void FiberMain() {
  (*g_run->body)();
  Fiber& f = g_run->fibers[g_run->current];
  f.state = State::kDone;
  Switch(f.context, g_run->scheduler);
  std::abort();  // a finished fiber is never resumed
}

void StartFiber(Fiber& f, char* stack) {
#if defined(TANDEM_EMU_FAST_SWITCH)
  // The first switch pops six zero registers and "returns" into FiberMain with the stack aligned
  // as after a call (rsp = 8 mod 16 at entry).
  auto top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  auto* slots = reinterpret_cast<void**>(top) - 8;
  for (int i = 0; i < 6; ++i) slots[i] = nullptr;
  slots[6] = reinterpret_cast<void*>(&FiberMain);
  slots[7] = nullptr;
  f.context.sp = slots;
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = stack;
  f.context.uc.uc_stack.ss_size = kStackBytes;
  f.context.uc.uc_link = nullptr;
  makecontext(&f.context.uc, reinterpret_cast<void (*)()>(&FiberMain), 0);
#endif
}

void Yield(State state) {
  if (g_run == nullptr || g_run->current < 0) Fail("device function called outside a kernel");
  Fiber& f = g_run->fibers[g_run->current];
  f.state = state;
  Switch(f.context, g_run->scheduler);
}

// Releases the warps whose live lanes all wait at a warp barrier; else the whole block when every
// live thread waits at __syncthreads. Returns false on deadlock.
bool Release(Run& run) {
  const int n = static_cast<int>(run.fibers.size());
  bool released = false;
  for (int w = 0; w * 32 < n; ++w) {
    int waiting = 0, done = 0, other = 0;
    const int end = std::min(n, (w + 1) * 32);
    for (int i = w * 32; i < end; ++i) {
      State s = run.fibers[i].state;
      if (s == State::kWarpBarrier) {
        ++waiting;
      } else if (s == State::kDone) {
        ++done;
      } else {
        ++other;
      }
    }
    if (waiting == 0) continue;
    if (done > 0) Fail("warp shuffle or __syncwarp with exited lanes");
    if (other > 0) continue;  // some lanes still elsewhere (at __syncthreads): divergence
    for (int i = w * 32; i < end; ++i) run.fibers[i].state = State::kRunnable;
    released = true;
  }
  if (released) return true;
  bool all_block = true, any = false;
  for (const Fiber& f : run.fibers) {
    if (f.state == State::kDone) continue;
    any = true;
    if (f.state != State::kBlockBarrier) all_block = false;
  }
  if (!any || !all_block) return false;
  for (Fiber& f : run.fibers) {
    if (f.state == State::kBlockBarrier) f.state = State::kRunnable;
  }
  return true;
}

void RunBlock(Run& run) {
  const int n = static_cast<int>(run.fibers.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = run.fibers[i];
    f.thread_idx = Dim3(i % run.block_dim.x, (i / run.block_dim.x) % run.block_dim.y,
                        i / (run.block_dim.x * run.block_dim.y));
    f.state = State::kRunnable;
    f.shuffles = 0;
    StartFiber(f, run.stacks[i].get());
  }
  std::fill(run.smem.begin(), run.smem.end(), 0xff);
  for (;;) {
    for (int i = 0; i < n; ++i) {
      if (run.fibers[i].state != State::kRunnable) continue;
      run.current = i;
      Switch(run.scheduler, run.fibers[i].context);
    }
    run.current = -1;
    bool all_done = true;
    for (const Fiber& f : run.fibers) all_done = all_done && f.state == State::kDone;
    if (all_done) return;
    if (!Release(run)) Fail("barrier deadlock (__syncthreads not reached by every thread?)");
  }
}

void RunGridNow(Dim3 grid, Dim3 block, size_t smem, const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const int threads = static_cast<int>(block.x * block.y * block.z);
  if (threads <= 0 || threads > kMaxThreads) {
    std::fprintf(stderr, "CUDA emulator: bad block size %d\n", threads);
    std::abort();
  }
  static Run* run = new Run();  // stacks are reused across launches
  run->fibers.assign(threads, Fiber{});
  while (static_cast<int>(run->stacks.size()) < threads) {
    run->stacks.push_back(std::make_unique<char[]>(kStackBytes));
  }
  run->smem.assign(smem, 0xff);
  run->warp_slots.assign((threads + 31) / 32 * 32, 0);
  run->warp_sums.assign(run->warp_slots.size(), 0.0f);
  run->warp_sum_ready.assign(run->warp_slots.size() / 32, 0);
  // Exchange areas: every lane writes its part before any lane reads, so only the sizes matter
  // (grown, never cleared: a launch does not pay for them).
  if (run->group_in.size() < run->warp_slots.size() * kMaxGroupSumValues) {
    for (int p = 0; p < 2; ++p) {
      run->exchange[p].resize(run->warp_slots.size());
      run->exchange_n[p].resize(run->warp_slots.size() * kMaxGroupSumValues);
    }
    run->group_in.resize(run->warp_slots.size() * kMaxGroupSumValues);
    run->group_out.resize(run->warp_slots.size() * kMaxGroupSumValues);
    run->group_shape.resize(run->warp_slots.size() * 2);
    run->mma_in.resize(run->warp_slots.size() * 10);
    run->mma_out.resize(run->warp_slots.size() * 4);
  }
  run->group_ready.assign(run->warp_slots.size() / 32, 0);
  run->mma_ready.assign(run->warp_slots.size() / 32, 0);
  run->block_dim = block;
  run->grid_dim = grid;
  run->body = &body;
  g_run = run;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        run->block_idx = Dim3(x, y, z);
        RunBlock(*run);
      }
    }
  }
  g_run = nullptr;
}

}  // namespace

const Dim3& ThreadIdx() { return g_run->fibers[g_run->current].thread_idx; }
const Dim3& BlockIdx() { return g_run->block_idx; }
const Dim3& BlockDim() { return g_run->block_dim; }
const Dim3& GridDim() { return g_run->grid_dim; }

void SyncThreads() { Yield(State::kBlockBarrier); }
void SyncWarp() { Yield(State::kWarpBarrier); }

uint64_t WarpExchange(uint64_t value, int src_lane) {
  Run& run = *g_run;
  const int me = run.current;
  const int warp_base = me / 32 * 32;
  const int src = warp_base + (src_lane & 31);
  if (src >= static_cast<int>(run.fibers.size())) Fail("shuffle from a lane outside the block");
  std::vector<uint64_t>& slots = run.exchange[run.fibers[me].shuffles++ & 1];
  slots[me] = value;
  Yield(State::kWarpBarrier);
  return slots[src];
}

float WarpSum(float value) {
  Run& run = *g_run;
  const int me = run.current;
  const int warp = me / 32;
  const int warp_base = warp * 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  run.warp_slots[me] = bits;
  // Every lane is past the previous sum's last barrier, so its results are no longer read.
  run.warp_sum_ready[warp] = 0;
  Yield(State::kWarpBarrier);
  if (!run.warp_sum_ready[warp]) {
    float v[32];
    for (int i = 0; i < 32; ++i) std::memcpy(&v[i], &run.warp_slots[warp_base + i], sizeof(float));
    // The butterfly of five shuffle rounds for every lane at once: same operations and order as
    // the device code, so the same bits.
    for (int m = 16; m > 0; m >>= 1) {
      float next[32];
      for (int i = 0; i < 32; ++i) next[i] = v[i] + v[i ^ m];
      std::memcpy(v, next, sizeof v);
    }
    std::memcpy(&run.warp_sums[warp_base], v, sizeof v);
    run.warp_sum_ready[warp] = 1;
  }
  const float out = run.warp_sums[me];
  Yield(State::kWarpBarrier);  // as a shuffle: no lane leaves before every lane has read
  return out;
}

void WarpSumGroups(float* values, int n, int width) {
  if (n < 0 || n > kMaxGroupSumValues) Fail("WarpSumGroups: too many values");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) Fail("WarpSumGroups: bad width");
  Run& run = *g_run;
  const int me = run.current;
  const int warp = me / 32;
  const int warp_base = warp * 32;
  if (warp_base + 32 > static_cast<int>(run.fibers.size())) Fail("WarpSumGroups: partial warp");
  std::memcpy(&run.group_in[static_cast<size_t>(me) * kMaxGroupSumValues], values,
              sizeof(float) * n);
  run.group_shape[me * 2] = n;
  run.group_shape[me * 2 + 1] = width;
  run.group_ready[warp] = 0;  // every lane is past the previous call's last barrier
  Yield(State::kWarpBarrier);
  if (!run.group_ready[warp]) {
    for (int i = 0; i < 32; ++i) {
      if (run.group_shape[(warp_base + i) * 2] != n ||
          run.group_shape[(warp_base + i) * 2 + 1] != width) {
        Fail("WarpSumGroups: lanes disagree on the count or width");
      }
    }
    // Per value, the butterfly of the device code for every lane at once: same operations and
    // order, so the same bits.
    for (int k = 0; k < n; ++k) {
      float v[32];
      for (int i = 0; i < 32; ++i) {
        v[i] = run.group_in[static_cast<size_t>(warp_base + i) * kMaxGroupSumValues + k];
      }
      for (int m = width / 2; m > 0; m >>= 1) {
        float next[32];
        for (int i = 0; i < 32; ++i) next[i] = v[i] + v[i ^ m];
        std::memcpy(v, next, sizeof v);
      }
      for (int i = 0; i < 32; ++i) {
        run.group_out[static_cast<size_t>(warp_base + i) * kMaxGroupSumValues + k] = v[i];
      }
    }
    run.group_ready[warp] = 1;
  }
  std::memcpy(values, &run.group_out[static_cast<size_t>(me) * kMaxGroupSumValues],
              sizeof(float) * n);
  Yield(State::kWarpBarrier);  // no lane starts another call before every lane has read
}

void ShuffleXorN(const float* in, float* out, int n, int lane_mask) {
  if (n < 0 || n > kMaxGroupSumValues) Fail("ShuffleXorN: too many values");
  Run& run = *g_run;
  const int me = run.current;
  const int warp_base = me / 32 * 32;
  const int src = warp_base + ((me - warp_base) ^ (lane_mask & 31));
  if (src >= static_cast<int>(run.fibers.size())) Fail("shuffle from a lane outside the block");
  std::vector<float>& slots = run.exchange_n[run.fibers[me].shuffles++ & 1];
  std::memcpy(&slots[static_cast<size_t>(me) * kMaxGroupSumValues], in, sizeof(float) * n);
  Yield(State::kWarpBarrier);
  std::memcpy(out, &slots[static_cast<size_t>(src) * kMaxGroupSumValues], sizeof(float) * n);
}

namespace {
float Bf16Bits(uint32_t h) {
  const uint32_t u = (h & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

void MmaBf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
  Run& run = *g_run;
  const int me = run.current;
  const int warp = me / 32;
  const int warp_base = warp * 32;
  if (warp_base + 32 > static_cast<int>(run.fibers.size())) Fail("mma.sync: partial warp");
  uint32_t* in = &run.mma_in[static_cast<size_t>(me) * 10];
  std::memcpy(in, a, 16);
  std::memcpy(in + 4, b, 8);
  std::memcpy(in + 6, d, 16);
  run.mma_ready[warp] = 0;  // every lane is past the previous call's last barrier
  Yield(State::kWarpBarrier);
  if (!run.mma_ready[warp]) {
    // The PTX fragment layouts (group g = lane / 4, t = lane % 4; low half first):
    //   a0: A[g][2t..2t+1]  a1: A[g+8][2t..]  a2: A[g][2t+8..]  a3: A[g+8][2t+8..]
    //   b0: B[2t..2t+1][g]  b1: B[2t+8..2t+9][g]
    //   d0: D[g][2t]  d1: D[g][2t+1]  d2: D[g+8][2t]  d3: D[g+8][2t+1]
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      const uint32_t* f = &run.mma_in[static_cast<size_t>(warp_base + lane) * 10];
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 4; ++i) {
        const int row = g + (i & 1) * 8, col = 2 * t + (i >> 1) * 8;
        A[row][col] = Bf16Bits(f[i]);
        A[row][col + 1] = Bf16Bits(f[i] >> 16);
      }
      for (int i = 0; i < 2; ++i) {
        B[2 * t + i * 8][g] = Bf16Bits(f[4 + i]);
        B[2 * t + i * 8 + 1][g] = Bf16Bits(f[4 + i] >> 16);
      }
      for (int i = 0; i < 4; ++i) {
        std::memcpy(&C[g + (i >> 1) * 8][2 * t + (i & 1)], &f[6 + i], sizeof(float));
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 4; ++i) {
        const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
        double sum = C[row][col];
        for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k] * B[k][col]);
        run.mma_out[static_cast<size_t>(warp_base + lane) * 4 + i] = static_cast<float>(sum);
      }
    }
    run.mma_ready[warp] = 1;
  }
  std::memcpy(d, &run.mma_out[static_cast<size_t>(me) * 4], 16);
  Yield(State::kWarpBarrier);  // no lane starts another mma before every lane has read
}

void CheckAligned(const void* p, size_t alignment, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignment == 0) return;
  char message[128];
  std::snprintf(message, sizeof message, "misaligned %s at %p (needs %zu-byte alignment)", what, p,
                alignment);
  Fail(message);
}

void* DynamicShared() { return g_run->smem.data(); }

void RunGrid(Dim3 grid, Dim3 block, size_t dynamic_smem, const void* stream,
             std::function<void()> body) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    std::fprintf(stderr, "CUDA emulator: empty grid (a real launch fails)\n");
    std::abort();
  }
  EnqueueOnStream(stream, [grid, block, dynamic_smem, body = std::move(body)] {
    RunGridNow(grid, block, dynamic_smem, body);
  });
}

}  // namespace tandem::cuda_emu
