/* Named example kernel specs: test fixtures and benchmark inputs (the unit tests, tests/gpu, bench/kernels) and the
 * epilogues `evtc kernel` prints. Not used by the compiler itself. Each builder's comment in examples.c (GEMM) or
 * examples_rows.c (row kernels) says what its spec computes. */
#ifndef EVT_CODEGEN_EXAMPLES_H
#define EVT_CODEGEN_EXAMPLES_H

#include "codegen/kspec.h"
#include "codegen/rspec.h"

/* The named GEMM epilogue into *s (bf16 operands, layout NN, D bf16 unless the example says otherwise; batched for
 * the bmm_* names) with mainloop cfg; EVT_ERR_INVALID for an unknown name. */
evt_status evt_kspec_example(evt_kspec *s, const char *name, evt_tile_config cfg);
extern const char *const evt_kspec_example_names[]; /* NULL-terminated */

/* The fp8 recipe's GEMM into *s (not a named example: the named ones take 16-bit operands): acc = A·B with A of dtype
 * a and B of dtype b (f8e4m3 / f8e5m2), layout NT, f32 accumulation, D (dtype d) = acc · inv_scale, inv_scale an f32
 * rank-0 tensor read at run time (the fp8 pass's 1/(sA·sB)); mainloop 128x128x128 cooperative. */
void evt_kspec_fp8_example(evt_kspec *s, evt_dtype a, evt_dtype b, evt_dtype d);

/* The fp8 recipe's row kernels into *s (nucleus-free; not named examples: those take one storage dtype), f8 the fp8
 * format: "quantize" q = cast(x · scale, f8) (x bf16 M×N, scale an f32 rank-0 tensor); "dequantize" y = q · scale
 * (q f8 M×N, y f32); "amax_rows" m[i] = max_j |x[i, j]| (x bf16, m f32: the first stage of the full-tensor amax, the
 * second the same kernel over m as a 1 x M row). EVT_ERR_INVALID for another name. */
evt_status evt_rspec_fp8_example(evt_rspec *s, const char *name, evt_dtype f8);

/* The named row-kernel spec into *s; dt is the storage dtype of every tensor except the f32 sums. EVT_ERR_INVALID
 * for an unknown name. */
evt_status evt_rspec_example(evt_rspec *s, const char *name, evt_dtype dt);
extern const char *const evt_rspec_example_names[]; /* NULL-terminated */

/* The named spmm spec (nucleus spmm: examples_spmm.c) into *s, dt the dtype of x, of val (unless the builder says f32)
 * and of the stores; "spmm_gcn1" bias + ReLU + dropout, "spmm_gcn2" bias + row max, "spmm_t" A^T dy through perm
 * with a sum over rows, "spmm_i32" i32 indices and f32 values. EVT_ERR_INVALID for an unknown name. */
evt_status evt_rspec_spmm_example(evt_rspec *s, const char *name, evt_dtype dt);
extern const char *const evt_rspec_spmm_example_names[]; /* NULL-terminated */

#endif
