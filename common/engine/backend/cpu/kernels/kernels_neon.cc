// The NEON kernels: the templates instantiated with neon::Simd (aarch64 Advanced SIMD, the
// baseline of the architecture). Everything it defines is named after neon::Simd.

#include "common/engine/backend/cpu/kernels/simd_neon.h"

#include "common/engine/backend/cpu/kernels/kernel_table_impl.h"

namespace tandem::cpu::internal {
namespace {
constexpr KernelTable kNeonTable = impl::MakeKernelTable<neon::Simd>(SimdLevel::kNeon);
}  // namespace

const KernelTable& NeonKernels() { return kNeonTable; }

}  // namespace tandem::cpu::internal
