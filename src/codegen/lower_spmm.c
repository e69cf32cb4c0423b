/* The spmm / spmm_t nucleus of a row group (contract in lower.h, ROW): its CSR operand and dense x bound as the row
 * spec's nucleus inputs (L->rin: rowptr, col, val, x), each a dense tensor outside the group. spmm_t (A^T dy) is the
 * same nucleus over A^T's CSR with the values read through perm (csr.h); rin still names A's rowptr / col / val,
 * from which the runtime builds A^T's structure on the device at every run (evt_fb_csr_transpose). */
#include <math.h>
#include <stdlib.h>

#include "codegen/csr.h"
#include "codegen/lower_internal.h"

/* Operand k of the nucleus: its memory node if it is a dense tensor of `numel` elements from outside the group, else -1
 * and the refusal recorded. */
static int csr_operand(lctx *c, int k, int64_t numel, const char *what) {
  const evt_graph *g = c->g;
  int x = g->nodes[c->nu].inputs[k], base;
  const evt_type *t = &g->nodes[x].type;
  int64_t st[EVT_MAX_RANK];
  if (c->group[x] == c->gi) {
    evt_lower_refuse(c, c->nu, "%s %%%s is computed in the group (no prologue fusion)", what, g->nodes[x].name);
    return -1;
  }
  if (!evt_lower_mem_strides(c->g, c->group, -1, x, st, &base) || !dense(t->shape, st, 0, t->rank, 1) ||
      evt_type_numel(t) != numel) {
    evt_lower_refuse(c, c->nu, "%s %%%s is not a dense %lld-element tensor", what, g->nodes[x].name, (long long)numel);
    return -1;
  }
  return base;
}

void evt_lower_spmm_inputs(lctx *c, evt_lowered *L) {
  const evt_graph *g = c->g;
  const evt_node *nn = &g->nodes[c->nu];
  const evt_type *rp = &g->nodes[nn->inputs[0]].type, *cl = &g->nodes[nn->inputs[1]].type;
  const evt_type *vl = &g->nodes[nn->inputs[2]].type, *xt = &g->nodes[nn->inputs[3]].type;
  bool tr = nn->op == EVT_OP_SPMM_T;
  if ((rp->dtype != EVT_I64 && rp->dtype != EVT_I32) || cl->dtype != rp->dtype)
    evt_lower_refuse(c, c->nu, "CSR indices %s / %s (i64 or i32, both the same)", evt_dtype_name(rp->dtype),
                     evt_dtype_name(cl->dtype));
  else if (!float_dtype(vl->dtype) || !float_dtype(xt->dtype))
    evt_lower_refuse(c, c->nu, "values %s, dense operand %s (bf16, f16 or f32)", evt_dtype_name(vl->dtype),
                     evt_dtype_name(xt->dtype));
  else if (xt->rank != 2 || xt->shape[1] != c->n || (!tr && rp->rank == 1 && rp->shape[0] != c->m + 1))
    evt_lower_refuse(c, c->nu, "operand shapes do not match the [%lld, %lld] output", (long long)c->m, (long long)c->n);
  int64_t rows = tr ? xt->shape[0] : c->m, nnz = evt_type_numel(cl);
  const char *what[4] = {"rowptr", "col", "val", "x"};
  int64_t numel[4] = {rows + 1, nnz, nnz, xt->shape[0] * c->n};
  for (int k = 0; k < 4 && c->bad < 0; k++) L->rin[k] = csr_operand(c, k, numel[k], what[k]);
  if (c->bad >= 0) return;
  L->rspec.in_dtype = xt->dtype;
  L->rspec.val_dtype = vl->dtype;
  L->rspec.idx_dtype = rp->dtype;
  /* spmm_t: a gather over A^T's CSR with val read through perm (csr.h), not a scatter with float atomics: bit-identical
   * run to run; the structure depends on rowptr / col only, so val may change between steps */
  L->rspec.has_perm = tr;
  int acc = evt_lower_add_node(c, c->nu, EVT_V_ACC, -1, -1, EVT_F32, NULL, -1);
  if (acc >= 0) c->accsel[acc] = EVT_RV_OUT;
  c->vid[c->nu] = acc;
}

/* Indices held as doubles (the interpreter's tensors) as int64; false for a value that is not an integer. */
static bool to_index(const double *d, int64_t n, int64_t *out) {
  for (int64_t i = 0; i < n; i++) {
    if (!(d[i] == floor(d[i]) && fabs(d[i]) < 9.0e15)) return false;
    out[i] = (int64_t)d[i];
  }
  return true;
}

/* spmm_t's operand: A^T's CSR (csr.h) from A's rowptr / col, as doubles in t (colptr, rowidx, perm back to back). */
static evt_status transposed_csr(const evt_graph *g, const evt_lowered *L, const double *const rin[4], double **t,
                                 evt_rspec_csr *a) {
  int64_t ma = evt_type_numel(&g->nodes[L->rin[0]].type) - 1, ka = L->m, nnz = evt_type_numel(&g->nodes[L->rin[1]].type);
  size_t len = (size_t)(ka + 1 + 2 * nnz);
  int64_t *rp = malloc(sizeof *rp * (size_t)(ma + 1)), *cl = malloc(sizeof *cl * (size_t)(nnz + 1));
  int64_t *tr = malloc(sizeof *tr * (len + 1));
  *t = malloc(sizeof **t * (len + 1));
  EVT_ASSERT(rp && cl && tr && *t);
  char why[160];
  evt_status st = to_index(rin[0], ma + 1, rp) && to_index(rin[1], nnz, cl) ? EVT_OK : EVT_ERR_INVALID;
  if (st == EVT_OK) st = evt_csr_transpose(ma, ka, nnz, rp, cl, tr, tr + ka + 1, tr + ka + 1 + nnz, why, sizeof why);
  for (size_t i = 0; st == EVT_OK && i < len; i++) (*t)[i] = (double)tr[i];
  *a = (evt_rspec_csr){.k = ma, .nnz = nnz, .rowptr = *t, .col = *t + ka + 1, .perm = *t + ka + 1 + nnz, .val = rin[2],
                       .x = rin[3]};
  free(rp);
  free(cl);
  free(tr);
  return st;
}

evt_status evt_lower_rows_reference(const evt_graph *g, const evt_lowered *L, const double *const rin[4], double *const *mem,
                                    uint64_t rng_step) {
  const evt_rspec *s = &L->rspec;
  if (s->nucleus != EVT_ROWN_SPMM) {
    evt_rspec_reference_at(s, L->m, L->n, rin, mem, NULL, NULL, rng_step);
    return EVT_OK;
  }
  double *t = NULL;
  evt_rspec_csr a = {.k = evt_type_numel(&g->nodes[L->rin[3]].type) / (L->n ? L->n : 1),
                     .nnz = evt_type_numel(&g->nodes[L->rin[1]].type), .rowptr = rin[0], .col = rin[1], .val = rin[2],
                     .x = rin[3]};
  evt_status st = s->has_perm ? transposed_csr(g, L, rin, &t, &a) : EVT_OK;
  if (st == EVT_OK) st = evt_rspec_reference_csr(s, L->m, L->n, &a, mem, rng_step);
  free(t);
  return st;
}
