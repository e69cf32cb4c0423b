// CUDA_CHECK(call): a failed CUDA runtime call prints where and why, and exits 2 (the GPU check programs' setup
// errors, apart from the checks' own ok / FAIL lines). C and C++.
#ifndef EVT_CUDA_CHECK_H
#define EVT_CUDA_CHECK_H

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(x)                                                                            \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                                   \
    }                                                                                            \
  } while (0)

#endif
