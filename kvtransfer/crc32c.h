#pragma once

// CRC32C (Castagnoli), the checksum of every TCP DATA message. Uses the SSE4.2 crc32
// instruction on three interleaved streams when the CPU has it (about 8 bytes per cycle),
// slicing-by-8 tables otherwise. Results are identical on every path.

#include <cstddef>
#include <cstdint>

namespace tandem::kvtransfer {

// Extends `crc` (the CRC of the bytes before; 0 for none) over data[0, n). Chaining calls over
// consecutive pieces gives the CRC of their concatenation.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

// The portable path, exposed for tests and for comparison in benchmarks.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

// True when Crc32c uses the SSE4.2 path.
bool Crc32cIsHardware();

}  // namespace tandem::kvtransfer
