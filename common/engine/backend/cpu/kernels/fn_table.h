#pragma once

// Function-pointer tables of the kernel templates (tile shapes chosen at run time).

#include <cstddef>

namespace tandem::cpu::impl {

// A table of kernel function pointers. Named after the ISA's Simd type and indexed as a plain
// array (no std::array::operator[]), so that no function shared with another ISA's file is
// emitted, even at -O0.
template <class S, class Fn, size_t N>
struct FnTable {
  Fn fn[N];
};

}  // namespace tandem::cpu::impl
