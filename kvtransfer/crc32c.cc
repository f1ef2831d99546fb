#include "kvtransfer/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tandem::kvtransfer {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

// ---------------------------------------------------------------- portable (slicing-by-8)

struct SliceTables {
  uint32_t t[8][256];
  SliceTables() {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n) {
      for (int k = 1; k < 8; ++k) t[k][n] = (t[k - 1][n] >> 8) ^ t[0][t[k - 1][n] & 0xff];
    }
  }
};

const SliceTables& Slices() {
  static const SliceTables tables;
  return tables;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// ---------------------------------------------------------------- shifting a CRC over zeros
// To combine three independently computed streams, the CRC of stream 0 is advanced over the
// length of the next stream (multiplication by x^(8*len) mod P), done with four 256-entry tables
// per length (Mark Adler's method).

constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

uint32_t Gf2MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    ++mat;
  }
  return sum;
}

void Gf2MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2MatrixTimes(mat, mat[n]);
}

// The operator that applies `len` zero bytes to a CRC.
void ZerosOperator(uint32_t* even, size_t len) {
  uint32_t odd[32];
  odd[0] = kPoly;  // operator for one zero bit
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n) {
    odd[n] = row;
    row <<= 1;
  }
  Gf2MatrixSquare(even, odd);  // two zero bits
  Gf2MatrixSquare(odd, even);  // four zero bits
  // Squaring again gives one zero byte, then 2, 4, ... bytes: square until len is consumed.
  do {
    Gf2MatrixSquare(even, odd);
    len >>= 1;
    if (len == 0) return;
    Gf2MatrixSquare(odd, even);
    len >>= 1;
  } while (len);
  std::memcpy(even, odd, sizeof odd);
}

struct ShiftTable {
  uint32_t t[4][256];
  explicit ShiftTable(size_t len) {
    uint32_t op[32];
    ZerosOperator(op, len);
    for (uint32_t n = 0; n < 256; ++n) {
      t[0][n] = Gf2MatrixTimes(op, n);
      t[1][n] = Gf2MatrixTimes(op, n << 8);
      t[2][n] = Gf2MatrixTimes(op, n << 16);
      t[3][n] = Gf2MatrixTimes(op, n << 24);
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

#if defined(__x86_64__)

struct HardwareTables {
  ShiftTable long_shift{kLong};
  ShiftTable short_shift{kShort};
};

const HardwareTables& Hardware() {
  static const HardwareTables tables;
  return tables;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const uint8_t* p, size_t n) {
  const HardwareTables& tables = Hardware();
  uint64_t crc0 = crc ^ 0xffffffffu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc0 = _mm_crc32_u8(static_cast<uint32_t>(crc0), *p++);
    --n;
  }
  // Three streams of kLong bytes at a time: the crc32 instruction has a latency of 3 cycles and
  // a throughput of 1, so three independent chains keep it busy.
  while (n >= 3 * kLong) {
    uint64_t crc1 = 0, crc2 = 0;
    const uint8_t* end = p + kLong;
    do {
      crc0 = _mm_crc32_u64(crc0, Load64(p));
      crc1 = _mm_crc32_u64(crc1, Load64(p + kLong));
      crc2 = _mm_crc32_u64(crc2, Load64(p + 2 * kLong));
      p += 8;
    } while (p < end);
    crc0 = tables.long_shift.Shift(static_cast<uint32_t>(crc0)) ^ crc1;
    crc0 = tables.long_shift.Shift(static_cast<uint32_t>(crc0)) ^ crc2;
    p += 2 * kLong;
    n -= 3 * kLong;
  }
  while (n >= 3 * kShort) {
    uint64_t crc1 = 0, crc2 = 0;
    const uint8_t* end = p + kShort;
    do {
      crc0 = _mm_crc32_u64(crc0, Load64(p));
      crc1 = _mm_crc32_u64(crc1, Load64(p + kShort));
      crc2 = _mm_crc32_u64(crc2, Load64(p + 2 * kShort));
      p += 8;
    } while (p < end);
    crc0 = tables.short_shift.Shift(static_cast<uint32_t>(crc0)) ^ crc1;
    crc0 = tables.short_shift.Shift(static_cast<uint32_t>(crc0)) ^ crc2;
    p += 2 * kShort;
    n -= 3 * kShort;
  }
  while (n >= 8) {
    crc0 = _mm_crc32_u64(crc0, Load64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc0 = _mm_crc32_u8(static_cast<uint32_t>(crc0), *p++);
    --n;
  }
  return static_cast<uint32_t>(crc0) ^ 0xffffffffu;
}

bool DetectSse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#endif

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  const SliceTables& s = Slices();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = crc ^ 0xffffffffu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = s.t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  while (n >= 8) {
    uint64_t w = Load64(p) ^ c;  // little-endian hosts only (x86-64, aarch64)
    c = s.t[7][w & 0xff] ^ s.t[6][(w >> 8) & 0xff] ^ s.t[5][(w >> 16) & 0xff] ^
        s.t[4][(w >> 24) & 0xff] ^ s.t[3][(w >> 32) & 0xff] ^ s.t[2][(w >> 40) & 0xff] ^
        s.t[1][(w >> 48) & 0xff] ^ s.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = s.t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  return c ^ 0xffffffffu;
}

bool Crc32cIsHardware() {
#if defined(__x86_64__)
  static const bool hw = DetectSse42();
  return hw;
#else
  return false;
#endif
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (Crc32cIsHardware()) return Crc32cSse42(crc, static_cast<const uint8_t*>(data), n);
#endif
  return Crc32cPortable(crc, data, n);
}

}  // namespace tandem::kvtransfer
