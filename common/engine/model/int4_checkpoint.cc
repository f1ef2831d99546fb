#include "common/engine/model/int4_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/half.h"
#include "common/base/status_macros.h"
#include "common/engine/model/safetensors.h"

namespace tandem {
namespace {

// The nibble holding output 8c + i in an AWQ word (the inverse of kAwqOrder).
constexpr int kAwqPosition[8] = {0, 4, 1, 5, 2, 6, 3, 7};

absl::Status Bad(const Checkpoint::TensorRef& ref, const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat(ref.file->path(), ": tensor '", ref.entry->name, "' ", message));
}

absl::Status CheckTensor(const Checkpoint::TensorRef& ref, std::initializer_list<DType> dtypes,
                         const std::vector<int64_t>& shape, const std::string& why) {
  const SafetensorsEntry& e = *ref.entry;
  if (std::find(dtypes.begin(), dtypes.end(), e.dtype) == dtypes.end()) {
    std::vector<std::string> names;
    for (DType d : dtypes) names.push_back(SafetensorsDTypeName(d));
    return Bad(ref, absl::StrCat("has dtype ", SafetensorsDTypeName(e.dtype), ", expected ",
                                 absl::StrJoin(names, " or ")));
  }
  if (e.shape != shape) {
    return Bad(ref, absl::StrCat("has shape ", ShapeString(e.shape), ", expected ",
                                 ShapeString(shape), " (", why, ")"));
  }
  return absl::OkStatus();
}

// Element i of an I32 tensor (the mapping gives no alignment guarantee).
inline uint32_t Word(const SafetensorsEntry& e, int64_t i) {
  uint32_t w;
  std::memcpy(&w, e.data + 4 * i, 4);
  return w;
}

float ScaleAt(const SafetensorsEntry& e, int64_t i) {
  uint16_t h;
  std::memcpy(&h, e.data + 2 * i, 2);
  return e.dtype == DType::kF16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
}

// Act-order: perm[j] = input channel in column j, groups contiguous; empty for the identity.
absl::StatusOr<std::vector<int32_t>> GroupPermutation(const Checkpoint::TensorRef& ref, int64_t K,
                                                      int64_t group, int64_t groups) {
  std::vector<int32_t> g(static_cast<size_t>(K));
  bool identity = true;
  for (int64_t k = 0; k < K; ++k) {
    g[k] = static_cast<int32_t>(Word(*ref.entry, k));
    if (g[k] < 0 || g[k] >= groups) {
      return Bad(ref, absl::StrCat("holds group ", g[k], " at input channel ", k, ", outside [0, ",
                                   groups, ")"));
    }
    identity = identity && g[k] == k / group;
  }
  if (identity) return std::vector<int32_t>();
  std::vector<int32_t> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return g[a] < g[b]; });
  for (int64_t j = 0; j < K; ++j) {
    if (g[perm[j]] != j / group) {
      return Bad(ref, absl::StrCat("does not give every group exactly ", group,
                                   " input channels (group ", j / group, " differs)"));
    }
  }
  return perm;
}

}  // namespace

