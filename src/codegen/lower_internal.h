/* The lowering's shared state and helpers (internal to src/codegen/; the contract is lower.h).
 * lower.c: the driver, strides of operands in memory, the partitioner's hook; lower_epilogue.c: a group's members
 * as visitor nodes (loads, computes, sums, stores); lower_gemm.c: mm / addmm groups; lower_bmm.c: bmm groups and
 * the batched epilogue; lower_rows.c: reduce-apply and nucleus-free groups. */
#ifndef EVT_CODEGEN_LOWER_INTERNAL_H
#define EVT_CODEGEN_LOWER_INTERNAL_H

#include "codegen/lower.h"

/* One group (or, with group NULL, one node judged alone) being lowered into the visitor DAG of s. */
typedef struct lctx {
  const evt_graph *g;
  const int *group;   /* NULL: judging one node (evt_lower_can_fuse) */
  int gi, nu;
  int64_t m, n;
  evt_kspec *s;
  int *vid;           /* graph node -> visitor node of its tile value, or -1 */
  int *vt;            /* visitor node -> graph node of its memory, or -1 */
  int nload[5];       /* per visitor kind, for names: a (aux), r (row), c (col), k (scalar, unnamed), h (one_hot) */
  int nstore, nrsum, ncsum;
  char *why;
  size_t whylen;
  int bad;
  /* row kernels: the nucleus's M x N inputs (graph nodes) are read as acc(IN0/IN1), not loaded again */
  int row, nrin, rin[2];
  evt_row_value accsel[EVT_KSPEC_MAX_NODES];
  /* batched GEMM (bmm nucleus): the tile is the nucleus's shape [batch..., M, N] (m = L*M, n = N) */
  int nbd;                 /* batch dims (nucleus rank - 2); 0 for every other kernel */
  const evt_type *bt;      /* the nucleus's type */
  int *alias;              /* graph node -> the tile value a member view (permute / reshape ...) shows, or -1 */
  int64_t vst[EVT_KSPEC_MAX_NODES][EVT_MAX_RANK]; /* loads: strides of node i's memory over bt's dims */
} lctx;

/* A scalar / full operand's value as the interpreter holds it: rounded to the node's dtype (a bf16 0.1 is
 * 0.10009765625, the threshold PyTorch compares a bf16 tensor with); visitor scalars are float constants,
 * which would otherwise keep the unrounded value. */
static inline double scalar_value(const evt_node *bn) { return evt_round_to_dtype(bn->attr.value, bn->type.dtype); }

static inline int64_t prod(const int64_t *d, int a, int b) {
  int64_t p = 1;
  for (int i = a; i < b; i++) p *= d[i];
  return p;
}

static inline bool is_view_op(evt_op op) {
  return op == EVT_OP_RESHAPE || op == EVT_OP_SQUEEZE || op == EVT_OP_UNSQUEEZE || op == EVT_OP_EXPAND ||
         op == EVT_OP_PERMUTE || op == EVT_OP_TRANSPOSE;
}

/* A view (chain) of an input/param/constant: the partitioner puts it in no group. */
static inline bool source_view(const evt_graph *g, int x) {
  if (!is_view_op(g->nodes[x].op)) return evt_op_table[g->nodes[x].op].cls == EVT_CLASS_SOURCE;
  return source_view(g, g->nodes[x].inputs[0]);
}

/* The split of shape (rank r, numel M*N) into the M dims [0, s) and the N dims [s, r); -1 if none. */
static inline int tile_split(const evt_type *t, int64_t m, int64_t n) {
  if (evt_type_numel(t) != m * n) return -1;
  for (int s = 0; s <= t->rank; s++)
    if (prod(t->shape, 0, s) == m) return s;
  return -1;
}

/* Are the strides over dims [a, b) of shape the contiguous strides of that sub-shape times `step`
 * (step 0: all zero)? Unit dims are ignored. */
static inline bool dense(const int64_t *shape, const int64_t *st, int a, int b, int64_t step) {
  int64_t want = step;
  for (int d = b - 1; d >= a; d--) {
    if (shape[d] == 1) continue;
    if (st[d] != want) return false;
    want *= shape[d];
  }
  return true;
}

static inline bool float_dtype(evt_dtype dt) { return dt == EVT_F32 || dt == EVT_F16 || dt == EVT_BF16; }

