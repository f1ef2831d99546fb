// The device sampler (SampleRows, sampling_kernels.cu) against the host sampler
// (common/engine/sampler): the processed rows bit for bit, greedy tokens and logprobs, draws with
// every cut (the same token as the host's for the same uniform except within rounding of a
// boundary, always one the host could draw), the statistical checks of the host sampler's tests
// run on the device's draws, and reproducibility.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/engine/backend/cuda/kernels.h"
#include "common/engine/backend/cuda/sample_inputs.h"
#include "common/engine/sampler/device_sample.h"
#include "common/engine/sampler/sampler.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::gpu_testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class CudaSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_REQUIRE_GPU(); }

  struct Run {
    std::vector<DeviceSample> samples;
    std::vector<float> work;  // the processed rows
  };

  // Samples `rows` over the raw rows `logits` ([*, vocab]) on the device.
  Run Sample(const std::vector<float>& logits, int32_t vocab,
             const std::vector<DeviceSampleRow>& rows) {
    const cuda::SampleLayout layout = cuda::LayoutSampleInputs(rows, vocab);
    std::vector<uint8_t> packed(layout.end);
    cuda::PackSampleInputs(rows, vocab, layout, packed.data());
    DeviceArray<uint8_t> inputs(packed);
    DeviceArray<float> dlogits(logits), work(rows.size() * vocab);
    DeviceArray<cuda::SampleOutput> out(rows.size());
    work.Poison();
    out.Poison();
    cuda::SampleArgs args = cuda::SampleArgsAt(layout, inputs.get(), rows.size(), vocab);
    args.logits = dlogits.get();
    args.work = work.get();
    args.out = out.get();
    EXPECT_EQ(cuda::SampleRows(args, nullptr), cudaSuccess);
    Run run;
    const std::vector<cuda::SampleOutput> got = out.Download();
    for (size_t i = 0; i < rows.size(); ++i) {
      run.samples.push_back(cuda::ToDeviceSample(got[i], rows[i], vocab));
    }
    run.work = work.Download();
    return run;
  }
};

// Equal when both are the same infinity, else within 1e-5.
void ExpectLogprob(float got, float want, const std::string& what) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-5) << what;
  }
}

std::vector<float> RandomLogits(int32_t n, std::mt19937& rng, bool masked, bool ties) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(n);
  for (float& x : l) x = ties ? std::round(normal(rng)) : normal(rng);
  if (masked) {
    for (int32_t i = 0; i < n; ++i) {
      if (rng() % 3 == 0) l[i] = kNegInf;
    }
  }
  if (ties && n > 3) l[1] = -0.0f, l[2] = 0.0f;  // -0 and +0 are equal logits
  return l;
}

// A row with every kind of processing: bias (a token twice), min_tokens masking, both penalties,
// and a grammar-like mask that refuses most tokens, with a revived end-of-sequence id.
DeviceSampleRow ProcessedRow(int32_t vocab, std::mt19937& rng, bool with_mask) {
  SamplingParams p;
  p.logit_bias = {{static_cast<int32_t>(rng() % vocab), 2.5f},
                  {static_cast<int32_t>(rng() % vocab), -1.25f},
                  {0, 0.75f},
                  {0, 0.5f}};
  p.min_tokens = 3;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.3f;
  std::vector<int32_t> prompt, output;
  for (int i = 0; i < 12; ++i) prompt.push_back(static_cast<int32_t>(rng() % vocab));
  for (int i = 0; i < 2; ++i) output.push_back(static_cast<int32_t>(rng() % vocab));
  output.push_back(output[0]);
  const std::vector<int32_t> stop = {vocab - 1, static_cast<int32_t>(rng() % vocab)};
  DeviceSampleRow row;
  BuildLogitEdits(p, {prompt, output}, stop, vocab, &row.edits);
  if (with_mask) {
    row.mask.allowed.assign((vocab + 63) / 64, 0);
    for (int32_t i = 0; i < vocab; ++i) {
      if (rng() % 4 == 0) row.mask.allowed[i / 64] |= uint64_t{1} << (i % 64);
    }
    row.mask.allowed[(vocab - 1) / 64] |= uint64_t{1} << ((vocab - 1) % 64);
    row.mask.revive = {vocab - 1};
  }
  return row;
}

