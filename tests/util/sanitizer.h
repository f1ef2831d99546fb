#pragma once

namespace tandem {

// True in a build instrumented by AddressSanitizer or ThreadSanitizer (scripts/sanitize.sh).
// Tests whose cost is long loops of checks do fewer there (several times slower on CI's two
// cores): that stage checks memory and races, the main suite keeps the full coverage.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

}  // namespace tandem
