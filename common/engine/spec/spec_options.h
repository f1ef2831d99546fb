#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// Server-wide speculative decoding settings (DESIGN §4 "Speculative decoding").
struct SpecOptions {
  enum class Method { kNone, kNgram, kDraft };
  Method method = Method::kNone;
  int32_t num_speculative_tokens = 4;  // k: drafted tokens per sequence and step at most
  // ngram (prompt lookup): match the last n tokens, n from ngram_max down to ngram_min.
  int32_t ngram_max = 4;
  int32_t ngram_min = 1;
  // draft: a smaller model with the same vocabulary, with its own paged KV.
  std::string draft_model_dir;
  int64_t draft_kv_blocks = 0;  // 0: as many as the target's pool
  // Adaptive k: per sequence, k shrinks while acceptance is low and speculation pauses below
  // min_acceptance (probing again every probe_interval steps).
  bool adaptive = true;
  double min_acceptance = 0.15;
  int32_t probe_interval = 16;
  // TESTING ONLY: accept every drafted token without verification. Exists so the statistical
  // test can prove it detects a broken verifier; never enable it in a server.
  bool testing_always_accept = false;
};

}  // namespace tandem
