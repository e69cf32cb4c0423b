/* The CPU model of one fused step (evt_exec_plan_run_cpu, contract in compile.h): what the GPU runs, in the
 * same order, through the interpreter and the kernel specs' CPU references. */
#include <stdlib.h>
#include <string.h>

#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "compile/compile.h"
#include "runtime/interp/interp.h"

static evt_status cpu_node_memory(evt_graph *g, int gi, int v, bool store, evt_tensor *values, double **mem) {
  if (store) {
    const evt_type *t = &g->nodes[v].type;
    evt_tensor_free(&values[v]);
    evt_status st = evt_tensor_alloc(&values[v], t->dtype, t->rank, t->shape);
    if (st != EVT_OK) return st;
  }
  if (!values[v].data) return evt_graph_errorf(g, v, EVT_ERR_INTERNAL, "group %d: tensor not computed before its kernel", gi);
  *mem = values[v].data;
  return EVT_OK;
}

/* An unf GEMM group on the CPU, as the GPU runs it: T = A.B (+ the bias) rounded to the operand dtype
 * (evt_kspec_reference of the plain spec), then the row spec over T and the group's bound tensors. */
static evt_status run_unfused_cpu(evt_graph *g, const evt_exec_plan *p, int gi, evt_tensor *values) {
  const evt_group_exec *x = &p->groups[gi];
  const evt_kspec *s = &p->low.k[gi].spec;
  const evt_rspec *rs = &p->urs[gi];
  for (int k = 0; k < x->nmembers; k++) evt_tensor_free(&values[x->members[k]]); /* not materialized */
  const double *a = values[x->a_node].data, *b = values[x->b_node].data;
  const double *bias = x->unf_bias >= 0 ? values[x->unf_bias].data : NULL;
  if (!a || !b || (x->unf_bias >= 0 && !bias))
    return evt_graph_errorf(g, x->members[0], EVT_ERR_INTERNAL, "group %d: an operand is not computed before its kernels", gi);
  evt_kspec ts;
  evt_kspec_init(&ts, s->layout, s->ab_dtype, s->ab_dtype, s->cfg);
  int acc = evt_kspec_add(&ts, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  ts.d_node = acc;
  double *tmem[EVT_KSPEC_MAX_NODES] = {0};
  if (bias) {
    int rb = evt_kspec_add(&ts, EVT_V_ROW_BCAST, -1, -1, s->ab_dtype, "bias");
    ts.d_node = evt_kspec_add(&ts, EVT_V_ADD, acc, rb, EVT_F32, NULL);
    tmem[rb] = (double *)bias;
  }
  double *t = malloc(sizeof(double) * (size_t)(x->m * x->n));
  EVT_ASSERT(t);
  evt_kspec_reference(&ts, x->m, x->n, x->k, a, b, tmem, t);
  double *mem[EVT_ROW_LAUNCH_MAX_PTRS] = {0};
  evt_status st = EVT_OK;
  for (int i = 0; i < rs->nnodes && st == EVT_OK; i++) {
    int v = x->rptr[i];
    if (v == EVT_EXEC_PTR_T) mem[i] = t;
    else if (v >= 0) st = cpu_node_memory(g, gi, v, evt_vop_class(rs->nodes[i].op) != 'L', values, &mem[i]);
  }
  const double *in[3] = {NULL, NULL, NULL};
  if (st == EVT_OK) evt_rspec_reference_at(rs, x->m, x->n, in, mem, NULL, NULL, g->rng_step);
  free(t);
  return st;
}

static evt_status run_gemm_cpu(evt_graph *g, const evt_exec_plan *p, int gi, evt_tensor *values) {
  const evt_group_exec *x = &p->groups[gi];
  const evt_kspec *s = &p->low.k[gi].spec;
  double *mem[EVT_KSPEC_MAX_NODES] = {0};
  for (int k = 0; k < x->nmembers; k++) evt_tensor_free(&values[x->members[k]]); /* not materialized */
  const double *a = values[x->a_node].data, *b = values[x->b_node].data;
  if (!a || !b) return evt_graph_errorf(g, x->members[0], EVT_ERR_INTERNAL, "group %d: an operand is not computed before its kernel", gi);
  evt_status st = EVT_OK;
  double *dmem = NULL;
  for (int i = -1; i < s->nnodes && st == EVT_OK; i++) {
    int v = i < 0 ? x->d_node : x->ptr_node[i];
    if (v >= 0) st = cpu_node_memory(g, gi, v, i < 0 || evt_vop_class(s->nodes[i].op) != 'L', values, i < 0 ? &dmem : &mem[i]);
  }
  if (st != EVT_OK) return st;
  double *scratch = NULL, *d = x->d_node >= 0 ? values[x->d_node].data : NULL;
  if (!d) {
    const evt_lowered *L = &p->low.k[gi];
    int64_t nb = s->batched ? (int64_t)(L->l > 0 ? L->l : 1) * (L->l_outer > 1 ? L->l_outer : 1) : 1;
    scratch = malloc(sizeof(double) * (size_t)(nb * x->m * x->n));
    EVT_ASSERT(scratch);
    d = scratch;
  }
  evt_lower_gemm_reference(&p->low.k[gi], a, b, mem, d, g->rng_step); /* batched: through the launch's strides; a conv:
                                                                         * evt_conv_accumulate's tile */
  free(scratch);
  return EVT_OK;
}

/* CPU model of a fused step: the GPU path's order, fused groups through their spec's reference. */
/* After fused group gi ran on the CPU: each member that shares another's memory (a reshape of a stored value,
 * evt_lowered_alias_base; the GPU reads the base's bytes, program.c follow_aliases) gets a copy of its base's
 * values, so every later reader - fused or node by node - finds it computed. */
static evt_status materialize_aliases(evt_graph *g, const evt_exec_plan *p, int gi, evt_tensor *values) {
  const evt_lowered *L = &p->low.k[gi];
  for (int i = 0; i < L->nalias; i++) {
    int v = L->alias_view[i], u = L->alias_base[i];
    if (!values[u].data || values[u].numel != evt_type_numel(&g->nodes[v].type))
      return evt_graph_errorf(g, v, EVT_ERR_INTERNAL, "group %d: the value this view shares was not stored", gi);
    const evt_type *t = &g->nodes[v].type;
    evt_tensor_free(&values[v]);
    evt_status st = evt_tensor_alloc(&values[v], t->dtype, t->rank, t->shape);
    if (st != EVT_OK) return st;
    memcpy(values[v].data, values[u].data, sizeof(double) * (size_t)values[u].numel);
  }
  return EVT_OK;
}

evt_status evt_exec_plan_run_cpu(evt_graph *g, const evt_exec_plan *p, evt_tensor *values) {
  evt_status st = EVT_OK;
  const evt_tensor *ins[EVT_MAX_INPUTS];
  for (int k = 0; k < p->nsources && st == EVT_OK; k++) {
    int v = p->sources[k];
    for (int j = 0; j < g->nodes[v].ninputs; j++) ins[j] = &values[g->nodes[v].inputs[j]];
    evt_tensor_free(&values[v]);
    st = evt_interp_node(g, v, ins, &values[v], 0);
  }
  for (int gi = 0; gi < p->ngroups && st == EVT_OK; gi++) {
    const evt_group_exec *x = &p->groups[gi];
    if (!x->fused) {
      for (int k = 0; k < x->nmembers && st == EVT_OK; k++) {
        int v = x->members[k];
        for (int j = 0; j < g->nodes[v].ninputs; j++) ins[j] = &values[g->nodes[v].inputs[j]];
        evt_tensor_free(&values[v]);
        st = evt_interp_node(g, v, ins, &values[v], 0);
      }
      continue;
    }
    if (x->kind == EVT_LK_GEMM_EVT || x->kind == EVT_LK_CONV_EVT) { /* (a conv: its tile, then the epilogue) */
      st = x->unf ? run_unfused_cpu(g, p, gi, values) : run_gemm_cpu(g, p, gi, values);
      if (st == EVT_OK) st = materialize_aliases(g, p, gi, values);
      continue;
    }
    const evt_rspec *s = &p->low.k[gi].rspec;
    const double *in[4] = {NULL, NULL, NULL, NULL};
    double *mem[EVT_ROW_LAUNCH_MAX_PTRS] = {0};
    for (int k = 0; k < 4; k++)
      if (x->in_node[k] >= 0) in[k] = values[x->in_node[k]].data;
    for (int k = 0; k < x->nmembers; k++) evt_tensor_free(&values[x->members[k]]); /* not materialized */
    for (int i = 0; i < s->nnodes && st == EVT_OK; i++) {
      int v = x->ptr_node[i];
      if (v >= 0) st = cpu_node_memory(g, gi, v, evt_vop_class(s->nodes[i].op) != 'L', values, &mem[i]);
    }
    if (st == EVT_OK && s->nucleus == EVT_ROWN_SPMM && evt_lower_rows_reference(g, &p->low.k[gi], in, mem, g->rng_step))
      st = evt_graph_errorf(g, p->low.k[gi].nucleus, EVT_ERR_INVALID, "group %d: a CSR index out of range", gi);
    else if (st == EVT_OK && s->nucleus != EVT_ROWN_SPMM)
      evt_rspec_reference_at(s, x->m, x->n, in, mem, NULL, NULL, g->rng_step);
    if (st == EVT_OK) st = materialize_aliases(g, p, gi, values);
  }
  return st;
}
