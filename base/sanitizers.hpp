// Whether this build runs under AddressSanitizer, which reserves terabytes of address space for its
// shadow memory at start-up: address-space limits (setrlimit, prlimit) must then be left out.
#pragma once

namespace shardkit {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

}  // namespace shardkit
