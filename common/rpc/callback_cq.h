#pragma once

namespace tandem {

// Keeps gRPC's process-wide callback completion queue alive for the life of the process.
//
// gRPC 1.51 on Linux runs client callback reactors on one shared "alternative" completion queue
// with its own threads, reference-counted by the channels that made callback calls. When the
// last such channel is destroyed inside one of that queue's callbacks (a reactor's OnDone
// dropping the last reference to a worker's channel), gRPC shuts the queue down and frees it
// under the thread still running the callback: a double free. Every process that makes
// callback calls pins the queue once, before its first channel; later calls are no-ops.
void PinCallbackCompletionQueue();

}  // namespace tandem
