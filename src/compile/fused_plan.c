/* The fused execution plan (contract: exec_plan.h). */
#include "compile/compile.h"

#include "partition/partition.h"
#include "passes/passes.h"
#include "tune/tune.h"

#include "evt_launch.h"
#include "evt_row_config.h"
#include "runtime/interp/interp.h"

#include <stdlib.h>
#include <string.h>

static bool caller_slot(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

_Static_assert(EVT_KSPEC_MAX_NODES <= EVT_ROW_LAUNCH_MAX_PTRS && EVT_KSPEC_MAX_NODES <= EVT_LAUNCH_MAX_PTRS,
               "a visitor node index must fit the launchers' pointer arrays");

#define WHY(...) (snprintf(x->why, sizeof x->why, __VA_ARGS__), false)

/* Both kinds: loads read no member of the group (members are not materialized before the kernel), and every
 * member value that leaves the group (read outside, or a graph output) is written by a store (or is D), itself or
 * the member whose memory it shares. */
static bool bind_group_io(const evt_graph *g, const int *group, int gi, const evt_vop *ops, int nnodes, int d,
                          const evt_lowered *L, evt_group_exec *x) {
  for (int i = 0; i < nnodes; i++)
    if (evt_vop_class(ops[i]) == 'L' && x->ptr_node[i] >= 0 && group[x->ptr_node[i]] == gi)
      return WHY("group %d: visitor node %d loads %%%s, a member of its own group (not in memory yet)", gi, i,
                 g->nodes[x->ptr_node[i]].name);
  for (int w = 0; w < g->nnodes; w++) {
    const evt_node *nd = &g->nodes[w];
    for (int k = -1; k < nd->ninputs; k++) {
      int u = k < 0 ? w : nd->inputs[k];
      if (group[u] != gi) continue;
      bool leaves = k < 0 ? (nd->flags & EVT_NODE_OUTPUT) != 0 : group[w] != gi;
      if (!leaves) continue;
      int m = evt_lowered_alias_base(L, u); /* a member sharing a stored member's memory is written by its store */
      if (m < 0) m = u;
      bool stored = d >= 0 && d == m;
      for (int i = 0; i < nnodes && !stored; i++) stored = x->ptr_node[i] == m && evt_vop_class(ops[i]) != 'L';
      if (!stored) return WHY("group %d: %%%s leaves the group but no store of the spec writes it", gi, g->nodes[u].name);
    }
  }
  return true;
}

/* A tensor of the GEMM kernel: bound, dtype, element count and 16-byte rows (row = elements per row). */
static bool gemm_tensor(const evt_graph *g, int gi, int v, const char *what, evt_dtype dt, int64_t elems, int64_t row,
                        evt_group_exec *x) {
  if (v < 0 || v >= g->nnodes) return WHY("group %d: %s is not bound to a tensor", gi, what);
  const evt_type *t = &g->nodes[v].type;
  if (t->dtype != dt)
    return WHY("group %d: %%%s is %s but %s needs %s", gi, g->nodes[v].name, evt_dtype_name(t->dtype), what,
               evt_dtype_name(dt));
  if (evt_type_numel(t) != elems)
    return WHY("group %d: %%%s has %lld elements, %s needs %lld", gi, g->nodes[v].name, (long long)evt_type_numel(t),
               what, (long long)elems);
  if (row * (int64_t)evt_dtype_size(dt) % 16)
    return WHY("group %d: %s (%%%s): rows of %lld x %s are not a multiple of 16 bytes", gi, what, g->nodes[v].name,
               (long long)row, evt_dtype_name(dt));
  return true;
}

/* dtype of a batched GEMM's tensor (its reach is evt_lower_batched_check's). */
static bool bmm_tensor(const evt_graph *g, int gi, int v, const char *what, evt_dtype dt, evt_group_exec *x) {
  if (v < 0 || v >= g->nnodes) return WHY("group %d: %s is not bound to a tensor", gi, what);
  if (g->nodes[v].type.dtype != dt)
    return WHY("group %d: %%%s is %s but %s needs %s", gi, g->nodes[v].name, evt_dtype_name(g->nodes[v].type.dtype), what,
               evt_dtype_name(dt));
  return true;
}

/* A batched stride or leading dim of a tensor in elements: 16-byte multiple (every batch's base pointer and
 * every row stays as aligned as the arena's base). */
static bool bmm_aligned(int gi, const char *what, const char *field, int64_t elems, evt_dtype dt, evt_group_exec *x) {
  if (elems < 0 || elems * (int64_t)evt_dtype_size(dt) % 16)
    return WHY("group %d: %s: %s of %lld x %s is not a multiple of 16 bytes", gi, what, field, (long long)elems,
               evt_dtype_name(dt));
  return true;
}

/* A store of a batched GEMM (D, aux store, row/col sum) writes every element of its tensor: its element count
 * is exactly what the launch writes (a padded or partly covered store would leave elements unwritten). */
static bool bmm_covers(const evt_graph *g, int gi, int v, const char *what, int64_t elems, evt_group_exec *x) {
  if (evt_type_numel(&g->nodes[v].type) != elems)
    return WHY("group %d: %s stores %lld elements into %%%s of %lld (every element must be written)", gi, what,
               (long long)elems, g->nodes[v].name, (long long)evt_type_numel(&g->nodes[v].type));
  return true;
}

/* A batched GEMM (spec.batched, a bmm nucleus): m, n, k per batch, l x l_outer batches placed by the lowered
 * leading dims and batch strides. Checks: dtypes as unbatched; every tensor holds every element the launch
 * reaches (evt_lower_batched_check); leading dims and batch strides are 16-byte multiples; every store
 * covers its whole tensor; shared (all-batch) sums with one launch level only. */
static bool bind_bmm(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x) {
  const evt_kspec *s = &L->spec;
  int gi = L->group;
  int64_t l = L->l > 0 ? L->l : 1, lo = L->l_outer > 1 ? L->l_outer : 1, M = L->m, N = L->n, K = L->k;
  if (L->l < 0 || L->l_outer < 0 || l * lo > 2147483647)
    return WHY("group %d: batch %d x %d does not fit the launcher", gi, L->l, L->l_outer);
  if (s->nnodes > EVT_LAUNCH_MAX_PTRS) return WHY("group %d: %d visitor nodes (at most %d pointers)", gi, s->nnodes, EVT_LAUNCH_MAX_PTRS);
  if (s->d_node < 0 || s->d_node >= s->nnodes) return WHY("group %d: the spec has no D node", gi);
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  if (!bmm_tensor(g, gi, L->a_node, "operand A", s->ab_dtype, x) ||
      !bmm_tensor(g, gi, L->b_node, "operand B", evt_kspec_b_dtype(s), x))
    return false;
  if (group[L->a_node] == gi || group[L->b_node] == gi)
    return WHY("group %d: an operand of the GEMM is a member of its own group", gi);
  int64_t lda = L->lda ? L->lda : at ? M : K, ldb = L->ldb ? L->ldb : bt ? K : N, ldd = L->ldd ? L->ldd : N;
  if (!bmm_aligned(gi, "operand A", "leading dim", lda, s->ab_dtype, x) ||
      !bmm_aligned(gi, "operand A", "batch stride", L->bs_a, s->ab_dtype, x) ||
      !bmm_aligned(gi, "operand A", "outer batch stride", L->os_a, s->ab_dtype, x) ||
      !bmm_aligned(gi, "operand B", "leading dim", ldb, s->ab_dtype, x) ||
      !bmm_aligned(gi, "operand B", "batch stride", L->bs_b, s->ab_dtype, x) ||
      !bmm_aligned(gi, "operand B", "outer batch stride", L->os_b, s->ab_dtype, x) ||
      !bmm_aligned(gi, "D", "leading dim", ldd, s->d_dtype, x) || !bmm_aligned(gi, "D", "batch stride", L->bs_d, s->d_dtype, x) ||
      !bmm_aligned(gi, "D", "outer batch stride", L->os_d, s->d_dtype, x))
    return false;
  x->a_node = L->a_node;
  x->b_node = L->b_node;
  if (L->d_tensor >= 0) {
    if (!bmm_tensor(g, gi, L->d_tensor, "D", s->d_dtype, x) || !bmm_covers(g, gi, L->d_tensor, "D", lo * l * M * N, x))
      return false;
    if (group[L->d_tensor] != gi) return WHY("group %d: D is bound to %%%s, not a member", gi, g->nodes[L->d_tensor].name);
  } else if (L->ldd || L->bs_d || L->os_d) {
    return WHY("group %d: a scratch D is packed (ldd, batch strides 0), the lowering gave %lld / %lld / %lld", gi,
               (long long)L->ldd, (long long)L->bs_d, (long long)L->os_d);
  }
  x->d_node = L->d_tensor;
  evt_vop ops[EVT_KSPEC_MAX_NODES];
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *r = &s->nodes[i];
    ops[i] = r->op;
    if (!evt_vop_has_memory(r->op)) continue;
    char what[64];
    snprintf(what, sizeof what, "visitor node %s (%s%s)", r->name, evt_vop_name(r->op), r->shared ? ", all batches" : "");
    if (!bmm_tensor(g, gi, L->vtensor[i], what, r->dtype, x)) return false;
    bool tile = r->op == EVT_V_AUX_LOAD || r->op == EVT_V_AUX_STORE;
    if (tile && !bmm_aligned(gi, what, "leading dim", L->ld_ptrs[i] ? L->ld_ptrs[i] : N, r->dtype, x)) return false;
    if (!tile && evt_vnode_numel(s, i, M, N) * (int64_t)evt_dtype_size(r->dtype) % 16)
      return WHY("group %d: %s (%%%s): %lld x %s is not a multiple of 16 bytes", gi, what, g->nodes[L->vtensor[i]].name,
                 (long long)evt_vnode_numel(s, i, M, N), evt_dtype_name(r->dtype));
    if (r->shared && (L->bs_ptrs[i] || L->os_ptrs[i]))
      return WHY("group %d: %s is shared by every batch but has batch strides", gi, what);
    if (!bmm_aligned(gi, what, "batch stride", L->bs_ptrs[i], r->dtype, x) ||
        !bmm_aligned(gi, what, "outer batch stride", L->os_ptrs[i], r->dtype, x))
      return false;
    if (evt_vop_class(r->op) == 'S') {
      if (group[L->vtensor[i]] != gi)
        return WHY("group %d: %s stores into %%%s, not a member of the group", gi, what, g->nodes[L->vtensor[i]].name);
      if (r->shared && lo > 1) return WHY("group %d: %s sums over every batch with %lld launches (each would restart it)", gi, what, (long long)lo);
      if (!bmm_covers(g, gi, L->vtensor[i], what, (r->shared ? 1 : lo * l) * evt_vnode_numel(s, i, M, N), x)) return false;
    }
    x->ptr_node[i] = L->vtensor[i];
  }
  char why[240];
  if (!evt_lower_batched_check(g, L, why, sizeof why)) return WHY("group %d: %s", gi, why);
  return bind_group_io(g, group, gi, ops, s->nnodes, x->d_node, L, x);
}