TEST_F(CudaSamplingTest, ProcessingAndGreedyMatchTheHostBitForBit) {
  std::mt19937 rng(11);
  for (int32_t vocab : {5, 100, 1000, 5000}) {
    std::vector<float> logits;
    std::vector<DeviceSampleRow> rows;
    for (int r = 0; r < 6; ++r) {
      const std::vector<float> l = RandomLogits(vocab, rng, r % 2 == 1, r % 3 == 0);
      logits.insert(logits.end(), l.begin(), l.end());
      DeviceSampleRow row = r < 4 ? ProcessedRow(vocab, rng, r % 2 == 0) : DeviceSampleRow{};
      row.logit_row = r;
      row.logprobs = r == 5 ? 0 : std::min(r * 4, 20);
      rows.push_back(row);
    }
    const Run run = Sample(logits, vocab, rows);
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> want(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      ApplyLogitEdits(rows[r].edits, want.data());
      ApplyTokenMask(rows[r].mask, want.data(), vocab);
      for (int32_t i = 0; i < vocab; ++i) {
        const float got = run.work[r * vocab + i];
        ASSERT_TRUE(std::memcmp(&got, &want[i], sizeof got) == 0)
            << "vocab " << vocab << " row " << r << " token " << i << ": " << got << " vs "
            << want[i];
      }
      const DeviceSample host = SampleRowOnHost(rows[r], logits.data() + r * vocab, vocab);
      const DeviceSample& dev = run.samples[r];
      EXPECT_EQ(dev.token, host.token) << "vocab " << vocab << " row " << r;
      EXPECT_EQ(dev.chosen.id, host.chosen.id);
      ExpectLogprob(dev.chosen.logprob, host.chosen.logprob, "chosen");
      ASSERT_EQ(dev.top.size(), host.top.size());
      for (size_t j = 0; j < dev.top.size(); ++j) {
        EXPECT_EQ(dev.top[j].id, host.top[j].id) << "vocab " << vocab << " row " << r;
        ExpectLogprob(dev.top[j].logprob, host.top[j].logprob, "top");
      }
    }
  }
}

TEST_F(CudaSamplingTest, EveryTokenRefusedGivesTokenZero) {
  const std::vector<float> none(7, kNegInf);
  for (float t : {0.0f, 1.0f}) {
    DeviceSampleRow row;
    row.temperature = t;
    row.top_p = t > 0 ? 0.5f : 1.0f;
    row.uniform = 0.7;
    EXPECT_EQ(Sample(none, 7, {row}).samples[0].token, 0) << "temperature " << t;
  }
}

TEST_F(CudaSamplingTest, DrawsAreTheHostsForTheSameUniform) {
  // Every cut on random rows (ties, masked tokens): the device's token is one the host's
  // distribution keeps, and the host's own draw for the same uniform except within rounding
  // of a boundary of the cumulative sum.
  std::mt19937 rng(3);
  int rows_checked = 0, differ = 0;
  for (int32_t vocab : {5, 100, 3000}) {
    for (int trial = 0; trial < 4; ++trial) {
      const std::vector<float> l = RandomLogits(vocab, rng, trial % 2 == 1, trial % 3 == 2);
      std::vector<DeviceSampleRow> rows;
      for (int32_t top_k : {0, 1, 7, 300}) {
        for (float top_p : {1.0f, 0.3f, 0.9f}) {
          for (float min_p : {0.0f, 0.05f}) {
            for (int u = 0; u < 3; ++u) {
              DeviceSampleRow row;
              row.temperature = trial % 2 ? 0.7f : 1.3f;
              row.top_k = top_k;
              row.top_p = top_p;
              row.min_p = min_p;
              row.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
              rows.push_back(row);
            }
          }
        }
      }
      const Run run = Sample(l, vocab, rows);
      for (size_t i = 0; i < rows.size(); ++i) {
        const DeviceSampleRow& row = rows[i];
        SamplingParams p;
        p.temperature = row.temperature;
        p.top_k = row.top_k;
        p.top_p = row.top_p;
        p.min_p = row.min_p;
        const TokenDistribution d = ComputeDistribution(p, l.data(), vocab);
        const int32_t got = run.samples[i].token;
        EXPECT_GT(d.ProbOf(got), 0.0f) << "vocab " << vocab << " k " << row.top_k << " p "
                                       << row.top_p << " min_p " << row.min_p;
        differ += got != SampleRowOnHost(row, l.data(), vocab).token;
        ++rows_checked;
      }
    }
  }
  EXPECT_EQ(rows_checked, 3 * 4 * 4 * 3 * 2 * 3);
  EXPECT_LE(differ, 2);
  std::printf("%d of %d draws differ from the host's for the same uniform\n", differ, rows_checked);
}

