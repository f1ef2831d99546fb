# WITH_CUDA=AUTO|ON|OFF. AUTO enables CUDA when nvcc is found, also at /usr/local/cuda/bin/nvcc
# when it is not on PATH. CUDA sources are compiled whenever CUDA is enabled, even on machines
# without a GPU; nothing here requires a device at build time.
set(WITH_CUDA "AUTO" CACHE STRING "Build the CUDA backend and NCCL transport: AUTO, ON or OFF")
set_property(CACHE WITH_CUDA PROPERTY STRINGS AUTO ON OFF)

set(TANDEM_HAVE_CUDA OFF)
if(NOT WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(TANDEM_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
    if(TANDEM_NVCC)
      set(CMAKE_CUDA_COMPILER "${TANDEM_NVCC}" CACHE FILEPATH "CUDA compiler" FORCE)
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Ampere (A100) and Hopper (H100/H200) as machine code, plus Blackwell (B200, sm_100) with
      # PTX for later GPUs when this nvcc knows it (CUDA >= 12.8). Never "native": build machines
      # have no GPU.
      set(tandem_cuda_archs "80-real;90")
      execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-arch
                      OUTPUT_VARIABLE tandem_nvcc_archs ERROR_QUIET RESULT_VARIABLE tandem_nvcc_rc)
      if(tandem_nvcc_rc EQUAL 0 AND tandem_nvcc_archs MATCHES "compute_100")
        set(tandem_cuda_archs "80-real;90-real;100")
      endif()
      set(CMAKE_CUDA_ARCHITECTURES "${tandem_cuda_archs}" CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TANDEM_HAVE_CUDA ON)
  elseif(WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WITH_CUDA=ON but no nvcc was found (looked on PATH and /usr/local/cuda/bin)")
  endif()
endif()
message(STATUS "Tandem CUDA backend: ${TANDEM_HAVE_CUDA} (WITH_CUDA=${WITH_CUDA})")

# Test builds only: the CUDA backend and the nccl KV transport compiled against the CPU emulator
# of CUDA and NCCL (common/engine/backend/cuda/emulation), so the GPU serving path runs end to end
# on machines without a GPU (scripts/build_emulated.sh, tests/e2e/gpu_emulated_cluster_test.py).
# Slow, and says so in `tandem --version` and every worker's startup log; never a release binary.
option(TANDEM_GPU_EMULATION "Test builds only: CUDA backend and NCCL on the CPU emulator" OFF)
if(TANDEM_GPU_EMULATION)
  if(TANDEM_HAVE_CUDA)
    message(FATAL_ERROR "TANDEM_GPU_EMULATION=ON needs WITH_CUDA=OFF (it replaces CUDA)")
  endif()
  message(WARNING "TANDEM_GPU_EMULATION=ON: a test build (CUDA and NCCL emulated on the CPU)")
endif()
