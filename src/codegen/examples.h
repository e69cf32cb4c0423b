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

/* The named row-kernel spec into *s; dt is the storage dtype of every tensor except the f32 sums. EVT_ERR_INVALID
 * for an unknown name. */
evt_status evt_rspec_example(evt_rspec *s, const char *name, evt_dtype dt);
extern const char *const evt_rspec_example_names[]; /* NULL-terminated */

#endif