/* D and the visitor tensors of an unbatched M x N tile (GEMM or convolution), then the group's inputs / outputs. */
static bool bind_epilogue(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x) {
  const evt_kspec *s = &L->spec;
  int gi = L->group;
  if (L->d_tensor >= 0) {
    if (!gemm_tensor(g, gi, L->d_tensor, "D", s->d_dtype, L->m * L->n, L->n, x)) return false;
    if (group[L->d_tensor] != gi) return WHY("group %d: D is bound to %%%s, not a member", gi, g->nodes[L->d_tensor].name);
  } else if (L->n * (int64_t)evt_dtype_size(s->d_dtype) % 16) {
    return WHY("group %d: scratch D rows of %lld x %s are not a multiple of 16 bytes", gi, (long long)L->n,
               evt_dtype_name(s->d_dtype));
  }
  x->d_node = L->d_tensor;
  evt_vop ops[EVT_KSPEC_MAX_NODES];
  for (int i = 0; i < s->nnodes; i++) {
    const evt_vnode *r = &s->nodes[i];
    ops[i] = r->op;
    if (!evt_vop_has_memory(r->op)) continue;
    /* rows of 16 bytes: a tile's N, a row vector's N, a column vector's M; a scalar is read as one value */
    int64_t elems = evt_vop_elems(r->op, L->m, L->n);
    int64_t rowlen = r->op == EVT_V_SCALAR_LOAD ? 0 : r->op == EVT_V_AUX_LOAD || r->op == EVT_V_AUX_STORE ? L->n : elems;
    char what[64];
    snprintf(what, sizeof what, "visitor node %s (%s)", r->name, evt_vop_name(r->op));
    if (!gemm_tensor(g, gi, L->vtensor[i], what, r->dtype, elems, rowlen, x)) return false;
    x->ptr_node[i] = L->vtensor[i];
    if (evt_vop_class(r->op) == 'S' && group[L->vtensor[i]] != gi)
      return WHY("group %d: %s stores into %%%s, not a member of the group", gi, what, g->nodes[L->vtensor[i]].name);
  }
  return bind_group_io(g, group, gi, ops, s->nnodes, x->d_node, L, x);
}

