/* Pass: canonicalize (frontend canonicalization). First in the pipeline; later passes only see its forms.
 *
 * Contract: requires a well-formed graph; preserves every output value exactly (no arithmetic changes).
 * Rules, applied once per node in id order:
 *   addmm(c, a, b)               -> add(mm(a, b), c)                                           (f32)
 *   addmm(c, a, b) of bf16/f16   -> cast(add(mm(a, b, out_dtype=f32), cast(c, f32)), bf16/f16)
 *                                   (one rounding of the f32 sum, as PyTorch's addmm: not mm + add in 16 bits)
 *   transpose(x, dims=[a,b])     -> permute(x, dims=<identity with a,b swapped>)
 *   cross_entropy(x, t)          -> nll_loss(log_softmax(x, dim=1), t)    (x: [N, C]; what PyTorch traces)
 *   reshape/expand to x's own shape, permute by the identity, cast to x's own dtype  -> x
 *   full of rank 0               -> scalar
 *   an elementwise operand that is a constant `full` (or any `expand`) whose broadcast the op does anyway
 *                                -> a `scalar` constant (resp. the expand's input); only when the node's
 *                                   type does not change.
 * Ends with a compaction (dead nodes dropped). */
#include "passes/passes.h"


static bool is_identity_perm(const evt_ilist *p) {
  for (int i = 0; i < p->n; i++)
    if (p->v[i] != i) return false;
  return true;
}

/* Returns the replacement of node id (id itself if none); -1 on a builder failure. */
static int canonical(evt_graph *g, int id) {
  evt_node *n = &g->nodes[id];
  const evt_type *t = &n->type;
  const evt_type *t0 = n->ninputs > 0 ? &g->nodes[n->inputs[0]].type : NULL;
  switch (n->op) {
  case EVT_OP_ADDMM: {
    int c = n->inputs[0], a = n->inputs[1], b = n->inputs[2];
    evt_dtype dt = t->dtype; /* n and t dangle once a node is added (g->nodes may move) */
    if (dt == EVT_F32) return evt_rw_binary(g, id, EVT_OP_ADD, evt_rw_binary(g, id, EVT_OP_MM, a, b), c);
    /* 16-bit: the bias joins the f32 accumulator and the sum is rounded once, as PyTorch's addmm (cuBLASLt's
     * bias epilogue) does; a 16-bit mm followed by a 16-bit add would round twice */
    evt_attrs at = evt_attrs_default;
    at.out_dtype = EVT_F32;
    int in[2] = {a, b};
    int acc = evt_rw_op(g, id, EVT_OP_MM, in, 2, &at, 1ull << EVT_ATTR_OUT_DTYPE);
    int bias = evt_rw_cast(g, id, c, EVT_F32);
    if (acc < 0 || bias < 0) return -1;
    return evt_rw_cast(g, id, evt_rw_binary(g, id, EVT_OP_ADD, acc, bias), dt);
  }
  case EVT_OP_TRANSPOSE: {
    int r = t0->rank;
    int a = evt_norm_dim(n->attr.dims.v[0], r), b = evt_norm_dim(n->attr.dims.v[1], r);
    if (n->attr.dims.n != 2 || a < 0 || b < 0) return id;
    evt_attrs at = evt_attrs_default;
    at.dims.n = r;
    for (int i = 0; i < r; i++) at.dims.v[i] = i;
    at.dims.v[a] = b, at.dims.v[b] = a;
    int x = n->inputs[0];
    return evt_rw_op(g, id, EVT_OP_PERMUTE, &x, 1, &at, 1ull << EVT_ATTR_DIMS);
  }
  case EVT_OP_CROSS_ENTROPY: {
    if (t0->rank != 2) return id;
    int x = n->inputs[0], tg = n->inputs[1];
    evt_attrs nl = n->attr;
    uint64_t given = n->attr_given;
    evt_attrs ls = evt_attrs_default;
    ls.dim = 1;
    int lp = evt_rw_op(g, id, EVT_OP_LOG_SOFTMAX, &x, 1, &ls, 1ull << EVT_ATTR_DIM);
    int in[2] = {lp, tg};
    return evt_rw_op(g, id, EVT_OP_NLL_LOSS, in, 2, &nl, given);
  }
  case EVT_OP_RESHAPE:
  case EVT_OP_EXPAND:
    return evt_type_equal(t, t0) ? n->inputs[0] : id;
  case EVT_OP_PERMUTE:
    return is_identity_perm(&n->attr.dims) && evt_type_equal(t, t0) ? n->inputs[0] : id;
  case EVT_OP_CAST:
    return t->dtype == t0->dtype ? n->inputs[0] : id;
  case EVT_OP_FULL:
    return t->rank == 0 ? evt_rw_scalar(g, id, t->dtype, n->attr.value) : id;
  default:
    return id;
  }
}

evt_status evt_pass_canonicalize(evt_graph *g, evt_pass_stats *st) {
  int n0 = g->nnodes;
  for (int id = 0; id < n0; id++) {
    int folded = evt_rw_fold_operands(g, id);
    if (folded < 0) return EVT_ERR_INTERNAL;
    st->rewrites += folded;
    int r = canonical(g, id);
    if (r < 0) return EVT_ERR_INTERNAL;
    if (r == id) continue;
    evt_graph_replace_uses(g, id, r);
    st->rewrites++;
  }
  return evt_graph_compact(g, &st->removed);
}
