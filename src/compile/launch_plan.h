/* The launch plan of a compiled training step (`evtc compile`): launches, buffers, one arena.
 *
 * Built from a graph, its partition plan and the lowered kernels (src/codegen/lower.h); pure C, no GPU.
 *   launches  one per group, in group order (a topological order of the contracted graph): the kernel
 *             (name and kind, or the reason it is not lowered), the buffers it reads and writes.
 *   buffers   one per tensor that crosses a group boundary or is a graph output, plus graph inputs and
 *             params (bound by the caller, not in the arena) and scratch D tiles of GEMM+EVT kernels that
 *             write no tensor as D. Views of sources are not buffers: their readers read the source's
 *             buffer (the `alias` of a view node points at it). Constants (scalar/full) are compile-time
 *             values and rand is regenerated in-kernel: no buffer.
 *   lifetime  [first, last] launch indices: written by launch `first`, last read by launch `last`; graph
 *             outputs live to the end; inputs and params are external (not placed).
 *   arena     every non-external buffer gets an offset in ONE arena: buffers sorted by size (largest
 *             first), each placed at the lowest-waste gap (best fit) among the already placed buffers whose
 *             lifetimes intersect its own, else on top. Offsets are EVT_ARENA_ALIGN aligned.
 *   bindings  inputs, params, outputs (the loss, gradients) by graph name → buffer.
 * evt_plan_check verifies: no two buffers whose lifetimes intersect share bytes, every buffer a launch
 * touches is live at that launch, every buffer fits the arena.
 */
#ifndef EVT_COMPILE_LAUNCH_PLAN_H
#define EVT_COMPILE_LAUNCH_PLAN_H

#include "codegen/lower.h"
#include "ir/ir.h"

typedef enum evt_buf_kind { EVT_BUF_INPUT = 0, EVT_BUF_PARAM, EVT_BUF_TEMP, EVT_BUF_OUTPUT, EVT_BUF_SCRATCH } evt_buf_kind;

typedef struct evt_plan_buffer {
  int node;              /* graph node whose tensor this is (a scratch D: the GEMM nucleus) */
  evt_buf_kind kind;
  int64_t bytes;
  int first, last;       /* lifetime in launch indices (external: -1, nlaunches) */
  int64_t offset;        /* in the arena; -1 for external buffers */
} evt_plan_buffer;

typedef struct evt_plan_launch {
  int group;
  const evt_lowered *kernel;  /* lowering result of the group (owned by the lowering result) */
  int *reads, nreads;         /* buffer ids */
  int *writes, nwrites;
  int64_t bytes_read, bytes_written;
} evt_plan_launch;

typedef struct evt_plan {
  int nlaunches;
  evt_plan_launch *launches;
  int nbuffers;
  evt_plan_buffer *buffers;
  int *buffer_of;             /* per graph node: its buffer id (views of sources: their source's), or -1 */
  int64_t arena_bytes;        /* size of the arena */
  int64_t naive_bytes;        /* sum of the aligned sizes of every arena buffer (no reuse) */
  int64_t external_bytes;     /* inputs and params */
  int64_t global_bytes;       /* Σ over launches of bytes read + written */
} evt_plan;

/* Builds the plan; EVT_ERR_INVALID if lowered/part do not match g. */
evt_status evt_plan_build(const evt_graph *g, const struct evt_part_plan *part, const evt_lower_result *low, evt_plan *plan);
void evt_plan_free(evt_plan *plan);
/* The invariants above; EVT_OK, or EVT_ERR_INTERNAL with the first violation in err. */
evt_status evt_plan_check(const evt_graph *g, const evt_plan *plan, char *err, size_t errlen);
/* plan.txt: launches (kernel, reads, writes), buffers (offset, bytes, lifetime), bindings, totals. */
void evt_plan_print(const evt_graph *g, const evt_plan *plan, FILE *out);

#endif
