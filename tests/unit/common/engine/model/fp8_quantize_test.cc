// fp8 e4m3 weights made at load time (common/base/quant.h, common/engine/model/quantize.h): the
// code conversion against an independent decoding of the format (every code), round trips of
// every representable value, round-to-nearest-even at every midpoint, saturation, and the
// per-row scale (max |w| / 448).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/base/quant.h"
#include "common/engine/model/model.h"
#include "common/engine/model/quantize.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

// E4M3FN from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m / 8 * 2^-6); S.1111.111 is NaN; no infinities.
double ReferenceValue(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) != 0 ? -mag : mag;
}

bool IsNan(uint8_t c) { return (c & 0x7f) == 0x7f; }

TEST(Fp8QuantizeTest, ValuesMatchTheFormatDefinition) {
  for (int c = 0; c < 256; ++c) {
    if (IsNan(static_cast<uint8_t>(c))) continue;
    const double want = ReferenceValue(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(Fp8E4M3Value(static_cast<uint8_t>(c))), want) << "code " << c;
    EXPECT_EQ(static_cast<double>(Fp8E4M3ValueScaled(static_cast<uint8_t>(c))),
              std::ldexp(want, -8))
        << "code " << c;
  }
  EXPECT_EQ(Fp8E4M3Value(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3Value(0x01), std::ldexp(1.0f, -9));
}

// Every representable value (both signs, subnormals, zero) encodes back to its own code.
TEST(Fp8QuantizeTest, EveryRepresentableValueRoundTrips) {
  int checked = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if (IsNan(code)) continue;
    EXPECT_EQ(Fp8E4M3Code(Fp8E4M3Value(code)), code) << "code " << c;
    ++checked;
  }
  EXPECT_EQ(checked, 254);
}

