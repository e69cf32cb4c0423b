/* The CUTLASS emitter's shared pieces (internal to src/codegen/; the contract is evt_emit_cutlass in kspec.h).
 * emit_cutlass.c: the banner, types, visitor tree and collectives; emit_cutlass_launch.c: the nested fusion
 * Arguments and the extern "C" launchers. */
#ifndef EVT_CODEGEN_EMIT_CUTLASS_INTERNAL_H
#define EVT_CODEGEN_EMIT_CUTLASS_INTERNAL_H

#include "codegen/kspec.h"
#include "ir/ir.h"

typedef evt_sbuf sbuf;
#define sb_printf evt_sbuf_printf

/* The CUTLASS element type of a dtype. */
static inline const char *cxx_type(evt_dtype t) {
  switch (t) {
    case EVT_BF16: return "cutlass::bfloat16_t";
    case EVT_F16: return "cutlass::half_t";
    case EVT_BOOL: return "uint8_t";
    default: return "float";
  }
}

/* Row sums (Σ over M) of an unbatched kernel with atomic reductions use the project's node
 * (kernels/evt_visitor_nodes.h: Sm90RowReduction keeps its sums in local memory in ping-pong kernels); the
 * deterministic workspace mode, batched kernels and stream-K keep CUTLASS's. */
static inline int own_row_sum(const evt_kspec *s) {
  return !s->batched && s->cfg.reduction == EVT_RED_ATOMIC && !s->cfg.stream_k;
}

/* The topological visitor's ops: outside subtrees and region nodes, in a topological order. */
typedef struct topo_ops {
  int n;
  int node[EVT_KSPEC_MAX_NODES];    /* node id of op k */
  int subtree[EVT_KSPEC_MAX_NODES]; /* 1: op k is the whole tree T<node>; 0: the bare region node N<node> */
} topo_ops;

/* emit_cutlass.c, shared with emit_cutlass_sm80.c: the functor of a compute node (NULL for other nodes); the
 * topological visitor's ops of t (none when t has no shared region) and op k's index of a node; the spec's text
 * as banner comment lines. */
const char *evt_cutlass_compute_fn(evt_vop op);
void evt_cutlass_topo_ops(const evt_vtree *t, topo_ops *o);
int evt_cutlass_topo_index(const topo_ops *o, int node);
void evt_cutlass_banner_spec(sbuf *b, const evt_kspec *s);

/* One node's own launch Arguments (the emitter's choice per CUTLASS generation), then `,` unless last. */
typedef void (*evt_node_args_fn)(sbuf *b, const evt_vtree *t, int v, int last);
/* emit_cutlass_launch.c: the nested Arguments of tree node v (Sm90EVT / Sm80EVT: {children..., node}; the
 * topological visitor lists its ops), each node's own through node_args. */
void evt_emit_tree_args(sbuf *b, const evt_vtree *t, int v, const topo_ops *o, int depth, int last, evt_node_args_fn node_args);

/* emit_cutlass_launch.c: `extern "C" int <name>(const evt_launch_args *)` (batched or not; with the launch cache's
 * state for specs without sums), after the namespace evt_gen_<hash> that holds the kernel's types. */
void evt_emit_cutlass_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash);

/* emit_cutlass_sm80_launch.c: the launcher of an sm_8x spec (batched or not), after its namespace. */
void evt_emit_cutlass_sm80_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash);

#endif