static bool bind_gemm(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x) {
  const evt_kspec *s = &L->spec;
  int gi = L->group;
  x->k = L->k;
  if (L->m < 1 || L->n < 1 || L->k < 1 || L->m > 2147483647 || L->n > 2147483647 || L->k > 2147483647)
    return WHY("group %d: GEMM [%lld x %lld x %lld] is empty or exceeds the launcher's int sizes", gi, (long long)L->m,
               (long long)L->n, (long long)L->k);
  if (s->batched) return bind_bmm(g, group, L, x);
  if (L->l > 1 || L->l_outer > 1)
    return WHY("group %d: batch fields (l %d, l_outer %d) on an unbatched spec", gi, L->l, L->l_outer);
  if (s->nnodes > EVT_LAUNCH_MAX_PTRS) return WHY("group %d: %d visitor nodes (at most %d pointers)", gi, s->nnodes, EVT_LAUNCH_MAX_PTRS);
  if (s->d_node < 0 || s->d_node >= s->nnodes) return WHY("group %d: the spec has no D node", gi);
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  if (!gemm_tensor(g, gi, L->a_node, "operand A", s->ab_dtype, L->m * L->k, at ? L->m : L->k, x)) return false;
  if (!gemm_tensor(g, gi, L->b_node, "operand B", evt_kspec_b_dtype(s), L->k * L->n, bt ? L->k : L->n, x)) return false;
  x->a_node = L->a_node;
  x->b_node = L->b_node;
  if (group[L->a_node] == gi || group[L->b_node] == gi)
    return WHY("group %d: an operand of the GEMM is a member of its own group", gi);
  return bind_epilogue(g, group, L, x);
}

/* A convolution's operand: bound, in the spec's dtype, exactly the NHWC / OHWC tensor of the geometry (channels
 * rows: 16-byte multiples by the lowering's channel rules, checked again), not a member of the group. */
static bool conv_operand(const evt_graph *g, const int *group, const evt_lowered *L, int v, const char *what,
                         int64_t elems, int64_t channels, evt_group_exec *x) {
  int gi = L->group;
  if (!gemm_tensor(g, gi, v, what, L->spec.ab_dtype, elems, channels, x)) return false;
  if (group[v] == gi) return WHY("group %d: %s %%%s is a member of its own group", gi, what, g->nodes[v].name);
  return true;
}

/* A CONV+EVT group (lower_conv.c): m, n, k the GEMM view the launcher checks against its compiled-in geometry; a, b
 * the operands as the geometry reads them (fprop x, w; dgrad dy, w; wgrad dy, x); the epilogue as a GEMM's over the
 * [m, n] tile (the NHWC output). Never a cuBLAS call, an unfused pair, a tuned config or an in-step A/B: those are
 * GEMM-only (a conv's mainloop is CUTLASS's implicit GEMM with its geometry compiled in; cuBLAS has no conv). */
