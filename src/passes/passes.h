/* The graph passes (stage 3): internal header of src/passes/. One file per pass, one entry function
 * `evt_pass_<name>(g, st)` each with its contract on top of its file; pipeline.c lists them in order.
 *
 * How a pass rewrites (rewrite.c): it appends replacement nodes at the end of g (their inputs exist, so they
 * get larger ids), then redirects the users of the old node with evt_graph_replace_uses(g, old, new) (the
 * output list and the loss included), or points one input of one node at the new node. Between those steps a
 * user may have a smaller id than its input; evt_graph_compact() restores the invariant "inputs have smaller
 * ids than users" (a stable topological re-sort), drops the nodes no output needs (dead-code elimination;
 * inputs and params always stay: they are the graph's interface) and renumbers ids and outputs. Names and
 * origins travel with their nodes. Every pass ends with a compaction, so between passes the graph is
 * well-formed again and evt_graph_verify() holds.
 *
 * Every pass preserves the values of every graph output (up to floating-point reassociation), except loss
 * elimination with EVT_PASS_DROP_LOSS, which replaces the loss value by 0 on purpose. */
#ifndef EVT_PASSES_H
#define EVT_PASSES_H

#include "ir/ir.h"

/* Node flag (beside EVT_NODE_OUTPUT/LOSS): the node was made by a pass and has a generated name, which it
 * gives up for the name of the node it replaces (evt_graph_replace_uses). */
#define EVT_NODE_FRESH_NAME 0x100u

/* Options (in) and counters (out) of one pass run. */
#define EVT_PASS_DROP_LOSS 1u   /* loss elimination: the loss output becomes the constant 0 */
#define EVT_PASS_FP8 2u         /* run the fp8 pass (evt_options.fp8): eligible GEMMs in FP8, fp8.c */
typedef struct evt_pass_stats {
  unsigned flags;     /* in: EVT_PASS_* options */
  int rewrites;       /* out: rules applied (a pass adds to it) */
  int removed;        /* out: nodes deleted by the final compaction */
} evt_pass_stats;

typedef evt_status (*evt_pass_fn)(evt_graph *g, evt_pass_stats *st);
typedef struct evt_pass_info {
  const char *name;   /* as in `evtc opt --passes=` */
  evt_pass_fn run;
  const char *what;   /* one line for --help */
  unsigned needs;     /* EVT_PASS_* flags the pipeline needs set to run this pass (0: always runs) */
} evt_pass_info;

/* ---- pipeline.c -------------------------------------------------------------------------------------- */
extern const evt_pass_info evt_passes[];
extern const int evt_npasses;
const evt_pass_info *evt_pass_find(const char *name, size_t len);   /* NULL if unknown */
/* Runs every pass of the pipeline in order whose `needs` flags are all in `flags` (then the graph is compact).
 * With `verify`, runs evt_graph_verify() after each pass and stops at the first failure. */
evt_status evt_passes_run_all(evt_graph *g, unsigned flags, int verify);

/* ---- rewrite.c --------------------------------------------------------------------------------------- */
/* Makes every use of node `old` (inputs of other nodes, the output list, the loss) use `nw` instead. Both
 * must have the same dtype and shape, and `nw` must not depend on `old`. If `old` was an output, `nw` takes
 * its place in the output list; if `nw` already is an output, `old` stays one instead, since outputs never
 * repeat. Names: an output keeps its name (it moves to `nw` unless `nw` is an input/param); a node made by a
 * pass (EVT_NODE_FRESH_NAME) takes old's name unless that was generated from old's op. */
void evt_graph_replace_uses(evt_graph *g, int old, int nw);
/* Stable topological re-sort + dead-node removal + renumbering (see the top of this file). *removed (may be
 * NULL) gets the number of nodes deleted. Returns EVT_ERR_INTERNAL if the rewrites made a cycle. */
evt_status evt_graph_compact(evt_graph *g, int *removed);
/* Structural check used between passes: inputs in range and before their users, outputs valid, loss is
 * the first output, and every node's type re-inferred equals its stored type. */