static inline bool same_shape(const evt_type *a, const evt_type *b) {
  if (a->rank != b->rank) return false;
  for (int d = 0; d < a->rank; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

/* Batch count of a bmm result [batch..., M, N]. */
static inline int64_t bmm_batch(const evt_type *t) { return prod(t->shape, 0, t->rank - 2); }

/* lower.c */
/* Records the first reason the group cannot lower (node named by it: node) in c->why; returns false. */
bool evt_lower_refuse(lctx *c, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Strides (in elements of *base) of x's elements in the memory of *base: x itself, or, through views in
 * group `through` (-1: views of sources), the tensor they alias. false if a view cannot be expressed with
 * strides (a reshape that regroups a non-contiguous tensor). */
bool evt_lower_mem_strides(const evt_graph *g, const int *group, int through, int x, int64_t *st, int *base);

/* lower_gemm.c */
/* The 16-byte rule of a GEMM's TMA operands in layout (ta, tb) (ta: A stored K x M; tb: B stored N x K): every
 * leading dim (A's K or M, B's N or K, D's N) a multiple of 8; the other extents take any size (TMA fills the edge
 * tiles). */
bool evt_lower_gemm_dims_ok(int64_t m, int64_t n, int64_t k, int ta, int tb);
/* +1 if x's value is read transposed (strides (1, rows)) through its chain of 2-D transposes / permutes down to the
 * memory it views, as the GEMM lowering absorbs them; 0 if row-major. */
int evt_lower_transposed_operand(const evt_graph *g, int x);

/* lower_epilogue.c */
/* Appends a visitor node for graph node v whose memory is graph node `tensor` (-1: none); -1 with the reason. */
int evt_lower_add_node(lctx *c, int v, evt_vop op, int in0, int in1, evt_dtype dt, const char *name, int tensor);
/* The visitor scalar holding scalar / full node bn's value (one node per value); -1 with the reason. */
int evt_lower_scalar(lctx *c, int v, const evt_node *bn);
/* A visitor node for operand x of member v, whose output shape is `out`: x's tile value, or a load
 * chosen from x's strides broadcast over `out`. -1 with the reason on failure. */
int evt_lower_operand(lctx *c, int v, int x, const evt_type *out);
/* Lowers member v (not the nucleus, not an operand permute). Sets c->vid[v] for tile values; a sum
 * becomes a row/col sum store whose vt is set by the caller. Returns false with the reason. */
bool evt_lower_member(lctx *c, int v);
/* Members of group c->gi, in id order, except the nucleus and GEMM operand permutes (skip1, skip2). */
void evt_lower_members(lctx *c, int skip1, int skip2);
/* Stores for every member value read outside the group (or a graph output): sums are bound to their
 * tensor (or to the view of it that leaves); with want_d, the latest tile value is D (*dmem), the others
 * aux stores; without, every one is an aux store. */
void evt_lower_add_stores(lctx *c, evt_lowered *L, bool want_d, int *dmem);
/* The finished spec must pass the spec's and the tree's checks (their message is the refusal, by the nucleus c->nu);
 * then L is of `kind`, ok, with its kernel name. */
void evt_lower_finish_spec(lctx *c, evt_lowered *L, evt_lower_kind kind);
/* s with its commutative operands in canonical order (evt_kspec_canonicalize) when that spec still passes the checks
 * and builds a visitor tree, so GEMM epilogues equal up to operand order share a kernel; else s unchanged. */
void evt_lower_canonical_spec(evt_kspec *s);

/* lower_bmm.c: the batched epilogue */
/* A load for operand x of batched member v (out: v's shape, the tile's). */
int evt_lower_operand_batched(lctx *c, int v, int x, const evt_type *out);
/* A sum in a batched epilogue: over M (row_sum) or N (col_sum), per batch (no batch dim reduced) or over
 * every batch too (shared). */
bool evt_lower_sum_batched(lctx *c, int v);

/* One group per nucleus kind: fill L (kind, spec, tensors, reason); vid: graph node -> visitor node, all -1. */
/* flags: EVT_LOWER_* (lower.h). */
void evt_lower_gemm(const evt_graph *g, const int *group, int gi, int nu, unsigned flags, evt_lowered *L, int *vid); /* lower_gemm.c */
void evt_lower_bmm(const evt_graph *g, const int *group, int gi, int nu, unsigned flags, evt_lowered *L, int *vid);  /* lower_bmm.c */
void evt_lower_conv(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid); /* lower_conv.c */
/* The conv geometry of conv2d node nu (kspec.h), or false with the reason (naming what the conv kernels refuse). */
bool evt_lower_conv_geometry(const evt_graph *g, int nu, evt_conv_geom *geo, char *why, size_t whylen);
void evt_lower_rows(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid); /* lower_rows.c */
/* lower_spmm.c: an spmm / spmm_t nucleus's operands into L->rin and the rspec's CSR fields, then its acc node
 * (c->m, c->n set: the output's rows and row length); refuses with the reason otherwise. */
void evt_lower_spmm_inputs(lctx *c, evt_lowered *L);

#endif
