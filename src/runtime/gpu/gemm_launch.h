/* GEMM+EVT and CONV+EVT groups of a fused plan on the GPU (src/runtime/gpu/gemm_launch.c): loading and launching of
 * the generated CUTLASS kernels (src/codegen/emit_cutlass.c, emit_cutlass_conv.c; ABI kernels/evt_launch.h: a conv's
 * launch carries its GEMM view m, n, k, operands a, b, D and visitor pointers as a GEMM's).
 *
 * Contract
 * - evt_gemm_kernels_load dlopens the compiled object of every distinct GEMM+EVT kernel of the plan (so[k],
 *   src/compile/kernels.c; NULL: it did not compile and its groups are demoted) and looks up its entry
 *   `evt_kernel_<hash>`. A kernel that fails to load demotes every group using it (evt_exec_plan_demote,
 *   reason in the group's `why`). Never fails: an unusable kernel is a fallback, not an error.
 * - evt_gemm_group_run launches fused GEMM group gi with the pointers of its bound tensors (node_ptr(ctx, v)
 *   = device address of graph node v; `scratch` = p->scratch_bytes device bytes for a D nobody reads) on
 *   `stream` (NULL: the default stream, which the fallback library also uses). Before calling the launcher
 *   it checks every pointer for 16-byte alignment. If the launcher returns anything but EVT_LAUNCH_OK (e.g.
 *   EVT_LAUNCH_CANNOT_IMPLEMENT from CUTLASS's can_implement), or a pointer is misaligned, the group is
 *   demoted (evt_exec_plan_demote_group: it runs node by node from then on), one warning naming the group,
 *   its kernel and the launcher's code goes to stderr, and false is returned: the caller then runs the
 *   group's members node by node for this step. A refusal happens before any launch, so nothing was written.
 * Pure C; no CUDA headers (the generated shared objects own every CUDA call). */
#ifndef EVT_RUNTIME_GEMM_LAUNCH_H
#define EVT_RUNTIME_GEMM_LAUNCH_H

#include <stdbool.h>

#include "runtime/gpu/exec_plan.h"

typedef struct evt_gemm_kernels evt_gemm_kernels;
typedef void *(*evt_node_ptr_fn)(void *ctx, int node);

evt_gemm_kernels *evt_gemm_kernels_load(evt_exec_plan *p, char *const *so);
bool evt_gemm_group_run(evt_gemm_kernels *gk, evt_exec_plan *p, int gi, evt_node_ptr_fn node_ptr, void *ctx,
                        void *scratch, void *stream);
/* Distinct GEMM kernels asked for / loaded (for --stats). */
void evt_gemm_kernels_counts(const evt_gemm_kernels *gk, int *wanted, int *loaded);
/* The launcher's return code as text ("cannot implement (CUTLASS can_implement)", ...). */
const char *evt_gemm_launch_status_name(int rc);
void evt_gemm_kernels_free(evt_gemm_kernels *gk);

#endif
