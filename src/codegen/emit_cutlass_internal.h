/* The CUTLASS emitters' shared pieces (internal to src/codegen/; the contract is evt_emit_cutlass in kspec.h).
 * Two generations: Sm90 (emit_cutlass.c: banner, types, nodes, collectives; emit_cutlass_launch.c: launchers) and
 * Sm80 (emit_cutlass_sm80.c, emit_cutlass_sm80_launch.c). What both write the same way, and the driver that puts a
 * kernel's parts in order, is in emit_cutlass_common.c. */
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
    case EVT_F8E4M3: return "cutlass::float_e4m3_t";
    case EVT_F8E5M2: return "cutlass::float_e5m2_t";
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

/* One CUTLASS generation's emitter: its text for the parts of a kernel that differ. */
typedef struct cutlass_gen {
  const char *visitor; /* prefix of its tree nodes: <visitor>EVT, <visitor>TopologicalVisitor */
  const char *tree_heading; /* the comment line above the tree */
  void (*banner)(sbuf *b, const evt_kspec *s, const char *name);
  void (*types)(sbuf *b, const evt_kspec *s, const char *hash);
  void (*node_type)(sbuf *b, const evt_vtree *t, int v); /* `using N<v> = <bare node>;` without the comment */
  void (*kernel)(sbuf *b, const evt_vtree *t, const char *hash); /* after the tree: EVT, kernel, namespace end */
  void (*launcher)(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash);
} cutlass_gen;

/* ---- emit_cutlass_common.c: types and tree ---------------------------------------------------------------- */
/* The kernel source of spec s in generation g's text: banner, types, visitor nodes, tree, kernel, launcher. NULL
 * with the reason in err when s has no tree. */
char *evt_cutlass_emit(const evt_kspec *s, const cutlass_gen *g, char *err, size_t errlen);
/* The functor of a compute node (NULL for other nodes). */
const char *evt_cutlass_compute_fn(evt_vop op);
/* The topological visitor's ops of t (none when t has no shared region) and op k's index of a node. */
void evt_cutlass_topo_ops(const evt_vtree *t, topo_ops *o);
int evt_cutlass_topo_index(const topo_ops *o, int node);
/* The spec's text as banner comment lines. */
void evt_cutlass_banner_spec(sbuf *b, const evt_kspec *s);
/* `namespace evt_gen_<hash> {` and the element types, layouts, rounding and alignments of A, B and D. */
void evt_cutlass_emit_elements(sbuf *b, const evt_kspec *s, const char *hash);

/* ---- emit_cutlass_common.c: launchers ---------------------------------------------------------------------- */
/* One node's own launch Arguments (the emitter's choice per CUTLASS generation), then `,` unless last. */
typedef void (*evt_node_args_fn)(sbuf *b, const evt_vtree *t, int v, int last);
/* The nested Arguments of tree node v (Sm90EVT / Sm80EVT: {children..., node}; the topological visitor lists its
 * ops), each node's own through node_args. */
void evt_emit_tree_args(sbuf *b, const evt_vtree *t, int v, const topo_ops *o, int depth, int last, evt_node_args_fn node_args);
/* After a node's own Arguments: `,` unless last, and a comment naming the node. */
void evt_cutlass_node_args_end(sbuf *b, const evt_vnode *nd, int v, int last);
/* `extern "C" int <name>(const evt_launch_args *a) {`, its namespace, and the checks of every pointer it needs. */
void evt_cutlass_emit_launcher_entry(sbuf *b, const evt_vtree *t, const char *name, const char *hash);
/* A batched launch's leading dims lda, ldb, ldd and batch strides bsa, bsb, bsd (launch fields; 0 = packed). */
void evt_cutlass_emit_batch_strides(sbuf *b, const evt_kspec *s);
/* ld<v>, bs<v>, os<v> of every live node with memory but scalar loads (unbatched: packed, os 0; shared nodes:
 * bs and os 0); returns whether a shared sum exists. */
int evt_cutlass_emit_node_strides(sbuf *b, const evt_vtree *t);
/* `Gemm gemm;` through can_implement, the workspace (grown; with keep_old the smaller old buffer stays allocated),
 * initialize, run(<run_args>) and the launch error check. */
void evt_cutlass_emit_gemm_run(sbuf *b, int keep_old, const char *run_args);

/* emit_cutlass_launch.c: `extern "C" int <name>(const evt_launch_args *)` (batched or not; with the launch cache's
 * state for specs without sums), after the namespace evt_gen_<hash> that holds the kernel's types. */
void evt_emit_cutlass_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash);

/* emit_cutlass.c: `using N<v> = <Sm90 node>;` of node v (a conv spec's aux loads / stores: evt_nodes::FlatM). */
void evt_cutlass_sm90_node_type(sbuf *b, const evt_vtree *t, int v);
/* emit_cutlass_launch.c: node v's own Sm90 launch Arguments (an evt_node_args_fn). */
void evt_cutlass_sm90_node_args(sbuf *b, const evt_vtree *t, int v, int last);
/* emit_cutlass_conv.c: the source of a conv spec (s->conv.kind set; evt_emit_cutlass dispatches to it). */
char *evt_emit_cutlass_conv(const evt_kspec *s, char *err, size_t errlen);

/* emit_cutlass_sm80_launch.c: the launcher of an sm_8x spec (batched or not), after its namespace. */
void evt_emit_cutlass_sm80_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash);

#endif
