/* CONV+EVT groups in the fused plan (src/compile/fused_plan.c bind_conv) and its CPU model (fused_cpu.c through
 * evt_lower_gemm_reference: evt_conv_accumulate, then the epilogue), on tests/graphs/resnet_block_nhwc_bf16.evt: two
 * fprop groups (conv + batch-norm sums), a stride-1 dgrad and two wgrads. No GPU: the host half of a program. (The
 * launches through stub kernels and the launcher's refusal: test_exec_plan.c gemm_launch_binds_args_and_falls_back;
 * the --check rule on the CPU model over 3 steps: check_rule_on_the_fused_cpu_model.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "compile/train.h"
#include "passes/passes.h"
#include "runtime/gpu/cuda.h"
#include "runtime/gpu/exec_plan.h"
#include "test.h"

static const char *k_file = "tests/graphs/resnet_block_nhwc_bf16.evt";

static evt_graph *load_joint(void) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(k_file, &err);
  CHECK_MSG(g != NULL, "%s: %s", k_file, err ? err : "");
  free(err);
  if (g) CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  return g;
}

/* The operands a conv nucleus's kernel reads: fprop (x, w), dgrad (dy, w), wgrad (x, dy) read as (dy, x). */
static void conv_operands(const evt_graph *g, int nu, int *a, int *b) {
  const evt_node *n = &g->nodes[nu];
  bool wgrad = n->op == EVT_OP_CONV2D_BACKWARD_WEIGHT;
  *a = n->inputs[wgrad ? 1 : 0];
  *b = n->inputs[wgrad ? 0 : 1];
}

/* One conv group of the host program's plan: fused on its generated kernel (never cuBLAS, the unfused pair or an
 * A/B), listed once as a CUTLASS kernel, bound with the geometry's GEMM view, the nucleus's operands, and D and every
 * visitor tensor as the lowering resolved them, each with arena memory while its step runs. */
static void check_conv_group(const evt_program *p, int step, int *kinds) {
  const evt_graph *g = p->g;
  int gi = p->steps[step].group;
  const evt_group_exec *x = &p->xp->groups[gi];
  const evt_lowered *L = &p->xp->low.k[gi];
  CHECK_MSG(x->fused && !x->blas && !x->unf && !x->ab && x->kernel >= 0, "group %d: %s", gi, x->why);
  if (!x->fused || x->kernel < 0) return;
  const evt_kspec *ks = p->xp->gspec[x->kernel]; /* (the first group's spec of a kernel several groups share) */
  CHECK(ks && ks->conv.kind == L->spec.conv.kind && !p->xp->kspec[x->kernel] && !strcmp(p->xp->kname[x->kernel], L->kernel));
  int64_t m, n, k;
  evt_conv_gemm_shape(&L->spec.conv, &m, &n, &k);
  CHECK(x->m == m && x->n == n && x->k == k);
  int a, b;
  conv_operands(g, L->nucleus, &a, &b);
  CHECK_MSG(x->a_node == a && x->b_node == b, "group %d: a %d b %d, want %d %d", gi, x->a_node, x->b_node, a, b);
  CHECK(x->d_node == L->d_tensor);
  int t[3 + EVT_LAUNCH_MAX_PTRS], nt = 0, bad = 0;
  t[nt++] = x->a_node, t[nt++] = x->b_node;
  if (x->d_node >= 0) t[nt++] = x->d_node;
  for (int i = 0; i < L->spec.nnodes; i++) {
    bool mem = evt_vop_has_memory(L->spec.nodes[i].op);
    CHECK(x->ptr_node[i] == (mem ? L->vtensor[i] : -1));
    if (mem) t[nt++] = x->ptr_node[i];
  }
  for (int j = 0; j < nt; j++) {
    const evt_arena_slot *s = &p->slots[t[j]];
    bad += s->kind == EVT_SLOT_NONE || (s->kind == EVT_SLOT_ARENA && (step < s->first || step > s->last));
  }
  CHECK_MSG(bad == 0, "group %d: %d tensors without memory at its step", gi, bad);
  kinds[L->spec.conv.kind]++;
}

