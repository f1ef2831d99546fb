#pragma once

// Host-only stand-ins for the NCCL calls the nccl KV transport makes (kvtransfer/nccl), with the
// real names and signatures, for the GPU emulation build (TANDEM_CUDA_EMULATION). A
// communicator has exactly two ranks joined by one loopback TCP connection, so its ranks may
// live in different processes on one machine (or in one process): ncclGetUniqueId opens a
// listener on 127.0.0.1 and writes its port and a random token into the id; the rank in the
// process that drew the id accepts, the other connects, and both check the token.
// ncclCommInitRankConfig returns at once (nonblocking config) and ncclCommGetAsyncError
// reports ncclInProgress until the connection is up. ncclSend / ncclRecv are queued on the
// stream (fake_cuda's StreamEnqueueAsync) and move bytes of the CUDA emulator's "device"
// memory (host memory) over the connection, in order, each send framed by its size: a recv
// whose size differs from its send's fails the communicator (ncclInvalidUsage), as NCCL
// requires them to match; a failed socket turns the communicator's async error into
// ncclRemoteError. ncclCommAbort shuts the connection down, which unblocks a
// send or receive in progress. Group calls only bracket (sends and receives run in the order
// posted: enough for the transport, where one rank only sends and the other only receives).
// Test builds only: never in a release binary.

#include <cstddef>
#include <cstdint>

#include "common/cuda/emulation/fake_cuda.h"

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclInt8 = 0, ncclUint8 = 1 } ncclDataType_t;

struct ncclComm;
typedef struct ncclComm* ncclComm_t;

typedef struct {
  int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER \
  { 1 }

const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

// Emulator only: ncclSend / ncclRecv calls accepted in this process so far (tests count them).
uint64_t FakeNcclSendCalls();
uint64_t FakeNcclRecvCalls();
