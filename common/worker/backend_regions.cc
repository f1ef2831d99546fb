#include "common/worker/backend_regions.h"

#if defined(TANDEM_HAVE_CUDA)
#include "common/engine/backend/cuda/cuda_backend.h"
#endif

namespace tandem {

uint8_t* BackendRegions::Region(int64_t layer, int32_t block) {
#if defined(TANDEM_HAVE_CUDA)
  if (device_memory_) return CudaDeviceBlockRegion(backend_, layer, block);
#endif
  return backend_->HostBlockRegion(layer, block);
}

void* BackendRegions::LayerReadyEvent(int64_t layer) {
#if defined(TANDEM_HAVE_CUDA)
  if (device_memory_) return CudaKvLayerReadyEvent(backend_, layer);
#endif
  return nullptr;
}

}  // namespace tandem
