/* Philox4x32-10 counter-based random numbers (Salmon et al., SC'11), shared by the CPU interpreter and the
 * generated CUDA kernels so that a dropout mask is identical bit for bit on both.
 *
 * evt's convention: element i of a tensor drawn with (seed, offset) in a run with RNG step s uses key =
 * (lo32(seed), hi32(seed)) and counter = (lo32(offset + i), hi32(offset + i), lo32(s), hi32(s)); its uniform
 * number is the top 24 bits of the first output word times 2^-24, in [0, 1). Dropout keeps element i when
 * u >= p. The step is a run's, not an op's: a training loop draws step k's masks with s = k (the interpreter:
 * evt_graph_set_rng_step; a GPU program advances its own after every run), so each step gets fresh masks and
 * step 0 draws what evt drew before the step existed. */
#ifndef EVT_PHILOX_H
#define EVT_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define EVT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EVT_HOST_DEVICE static inline
#endif

EVT_HOST_DEVICE uint32_t evt_philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

/* Ten rounds; returns the first of the four output words (the only one evt uses). */
EVT_HOST_DEVICE uint32_t evt_philox4x32_10_word0(uint64_t seed, uint64_t counter, uint64_t step) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = (uint32_t)step, c3 = (uint32_t)(step >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = evt_philox_mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = evt_philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

/* Uniform in [0, 1) with 24 random bits: exactly representable in f32. */
EVT_HOST_DEVICE float evt_philox_uniform(uint64_t seed, uint64_t offset, uint64_t step, uint64_t i) {
  return (float)(evt_philox4x32_10_word0(seed, offset + i, step) >> 8) * (1.0f / 16777216.0f);
}

#endif
