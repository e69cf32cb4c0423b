/* rules.c — THE fusion rule table, and the edge statuses derived from it.
 *
 * Op -> role (evt_part_op_flags):
 *   source    input, param, full, scalar, rand (rand is a counter-based RNG: regenerated in every kernel
 *             that reads it, 0 bytes); and views/permutes of sources (adapter.c).
 *   nucleus   (CUT_IN: no prologue fusion)
 *             GEMM mm, bmm, addmm (LAYOUT_IN: a permute/transpose with a single consumer fuses into it as
 *             an operand layout); CONV conv2d, conv2d_backward_input (dgrad); SPARSE spmm, spmm_t;
 *             ROW reduce-apply kernels softmax, log_softmax, softmax_backward, log_softmax_backward,
 *             layer_norm, layer_norm_backward_input.
 *   singleton (CUT_IN|CUT_OUT: a kernel of its own) conv2d_backward_weight (wgrad, not fused by the paper
 *             either; nhwc ones lower to a CONV+EVT kernel that stores dw only, src/codegen/lower_conv.c), pools and their backwards, embedding(_backward), index_select(_backward)
 *             (gathers/scatters with data-dependent addressing), sdpa and its backwards (attention is its
 *             own library kernel), batch_norm and batch_norm_backward_input (whole-batch statistics: no
 *             row kernel computes them; the decomposition pass splits them into stats + elementwise).
 *   reduction (fusible, CUT_OUT: ends its group — its value exists only when the kernel is done)
 *             sum, mean, amax, layer_norm_backward_weight, batch_norm_backward_weight, and every loss
 *             with reduction mean/sum.
 *   view      (VIEW: alias of its producer) reshape, squeeze, unsqueeze, expand.
 *   rng       (FUSE_IN) dropout: generated in its producer's kernel.
 *   operand   (OPERAND) permute, transpose: fusible; fuse into a GEMM consumer as a layout. A permute of an fp8
 *             tensor read other than as an mm's B is a singleton: a K-major copy for an fp8 GEMM (fp8 GEMMs take
 *             no transposed A; row kernels write row-major tiles).
 *   convert   (CONVERT) a widening cast bf16/f16 -> f32 (exact): fusible; fuses into a row nucleus that reads it
 *             as an M x N input (CONVERT_IN: softmax, layer_norm, softmax_backward, layer_norm_backward_input),
 *             which then loads the 16-bit tensor and converts in registers (the f32 copy is never written:
 *             half the bytes of a vocabulary head's logits; a layer-norm backward's 16-bit dy next to its f32 x).
 *   fusible   everything else: elementwise, slice, slice_backward, concat, one_hot, losses without
 *             reduction and loss backwards (elementwise-ish).
 *   scalar    (CUT_OUT, besides its role) a shared scalar computation (shared_scalar): a 1-element value of
 *             1-element inputs read by several nodes or a graph output ends its group.
 * Edge statuses (evt_part_derive_rules), first matching rule wins:
 *   from a source                                 -> SOURCE (a read, never a choice)
 *   into a VIEW (with one input)                  -> FUSE (a view is metadata)
 *   OPERAND u with one consumer v that is LAYOUT_IN -> FUSE, and u's in-edges become CUT
 *   CONVERT u with one consumer v that is CONVERT_IN and reads it once, as an M x N input -> FUSE, u's in-edges CUT
 *   out of CUT_OUT (views inherit it) / into CUT_IN -> CUT
 *   into FUSE_IN (with one input)                 -> FUSE
 *   otherwise                                     -> FREE
 * FUSE edges whose closure would break a pair rule (two nuclei, or compat) are demoted to FREE.
 * Epilogue implementability (compat hook): see evt_part_compat_evt; it applies to a nucleus and every other
 * member of its group except operand prologues. A view member is judged as its producer. one_hot and a member
 * reading rand never join a GEMM (row-kernel visitors only). */
#include "partition/partition.h"

#include <stdlib.h>
#include <string.h>

/* A permute of an fp8 tensor that something other than an mm reads as its B: a K-major copy of an fp8 GEMM operand
 * (passes/layout.c: a copy of B, or a transposed A, which fp8 GEMMs cannot take as a layout). */
static bool fp8_copy(const evt_graph *g, int id) {
  if (!evt_dtype_is_fp8(g->nodes[id].type.dtype)) return false;
  for (int i = id + 1; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    for (int k = 0; k < n->ninputs; k++)
      if (n->inputs[k] == id && (n->op != EVT_OP_MM || k != 1)) return true;
  }
  return false;
}