class CudaSamplingStatsTest : public CudaSamplingTest {
 public:
  // Draws of `row` over one raw row on the device, their uniforms from Rng(seed).
  std::vector<int32_t> Draws(const std::vector<float>& l, DeviceSampleRow row, int n,
                             uint64_t seed) {
    Rng rng(seed);
    std::vector<DeviceSampleRow> rows(n, row);
    for (DeviceSampleRow& r : rows) r.uniform = rng.Uniform();
    const Run run = Sample(l, static_cast<int32_t>(l.size()), rows);
    std::vector<int32_t> tokens;
    for (const DeviceSample& s : run.samples) tokens.push_back(s.token);
    return tokens;
  }
};

// Chi-square of `tokens` against the host's distribution for `row`.
double ChiSquare(const std::vector<int32_t>& tokens, const std::vector<float>& l,
                 const DeviceSampleRow& row, int* dof) {
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_k = row.top_k;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  const TokenDistribution d = ComputeDistribution(p, l.data(), static_cast<int32_t>(l.size()));
  std::map<int32_t, int> counts;
  for (int32_t t : tokens) ++counts[t];
  double chi2 = 0;
  for (const auto& [id, c] : counts) {
    if (d.ProbOf(id) == 0.0f) return 1e9;  // a token the host never draws
  }
  for (size_t i = 0; i < d.ids.size(); ++i) {
    const double expected = tokens.size() * static_cast<double>(d.probs[i]);
    const double c = counts[d.ids[i]];
    chi2 += (c - expected) * (c - expected) / expected;
  }
  *dof = static_cast<int>(d.ids.size()) - 1;
  return chi2;
}

TEST_F(CudaSamplingStatsTest, DrawsFollowTheHostsDistribution) {
  // The host sampler's statistical checks (sampler_test, sampler_selection_test) on device draws:
  // a softmax with temperature and two masked tokens, and each cut. Critical values: p = 0.001.
  const std::vector<float> l = {0.5f, kNegInf, 1.5f, 0.0f, kNegInf, -1.0f, 1.0f, -0.5f};
  const double kCritical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46};
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  for (const Case& c :
       {Case{1.0f, 0, 1.0f, 0.0f}, Case{0.7f, 0, 1.0f, 0.0f}, Case{1.0f, 3, 1.0f, 0.0f},
        Case{1.0f, 0, 0.8f, 0.0f}, Case{1.3f, 0, 1.0f, 0.2f}, Case{1.0f, 4, 0.9f, 0.1f}}) {
    DeviceSampleRow row;
    row.temperature = c.temperature;
    row.top_k = c.top_k;
    row.top_p = c.top_p;
    row.min_p = c.min_p;
    const std::vector<int32_t> tokens = Draws(l, row, 1500, 7);
    int dof = 0;
    const double chi2 = ChiSquare(tokens, l, row, &dof);
    ASSERT_GE(dof, 1);
    EXPECT_LT(chi2, kCritical[dof]) << "temperature " << c.temperature << " k " << c.top_k << " p "
                                    << c.top_p << " min_p " << c.min_p;
  }
}

TEST_F(CudaSamplingStatsTest, SeededDrawsAreReproducible) {
  const std::vector<float> l = {1.0f, 0.0f, 2.0f, -0.5f, 0.5f};
  DeviceSampleRow row;
  row.temperature = 1.0f;
  row.top_p = 0.95f;
  const std::vector<int32_t> a = Draws(l, row, 300, 42), b = Draws(l, row, 300, 42);
  const std::vector<int32_t> c = Draws(l, row, 300, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

}  // namespace
}  // namespace tandem::gpu_testing
