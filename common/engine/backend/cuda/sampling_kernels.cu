// Sampling on the device: one block per sampled row does what the host sampler does to it
// (common/engine/sampler: logit edits, token mask, greedy or temperature + top-k + top-p + min-p
// and one draw, logprobs of the raw row) and writes the token instead of the row going back.
//
// Cuts without a sort: the candidates' order (descending logit, ascending id) is a 64-bit key
// per token, and every cut keeps a prefix of that order, i.e. the tokens whose key is at least a
// threshold. Each threshold (the k-th key, the shortest prefix holding top_p of the mass, the
// token where the cumulative mass passes the draw) is found bit by bit, each bit one pass over
// the row with a block reduction in a fixed order: a row's answer depends only on its inputs.

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kMaxWarps = 32;

TANDEM_DEVICE float NegInf() { return dev::BitsToFloat(0xff800000u); }
TANDEM_DEVICE bool IsFinite(float x) { return (dev::FloatToBits(x) & 0x7f800000u) != 0x7f800000u; }

// Larger key = earlier in the order: the logit's bits made monotone (-0 counted as +0, as the
// host's comparisons do), then the complement of the id (lower id first on ties).
TANDEM_DEVICE uint64_t Key(float l, int32_t id) {
  uint32_t b = dev::FloatToBits(l + 0.0f);
  b = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(b) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
TANDEM_DEVICE int32_t IdOf(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu));
}

// Block reductions returning the same value to every thread: a warp butterfly, lane 0 of each
// warp publishes, every thread adds the warps' values in warp order.
struct Scratch {
  double d[kMaxWarps];
  uint64_t u[kMaxWarps];
  int32_t i[kMaxWarps];
};

TANDEM_DEVICE double BlockSumD(double v, Scratch* s) {
  for (int m = 16; m > 0; m >>= 1) v += dev::ShflXorAny(v, m);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) s->d[warp] = v;
  dev::SyncThreads();
  double t = 0.0;
  for (int w = 0; w < warps; ++w) t += s->d[w];
  dev::SyncThreads();
  return t;
}

TANDEM_DEVICE int32_t BlockSumI(int32_t v, Scratch* s) {
  for (int m = 16; m > 0; m >>= 1) v += dev::ShflXorAny(v, m);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) s->i[warp] = v;
  dev::SyncThreads();
  int32_t t = 0;
  for (int w = 0; w < warps; ++w) t += s->i[w];
  dev::SyncThreads();
  return t;
}

TANDEM_DEVICE uint64_t BlockMaxU(uint64_t v, Scratch* s) {
  for (int m = 16; m > 0; m >>= 1) {
    const uint64_t o = dev::ShflXorAny(v, m);
    v = o > v ? o : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) s->u[warp] = v;
  dev::SyncThreads();
  uint64_t t = 0;
  for (int w = 0; w < warps; ++w) t = s->u[w] > t ? s->u[w] : t;
  dev::SyncThreads();
  return t;
}

// The largest key b for which holds(b) (a block-wide predicate, monotone: true up to some key,
// false above), built bit by bit from the top. The complement of an id below 2^id_bits has its
// bits id_bits..31 set, so those are fixed rather than searched. False when holds(b) is false
// for every key (then *key is meaningless).
template <class Holds>
TANDEM_DEVICE bool LargestKey(Holds holds, int id_bits, uint64_t* key) {
  const uint64_t fixed = id_bits >= 32 ? 0 : (0xffffffffull & ~((1ull << id_bits) - 1));
  uint64_t b = fixed;
  for (int bit = 63; bit >= 32; --bit) {
    const uint64_t c = b | (1ull << bit);
    if (holds(c)) b = c;
  }
  for (int bit = id_bits - 1; bit >= 0; --bit) {
    const uint64_t c = b | (1ull << bit);
    if (holds(c)) b = c;
  }
  *key = b;
  return holds(b);
}