static bool bind_conv(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x) {
  const evt_kspec *s = &L->spec;
  const evt_conv_geom *c = &s->conv;
  int gi = L->group;
  int64_t m, n, k;
  evt_conv_gemm_shape(c, &m, &n, &k);
  x->k = L->k;
  if (m != L->m || n != L->n || k != L->k || m > 2147483647 || n > 2147483647 || k > 2147483647)
    return WHY("group %d: conv %s [%lld x %lld x %lld] is not its geometry's GEMM view or exceeds the launcher's int sizes",
               gi, evt_conv_kind_name(c->kind), (long long)L->m, (long long)L->n, (long long)L->k);
  if (s->batched || s->nnodes > EVT_LAUNCH_MAX_PTRS || s->d_node < 0 || s->d_node >= s->nnodes)
    return WHY("group %d: a conv spec is unbatched with a D node and at most %d visitor nodes", gi, EVT_LAUNCH_MAX_PTRS);
  int64_t xs = (int64_t)c->n * c->h * c->w * c->c, ys = (int64_t)c->n * c->p * c->q * c->o;
  int64_t ws = (int64_t)c->o * c->kh * c->kw * c->c;
  bool fprop = c->kind == EVT_CONV_FPROP, wgrad = c->kind == EVT_CONV_WGRAD;
  if (!conv_operand(g, group, L, L->a_node, fprop ? "operand x" : "operand dy", fprop ? xs : ys, fprop ? c->c : c->o, x) ||
      !conv_operand(g, group, L, L->b_node, wgrad ? "operand x" : "operand w", wgrad ? xs : ws, c->c, x))
    return false;
  x->a_node = L->a_node;
  x->b_node = L->b_node;
  return bind_epilogue(g, group, L, x);
}

/* A nucleus-free spec whose every tensor is a whole M x N one (aux loads / stores, scalars, compute): the kernel
 * computes element (i, j) from element (i, j) of each tensor only, so any M' x N' = M x N launch computes the
 * same (no broadcast vector, reduction, one_hot or Philox index ties an element to its row and column). */
static bool elementwise_only(const evt_rspec *s) {
  if (s->nucleus != EVT_ROWN_NONE) return false;
  for (int i = 0; i < s->nnodes; i++) {
    evt_vop op = s->nodes[i].op;
    if (op == EVT_V_AUX_LOAD || op == EVT_V_AUX_STORE || op == EVT_V_SCALAR || op == EVT_V_SCALAR_LOAD) continue;
    if (evt_vop_class(op) != 'C') return false;
  }
  return true;
}

/* The launch shape of an elementwise-only group: [M, N] itself unless M is too small to fill the GPU (a 1-D
 * tensor is one row: one CTA of the row kernel for all of it), N too short for the row kernel's vectors and
 * warps (N = 64: a warp of 8 rows per CTA) or too long for a register-resident row (XML-CNN's [1, 670208] bias gradient);
 * then [M·N / n', n'] with n' the largest multiple of 8 dividing M·N in [256, 4096] (vectors stay whole). */
static void elementwise_launch_shape(const evt_rspec *s, int64_t m, int64_t n, int64_t *mo, int64_t *no) {
  *mo = m, *no = n;
  int64_t total = m * n;
  if (!elementwise_only(s) || (m >= 1024 && n >= 512 && n <= EVT_ROW_MAX_N) || total < 8192) return;
  for (int64_t c = 4096; c >= 256; c -= 8)
    if (total % c == 0) {
      if (c != n) *mo = total / c, *no = c;
      return;
    }
}

/* spmm_t: the runtime builds A^T's CSR (colptr, rowidx, perm) in the CSR's index dtype on the device every run
 * (evt_fb_csr_transpose); with i32 indices every position and size must fit i32. */
static bool spmm_t_fits(const evt_graph *g, const evt_lowered *L, evt_group_exec *x) {
  if (L->rspec.idx_dtype != EVT_I32) return true;
  int64_t nnz = L->rin[1] >= 0 ? evt_type_numel(&g->nodes[L->rin[1]].type) : 0;
  int64_t rows = L->rin[0] >= 0 ? evt_type_numel(&g->nodes[L->rin[0]].type) : 0;
  if (nnz <= 2147483647 && rows <= 2147483647 && L->m < 2147483647) return true;
  return WHY("group %d: spmm_t with i32 indices over %lld entries: A^T's CSR would not fit i32", L->group,
             (long long)nnz);
}

bool evt_exec_bind(const evt_graph *g, const int *group, const evt_lowered *L, evt_group_exec *x) {
  const evt_rspec *s = &L->rspec;
  for (int k = 0; k < 4; k++) x->in_node[k] = -1;
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) x->ptr_node[i] = -1;
  x->a_node = x->b_node = x->d_node = -1;
  x->m = L->m;
  x->n = L->n;
  x->k = 0;
  x->why[0] = 0;
  if (!L->ok) return WHY("%s", L->reason);
  if (L->kind == EVT_LK_GEMM_EVT) return bind_gemm(g, group, L, x);
  if (L->kind == EVT_LK_CONV_EVT) return bind_conv(g, group, L, x);
  if (L->kind != EVT_LK_ROW && L->kind != EVT_LK_POINTWISE) return WHY("group %d: no generated kernel for this kind", L->group);
  if (s->nucleus == EVT_ROWN_SPMM && s->has_perm && !spmm_t_fits(g, L, x)) return false;
  elementwise_launch_shape(s, L->m, L->n, &x->m, &x->n);
  /* rows longer than a register-resident row-group run as the generated kernel's long-row or column-block form */
  if ((x->n > EVT_ROW_MAX_N && !evt_rspec_long_rows(s)) || x->n > 2147483647 || x->m > 2147483647 || x->n < 0 || x->m < 0)
    return WHY("group %d: [%lld, %lld] does not fit a row kernel (rows over 32768 with a sum over rows beside a nucleus "
               "or a per-row reduction)", L->group, (long long)L->m, (long long)L->n);
  if (s->nnodes > EVT_ROW_LAUNCH_MAX_PTRS)
    return WHY("group %d: %d spec nodes (at most %d pointers)", L->group, s->nnodes, EVT_ROW_LAUNCH_MAX_PTRS);
  int nin = s->nucleus == EVT_ROWN_SPMM ? 4 : evt_row_nucleus_ninputs(s); /* (spmm: rowptr, col, val, x) */
  for (int k = 0; k < nin && k < 4; k++) {
    int v = L->rin[k];
    if (v < 0 || v >= g->nnodes) return WHY("group %d: nucleus input %d is not bound", L->group, k);
    if (group[v] == L->group)
      return WHY("group %d: nucleus input %d is %%%s, a member of its own group", L->group, k, g->nodes[v].name);
    x->in_node[k] = v;
  }
  evt_vop ops[EVT_ROW_LAUNCH_MAX_PTRS];
  for (int i = 0; i < s->nnodes; i++) {
    const evt_rnode *r = &s->nodes[i];
    ops[i] = r->op;
    if (!evt_vop_has_memory(r->op)) continue;
    int v = L->vtensor[i];
    if (v < 0 || v >= g->nnodes) return WHY("group %d: spec node %s is not bound to a tensor", L->group, r->name);
    const evt_type *t = &g->nodes[v].type;
    if (t->dtype != r->dtype)
      return WHY("group %d: %%%s is %s but spec node %s has %s", L->group, g->nodes[v].name, evt_dtype_name(t->dtype),
                 r->name, evt_dtype_name(r->dtype));
    if (evt_type_numel(t) != evt_rspec_node_elems(s, i, L->m, L->n))
      return WHY("group %d: %%%s has %lld elements, spec node %s needs %lld", L->group, g->nodes[v].name,
                 (long long)evt_type_numel(t), r->name, (long long)evt_rspec_node_elems(s, i, L->m, L->n));
    x->ptr_node[i] = v;
  }
  return bind_group_io(g, group, L->group, ops, s->nnodes, -1, L, x);
}

