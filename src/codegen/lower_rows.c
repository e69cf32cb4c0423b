/* Reduce-apply row groups and nucleus-free (pointwise) groups → evt_rspec (contract in lower.h). The [M, N] space is
 * the nucleus's output with N its last (row) dim, or, without a nucleus, the largest tensor a member writes or reads
 * (N = its last dim). The epilogue is built exactly as for a GEMM into a scratch kspec (acc nodes carry which
 * nucleus value they read) and then copied; every member value that leaves is an aux store. */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_internal.h"
#include "evt_row_config.h"

/* A dense M x N (mn = 1) or N-vector (mn = 0) operand of a row nucleus: its memory node, or -1. */
static int row_input(lctx *c, int x, bool mn) {
  int64_t st[EVT_MAX_RANK];
  int base;
  const evt_type *t = &c->g->nodes[x].type;
  if (!evt_lower_mem_strides(c->g, c->group, -1, x, st, &base)) return -1;
  if (mn ? evt_type_numel(t) != c->m * c->n : evt_type_numel(t) != c->n) return -1;
  return dense(t->shape, st, 0, t->rank, 1) ? base : -1;
}

/* The row nucleus of nucleus node c->nu (refused: not a row op, a softmax not over the last dim, rank 0). */
static evt_row_nucleus row_nucleus(lctx *c) {
  const evt_graph *g = c->g;
  int nu = c->nu;
  evt_row_nucleus rn = EVT_ROWN_NONE;
  const evt_node *nn = &g->nodes[nu];
  const evt_type *space = &nn->type;
  switch (nn->op) {
  case EVT_OP_SOFTMAX: rn = EVT_ROWN_SOFTMAX; break;
  case EVT_OP_SOFTMAX_BACKWARD: rn = EVT_ROWN_SOFTMAX_BWD; break;
  case EVT_OP_LAYER_NORM: rn = EVT_ROWN_LAYERNORM; break;
  case EVT_OP_LAYER_NORM_BACKWARD_INPUT: rn = EVT_ROWN_LAYERNORM_BWD; break;
  case EVT_OP_SPMM: case EVT_OP_SPMM_T: rn = EVT_ROWN_SPMM; break;
  default: evt_lower_refuse(c, nu, "no row nucleus for %s", evt_op_table[nn->op].name); break;
  }
  if (rn == EVT_ROWN_SOFTMAX || rn == EVT_ROWN_SOFTMAX_BWD) {
    int64_t d = nn->attr.dim < 0 ? nn->attr.dim + space->rank : nn->attr.dim;
    if (d != space->rank - 1)
      evt_lower_refuse(c, nu, "softmax over dim %lld (row kernels reduce the last dim)", (long long)d);
  }
  if (space->rank == 0) evt_lower_refuse(c, nu, "a rank-0 row");
  if (rn == EVT_ROWN_SPMM && space->shape[space->rank - 1] > EVT_ROW_MAX_N)
    evt_lower_refuse(c, nu, "rows of %lld (the spmm kernel holds a row of at most %d in registers)",
                     (long long)space->shape[space->rank - 1], EVT_ROW_MAX_N);
  return rn;
}

/* A nucleus-free group's space: the largest tensor a member writes or reads. */
static const evt_type *pointwise_space(const lctx *c) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi;
  const evt_type *space = NULL;
  int64_t best = -1;
  for (int v = 0; v < g->nnodes; v++) {
    if (group[v] != gi) continue;
    if (evt_type_numel(&g->nodes[v].type) > best) best = evt_type_numel(&g->nodes[v].type), space = &g->nodes[v].type;
    for (int k = 0; k < g->nodes[v].ninputs; k++) {
      const evt_type *t = &g->nodes[g->nodes[v].inputs[k]].type;
      if (evt_type_numel(t) > best) best = evt_type_numel(t), space = t;
    }
  }
  return space;
}

/* Widening casts fused as the nucleus's loads (partition rules: CONVERT): the kernel reads their 16-bit inputs.
 * xin: the nucleus's M×N inputs as read, conv: the casts (members with no visitor node). Returns how many M×N
 * inputs the nucleus has. */
static int fused_casts(const lctx *c, evt_row_nucleus rn, int conv[2], int xin[2]) {
  const evt_graph *g = c->g;
  const int *group = c->group;
  int gi = c->gi, nu = c->nu;
  int nmn = rn == EVT_ROWN_SPMM ? 0 : rn == EVT_ROWN_SOFTMAX || rn == EVT_ROWN_LAYERNORM ? 1 : 2;
  for (int k = 0; nu >= 0 && rn != EVT_ROWN_NONE && k < nmn && k < g->nodes[nu].ninputs; k++) {
    int x = xin[k] = g->nodes[nu].inputs[k];
    const evt_node *xn = &g->nodes[x];
    if (group[x] == gi && xn->op == EVT_OP_CAST && xn->ninputs == 1 && xn->type.dtype == EVT_F32) {
      evt_dtype from = g->nodes[xn->inputs[0]].type.dtype;
      if (from == EVT_BF16 || from == EVT_F16) conv[k] = x, xin[k] = xn->inputs[0];
    }
  }
  return nmn;
}