TEST(exec_plan_binds_conv_groups) {
  evt_graph *g = load_joint();
  evt_program *p = NULL;
  if (g) CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  int kinds[4] = {0};
  for (int s = 0; p && s < p->nsteps; s++)
    if (p->steps[s].node < 0 && p->xp->groups[p->steps[s].group].kind == EVT_LK_CONV_EVT) check_conv_group(p, s, kinds);
  CHECK_MSG(kinds[EVT_CONV_FPROP] == 2 && kinds[EVT_CONV_DGRAD] == 1 && kinds[EVT_CONV_WGRAD] == 2, "%d fprop %d dgrad %d wgrad",
            kinds[EVT_CONV_FPROP], kinds[EVT_CONV_DGRAD], kinds[EVT_CONV_WGRAD]);
  int ncut = 0;
  for (int k = 0; p && k < p->xp->nkernels; k++) ncut += p->xp->gspec[k] != NULL;
  CHECK_MSG(ncut == 3, "%d CUTLASS kernels (one per conv operator)", ncut);
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* The plan text and EVT_PROFILE's step labels name a conv group conv+evt with its kernel, GEMM view and geometry. */
TEST(conv_groups_in_plan_text_and_profile_labels) {
  evt_graph *g = load_joint();
  evt_program *p = NULL;
  if (g) CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (p) evt_exec_plan_print(g, p->xp, f);
  fclose(f);
  int labels = 0;
  for (int s = 0; p && s < p->nsteps; s++) {
    if (p->steps[s].node >= 0) continue;
    const evt_group_exec *x = &p->xp->groups[p->steps[s].group];
    if (x->kind != EVT_LK_CONV_EVT) continue;
    char label[640], want[200], geo[160];
    evt_conv_text(&p->xp->low.k[x->group].spec.conv, geo, sizeof geo);
    geo[strcspn(geo, "\n")] = 0;
    evt_prof_step_label(p, s, label, sizeof label);
    snprintf(want, sizeof want, "conv+evt %s %lldx%lldx%lld %s from %%", p->xp->kname[x->kernel], (long long)x->m,
             (long long)x->n, (long long)x->k, geo);
    CHECK_MSG(strstr(label, want), "%s", label);
    snprintf(want, sizeof want, "group %d conv+evt %s fused [%lld x %lld x %lld] %s", x->group, p->xp->kname[x->kernel],
             (long long)x->m, (long long)x->n, (long long)x->k, geo);
    CHECK_MSG(text && strstr(text, want), "%s", want);
    labels++;
  }
  CHECK(labels == 5);
  free(text);
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* evt_conv_accumulate (the CPU model's conv tile) against the interpreter's conv nodes: every conv group's tile,
 * rounded to bf16, is the interpreter's value to within bf16 rounding (relative norm; a swapped operand or a wrong
 * index is off by O(1)). */
TEST(conv_tile_reference_matches_interpreter) {
  evt_graph *g = load_joint();
  if (!g) return;
  CHECK(evt_passes_run_all(g, 0, 0) == EVT_OK);
  evt_exec_plan xp;
  evt_options o;
  evt_options_init(&o);
  CHECK(evt_exec_plan_build(g, &o, &xp) == EVT_OK);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(v && evt_interp_init_inputs(g, v, 0) == EVT_OK && evt_interp_run(g, v, 0, 1) == EVT_OK);
  int checked = 0;
  for (int gi = 0; gi < xp.ngroups; gi++) {
    const evt_lowered *L = &xp.low.k[gi];
    if (L->kind != EVT_LK_CONV_EVT || !v[L->nucleus].data) continue;
    double *acc = malloc(sizeof(double) * (size_t)(L->m * L->n)), num = 0, den = 0;
    EVT_ASSERT(acc);
    evt_conv_accumulate(&L->spec.conv, v[L->a_node].data, v[L->b_node].data, acc);
    const double *y = v[L->nucleus].data;
    for (int64_t i = 0; i < L->m * L->n; i++) {
      double d = evt_round_to_dtype(acc[i], EVT_BF16) - y[i];
      num += d * d, den += y[i] * y[i];
    }
    CHECK_MSG(den > 0 && sqrt(num / den) < 4e-3, "group %d (%s): rel error %g", gi, evt_conv_kind_name(L->spec.conv.kind),
              sqrt(num / (den > 0 ? den : 1)));
    free(acc);
    checked++;
  }
  CHECK(checked == 5);
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_exec_plan_free(&xp);
  evt_graph_free(g);
}

/* A conv group whose binding cannot hold is refused by name: an operand of the wrong size (w where x belongs), a
 * geometry whose GEMM view is not the group's m, n, k. */
TEST(exec_bind_conv_refusals) {
  evt_graph *g = load_joint();
  if (!g) return;
  CHECK(evt_passes_run_all(g, 0, 0) == EVT_OK);
  evt_exec_plan xp;
  evt_options o;
  evt_options_init(&o);
  CHECK(evt_exec_plan_build(g, &o, &xp) == EVT_OK);
  int gi = 0;
  while (gi < xp.ngroups && !(xp.low.k[gi].kind == EVT_LK_CONV_EVT && xp.low.k[gi].spec.conv.kind == EVT_CONV_FPROP)) gi++;
  CHECK(gi < xp.ngroups);
  if (gi < xp.ngroups) {
    evt_lowered *L = malloc(sizeof *L);
    evt_group_exec x;
    EVT_ASSERT(L);
    *L = xp.low.k[gi];
    L->a_node = xp.low.k[gi].b_node; /* w [16,3,3,16] as x [4,8,8,16] */
    CHECK(!evt_exec_bind(g, xp.part.group, L, &x));
    char want[96];
    snprintf(want, sizeof want, "group %d: %%%s has 2304 elements, operand x needs 4096", gi, g->nodes[L->a_node].name);
    CHECK_MSG(strstr(x.why, want), "%s", x.why);
    *L = xp.low.k[gi];
    L->k = 2 * L->k;
    CHECK(!evt_exec_bind(g, xp.part.group, L, &x) && strstr(x.why, "conv fprop") && strstr(x.why, "GEMM view"));
    free(L);
  }
  evt_exec_plan_free(&xp);
  evt_graph_free(g);
}

/* evt_plan_report (the JSON of the plan a program runs): every conv group is a generated conv+evt kernel with its
 * geometry. */
TEST(plan_report_shows_conv_groups) {
  evt_graph *g = load_joint();
  char *rep = g ? evt_plan_report(g, NULL) : NULL;
  CHECK_MSG(rep != NULL, "%s", g ? evt_graph_error(g) : "");
  int generated = 0, geometry = 0;
  for (const char *p = rep; p && (p = strstr(p, "\"kind\": \"conv+evt\", \"path\": \"generated\"")); p++) generated++;
  for (const char *p = rep; p && (p = strstr(p, "\"conv\": \"conv ")); p++) geometry++;
  CHECK_MSG(generated == 5 && geometry == 5, "%d generated conv groups, %d geometries:\n%s", generated, geometry,
            rep ? rep : "");
  CHECK(rep && strstr(rep, "\"conv\": \"conv wgrad n 4 h 8 w 8 c 16 o 16 kernel 3x3 stride 1x1 pad 1x1 out 8x8\""));
  free(rep);
  evt_graph_free(g);
}
