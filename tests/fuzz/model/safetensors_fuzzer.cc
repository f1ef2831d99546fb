// Fuzzes the safetensors header parser (ParseSafetensors) on whole files held in memory. Checked
// for every file it accepts: each tensor's bytes lie inside the data region (all are read, so a
// sanitizer sees any overflow), match its shape and dtype, and no two tensors overlap.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/engine/model/safetensors.h"

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A private copy of exactly `size` bytes, so reads past the end are caught.
  std::vector<uint8_t> file(data, data + size);
  auto header = tandem::ParseSafetensors(file.data(), file.size(), "fuzz.safetensors");
  if (!header.ok()) return 0;
  FUZZ_CHECK(header->data_start >= 8 && header->data_start <= size);
  const uint8_t* region = file.data() + header->data_start;
  const uint64_t region_size = size - header->data_start;
  uint64_t prev_end = 0;
  uint8_t sum = 0;
  for (const tandem::SafetensorsEntry& e : header->entries) {
    FUZZ_CHECK(e.begin <= e.end && e.end <= region_size);
    FUZZ_CHECK(e.data == region + e.begin);
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      FUZZ_CHECK(d >= 0);
      numel *= static_cast<uint64_t>(d);
    }
    FUZZ_CHECK(numel * tandem::DTypeSize(e.dtype) == e.nbytes());
    if (e.begin != e.end) {
      FUZZ_CHECK(e.begin >= prev_end);
      prev_end = e.end;
    }
    for (size_t i = 0; i < e.nbytes(); ++i) sum += e.data[i];
    FUZZ_CHECK(header->Find(e.name) != nullptr);
  }
  volatile uint8_t sink = sum;
  (void)sink;
  return 0;
}