/* The row spec's nucleus and input dtypes over the [M, N] space. */
static void row_spec_init(lctx *c, evt_lowered *L, const evt_type *space, evt_row_nucleus rn, const int xin[2]) {
  const evt_graph *g = c->g;
  L->n = space->rank ? space->shape[space->rank - 1] : 1;
  L->m = L->n ? evt_type_numel(space) / L->n : 0;
  c->m = L->m, c->n = L->n;
  evt_rspec_init(&L->rspec, rn, xin[0] >= 0 ? g->nodes[xin[0]].type.dtype : EVT_F32);
  if (xin[1] >= 0 && g->nodes[xin[1]].type.dtype != L->rspec.in_dtype) {
    L->rspec.in1_mixed = 1;
    L->rspec.in1_dtype = g->nodes[xin[1]].type.dtype;
  }
}

/* The nucleus's inputs: dense M×N tiles (read once, reused as acc(IN0/IN1)) and N-vectors w / b; then acc(OUT). */
static void nucleus_inputs(lctx *c, evt_lowered *L, evt_row_nucleus rn, int nmn, const int xin[2]) {
  const evt_graph *g = c->g;
  int nu = c->nu;
  int *vid = c->vid;
  const evt_node *nn = &g->nodes[nu];
  for (int k = 0; k < nn->ninputs && c->bad < 0; k++) {
    bool mn = k < nmn;
    int x = mn ? xin[k] : nn->inputs[k];
    int base = row_input(c, x, mn);
    evt_dtype dt = g->nodes[x].type.dtype;
    if (base < 0)
      evt_lower_refuse(c, nu, "input %%%s is not a dense %s", g->nodes[x].name, mn ? "M x N tile" : "N-vector");
    else if (!float_dtype(dt)) evt_lower_refuse(c, nu, "input dtype %s", evt_dtype_name(dt));
    if (c->bad >= 0) break;
    L->rin[k] = base;
    if (mn) c->rin[c->nrin++] = base;
    else {
      L->rspec.w_dtype = dt;
      if (k == nmn) L->rspec.has_w = 1;
      else L->rspec.has_b = 1;
    }
  }
  if (rn == EVT_ROWN_LAYERNORM || rn == EVT_ROWN_LAYERNORM_BWD) L->rspec.eps = nn->attr.eps;
  if (c->bad < 0) {
    int acc = evt_lower_add_node(c, nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
    if (acc >= 0) c->accsel[acc] = EVT_RV_OUT;
    vid[nu] = acc;
  }
}

/* The scratch DAG copied into the row spec (same ids). */
static void copy_scratch(lctx *c, evt_lowered *L, const evt_kspec *scratch) {
  int nu = c->nu;
  for (int i = 0; i < scratch->nnodes && c->bad < 0; i++) {
    const evt_vnode *v = &scratch->nodes[i];
    int id = v->op == EVT_V_ACC      ? evt_rspec_acc(&L->rspec, c->accsel[i])
             : v->op == EVT_V_SCALAR ? evt_rspec_scalar(&L->rspec, v->value)
             : v->op == EVT_V_RAND   ? evt_rspec_rand(&L->rspec, v->seed, v->offset, v->dtype)
                                   : evt_rspec_add3(&L->rspec, v->op, v->in[0], v->in[1], v->in[2], v->dtype, v->name);
    if (id != i) evt_lower_refuse(c, nu >= 0 ? nu : c->bad, "row spec rejected node %d", i);
  }
}

void evt_lower_rows(const evt_graph *g, const int *group, int gi, int nu, evt_lowered *L, int *vid) {
  evt_kspec *scratch = calloc(1, sizeof *scratch);
  EVT_ASSERT(scratch);
  lctx c = {.g = g, .group = group, .gi = gi, .nu = nu, .s = scratch, .vid = vid, .vt = L->vtensor,
            .why = L->reason, .whylen = sizeof L->reason, .bad = -1, .row = 1};
  L->kind = nu >= 0 ? EVT_LK_ROW : EVT_LK_POINTWISE;
  const evt_type *space = nu >= 0 ? &g->nodes[nu].type : pointwise_space(&c);
  evt_row_nucleus rn = nu >= 0 ? row_nucleus(&c) : EVT_ROWN_NONE;
  int conv[2] = {-1, -1}, xin[2] = {-1, -1};
  int nmn = fused_casts(&c, rn, conv, xin);
  if (c.bad < 0) row_spec_init(&c, L, space, rn, xin);
  if (c.bad < 0 && rn == EVT_ROWN_SPMM) evt_lower_spmm_inputs(&c, L);
  else if (c.bad < 0 && nu >= 0) nucleus_inputs(&c, L, rn, nmn, xin);
  if (c.bad < 0) evt_lower_members(&c, conv[0], conv[1]);
  int dmem;
  if (c.bad < 0) evt_lower_add_stores(&c, L, false, &dmem);
  copy_scratch(&c, L, scratch);
  free(scratch);
  evt_rspec_canonicalize(&L->rspec); /* commutative operands in one order: one kernel for both orders */
  char err[256];
  if (c.bad < 0 && evt_rspec_check(&L->rspec, err, sizeof err) != EVT_OK) {
    int first = nu;
    for (int v = 0; v < g->nnodes && first < 0; v++)
      if (group[v] == gi) first = v;
    evt_lower_refuse(&c, first, "%s", err);
  }
  if (c.bad >= 0) {
    L->bad_node = c.bad;
    L->kind = EVT_LK_UNFUSED;
    return;
  }
  L->ok = 1;
  L->reason[0] = 0;
  evt_rspec_kernel_name(&L->rspec, L->kernel);
}