/* A scalar computation read by more than one node, or a graph output: a 1-element value computed from 1-element
 * values only (not a reduction of a larger tensor), such as an fp8 scale. It must leave its kernel, and a kernel over
 * a larger tile stores whole tiles only, so it ends its group (CUT_OUT): its group holds it and the scalar
 * computations it reads. A scalar with one reader joins that reader's kernel, which computes it per element. */
static bool shared_scalar(const evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  if (n->ninputs == 0 || evt_type_numel(&n->type) != 1) return false;
  for (int k = 0; k < n->ninputs; k++)
    if (evt_type_numel(&g->nodes[n->inputs[k]].type) != 1) return false;
  if (n->flags & EVT_NODE_OUTPUT) return true;
  int readers = 0;
  for (int i = id + 1; i < g->nnodes && readers < 2; i++)
    for (int k = 0; k < g->nodes[i].ninputs; k++)
      if (g->nodes[i].inputs[k] == id) {
        readers++;
        break;
      }
  return readers > 1;
}

static unsigned op_role(const evt_graph *g, int id);

unsigned evt_part_op_flags(const evt_graph *g, int id) {
  unsigned f = op_role(g, id);
  return (f & EVT_PN_SOURCE) || !shared_scalar(g, id) ? f : f | EVT_PN_CUT_OUT;
}

static unsigned op_role(const evt_graph *g, int id) {
  const evt_node *n = &g->nodes[id];
  const unsigned singleton = EVT_PN_CUT_IN | EVT_PN_CUT_OUT;
  switch (n->op) {
  case EVT_OP_INPUT: case EVT_OP_PARAM: case EVT_OP_FULL: case EVT_OP_SCALAR: case EVT_OP_RAND:
    return EVT_PN_SOURCE;
  case EVT_OP_MM: case EVT_OP_BMM: case EVT_OP_ADDMM:
    return EVT_PN_NUCLEUS | EVT_PN_CUT_IN | EVT_PN_LAYOUT_IN;
  case EVT_OP_SOFTMAX: case EVT_OP_LAYER_NORM: case EVT_OP_SOFTMAX_BACKWARD: case EVT_OP_LAYER_NORM_BACKWARD_INPUT:
    return EVT_PN_NUCLEUS | EVT_PN_CUT_IN | EVT_PN_CONVERT_IN;
  case EVT_OP_CONV2D: case EVT_OP_CONV2D_BACKWARD_INPUT: case EVT_OP_SPMM: case EVT_OP_SPMM_T:
  case EVT_OP_LOG_SOFTMAX: case EVT_OP_LOG_SOFTMAX_BACKWARD:
    return EVT_PN_NUCLEUS | EVT_PN_CUT_IN;
  case EVT_OP_CAST: {
    evt_dtype from = g->nodes[n->inputs[0]].type.dtype;
    return n->ninputs == 1 && n->type.dtype == EVT_F32 && (from == EVT_BF16 || from == EVT_F16) ? EVT_PN_CONVERT : 0;
  }
  case EVT_OP_CONV2D_BACKWARD_WEIGHT: case EVT_OP_BATCH_NORM: case EVT_OP_BATCH_NORM_BACKWARD_INPUT:
    return singleton;
  case EVT_OP_SUM: case EVT_OP_MEAN: case EVT_OP_AMAX:
  case EVT_OP_LAYER_NORM_BACKWARD_WEIGHT: case EVT_OP_BATCH_NORM_BACKWARD_WEIGHT:
    return EVT_PN_CUT_OUT;
  case EVT_OP_RESHAPE: case EVT_OP_SQUEEZE: case EVT_OP_UNSQUEEZE: case EVT_OP_EXPAND:
    return EVT_PN_VIEW;
  case EVT_OP_PERMUTE: case EVT_OP_TRANSPOSE:
    return fp8_copy(g, id) ? singleton : EVT_PN_OPERAND;
  case EVT_OP_DROPOUT:
    return EVT_PN_FUSE_IN;
  case EVT_OP_ONE_HOT:
    return 0;
  default:
    break;
  }
  switch (evt_op_table[n->op].cls) {
  case EVT_CLASS_POOL: case EVT_CLASS_GATHER: case EVT_CLASS_ATTENTION: case EVT_CLASS_CONV:
    return singleton;
  case EVT_CLASS_LOSS:
    if ((evt_op_table[n->op].attrs >> EVT_ATTR_REDUCTION) & 1u)
      if (n->attr.reduction != EVT_REDUCTION_NONE && n->type.rank == 0) return EVT_PN_CUT_OUT;
    return 0;
  case EVT_CLASS_REDUCTION: return EVT_PN_CUT_OUT;
  case EVT_CLASS_GEMM: case EVT_CLASS_SPARSE: case EVT_CLASS_ROW: return EVT_PN_NUCLEUS | EVT_PN_CUT_IN;
  case EVT_CLASS_SOURCE: return EVT_PN_SOURCE;
  default: return 0;
  }
}

