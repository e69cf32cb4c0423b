/* The fused plan at run time: its groups' paths change when a kernel fails or a launcher refuses, and the
 * in-step A/B swaps implementations (contract in exec_plan.h; built by src/compile/fused_plan.c). */
#include "runtime/gpu/exec_plan.h"

#include <stdlib.h>
#include <string.h>

void evt_exec_swap_alt(evt_exec_plan *p, int gi) {
  EVT_ASSERT(gi >= 0 && gi < p->ngroups && p->groups[gi].ab && p->alt);
  evt_group_exec t = p->groups[gi];
  p->groups[gi] = p->alt[gi];
  p->alt[gi] = t;
}

/* Binds the unfused pair as group gi's alternative implementation (ab; x keeps its kernel): bias 1 / 0 with /
 * without cuBLASLt adding the bias, -1 with if it can, else without. False (nothing bound) if the pair cannot run. */
static void drop_alt(evt_exec_plan *p, int gi, const char *what) {
  evt_group_exec *x = &p->groups[gi];
  if (!x->ab) return;
  x->ab = 0;
  p->nab--;
  size_t len = strlen(x->tune_desc);
  snprintf(x->tune_desc + len, sizeof x->tune_desc - len, " [no A/B: %s]", what);
}

void evt_exec_plan_demote(evt_exec_plan *p, int k, const char *why) {
  for (int gi = 0; gi < p->ngroups; gi++) {
    evt_group_exec *x = &p->groups[gi];
    if (x->ab && p->alt[gi].kernel == k) drop_alt(p, gi, "the other kernel failed");
    if (!x->fused || x->kernel != k) continue;
    if (x->ab) { /* the other implementation takes over */
      evt_exec_swap_alt(p, gi);
      drop_alt(p, gi, "the other kernel failed");
      continue;
    }
    x->fused = 0;
    snprintf(x->why, sizeof x->why, "group %d: kernel %s: %.340s", gi, p->kname[k], why);
  }
}

void evt_exec_plan_demote_group(evt_exec_plan *p, int gi, const char *why) {
  EVT_ASSERT(gi >= 0 && gi < p->ngroups);
  evt_group_exec *x = &p->groups[gi];
  drop_alt(p, gi, "its launcher refused");
  x->fused = 0;
  snprintf(x->why, sizeof x->why, "group %d: kernel %s: %.340s", gi, x->kernel >= 0 ? p->kname[x->kernel] : "?", why);
}

void evt_exec_plan_counts(const evt_exec_plan *p, int *fused, int *fallback) {
  *fused = *fallback = 0;
  for (int gi = 0; gi < p->ngroups; gi++) (p->groups[gi].fused ? fused : fallback)[0]++;
}

int evt_exec_alias(const evt_exec_plan *p, int v) {
  if (!p || !p->part.group || v < 0) return -1;
  int gi = p->part.group[v];
  if (gi < 0 || gi >= p->ngroups || !p->groups[gi].fused) return -1;
  return evt_lowered_alias_base(&p->low.k[gi], v);
}

void evt_exec_plan_free(evt_exec_plan *p) {
  if (p->groups)
    for (int gi = 0; gi < p->ngroups; gi++) free(p->groups[gi].members);
  free(p->groups);
  free(p->sources);
  free(p->kname);
  free(p->kspec);
  free(p->gspec);
  free(p->urs);
  free(p->alt); /* (members shared with groups) */
  if (p->low.k) evt_lower_free(&p->low);
  evt_part_plan_free(&p->part);
  memset(p, 0, sizeof *p);
}

/* "group 2 conv+evt evt_kernel_... fused [256 x 16 x 144] conv fprop n 4 h 8 ... out 8x8, 3 nodes" */
static void print_conv(const evt_exec_plan *p, int gi, FILE *out) {
  const evt_group_exec *x = &p->groups[gi];
  char geo[160] = "";
  evt_conv_text(&p->low.k[gi].spec.conv, geo, sizeof geo);
  char *nl = strchr(geo, '\n');
  if (nl) *nl = 0;
  fprintf(out, "group %d conv+evt %s fused [%lld x %lld x %lld] %s%s, %d nodes\n", gi, p->kname[x->kernel], (long long)x->m,
          (long long)x->n, (long long)x->k, geo, x->d_node < 0 ? " (D scratch)" : "", x->nmembers);
}