/* Refinement (evt_options.refine_partition): a group of several nodes the lowering refuses would run every
 * member node by node. The node the refusal names (a per-row index vector in a row space, a cast, a permute
 * inside an epilogue, ...) is put in a group of its own and the graph partitioned again, up to REFINE_ROUNDS
 * times, so the rest of the group still becomes a generated kernel. Off by default for evtc and the C API:
 * on tiny bf16 graphs (resnet_block) refined plans flip ReLU masks under bf16 rounding, which `evtc run
 * --check`'s bound, relative to the interpreter's own distance from exact, cannot follow. Refined plans can
 * make a view of a stored value share its memory (evt_lowered_alias_base); the CPU model materializes such
 * views. */
#define REFINE_ROUNDS 16

static bool is_view(evt_op op) {
  return op == EVT_OP_RESHAPE || op == EVT_OP_SQUEEZE || op == EVT_OP_UNSQUEEZE || op == EVT_OP_EXPAND ||
         op == EVT_OP_PERMUTE || op == EVT_OP_TRANSPOSE;
}

/* refine_partition 2: a group refused because a member's shape is not a split of its row space (a batch
 * norm's per-channel statistics math, [C], beside its [N·H·W, C] apply) has every elementwise member smaller
 * than its largest value isolated in the same round, as one class that may group among itself, so one more
 * partition separates them all instead of one per round (each round solves the ILP again). */
static void isolate_small_elementwise(const evt_graph *g, const evt_part_plan *part, int grp, unsigned char *iso) {
  int64_t big = 0;
  for (int v = 0; v < g->nnodes; v++)
    if (part->group[v] == grp && evt_type_numel(&g->nodes[v].type) > big) big = evt_type_numel(&g->nodes[v].type);
  for (int v = 0; v < g->nnodes; v++)
    if (part->group[v] == grp && evt_op_is_elementwise(g->nodes[v].op) && evt_type_numel(&g->nodes[v].type) < big)
      iso[v] = EVT_PART_ISOLATE_CLASS; /* together, apart from the big members: one kernel, not one per node */
}

static evt_status refine(evt_graph *g, const evt_part_options *opt, int mode, evt_exec_plan *p) {
  if (mode != 1 && mode != 2) return EVT_OK;
  const bool batch = mode == 2;
  int n = g->nnodes;
  unsigned char *iso = calloc((size_t)n + 1, 1);
  int *size = calloc((size_t)n + 1, sizeof *size);
  EVT_ASSERT(iso && size);
  evt_status st = EVT_OK;
  for (int round = 0; round < REFINE_ROUNDS && st == EVT_OK; round++) {
    memset(size, 0, ((size_t)n + 1) * sizeof *size);
    for (int v = 0; v < n; v++)
      if (p->part.group[v] >= 0 && p->part.group[v] < n) size[p->part.group[v]]++;
    bool more = false;
    for (int i = 0; i < p->low.n; i++) {
      const evt_lowered *L = &p->low.k[i];
      int b = L->bad_node;
      if (L->ok || b < 0 || b >= n || L->group < 0 || L->group >= n || size[L->group] < 2) continue;
      /* views and permutes follow their producer: a refused view (e.g. a second view of a reduction that
       * leaves the group) isolates the node it views instead */
      while (b >= 0 && is_view(g->nodes[b].op)) b = g->nodes[b].ninputs > 0 ? g->nodes[b].inputs[0] : -1;
      /* (a node refused among its class goes on alone) */
      if (b < 0 || iso[b] == EVT_PART_ISOLATE_ALONE || g->nodes[b].op == EVT_OP_INPUT || g->nodes[b].op == EVT_OP_PARAM)
        continue;
      iso[b] = EVT_PART_ISOLATE_ALONE;
      more = true;
      if (batch && strstr(L->reason, "is not a split of the")) isolate_small_elementwise(g, &p->part, L->group, iso);
    }
    if (!more) break;
    evt_part_plan next;
    st = evt_part_plan_build_isolated(g, opt, EVT_PART_LAMBDA_DEFAULT, evt_lower_compat_for(p->lower_flags), iso, &next);
    if (st != EVT_OK) break;
    evt_lower_result low;
    st = evt_lower_plan_flags(g, &next, p->lower_flags, &low);
    if (st != EVT_OK) {
      evt_part_plan_free(&next);
      break;
    }
    evt_lower_retarget(g, next.group, &low, p->arch);
    evt_lower_free(&p->low);
    evt_part_plan_free(&p->part);
    p->part = next;
    p->low = low;
  }
  free(iso);
  free(size);
  return st;
}

