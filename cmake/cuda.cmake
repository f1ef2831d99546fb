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
      # Hopper (H100/H200) and Ampere (A100). Never "native": build machines have no GPU.
      set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TANDEM_HAVE_CUDA ON)
  elseif(WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WITH_CUDA=ON but no nvcc was found (looked on PATH and /usr/local/cuda/bin)")
  endif()
endif()
message(STATUS "Tandem CUDA backend: ${TANDEM_HAVE_CUDA} (WITH_CUDA=${WITH_CUDA})")
