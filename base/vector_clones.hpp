// SHARDKIT_VECTOR_CLONES, written before a function whose loop should run at the machine's vector
// width: on x86-64 the compiler emits AVX-512, AVX2 and baseline versions and the loader picks the
// best the CPU has, so one binary runs everywhere. A loop still vectorises only if nothing in it is a
// call the compiler cannot inline (an exported function, from position-independent code) or a branch
// it cannot turn into a select (std::sqrt's errno: compile with -fno-math-errno).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define SHARDKIT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SHARDKIT_VECTOR_CLONES
#endif