TANDEM_GLOBAL void SampleRowsKernel(SampleArgs a) {
  TANDEM_SHARED Scratch s;
  const SampleRowArgs r = a.rows[blockIdx.x];
  const int32_t V = a.vocab;
  const float* raw = a.logits + static_cast<int64_t>(r.logit_row) * V;
  float* l = a.work + static_cast<int64_t>(blockIdx.x) * V;
  SampleOutput* out = a.out + blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  int id_bits = 0;
  while (id_bits < 32 && (1ll << id_bits) < V) ++id_bits;

  // 1. Logprobs of the raw row (ComputeLogprobs): log Z and the top n by key.
  float log_z = 0.0f;
  if (r.logprobs >= 0) {
    uint64_t k = 0;
    for (int32_t i = tid; i < V; i += nt) {
      const uint64_t ki = Key(raw[i], i);
      k = ki > k ? ki : k;
    }
    const float max_raw = raw[IdOf(BlockMaxU(k, &s))];
    double z = 0.0;
    for (int32_t i = tid; i < V; i += nt) z += dev::ExpD(static_cast<double>(raw[i]) - max_raw);
    z = BlockSumD(z, &s);
    log_z = max_raw + static_cast<float>(dev::LogD(z));
    uint64_t below = ~0ull;  // the previous entry's key
    const int32_t n = r.logprobs < V ? r.logprobs : V;
    for (int32_t j = 0; j < n && j < kMaxSampleLogprobs; ++j) {
      uint64_t m = 0;
      for (int32_t i = tid; i < V; i += nt) {
        const uint64_t ki = Key(raw[i], i);
        if (ki < below && ki > m) m = ki;
      }
      below = BlockMaxU(m, &s);
      if (tid == 0) {
        out->top_ids[j] = IdOf(below);
        out->top_logprobs[j] = raw[IdOf(below)] - log_z;
      }
    }
  }

  // 2. The processed row: edits phase by phase (a phase touches each token once), then the mask.
  for (int32_t i = tid; i < V; i += nt) l[i] = raw[i];
  dev::SyncThreads();
  int32_t begin = r.edits_begin;
  for (int32_t p = 0; p < r.num_phases; ++p) {
    const int32_t end = r.edits_begin + a.phase_ends[r.phases_begin + p];
    for (int32_t e = begin + tid; e < end; e += nt) {
      const SampleEdit ed = a.edits[e];
      const float x = l[ed.id];
      float y = x;
      if (ed.op == 0) {
        y = x + ed.value;
      } else if (ed.op == 1) {
        y = NegInf();
      } else if (ed.op == 2) {
        y = x > 0 ? x / ed.value : x * ed.value;
      } else if (ed.op == 3) {
        y = x - ed.value;
      }
      l[ed.id] = y;
    }
    dev::SyncThreads();
    begin = end;
  }
  if (r.mask_begin >= 0) {
    const uint64_t* words = a.masks + r.mask_begin;
    for (int32_t i = tid; i < V; i += nt) {
      if (((words[i >> 6] >> (i & 63)) & 1u) == 0) l[i] = NegInf();
    }
    dev::SyncThreads();
    for (int32_t j = tid; j < r.num_revive; j += nt) {
      const int32_t id = a.revive[r.revive_begin + j];
      if (id >= 0 && id < V && !IsFinite(l[id])) l[id] = 0.0f;
    }
    dev::SyncThreads();
  }

  // 3. The token.
  uint64_t k = 0;
  for (int32_t i = tid; i < V; i += nt) {
    const uint64_t ki = Key(l[i], i);
    k = ki > k ? ki : k;
  }
  const int32_t best = IdOf(BlockMaxU(k, &s));
  const float max_l = l[best];
  int32_t token = best;
  if (r.temperature > 0.0f && max_l == NegInf()) {
    token = 0;  // every token refused: the lowest id, as greedy would pick
  } else if (r.temperature > 0.0f) {
    const float inv_t = 1.0f / r.temperature;
    auto e_of = [&](int32_t i) { return dev::Exp((l[i] - max_l) * inv_t); };
    const bool cuts = (r.top_k > 0 && r.top_k < V) || r.top_p < 1.0f || r.min_p > 0.0f;
    if (!cuts) {
      // Id order (the host's single pass): the token where the cumulative mass passes u * sum,
      // i.e. the largest y with mass(ids < y) <= u * sum.
      double sum = 0.0;
      for (int32_t i = tid; i < V; i += nt) sum += e_of(i);
      sum = BlockSumD(sum, &s);
      const double target = r.uniform * sum;
      auto mass_below = [&](int64_t y) {
        double m = 0.0;
        for (int32_t i = tid; i < V && i < y; i += nt) m += e_of(i);
        return BlockSumD(m, &s);
      };
      int64_t y = 0;
      for (int bit = id_bits; bit >= 0; --bit) {
        const int64_t c = y | (1ll << bit);
        if (c <= V && mass_below(c) <= target) y = c;
      }
      if (y >= V) {  // rounding: the draw beyond the accumulated sum takes the last token
        uint64_t last = 0;
        for (int32_t i = tid; i < V; i += nt) {
          if (e_of(i) > 0.0f && static_cast<uint64_t>(i) + 1 > last) last = i + 1;
        }
        y = static_cast<int64_t>(BlockMaxU(last, &s)) - 1;
      }
      token = static_cast<int32_t>(y);
    } else {
      // Candidates (e > 0) in key order. top-k: the k-th key; top-p measures against the top-k
      // mass (or all); min-p keeps e >= min_p; top-p the shortest prefix holding top_p of it.
      int32_t count = 0;
      for (int32_t i = tid; i < V; i += nt) count += e_of(i) > 0.0f ? 1 : 0;
      count = BlockSumI(count, &s);
      uint64_t kth = 0;
      if (r.top_k > 0 && r.top_k < count) {
        LargestKey(
            [&](uint64_t b) {
              int32_t c = 0;
              for (int32_t i = tid; i < V; i += nt) c += e_of(i) > 0.0f && Key(l[i], i) >= b;
              return BlockSumI(c, &s) >= r.top_k;
            },
            id_bits, &kth);
      }
      auto in_k = [&](int32_t i, float e) { return e > 0.0f && Key(l[i], i) >= kth; };
      double mass = 0.0;
      for (int32_t i = tid; i < V; i += nt) {
        const float e = e_of(i);
        if (in_k(i, e)) mass += e;
      }
      mass = BlockSumD(mass, &s);
      auto in_min_p = [&](int32_t i, float e) {
        return in_k(i, e) && (r.min_p <= 0.0f || e >= r.min_p);
      };
      auto mass_from = [&](uint64_t b, auto in_set) {
        double m = 0.0;
        for (int32_t i = tid; i < V; i += nt) {
          const float e = e_of(i);
          if (in_set(i, e) && Key(l[i], i) >= b) m += e;
        }
        return BlockSumD(m, &s);
      };
      uint64_t pth = 0;
      if (r.top_p < 1.0f) {
        const double want = static_cast<double>(r.top_p) * mass;
        // None reaching it (rounding): everything min-p kept, as the host does.
        if (!LargestKey([&](uint64_t b) { return mass_from(b, in_min_p) >= want; }, id_bits,
                        &pth)) {
          pth = 0;
        }
      }
      auto kept = [&](int32_t i, float e) { return in_min_p(i, e) && Key(l[i], i) >= pth; };
      const double target = r.uniform * mass_from(0, kept);
      // The first kept token (in key order) where the cumulative mass passes the target.
      uint64_t at = 0;
      if (LargestKey([&](uint64_t b) { return mass_from(b, kept) > target; }, id_bits, &at)) {
        token = IdOf(at);
      } else {  // rounding: the last kept token
        uint64_t lowest = ~0ull;
        for (int32_t i = tid; i < V; i += nt) {
          const uint64_t ki = Key(l[i], i);
          if (kept(i, e_of(i)) && ki < lowest) lowest = ki;
        }
        token = IdOf(~BlockMaxU(~lowest, &s));
      }
    }
  }
  if (tid == 0) {
    out->token = token;
    out->logprob = r.logprobs >= 0 ? raw[token] - log_z : 0.0f;
  }
}

}  // namespace

cudaError_t SampleRows(const SampleArgs& args, cudaStream_t stream) {
  if (args.num_rows == 0 || args.vocab == 0) return cudaSuccess;
  // About 32 tokens per thread and pass, one warp at least, 1024 threads at most.
  int threads = 32;
  while (threads < 1024 && threads * 32 < args.vocab) threads *= 2;
  TANDEM_LAUNCH(SampleRowsKernel, args.num_rows, threads, 0, stream, args);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
