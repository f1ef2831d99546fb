// The avx2 kernels: the templates instantiated with avx2::Simd. Compiled with this ISA's flags
// only (see CMakeLists.txt); everything it defines is named after avx2::Simd.

#include "common/engine/backend/cpu/kernels/simd_avx2.h"

#include "common/engine/backend/cpu/kernels/kernel_table_impl.h"

namespace tandem::cpu::internal {
namespace {
constexpr KernelTable kAvx2Table = impl::MakeKernelTable<avx2::Simd>(SimdLevel::kAvx2);
}  // namespace

const KernelTable& Avx2Kernels() { return kAvx2Table; }

}  // namespace tandem::cpu::internal