absl::StatusOr<Int4CheckpointMatrix> ConvertInt4Checkpoint(const CheckpointQuantConfig& config,
                                                           const PackedInt4Refs& refs, int64_t N,
                                                           int64_t K, ThreadPool* pool) {
  const bool awq = config.method == CheckpointQuantMethod::kAwq;
  const int64_t group = config.group_size > 0 ? config.group_size : K;
  if (K % group != 0 || K % 8 != 0) {
    const std::string what =
        absl::StrCat("] projection whose input dimension ", K, " is not a multiple of group_size ",
                     group, " (from ", config.source, ") and of 8");
    return Bad(refs.qweight, absl::StrCat("belongs to a [", N, ", ", K, what));
  }
  if (N % 8 != 0) {
    return Bad(refs.qweight,
               absl::StrCat("belongs to a projection with ", N, " outputs, not a multiple of 8"));
  }
  const int64_t G = K / group;
  const std::string from = absl::StrCat(config.MethodName(), " [", N, ", ", K, "] group ", group);
  TANDEM_RETURN_IF_ERROR(
      CheckTensor(refs.qweight, {DType::kI32},
                  awq ? std::vector<int64_t>{K, N / 8} : std::vector<int64_t>{K / 8, N}, from));
  TANDEM_RETURN_IF_ERROR(CheckTensor(refs.qzeros, {DType::kI32}, {G, N / 8}, from));
  TANDEM_RETURN_IF_ERROR(CheckTensor(refs.scales, {DType::kF16, DType::kBF16}, {G, N}, from));

  Int4CheckpointMatrix out;
  if (!awq && refs.g_idx.entry != nullptr) {
    TANDEM_RETURN_IF_ERROR(CheckTensor(refs.g_idx, {DType::kI32}, {K}, from));
    TANDEM_ASSIGN_OR_RETURN(out.perm, GroupPermutation(refs.g_idx, K, group, G));
  }

  QuantizedMatrix& m = out.matrix;
  m.quant = WeightQuant::kInt4;
  m.rows = N;
  m.cols = K;
  m.group_size = 32;
  while (m.group_size < group) m.group_size *= 2;  // == group unless group_size is -1
  m.scales.resize(static_cast<size_t>(N * G));
  m.zeros.resize(static_cast<size_t>(N * G));
  const SafetensorsEntry& qz = *refs.qzeros.entry;
  const SafetensorsEntry& sc = *refs.scales.entry;
  const int zero_offset = !awq && config.gptq_version == 1 ? 1 : 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      const float s = ScaleAt(sc, g * N + n);
      if (!std::isfinite(s)) {
        return Bad(refs.scales, absl::StrCat("holds a non-finite scale at [", g, ", ", n, "]"));
      }
      const int pos = awq ? kAwqPosition[n % 8] : static_cast<int>(n % 8);
      const int zero =
          static_cast<int>((Word(qz, g * (N / 8) + n / 8) >> (4 * pos)) & 15) + zero_offset;
      if (!awq && config.sym && zero != 8) {
        return Bad(refs.qzeros,
                   absl::StrCat("holds zero point ", zero, " at group ", g, ", output ", n, " but ",
                                config.source, " says sym (zero point 8)"));
      }
      m.scales[n * G + g] = s;
      m.zeros[n * G + g] = static_cast<float>(zero);
    }
  }

  const int64_t row_bytes = Int4RowBytes(K);
  m.codes.assign(static_cast<size_t>(N * row_bytes), 0);
  const SafetensorsEntry& qw = *refs.qweight.entry;
  const int32_t* perm = out.perm.empty() ? nullptr : out.perm.data();
  auto work = [&](int64_t b0, int64_t b1) {  // blocks of 8 output rows
    std::vector<uint8_t> q(static_cast<size_t>(8 * K));
    for (int64_t b = b0; b < b1; ++b) {
      if (awq) {
        for (int64_t k = 0; k < K; ++k) {
          const uint32_t w = Word(qw, k * (N / 8) + b);
          for (int i = 0; i < 8; ++i) q[kAwqOrder[i] * K + k] = (w >> (4 * i)) & 15;
        }
      } else {
        for (int64_t r = 0; r < K / 8; ++r) {
          for (int64_t i = 0; i < 8; ++i) {
            const uint32_t w = Word(qw, r * N + b * 8 + i);
            for (int j = 0; j < 8; ++j) q[i * K + r * 8 + j] = (w >> (4 * j)) & 15;
          }
        }
      }
      for (int64_t i = 0; i < 8; ++i) {
        uint8_t* row = m.codes.data() + (b * 8 + i) * row_bytes;
        const uint8_t* src = q.data() + i * K;
        for (int64_t j = 0; j < K; ++j) {
          const uint8_t v = src[perm != nullptr ? perm[j] : j];
          const int64_t c = j % kInt4Chunk;
          row[j / kInt4Chunk * 16 + (c & 15)] |= c < 16 ? v : static_cast<uint8_t>(v << 4);
        }
      }
    }
  };
  if (pool != nullptr && pool->size() > 1 && N * K > (1 << 16)) {
    pool->ParallelForGrain(N / 8, 4, work);
  } else {
    work(0, N / 8);
  }
  return out;
}

}  // namespace tandem
