// The avx512 kernels: the templates instantiated with avx512::Simd. Compiled with this ISA's flags
// only (see CMakeLists.txt); everything it defines is named after avx512::Simd.

#include "common/engine/backend/cpu/kernels/simd_avx512.h"

#include "common/engine/backend/cpu/kernels/kernel_table_impl.h"

namespace tandem::cpu::internal {
namespace {
constexpr KernelTable kAvx512Table = impl::MakeKernelTable<avx512::Simd>(SimdLevel::kAvx512);
}  // namespace

const KernelTable& Avx512Kernels() { return kAvx512Table; }

}  // namespace tandem::cpu::internal