/* The unfused pair of GEMM group gi (see evt_group_exec.unf): the tuner's row spec for the rest of the
 * epilogue, bound through the GEMM spec's bindings. False when it cannot run so. */
static bool bind_unfused(const evt_graph *g, evt_exec_plan *p, int gi, const evt_lowered *L, evt_group_exec *x,
                         int bias) {
  int map[EVT_RSPEC_MAX_NODES], tn = -1, dn = -1, bn = -1;
  char err[320];
  evt_rspec *rs = &p->urs[gi];
  if (L->spec.batched || x->d_node < 0 || x->n > EVT_ROW_MAX_N) return false;
  if (evt_dtype_is_fp8(L->spec.ab_dtype)) return false; /* cuBLAS takes no fp8 operands here, and T would be fp8 */
  evt_status st = evt_tune_unfused_rspec(&L->spec, L->spec.ab_dtype, bias, rs, map, &tn, &dn, &bn, err, sizeof err);
  if (st == EVT_ERR_UNSUPPORTED && dn < 0 && bias && bn >= 0 && L->spec.d_dtype == L->spec.ab_dtype) {
    /* D = acc + bias: cuBLASLt's bias epilogue writes D itself, no row kernel */
    int b = x->ptr_node[bn];
    if (b < 0 || g->nodes[b].type.dtype != L->spec.ab_dtype) return false;
    x->unf_bias = b;
    x->blas = 1;
    return true;
  }
  if (st != EVT_OK || tn < 0 || dn < 0 || rs->nnodes > EVT_ROW_LAUNCH_MAX_PTRS) return false;
  for (int i = 0; i < EVT_ROW_LAUNCH_MAX_PTRS; i++) x->rptr[i] = -1;
  for (int i = 0; i < rs->nnodes; i++) {
    x->rptr[i] = i == tn ? EVT_EXEC_PTR_T : i == dn ? x->d_node : map[i] >= 0 ? x->ptr_node[map[i]] : -1;
    if (evt_vop_has_memory(rs->nodes[i].op) && x->rptr[i] == -1) return false;
  }
  x->unf_bias = bias && bn >= 0 ? x->ptr_node[bn] : -1;
  if (bias && (x->unf_bias < 0 || g->nodes[x->unf_bias].type.dtype != L->spec.ab_dtype)) return false;
  x->unf = 1;
  return true;
}

/* The kernel (generated GEMM or row kernel; none for a cuBLAS call) of a fused group's implementation x, added
 * to the plan's list once; T's bytes of an unf implementation into *tmax, a scratch D into the scratch. */
static void assign_kernel(evt_exec_plan *p, int gi, const evt_lowered *L, evt_group_exec *x, int64_t *tmax) {
  if (x->blas || (L->kind == EVT_LK_GEMM_EVT && x->d_node >= 0 && evt_exec_plain_blas(L, x->tuned))) {
    x->blas = 1; /* (or cuBLASLt with the bias: bind_unfused) */
    return;
  }
  char uname[40];
  const char *kn = L->kernel;
  if (x->unf) {
    evt_rspec_kernel_name(&p->urs[gi], uname);
    kn = uname;
    int64_t tb = x->m * x->n * (int64_t)evt_dtype_size(L->spec.ab_dtype);
    if (tb > *tmax) *tmax = tb;
  }
  int k = 0;
  while (k < p->nkernels && strcmp(p->kname[k], kn)) k++;
  if (k == p->nkernels) {
    snprintf(p->kname[k], sizeof p->kname[k], "%s", kn);
    if (x->unf) p->kspec[k] = &p->urs[gi];
    else if (evt_lowered_cutlass(L)) p->gspec[k] = &L->spec; /* GEMM+EVT or CONV+EVT: a CUTLASS kernel */
    else p->kspec[k] = &L->rspec;
    p->nkernels++;
  }
  x->kernel = k;
  if (evt_lowered_cutlass(L) && x->d_node < 0) { /* a batched scratch D is packed: every batch's tile */
    int64_t nb = L->spec.batched ? (int64_t)(L->l > 0 ? L->l : 1) * (L->l_outer > 1 ? L->l_outer : 1) : 1;
    int64_t bytes = nb * x->m * x->n * (int64_t)evt_dtype_size(L->spec.d_dtype);
    if (bytes > p->scratch_bytes) p->scratch_bytes = bytes;
  }
}

static bool bind_alt_unfused(const evt_graph *g, evt_exec_plan *p, int gi, const evt_lowered *L, evt_group_exec *x,
                             int bias) {
  evt_group_exec other = *x;
  bool ok = bind_unfused(g, p, gi, L, &other, bias != 0);
  if (!ok && bias < 0) {
    other = *x;
    ok = bind_unfused(g, p, gi, L, &other, 0);
  }
  if (!ok) return false;
  x->ab = other.ab = 1;
  p->alt[gi] = other;
  return true;
}

/* The descriptions of a group whose kernel runs first and whose pair is its alternative. */
static void note_ab(evt_exec_plan *p, int gi, const char *why) {
  evt_group_exec *x = &p->groups[gi];
  size_t len = strlen(x->tune_desc);
  snprintf(x->tune_desc + len, sizeof x->tune_desc - len, "%sruns fused (in-step A/B: %s)", len ? "; " : "", why);
  snprintf(p->alt[gi].tune_desc, sizeof p->alt[gi].tune_desc, "runs unfused (in-step A/B: %s)", why);
}

