/* Philox4x32-10 counter-based random numbers (Salmon et al., SC'11), shared by the CPU interpreter and the
 * generated CUDA kernels so that a dropout mask is identical bit for bit on both.
 *
 * evt's convention: element i of a tensor drawn with (seed, offset) in a run with RNG step s is stream element
 * j = offset + i. One Philox call gives four stream elements: j uses output word j mod 4 of the call with key =
 * (lo32(seed), hi32(seed)) and counter = (lo32(j / 4), hi32(j / 4), lo32(s), hi32(s)). Its uniform number is
 * the top 24 bits of that word times 2^-24, in [0, 1). Dropout keeps element i when u >= p. So a kernel that
 * draws four consecutive elements starting at a multiple of 4 calls Philox once (evt_philox_uniform4), not four
 * times. The step is a run's, not an op's: a training loop draws step k's masks with s = k (the interpreter:
 * evt_graph_set_rng_step; a GPU program advances its own after every run), so each step gets fresh masks. */
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

/* Ten rounds of Philox4x32 on counter (lo32(counter), hi32(counter), lo32(step), hi32(step)) with key seed:
 * the four output words into w. */
EVT_HOST_DEVICE void evt_philox4x32_10(uint64_t seed, uint64_t counter, uint64_t step, uint32_t w[4]) {
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
  w[0] = c0; w[1] = c1; w[2] = c2; w[3] = c3;
}

/* A Philox word's uniform number: its top 24 bits times 2^-24 (exactly representable in f32). */
EVT_HOST_DEVICE float evt_philox_word_uniform(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

/* The uniform number of element i of the stream (seed, offset) in a run with RNG step `step` (one Philox call
 * per element; evt_philox_uniform4 draws four at once). */
EVT_HOST_DEVICE float evt_philox_uniform(uint64_t seed, uint64_t offset, uint64_t step, uint64_t i) {
  const uint64_t j = offset + i;
  uint32_t w[4];
  evt_philox4x32_10(seed, j >> 2, step, w);
  const uint32_t k = (uint32_t)(j & 3);
  /* (selects, not w[k]: a register array indexed at run time would go to local memory on the GPU) */
  return evt_philox_word_uniform(k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3]);
}

/* Elements i .. i + 3 of the stream, for offset + i a multiple of 4 (one Philox call): u[k] of element i + k. */
EVT_HOST_DEVICE void evt_philox_uniform4(uint64_t seed, uint64_t offset, uint64_t step, uint64_t i, float u[4]) {
  uint32_t w[4];
  evt_philox4x32_10(seed, (offset + i) >> 2, step, w);
  for (int k = 0; k < 4; k++) u[k] = evt_philox_word_uniform(w[k]);
}

#endif