void evt_exec_plan_print(const evt_graph *g, const evt_exec_plan *p, FILE *out) {
  for (int gi = 0; gi < p->ngroups; gi++) {
    const evt_group_exec *x = &p->groups[gi];
    const evt_lowered *L = &p->low.k[gi];
    char bat[200] = "";
    if (x->fused && x->kind == EVT_LK_GEMM_EVT && L->spec.batched)
      snprintf(bat, sizeof bat, " batched %d x %d %s, ld %lld/%lld/%lld, batch strides %lld/%lld/%lld, outer %lld/%lld/%lld",
               L->l > 0 ? L->l : 1, L->l_outer > 1 ? L->l_outer : 1, (L->spec.layout == EVT_LAYOUT_NN ? "NN" : L->spec.layout == EVT_LAYOUT_NT ? "NT" : "TN"), (long long)L->lda,
               (long long)L->ldb, (long long)L->ldd, (long long)L->bs_a, (long long)L->bs_b, (long long)L->bs_d,
               (long long)L->os_a, (long long)L->os_b, (long long)L->os_d);
    if (x->fused && x->blas && x->unf_bias >= 0)
      fprintf(out, "group %d %s unfused: cuBLASLt(bias) [%lld x %lld x %lld] writes D, %d nodes\n", gi,
              evt_lower_kind_name(x->kind), (long long)x->m, (long long)x->n, (long long)x->k, x->nmembers);
    else if (x->fused && x->unf)
      fprintf(out, "group %d %s unfused: cuBLAS%s [%lld x %lld x %lld] + row kernel %s, %d nodes\n", gi,
              evt_lower_kind_name(x->kind), x->unf_bias >= 0 ? "Lt(bias)" : "", (long long)x->m, (long long)x->n,
              (long long)x->k, p->kname[x->kernel], x->nmembers);
    else if (x->fused && x->blas)
      fprintf(out, "group %d %s cuBLAS (plain epilogue) [%lld x %lld x %lld] %s%s, %d nodes\n", gi,
              evt_lower_kind_name(x->kind), (long long)x->m, (long long)x->n, (long long)x->k,
              L->spec.layout == EVT_LAYOUT_NN ? "NN" : L->spec.layout == EVT_LAYOUT_NT ? "NT" : "TN",
              L->spec.batched ? " batched" : "", x->nmembers);
    else if (x->fused && x->kind == EVT_LK_CONV_EVT)
      print_conv(p, gi, out);
    else if (x->fused && x->kind == EVT_LK_GEMM_EVT)
      fprintf(out, "group %d %s %s fused [%lld x %lld x %lld]%s%s, %d nodes\n", gi, evt_lower_kind_name(x->kind),
              p->kname[x->kernel], (long long)x->m, (long long)x->n, (long long)x->k, bat, x->d_node < 0 ? " (D scratch)" : "",
              x->nmembers);
    else if (x->fused)
      fprintf(out, "group %d %s %s fused [%lld x %lld], %d nodes\n", gi, evt_lower_kind_name(x->kind),
              p->kname[x->kernel], (long long)x->m, (long long)x->n, x->nmembers);
    else if (x->kind == EVT_LK_CONV_EVT && L->nucleus >= 0 && L->nucleus < g->nnodes) /* (refused or demoted) */
      fprintf(out, "group %d conv+evt fallback (%%%s), %d nodes: %s\n", gi, g->nodes[L->nucleus].name, x->nmembers, x->why);
    else
      fprintf(out, "group %d %s fallback, %d nodes: %s\n", gi, evt_lower_kind_name(x->kind), x->nmembers, x->why);
  }
}

/* A fused GEMM group on the CPU: evt_kspec_reference on the bound tensors (stores and D freshly allocated,
 * a scratch D in a host buffer). */
/* The CPU model's memory of one spec node bound to graph node v: a store (not a load) gets a fresh tensor
 * of v's type; either way v must then hold data (a load read before it was computed is an internal error). */