evt_status evt_graph_check(evt_graph *g);
/* Users: count of uses of each node (outputs count as a use). uses[] has g->nnodes entries. */
void evt_graph_count_uses(const evt_graph *g, int *uses);

/* Node builders for passes. Each appends a node with a fresh name and the origin of node `at` (so messages
 * point at the source of the node being rewritten) and returns its id. Sticky errors: any input id < 0
 * makes them return -1 without adding, so a pass can chain calls and check once. A failure to add is a
 * bug in the pass; the message is on the graph. */
int evt_rw_op(evt_graph *g, int at, evt_op op, const int *in, int nin, const evt_attrs *attrs, uint64_t given);
int evt_rw_unary(evt_graph *g, int at, evt_op op, int x);
int evt_rw_binary(evt_graph *g, int at, evt_op op, int a, int b);
int evt_rw_where(evt_graph *g, int at, int cond, int a, int b);
int evt_rw_scalar(evt_graph *g, int at, evt_dtype dt, double v);                   /* value rounded to dt */
int evt_rw_factor(evt_graph *g, int at, evt_dtype dt, double v); /* an arithmetic operand of dtype-dt math (below) */
int evt_rw_full(evt_graph *g, int at, const evt_type *t, double v);                /* full or scalar */
int evt_rw_cast(evt_graph *g, int at, int x, evt_dtype dt);                         /* no-op if same dtype */
int evt_rw_reduce(evt_graph *g, int at, evt_op op, int x, const int *dims, int ndims, int keepdim);
int evt_rw_reshape(evt_graph *g, int at, int x, int rank, const int64_t *shape);    /* no-op if same shape */
int evt_rw_expand(evt_graph *g, int at, int x, const evt_type *to);                /* no-op if same shape */
int evt_rw_one_hot(evt_graph *g, int at, int idx, int64_t classes, evt_dtype dt);

/* In elementwise node id, replaces each operand that is a constant `full` by a `scalar` and each `expand` by
 * its input, where the node's type stays the same (its own broadcast does the work). Returns the number of
 * operands replaced, -1 on a builder failure. Used by canonicalize and constprop. */
int evt_rw_fold_operands(evt_graph *g, int id);

/* Small node facts shared by the passes. */
static inline evt_node *evt_rw_node(evt_graph *g, int id) { return &g->nodes[id]; }
bool evt_node_is_const(const evt_graph *g, int id, double *value);   /* full/scalar; floats exact, ints/bool rounded */
bool evt_node_attrs_equal(const evt_node *a, const evt_node *b);      /* the op's attributes only */
bool evt_node_same_value(const evt_graph *g, int a, int b);           /* same op, inputs, attrs, type */
int evt_norm_dim(int64_t d, int rank);                                /* -1 if out of range */
bool evt_op_is_elementwise(evt_op op);

/* ---- loss_elim.c (shared with decompose.c) ------------------------------------------------------------ */
/* x if node lp is log_softmax(x) or log(softmax(x)) over dim 1 of a rank-2 x; else -1. */
int evt_match_log_softmax(const evt_graph *g, int lp);
/* Softmax cross-entropy pieces for the loss-op node `node` (reduction, ignore_index) with targets t [N] and
 * incoming gradient dy: returns w = dy * mask [/ count] as [N, 1] (or -1 when dy < 0); *mask = (t !=
 * ignore_index) as dtype dt [N]; *safe_target = where(mask, t, 0), always a valid class. */
int evt_ce_parts(evt_graph *g, int node, int t, int dy, evt_dtype dt, int *mask, int *safe_target);

/* ---- the passes, in pipeline order (one file each) ---------------------------------------------------- */
evt_status evt_pass_canonicalize(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_fp8(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_loss_elim(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_decompose(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_reduce_elim(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_constprop(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_cse(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_edge_spmm(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_layout(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_dce(evt_graph *g, evt_pass_stats *st);
evt_status evt_pass_split_casts(evt_graph *g, evt_pass_stats *st);

#endif