/* The plan's sources (ungrouped nodes other than inputs / params) and each group's members, in id order. */
static evt_status collect_members(evt_graph *g, evt_exec_plan *p) {
  int n = g->nnodes, ng = p->ngroups;
  for (int v = 0; v < n; v++) {
    int gi = p->part.group[v];
    if (gi >= 0) {
      EVT_ASSERT(gi < ng);
      p->groups[gi].nmembers++;
      continue;
    }
    if (caller_slot(&g->nodes[v])) continue;
    for (int k = 0; k < g->nodes[v].ninputs; k++)
      if (p->part.group[g->nodes[v].inputs[k]] >= 0)
        return evt_graph_errorf(g, v, EVT_ERR_INTERNAL, "a partition source reads a grouped tensor");
    p->sources[p->nsources++] = v;
  }
  for (int gi = 0; gi < ng; gi++) {
    evt_group_exec *x = &p->groups[gi];
    x->members = malloc(sizeof(int) * ((size_t)x->nmembers + 1));
    EVT_ASSERT(x->members);
    x->nmembers = 0;
  }
  for (int v = 0; v < n; v++)
    if (p->part.group[v] >= 0) {
      evt_group_exec *x = &p->groups[p->part.group[v]];
      x->members[x->nmembers++] = v;
    }
  return EVT_OK;
}

/* A GEMM group whose tuning record measured the unfused pair faster: the pair where it measured at least
 * EVT_EXEC_UNFUSED_MIN_GAIN faster (evt_exec_unfused_wanted), else the fastest fused config measured; with the
 * in-step A/B both are bound, the margin's choice first. */
static void apply_unfused_record(const evt_graph *g, evt_exec_plan *p, int gi, const evt_lowered *L,
                                 const evt_tune_group *t, int ab_mode) {
  evt_group_exec *x = &p->groups[gi];
  char lab[96];
  const bool want = evt_exec_unfused_wanted(t->fused_ms, t->unfused_ms);
  evt_tile_config_label(&L->spec.cfg, lab, sizeof lab);
  if (ab_mode >= 1 && bind_alt_unfused(g, p, gi, L, x, t->unfused_bias)) {
    snprintf(p->alt[gi].tune_desc, sizeof p->alt[gi].tune_desc, "%.150s; runs unfused (in-step A/B)", t->desc);
    snprintf(x->tune_desc, sizeof x->tune_desc, "%.120s; runs fused %.60s (in-step A/B)", t->desc, lab);
    if (want) evt_exec_swap_alt(p, gi);
  } else if (want && bind_unfused(g, p, gi, L, x, t->unfused_bias)) {
    snprintf(x->tune_desc, sizeof x->tune_desc, "%.150s; runs unfused", t->desc);
  } else {
    snprintf(x->tune_desc, sizeof x->tune_desc, "%.120s; runs fused %.40s (pair < %g%% faster)", t->desc, lab,
             100 * EVT_EXEC_UNFUSED_MIN_GAIN);
  }
}

/* A GEMM group's tuning record (src/tune/tune.h) and the in-step A/B it calls for. */
static void apply_tuning(const evt_graph *g, evt_exec_plan *p, int gi, const evt_lowered *L, const evt_tune_group *t,
                         int ab_mode) {
  evt_group_exec *x = &p->groups[gi];
  x->tuned = t->choice;
  x->swizzle = t->swizzle;
  x->raster = t->raster;
  snprintf(x->tune_desc, sizeof x->tune_desc, "%s", t->desc);
  x->rec_fused_ms = t->fused_ms;
  x->rec_unfused_ms = t->unfused_ms;
  if (x->fused && t->choice == EVT_TUNE_UNFUSED && !(x->d_node >= 0 && evt_exec_plain_blas(L, EVT_TUNE_UNFUSED)))
    apply_unfused_record(g, p, gi, L, t, ab_mode);
  /* a FUSED record whose pair measured within the isolated timings' error of the kernel: the in-step A/B too */
  const bool epi_kernel = x->fused && !x->ab && !x->unf && !x->blas && x->d_node >= 0 && !evt_exec_plain_blas(L, x->tuned);
  if (ab_mode >= 1 && epi_kernel && t->choice == EVT_TUNE_FUSED && t->fused_ms > 0 && t->unfused_ms > 0 &&
      t->unfused_ms <= (1.0 + EVT_EXEC_UNFUSED_MIN_GAIN) * t->fused_ms && bind_alt_unfused(g, p, gi, L, x, t->unfused_bias)) {
    char why[48];
    snprintf(why, sizeof why, "the pair within %g%%", 100 * EVT_EXEC_UNFUSED_MIN_GAIN);
    note_ab(p, gi, why);
  } else if (ab_mode == 2 && epi_kernel && bind_alt_unfused(g, p, gi, L, x, -1)) {
    note_ab(p, gi, "fusion_ab 2");
  }
}

/* Few output tiles for a long K: without split-K the generated kernel runs a handful of CTAs down K, so an
 * untuned group runs cuBLAS (split-K) + a row kernel. (Not for a group with an in-step A/B: it measures both,
 * and its alternative owns urs[gi].) */
static void apply_split_k_rule(const evt_graph *g, evt_exec_plan *p, int gi, const evt_lowered *L) {
  evt_group_exec *x = &p->groups[gi];
  if (x->fused && !x->ab && !x->unf && !x->blas && x->d_node >= 0 && x->tuned != EVT_TUNE_FUSED &&
      !evt_exec_plain_blas(L, x->tuned) && evt_exec_split_k_starved(L, x->m, x->n, x->k) && bind_unfused(g, p, gi, L, x, 0))
    snprintf(x->tune_desc, sizeof x->tune_desc, "runs unfused: %lld output tiles for K = %lld (no split-K in the "
             "generated mainloop)", (long long)evt_exec_output_tiles(L, x->m, x->n), (long long)x->k);
}

