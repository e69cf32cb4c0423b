/* The lowering's GPU target (contract in lower.h, evt_lower_retarget): groups are lowered once for the default
 * target (sm_90a) and then retargeted, so the lowering itself stays one code path. A GEMM+EVT spec an sm_8x target
 * cannot hold (evt_kspec_retarget: a rand / dropout node) becomes an unfused group that names the node, which the
 * refinement (evt_options.refine_partition) then splits off; row and pointwise specs only record the target; a
 * CONV+EVT group on an sm_8x target becomes unfused (its kernels are Sm90 implicit GEMMs). */
#include <stdio.h>
#include <string.h>

#include "codegen/lower.h"

/* The member of group gi that made the spec's node bad (a rand or dropout member for a rand node), or the nucleus. */
static int refused_member(const evt_graph *g, const int *group, const evt_lowered *L) {
  for (int v = 0; v < g->nnodes; v++)
    if (group[v] == L->group && (g->nodes[v].op == EVT_OP_RAND || g->nodes[v].op == EVT_OP_DROPOUT)) return v;
  return L->nucleus;
}

static void refuse(const evt_graph *g, const int *group, evt_lower_result *r, evt_lowered *L, const char *why) {
  int v = refused_member(g, group, L);
  r->count[L->kind]--;
  L->ok = 0;
  L->kind = EVT_LK_UNFUSED;
  L->kernel[0] = 0;
  L->bad_node = v;
  if (v >= 0)
    snprintf(L->reason, sizeof L->reason, "group %d: %%%s (%s): %s", L->group, g->nodes[v].name,
             evt_op_table[g->nodes[v].op].name, why);
  else snprintf(L->reason, sizeof L->reason, "group %d: %s", L->group, why);
  r->count[EVT_LK_UNFUSED]++;
  r->lowered--;
}

void evt_lower_retarget(const evt_graph *g, const int *group, evt_lower_result *r, int arch) {
  int a = evt_arch_sm8x(arch) ? arch : 0;
  for (int i = 0; i < r->n; i++) {
    evt_lowered *L = &r->k[i];
    if (!L->ok) continue;
    if (L->kind == EVT_LK_ROW || L->kind == EVT_LK_POINTWISE) {
      L->rspec.arch = a;
      evt_rspec_kernel_name(&L->rspec, L->kernel);
      continue;
    }
    if (L->kind == EVT_LK_CONV_EVT && a) /* CUTLASS 2.x convolutions would need an emitter of their own */
      refuse(g, group, r, L, "the conv kernels are sm_90a's (CUTLASS's Sm90 implicit GEMM)");
    if (L->kind != EVT_LK_GEMM_EVT) continue;
    char why[256];
    if (evt_kspec_retarget(&L->spec, a, L->n, NULL, why, sizeof why) != EVT_OK) {
      refuse(g, group, r, L, why);
      continue;
    }
    evt_kspec_kernel_name(&L->spec, L->kernel);
  }
}