bool evt_part_compat_shape_class(const evt_pgraph *g, int nucleus, int member) {
  return g->nodes[member].shape_class == 0 || g->nodes[member].shape_class == g->nodes[nucleus].shape_class;
}

static bool same_shape(const evt_type *a, const evt_type *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* Member `m` may join nucleus `nu`'s kernel when the tensor it produces is the nucleus output's shape
 * (or has its element count: a view or a transposed store), or broadcasts to it (a row/column/scalar
 * operand of the epilogue). A reduction member must reduce a tensor of the output's size over the row
 * dim (the last), the column dims (all but the last), or all dims. */
bool evt_part_compat_evt(const evt_pgraph *g, int nucleus, int member) {
  const evt_graph *eg = g->src;
  if (!eg) return evt_part_compat_shape_class(g, nucleus, member);
  const evt_type *tn = &eg->nodes[nucleus].type;
  const evt_node *m = &eg->nodes[member];
  int64_t numel = evt_type_numel(tn);
  if (member == nucleus) return true;
  /* one_hot is a row-kernel visitor only (no GEMM epilogue node: the lowering refuses it there) */
  if (m->op == EVT_OP_ONE_HOT && evt_op_table[eg->nodes[nucleus].op].cls == EVT_CLASS_GEMM) return false;
  /* nor is the Philox draw: a member reading rand (a dropout's mask) stays out of GEMM epilogues, where drawing
   * it measured slower than a row kernel of its own */
  if (evt_op_table[eg->nodes[nucleus].op].cls == EVT_CLASS_GEMM)
    for (int k = 0; k < m->ninputs; k++)
      if (eg->nodes[m->inputs[k]].op == EVT_OP_RAND) return false;
  if ((g->nodes[member].flags & EVT_PN_VIEW) && m->ninputs == 1 && evt_pgraph_kernel(g, m->inputs[0]))
    return evt_part_compat_evt(g, nucleus, m->inputs[0]);   /* a view is its producer's tensor */
  if ((evt_part_op_flags(eg, member) & EVT_PN_CUT_OUT) && m->ninputs > 0) {
    const evt_type *ti = &eg->nodes[m->inputs[0]].type;
    if (evt_type_numel(ti) != numel) return false;
    if (m->op == EVT_OP_SUM || m->op == EVT_OP_MEAN || m->op == EVT_OP_AMAX) {
      const evt_ilist *d = &m->attr.dims;
      if (d->n == 0 || d->n == ti->rank) return true;
      bool has_last = false;
      for (int i = 0; i < d->n; i++) {
        int64_t k = d->v[i] < 0 ? d->v[i] + ti->rank : d->v[i];
        if (k == ti->rank - 1) has_last = true;
      }
      if (has_last) return d->n == 1;
      return d->n == ti->rank - 1;
    }
    return true;
  }
  if (evt_type_numel(&m->type) == numel) return true;
  evt_type out;
  return evt_broadcast_shapes(&m->type, tn, &out) && same_shape(&out, tn);
}

static bool compat(const evt_pgraph *g, int nucleus, int member) {
  return g->compat ? g->compat(g, nucleus, member) : evt_part_compat_shape_class(g, nucleus, member);
}

/* An operand prologue (a permute fused into its GEMM as a layout) is part of the mainloop's load, not of
 * the epilogue: the compat hook does not apply to it. */
static bool prologue(const evt_pgraph *g, int v) { return evt_pn_prologue(g->nodes[v].flags); }

/* True when CONVERT node u (not a graph output) has one out-edge, to a CONVERT_IN nucleus that reads u once, as
 * one of its M x N inputs (softmax / layer_norm: x; softmax_backward: dy, y; layer_norm_backward_input: dy, x). */
static bool convert_into(const evt_pgraph *g, int u) {
  const evt_pnode *p = &g->nodes[u];
  if (!(p->flags & EVT_PN_CONVERT) || (p->flags & (EVT_PN_SOURCE | EVT_PN_OUTPUT)) || p->nout != 1 || !g->src) return false;
  int w = g->edges[g->out_edges[p->out0]].v;
  if (!(g->nodes[w].flags & EVT_PN_CONVERT_IN)) return false;
  const evt_node *wn = &g->src->nodes[w];
  int mn = wn->op == EVT_OP_SOFTMAX || wn->op == EVT_OP_LAYER_NORM ? 1 : 2, uses = 0, at = -1;
  for (int k = 0; k < wn->ninputs; k++)
    if (wn->inputs[k] == u) uses++, at = k;
  return uses == 1 && at < mn;
}

bool evt_part_pair_ok(const evt_pgraph *g, int a, int b) {
  bool na = g->nodes[a].flags & EVT_PN_NUCLEUS, nb = g->nodes[b].flags & EVT_PN_NUCLEUS;
  if (na && nb) return a == b;
  if (prologue(g, a) || prologue(g, b)) return true;
  if (na) return compat(g, a, b);
  if (nb) return compat(g, b, a);
  return true;
}

static int uf_find(int *p, int x) {
  while (p[x] != x) x = p[x] = p[p[x]];
  return x;
}

void evt_part_derive_rules(evt_pgraph *g) {
  /* views inherit CUT_OUT from their producer; operand prologues become CUT_IN */
  for (int v = 0; v < g->n; v++) {
    evt_pnode *p = &g->nodes[v];
    if ((p->flags & EVT_PN_VIEW) && !(p->flags & EVT_PN_SOURCE) && p->nin == 1)
      for (int k = 0; k < p->nin; k++) {
        int u = g->edges[g->in_edges[p->in0 + k]].u;
        if (evt_pgraph_kernel(g, u) && (g->nodes[u].flags & EVT_PN_CUT_OUT)) p->flags |= EVT_PN_CUT_OUT;
      }
    if ((p->flags & EVT_PN_OPERAND) && !(p->flags & EVT_PN_SOURCE) && p->nout == 1) {
      int w = g->edges[g->out_edges[p->out0]].v;
      if (g->nodes[w].flags & EVT_PN_LAYOUT_IN) p->flags |= EVT_PN_CUT_IN;
    }
    if (convert_into(g, v)) p->flags |= EVT_PN_CUT_IN;
  }
  for (int e = 0; e < g->m; e++) {
    evt_pedge *ed = &g->edges[e];
    const evt_pnode *u = &g->nodes[ed->u], *v = &g->nodes[ed->v];
    if (u->flags & EVT_PN_SOURCE) ed->status = EVT_PE_SOURCE;
    else if ((v->flags & EVT_PN_VIEW) && v->nin == 1) ed->status = EVT_PE_FUSE;
    else if ((u->flags & EVT_PN_OPERAND) && u->nout == 1 && (v->flags & EVT_PN_LAYOUT_IN)) ed->status = EVT_PE_FUSE;
    else if ((u->flags & EVT_PN_CONVERT) && (u->flags & EVT_PN_CUT_IN) && u->nout == 1) ed->status = EVT_PE_FUSE;
    else if ((u->flags & EVT_PN_CUT_OUT) || (v->flags & EVT_PN_CUT_IN)) ed->status = EVT_PE_CUT;
    else if ((v->flags & EVT_PN_FUSE_IN) && v->nin == 1) ed->status = EVT_PE_FUSE;
    else ed->status = EVT_PE_FREE;
    EVT_ASSERT(!(v->flags & EVT_PN_SOURCE) || (u->flags & EVT_PN_SOURCE));
  }
  /* demote FUSE edges whose closure would break a pair rule (members of each closure in a circular list) */
  int *parent = malloc((size_t)(g->n + 1) * sizeof(int)), *nuc = malloc((size_t)(g->n + 1) * sizeof(int));
  int *next = malloc((size_t)(g->n + 1) * sizeof(int));
  EVT_ASSERT(parent && nuc && next);
  for (int v = 0; v < g->n; v++) parent[v] = next[v] = v, nuc[v] = (g->nodes[v].flags & EVT_PN_NUCLEUS) ? v : -1;
  for (int e = 0; e < g->m; e++) {
    evt_pedge *ed = &g->edges[e];
    if (ed->status != EVT_PE_FUSE) continue;
    int a = uf_find(parent, ed->u), b = uf_find(parent, ed->v);
    if (a == b) continue;
    bool ok = !(nuc[a] >= 0 && nuc[b] >= 0);
    int nu = nuc[a] >= 0 ? nuc[a] : nuc[b];
    for (int r = 0; r < 2 && ok && nu >= 0; r++) {
      int w = r ? b : a;
      do {
        if (!evt_part_pair_ok(g, nu, w)) ok = false;
        w = next[w];
      } while (ok && w != (r ? b : a));
    }
    if (!ok) { ed->status = EVT_PE_FREE; continue; }
    parent[b] = a;
    nuc[a] = nu;
    int t = next[a];
    next[a] = next[b], next[b] = t;
  }
  free(parent);
  free(nuc);
  free(next);
}