static void alloc_plan(evt_exec_plan *p, int n, int ng) {
  p->ngroups = ng;
  p->groups = calloc((size_t)ng + 1, sizeof *p->groups);
  p->sources = malloc(sizeof(int) * ((size_t)n + 1));
  p->kname = calloc((size_t)ng + 1, sizeof *p->kname);
  p->kspec = calloc((size_t)ng + 1, sizeof *p->kspec);
  p->gspec = calloc((size_t)ng + 1, sizeof *p->gspec);
  p->urs = calloc((size_t)ng + 1, sizeof *p->urs);
  p->alt = calloc((size_t)ng + 1, sizeof *p->alt);
  EVT_ASSERT(p->groups && p->sources && p->kname && p->kspec && p->gspec && p->urs && p->alt);
}

evt_status evt_exec_plan_build(evt_graph *g, const evt_options *o, evt_exec_plan *p) {
  evt_options dflt;
  if (!o) evt_options_init(&dflt), o = &dflt;
  memset(p, 0, sizeof *p);
  evt_part_options opt = evt_part_options_default();
  opt.use_cache = 0;
  p->lower_flags = evt_lower_flags(o);
  evt_status st = evt_lower_partition_flags(g, &opt, EVT_PART_LAMBDA_DEFAULT, p->lower_flags, &p->part);
  if (st != EVT_OK) return st;
  evt_compile_target(o, &p->arch, &p->ptx);
  st = evt_lower_plan_flags(g, &p->part, p->lower_flags, &p->low);
  if (st == EVT_OK) evt_lower_retarget(g, p->part.group, &p->low, p->arch);
  if (st == EVT_OK) st = refine(g, &opt, o->refine_partition, p);
  if (st != EVT_OK) {
    evt_part_plan_free(&p->part);
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "the lowering does not match the partition");
  }
  evt_tune_group *tg = calloc((size_t)p->low.n + 1, sizeof *tg);
  EVT_ASSERT(tg);
  evt_tune_apply_lowered(&p->low, NULL, NULL, tg); /* tuned configs / unfused choices (tune.h) */
  alloc_plan(p, g->nnodes, p->part.ngroups);
  if ((st = collect_members(g, p)) != EVT_OK) {
    evt_exec_plan_free(p);
    free(tg);
    return st;
  }
  int64_t tmax = 0; /* largest T of an unf group */
  for (int gi = 0; gi < p->ngroups; gi++) {
    evt_group_exec *x = &p->groups[gi];
    const evt_lowered *L = &p->low.k[gi];
    x->group = gi;
    x->kind = L->kind;
    x->kernel = -1;
    x->unf_bias = -1;
    x->fused = evt_exec_bind(g, p->part.group, L, x);
    /* tuning records, the unfused pair (cuBLAS + row kernel) and the in-step A/B are GEMM-only: a CONV+EVT group
     * keeps its generated kernel (cuBLAS has no convolution; the tuner measures GEMM mainloops, and a conv's
     * configuration is the lowering's, compiled in with its geometry) */
    if (L->kind == EVT_LK_GEMM_EVT) {
      apply_tuning(g, p, gi, L, &tg[gi], o->fusion_ab);
      apply_split_k_rule(g, p, gi, L);
    }
    if (!x->fused) continue;
    assign_kernel(p, gi, L, x, &tmax);
    if (x->ab) {
      assign_kernel(p, gi, L, &p->alt[gi], &tmax);
      p->nab++;
    }
  }
  if (tmax > 0) { /* T after the D scratch */
    p->t_offset = (p->scratch_bytes + 255) / 256 * 256;
    p->scratch_bytes = p->t_offset + tmax;
  }
  free(tg);
  return EVT_OK;
}

int64_t evt_exec_output_tiles(const evt_lowered *L, int64_t m, int64_t n) {
  int64_t tm = L->spec.cfg.tile_m > 0 ? L->spec.cfg.tile_m : 128, tn = L->spec.cfg.tile_n > 0 ? L->spec.cfg.tile_n : 256;
  return ((m + tm - 1) / tm) * ((n + tn - 1) / tn);
}

bool evt_exec_split_k_starved(const evt_lowered *L, int64_t m, int64_t n, int64_t k) {
  if (L->kind != EVT_LK_GEMM_EVT || L->spec.batched) return false;
  return evt_exec_output_tiles(L, m, n) * 4 <= EVT_EXEC_SMS && k >= 32 * (m > n ? m : n);
}

bool evt_exec_unfused_wanted(double fused_ms, double unfused_ms) {
  return fused_ms > 0 && unfused_ms > 0 && unfused_ms <= (1.0 - EVT_EXEC_UNFUSED_MIN_GAIN) * fused_ms;
}

bool evt_exec_plain_blas(const evt_lowered *L, int tuned) {
  const evt_kspec *s = &L->spec;
  if (L->kind != EVT_LK_GEMM_EVT || !L->ok || L->d_tensor < 0) return false;
  if (s->nnodes != 1 || s->nodes[0].op != EVT_V_ACC || s->d_node != 0) return false;
  if (s->batched && L->l_outer > 1) return false;
  bool ab16 = s->ab_dtype == EVT_BF16 || s->ab_dtype == EVT_F16;
  if (!(ab16 || s->ab_dtype == EVT_F32) || (s->d_dtype != s->ab_dtype && s->d_dtype != EVT_F32)) return false;
  return tuned != EVT_TUNE_FUSED;
}

/* Drops group gi's alternative implementation (it keeps the one it runs). */