// Between two neighbouring codes: values below the midpoint go down, above it up, the midpoint
// itself to the even code (mantissa's last bit 0); past 448 (and NaN, inf) saturate to +-448.
TEST(Fp8QuantizeTest, RoundsToNearestEvenAndSaturates) {
  for (int c = 0; c < 0x7e; ++c) {
    for (uint8_t sign : {uint8_t{0}, uint8_t{0x80}}) {
      const auto lo = static_cast<uint8_t>(c | sign), hi = static_cast<uint8_t>((c + 1) | sign);
      const float a = Fp8E4M3Value(lo), b = Fp8E4M3Value(hi);
      const float mid = (a + b) / 2;  // exact: a and b differ in their last few bits only
      ASSERT_EQ(static_cast<double>(mid), (ReferenceValue(lo) + ReferenceValue(hi)) / 2);
      EXPECT_EQ(Fp8E4M3Code(mid), (c & 1) == 0 ? lo : hi) << "midpoint after code " << int{lo};
      EXPECT_EQ(Fp8E4M3Code(std::nextafter(mid, a)), lo) << "below midpoint after " << int{lo};
      EXPECT_EQ(Fp8E4M3Code(std::nextafter(mid, b)), hi) << "above midpoint after " << int{lo};
    }
  }
  EXPECT_EQ(Fp8E4M3Code(463.9f), 0x7e);
  EXPECT_EQ(Fp8E4M3Code(1e30f), 0x7e);
  EXPECT_EQ(Fp8E4M3Code(-1e30f), 0xfe);
  EXPECT_EQ(Fp8E4M3Code(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(Fp8E4M3Code(std::numeric_limits<float>::quiet_NaN()), 0x7e);
  EXPECT_EQ(Fp8E4M3Code(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(Fp8E4M3Code(std::ldexp(1.5f, -10)), 0x01);
}

// Quantize: one scale per row, max |w| / 448 (1 for an all-zero row); each code is the e4m3 code
// of w / scale; DequantizeRow gives e4m3(q) * scale, the value the kernels use.
TEST(Fp8QuantizeTest, QuantizesRowsWithPerChannelScales) {
  const int64_t N = 3, K = 70;
  std::vector<float> w(N * K);
  for (int64_t k = 0; k < K; ++k) {
    w[k] = std::sin(0.37f * static_cast<float>(k)) * 3.0f;
    w[K + k] = 0.0f;
    w[2 * K + k] = static_cast<float>(k) * -1e-3f;
  }
  const QuantizedMatrix m = Quantize(
      WeightQuant::kFp8, N, K, 0,
      [&](int64_t n, float* row) { std::memcpy(row, w.data() + n * K, K * sizeof(float)); },
      nullptr);
  ASSERT_EQ(m.quant, WeightQuant::kFp8);
  ASSERT_EQ(m.codes.size(), static_cast<size_t>(N * K));
  ASSERT_EQ(m.scales.size(), static_cast<size_t>(N));
  EXPECT_TRUE(m.zeros.empty());
  for (int64_t n = 0; n < N; ++n) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    EXPECT_EQ(m.scales[n], s) << "row " << n;
    std::vector<float> dq(K);
    DequantizeRow(WeightQuant::kFp8, m.codes.data() + n * K, m.scales.data() + n, nullptr, K, 0,
                  dq.data());
    bool has_max = false;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t q = m.codes[n * K + k];
      EXPECT_EQ(q, Fp8E4M3Code(w[n * K + k] / s)) << n << "," << k;
      EXPECT_EQ(dq[k], Fp8E4M3Value(q) * s) << n << "," << k;
      // Relative error at most half a step of the 3-bit mantissa (subnormals: half of 2^-9 s).
      EXPECT_LE(std::fabs(dq[k] - w[n * K + k]),
                std::max(std::fabs(w[n * K + k]) / 16.0f, std::ldexp(s, -10)) * 1.0001f)
          << n << "," << k;
      has_max |= (q & 0x7f) == 0x7e;
    }
    EXPECT_EQ(has_max, amax > 0.0f) << "the largest |w| maps to +-448, row " << n;
  }
  // fp8 has no tiles: ToTiles16 leaves it in rows.
  QuantizedMatrix t = m;
  ToTiles16(&t);
  EXPECT_EQ(t.layout, WeightLayout::kRows);
  EXPECT_EQ(t.codes, m.codes);
}

TEST(Fp8QuantizeTest, ParsesTheFlagValue) {
  WeightQuant q = WeightQuant::kNone;
  ASSERT_TRUE(ParseWeightQuant("fp8", &q));
  EXPECT_EQ(q, WeightQuant::kFp8);
  EXPECT_EQ(WeightQuantName(q), "fp8");
  EXPECT_FALSE(ParseWeightQuant("FP8", &q));
}

// The model id (the KV handshakes' and the KV tiers' key) tells fp8 weights from every other
// format of the same checkpoint; projections and lm_head are fp8, the embedding stays dense.
TEST(Fp8QuantizeTest, LoadedModelIsFp8WithItsOwnModelId) {
  const std::string dir = TestSourceDir() + "/models/stories260k";
  std::set<std::string> ids;
  for (WeightQuant q :
       {WeightQuant::kNone, WeightQuant::kInt8, WeightQuant::kInt4, WeightQuant::kFp8}) {
    LoadOptions o;
    o.quantization = q;
    auto m = LoadModel(dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    ids.insert((*m)->model_id());
    if (q != WeightQuant::kFp8) continue;
    EXPECT_NE((*m)->model_id().find("-fp8-"), std::string::npos) << (*m)->model_id();
    EXPECT_EQ((*m)->quantization(), WeightQuant::kFp8);
    const ModelWeights& w = (*m)->weights();
    EXPECT_EQ(w.lm_head.quant, WeightQuant::kFp8);
    EXPECT_EQ(w.embed_tokens.quant, WeightQuant::kNone);
    for (const Tensor* t : {&w.layers[0].q_proj, &w.layers[0].down_proj}) {
      EXPECT_EQ(t->quant, WeightQuant::kFp8);
      EXPECT_EQ(t->layout, WeightLayout::kRows);
      EXPECT_EQ(t->stored_bytes(), static_cast<size_t>(t->rows() * (t->cols() + 4)));
    }
    // kTiles16 asked for (the int8-input layout) still gives rows: fp8 has no tiles.
    o.quant_layout = WeightLayout::kTiles16;
    auto tiled = LoadModel(dir, o);
    ASSERT_TRUE(tiled.ok()) << tiled.status();
    EXPECT_EQ((*tiled)->quant_layout(), WeightLayout::kRows);
  }
  EXPECT_EQ(ids.size(), 4u);
}

}  // namespace
}  // namespace tandem
