/* The CPU interpreter (the oracle): the public evt_interp_run / evt_interp_init_inputs (include/evt.h), and
 * what other modules use of it. */
#ifndef EVT_INTERP_H
#define EVT_INTERP_H

#include "ir/ir.h"

/* (public: evt_interp_run, evt_interp_init_inputs) */
/* Runs one node given its input tensors; `out` is allocated by the callee. */
evt_status evt_interp_node(evt_graph *g, int id, const evt_tensor *const *inputs, evt_tensor *out, unsigned flags);
/* Small accessors for language bindings (tests/python/evt_ctypes.py) that must not mirror evt_node:
 * a node's name and op name (NULL for a bad id), and the id of output i (-1 past the end). */
const char *evt_interp_node_name(const evt_graph *g, int id);
const char *evt_interp_node_op(const evt_graph *g, int id);
int evt_interp_output(const evt_graph *g, int i);

/* The perturbed reference (`evtc run --check`'s fp8 rule, src/compile/gpu_check.c): the product of every GEMM whose
 * two operands are fp8 (mm, bmm; addmm before its bias) is multiplied element-wise by (1 + eps u), u uniform in
 * [-1, 1] from a generator keyed by (seed, node id, element) alone, so the run's own RNG (dropout) is unchanged.
 * It models the limited-precision accumulation of fp8 tensor cores; every other node is computed as usual. */
typedef struct evt_fp8_noise {
  double eps;
  uint64_t seed;
} evt_fp8_noise;
/* evt_interp_run with `noise` on the fp8 GEMMs (NULL: none, exactly evt_interp_run). */
evt_status evt_interp_run_fp8_noise(evt_graph *g, evt_tensor *values, unsigned flags, int keep_all,
                                    const evt_fp8_noise *noise);

#endif
