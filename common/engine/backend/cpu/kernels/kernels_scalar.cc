// The scalar kernels: the templates instantiated with scalar::Simd. Compiled with this ISA's flags
// only (see CMakeLists.txt); everything it defines is named after scalar::Simd.

#include "common/engine/backend/cpu/kernels/simd_scalar.h"

#include "common/engine/backend/cpu/kernels/kernel_table_impl.h"

namespace tandem::cpu::internal {
namespace {
constexpr KernelTable kScalarTable = impl::MakeKernelTable<scalar::Simd>(SimdLevel::kScalar);
}  // namespace

const KernelTable& ScalarKernels() { return kScalarTable; }

}  // namespace tandem::cpu::internal
