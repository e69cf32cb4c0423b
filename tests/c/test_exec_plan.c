/* The fused execution plan of `evtc run --fused` (src/compile/fused_plan.c) and the JIT's CUTLASS-free
 * flags: which groups take which path, how spec pointers bind to tensors, and the refusals. No GPU. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "compile/compile.h"
#include "runtime/gpu/exec_plan.h"
#include "tune/tune.h"
#include "runtime/gpu/gemm_launch.h"
#include "runtime/jit/jit.h"
#include "test.h"

/* The options the plans of this file are built with (tests change fields and set them back). */
static evt_options *topt(void) {
  static evt_options o;
  static int ready;
  if (!ready) evt_options_init(&o), ready = 1;
  return &o;
}
#include "compile/train.h"

/* g (parsed from `name`, NULL when that failed: a failed check) as evtc run --fused takes it: the joint graph and
 * the passes */
static evt_graph *joint_opt(evt_graph *g, const char *name, char *err) {
  CHECK_MSG(g, "%s: %s", name, err ? err : "");
  free(err);
  if (!g) return NULL;
  CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  CHECK_MSG(evt_passes_run_all(g, 0, 0) == EVT_OK, "%s", evt_graph_error(g));
  return g;
}

static evt_graph *load_opt(const char *path) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  return joint_opt(g, path, err);
}

/* load_opt for a graph given as text */
static evt_graph *load_opt_text(const char *text, const char *name) {
  char *err = NULL;
  evt_graph *g = evt_parse(text, name, &err);
  return joint_opt(g, name, err);
}

/* Every lowered group (row / pointwise / GEMM+EVT) is fused with a complete binding; everything else falls
 * back with the lowering's reason; each fused group's kernel is listed once, with its kind's spec. */
TEST(exec_plan_paths_and_bindings_bf16) {
  const char *files[] = {"bench/graphs/mlp_bf16.evt", "bench/graphs/bert_layer_bf16.evt"};
  for (int f = 0; f < 2; f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    evt_exec_plan p;
    CHECK_MSG(evt_exec_plan_build(g, topt(), &p) == EVT_OK, "%s", evt_graph_error(g));
    int nf, nb, rowlow = 0, gemmlow = 0;
    evt_exec_plan_counts(&p, &nf, &nb);
    CHECK(nf + nb == p.ngroups && p.ngroups == p.part.ngroups);
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_lowered *L = &p.low.k[gi];
      const evt_group_exec *x = &p.groups[gi];
      rowlow += L->ok && (L->kind == EVT_LK_ROW || L->kind == EVT_LK_POINTWISE);
      gemmlow += L->ok && L->kind == EVT_LK_GEMM_EVT;
      if (!L->ok) CHECK(!x->fused && !strcmp(x->why, L->reason));
      if (!x->fused) continue;
      CHECK(x->blas ? x->kernel == -1 && evt_exec_plain_blas(L, x->tuned)
                    : x->kernel >= 0 && x->kernel < p.nkernels && !strcmp(p.kname[x->kernel], L->kernel));
      if (L->kind == EVT_LK_GEMM_EVT) {
        const evt_kspec *s = &L->spec;
        CHECK((x->blas || (p.gspec[x->kernel] && !p.kspec[x->kernel])) && x->k == L->k);
        CHECK(x->a_node >= 0 && x->b_node >= 0 && p.part.group[x->a_node] != gi && p.part.group[x->b_node] != gi);
        CHECK(g->nodes[x->a_node].type.dtype == s->ab_dtype && g->nodes[x->b_node].type.dtype == s->ab_dtype);
        if (x->d_node >= 0) CHECK(p.part.group[x->d_node] == gi && g->nodes[x->d_node].type.dtype == s->d_dtype);
        else CHECK(p.scratch_bytes >= (s->batched ? (int64_t)L->l * (L->l_outer > 1 ? L->l_outer : 1) : 1) * x->m * x->n *
                                            (int64_t)evt_dtype_size(s->d_dtype));
        for (int i = 0; i < s->nnodes; i++) {
          int v = x->ptr_node[i];
          CHECK(evt_vop_has_memory(s->nodes[i].op) ? v >= 0 && g->nodes[v].type.dtype == s->nodes[i].dtype : v == -1);
          if (v >= 0) CHECK((evt_vop_class(s->nodes[i].op) == 'L') == (p.part.group[v] != gi));
        }
        continue;
      }
      CHECK(p.kspec[x->kernel] && !p.gspec[x->kernel]);
      for (int i = 0; i < L->rspec.nnodes; i++) {
        const evt_rnode *r = &L->rspec.nodes[i];
        if (!evt_vop_has_memory(r->op)) {
          CHECK(x->ptr_node[i] == -1);
          continue;
        }
        int v = x->ptr_node[i];
        CHECK(v >= 0 && g->nodes[v].type.dtype == r->dtype);
        if (evt_vop_class(r->op) != 'L') CHECK(p.part.group[v] == gi); /* stores write members */
        if (r->op == EVT_V_ROW_SUM || r->op == EVT_V_COL_SUM) CHECK(r->dtype == g->nodes[v].type.dtype); /* rounded at the store */
      }
      for (int k = 0; k < evt_row_nucleus_ninputs(&L->rspec); k++) CHECK(x->in_node[k] >= 0);
      for (int k = 0; k < x->nmembers; k++) CHECK(p.part.group[x->members[k]] == gi);
    }
    CHECK_MSG(rowlow > 0 && gemmlow > 0 && nf == rowlow + gemmlow, "%s: %d fused of %d lowered row and %d GEMM groups",
              files[f], nf, rowlow, gemmlow);
    for (int a = 0; a < p.nkernels; a++)
      for (int b = a + 1; b < p.nkernels; b++) CHECK(strcmp(p.kname[a], p.kname[b]));
    for (int k = 0; k < p.nsources; k++) CHECK(p.part.group[p.sources[k]] < 0);
    /* a failed compile demotes exactly the groups of that kernel */
    if (p.nkernels > 0) {
      int users = 0;
      for (int gi = 0; gi < p.ngroups; gi++) users += p.groups[gi].fused && p.groups[gi].kernel == 0;
      evt_exec_plan_demote(&p, 0, "nvcc exit 1");
      int nf2, nb2;
      evt_exec_plan_counts(&p, &nf2, &nb2);
      CHECK(nf2 == nf - users && nb2 == nb + users);
      for (int gi = 0; gi < p.ngroups; gi++)
        if (p.groups[gi].kernel == 0) CHECK(!p.groups[gi].fused && strstr(p.groups[gi].why, "nvcc exit 1"));
    }
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
}

/* bert_layer_bf16's attention bmm groups (scores, context and their four backward GEMMs) bind as batched GEMM
 * launches: per-batch M x N x K, H heads per launch and B launches (the two-level "heads" layout of a
 * [B, S, H, D] tensor), NT / NN / TN layouts, strides from the lowering; the plan listing shows them. Tampered
 * lowerings are refused with the group and the tensor named: a batch stride off 16 bytes, a batch count whose
 * launch reaches past a tensor, a D the launch does not cover, an operand dtype. */
TEST(exec_plan_binds_batched_gemms) {
  evt_graph *g = load_opt("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int nb = 0, lay[3] = {0, 0, 0}, first = -1;
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_lowered *L = &p.low.k[gi];
    const evt_group_exec *x = &p.groups[gi];
    if (L->nucleus < 0 || g->nodes[L->nucleus].op != EVT_OP_BMM) continue;
    CHECK_MSG(L->ok && L->spec.batched && x->fused && x->kind == EVT_LK_GEMM_EVT, "group %d: %s", gi, x->why);
    if (!x->fused) continue;
    nb++;
    if (first < 0) first = gi;
    lay[L->spec.layout]++;
    const evt_type *t = &g->nodes[L->nucleus].type; /* [B, H, S, S] or [B, H, S, D] */
    int64_t batch = 1;
    for (int d = 0; d < t->rank - 2; d++) batch *= t->shape[d];
    CHECK(t->rank == 4 && L->l == t->shape[1] && L->l_outer == t->shape[0] && batch == (int64_t)L->l * L->l_outer);
    CHECK(x->m * x->n == t->shape[2] * t->shape[3] && x->k == L->k);
    CHECK(x->a_node == L->a_node && x->b_node == L->b_node && x->d_node == L->d_tensor);
    /* heads: the inner batch steps one head (D columns of [B, S, H, D], or a packed S x S tile), the outer one
     * a whole sequence's rows */
    CHECK(L->bs_a > 0 && L->bs_b > 0 && L->os_a == L->os_b && L->os_a == (int64_t)L->l * x->m * x->k);
    for (int i = 0; i < L->spec.nnodes; i++)
      if (evt_vop_has_memory(L->spec.nodes[i].op)) CHECK(x->ptr_node[i] == L->vtensor[i] && x->ptr_node[i] >= 0);
  }
  CHECK_MSG(nb == 6 && lay[EVT_LAYOUT_NN] && lay[EVT_LAYOUT_NT] && lay[EVT_LAYOUT_TN], "%d batched groups", nb);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  evt_exec_plan_print(g, &p, f);
  fclose(f);
  CHECK_MSG(buf && strstr(buf, "fused [16 x 16 x 16] batched 4 x 2 NT, ld 64/64/16, batch strides 16/16/256, outer 1024/1024/1024"),
            "%s", buf ? buf : "");
  free(buf);
  if (first >= 0) {
    evt_lowered *L = malloc(sizeof *L);
    evt_group_exec *x = calloc(1, sizeof *x);
    const int *grp = p.part.group;
    char tag[32];
    snprintf(tag, sizeof tag, "group %d:", first);
    *L = p.low.k[first];
    CHECK(evt_exec_bind(g, grp, L, x));
    L->bs_a = 4; /* 8 bytes of bf16 */
    CHECK_MSG(!evt_exec_bind(g, grp, L, x) && strstr(x->why, tag) && strstr(x->why, "operand A: batch stride"), "%s", x->why);
    *L = p.low.k[first];
    L->os_b += 8;
    CHECK_MSG(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "reaches element") && strstr(x->why, g->nodes[L->b_node].name),
              "%s", x->why);
    *L = p.low.k[first];
    L->l_outer = 1; /* half the batches: D (a member) would be half written */
    CHECK_MSG(!evt_exec_bind(g, grp, L, x) && strstr(x->why, tag) && strstr(x->why, "every element must be written"), "%s",
              x->why);
    *L = p.low.k[first];
    L->spec.ab_dtype = EVT_F16;
    CHECK_MSG(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "operand A needs f16"), "%s", x->why);
    free(L);
    free(x);
  }
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* The binding checks refuse a row spec whose memory does not match the graph. */
TEST(exec_bind_refusals) {
  evt_graph *g = load_opt("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int gi = 0;
  while (gi < p.ngroups && !(p.groups[gi].fused && p.groups[gi].kind == EVT_LK_ROW)) gi++;
  CHECK(gi < p.ngroups);
  if (gi < p.ngroups) {
    evt_lowered *L = malloc(sizeof *L);
    evt_group_exec *x = calloc(1, sizeof *x);
    int st = -1;
    *L = p.low.k[gi];
    for (int i = 0; i < L->rspec.nnodes && st < 0; i++)
      if (evt_vop_class(L->rspec.nodes[i].op) == 'S') st = i;
    CHECK(st >= 0);
    CHECK(evt_exec_bind(g, p.part.group, L, x));
    /* wrong dtype */
    L->rspec.nodes[st].dtype = L->rspec.nodes[st].dtype == EVT_F32 ? EVT_BF16 : EVT_F32;
    CHECK(!evt_exec_bind(g, p.part.group, L, x) && strstr(x->why, "spec node"));
    /* unbound */
    *L = p.low.k[gi];
    L->vtensor[st] = -1;
    CHECK(!evt_exec_bind(g, p.part.group, L, x) && strstr(x->why, "not bound"));
    /* the store writes another tensor: its member leaves unwritten (or the sizes differ) */
    *L = p.low.k[gi];
    L->vtensor[st] = 0;
    CHECK(!evt_exec_bind(g, p.part.group, L, x) && x->why[0]);
    /* too long a row: past 32768 columns only without a sum over rows (the long-row kernel has none), never past
     * 2^31 - 1 */
    *L = p.low.k[gi];
    L->n = 3000000000LL;
    CHECK(!evt_exec_bind(g, p.part.group, L, x) && strstr(x->why, "does not fit a row kernel"));
    *L = p.low.k[gi];
    L->n = 40000;
    L->rspec.nodes[st].op = EVT_V_ROW_SUM;
    CHECK(!evt_exec_bind(g, p.part.group, L, x) && strstr(x->why, "does not fit a row kernel"));
    /* not lowered: the lowering's reason */
    *L = p.low.k[gi];
    L->ok = 0;
    snprintf(L->reason, sizeof L->reason, "group %d: because", gi);
    CHECK(!evt_exec_bind(g, p.part.group, L, x) && !strcmp(x->why, L->reason));
    free(L);
    free(x);
  }
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* Row kernels compile without CUTLASS: no CUTLASS include paths, and no CUTLASS needed. */
TEST(jit_flags_without_cutlass) {
  evt_jit_options o = {.cutlass_path = "/nonexistent/cutlass", .kernels_dir = "kernels", .no_cutlass = 1};
  char flags[4096];
  CHECK(evt_jit_flags(&o, flags, sizeof flags) == EVT_OK);
  CHECK_MSG(!strstr(flags, "cutlass") && strstr(flags, "-I'kernels'") && strstr(flags, "-shared -lcuda") &&
                strstr(flags, "sm_90a"),
            "%s", flags);
  o.no_cutlass = 0;
  CHECK(evt_jit_flags(&o, flags, sizeof flags) == EVT_ERR_UNSUPPORTED);
}

/* Frees the three value arrays (n tensors each) a plan-vs-interpreter comparison holds. */
static void free_values3(evt_tensor *v, evt_tensor *w, evt_tensor *x, int n) {
  for (int i = 0; i < n; i++) {
    evt_tensor_free(&v[i]);
    evt_tensor_free(&w[i]);
    evt_tensor_free(&x[i]);
  }
  free(v);
  free(w);
  free(x);
}

/* The CPU model of plan p (evt_exec_plan_run_cpu) against the interpreter on fresh inputs (seed; float inputs
 * scaled by 2^shift, exact in bf16): the largest relative error over the graph outputs (evt_cuda_rel_error,
 * floor 0.1 x the largest non-loss output), its output node in *worst; +inf when a run fails. A 16-bit output
 * further than `bound` from the interpreter counts as 0 when it is no further from the exact answer (an fp64
 * run) than max(the interpreter's distance, 1e-2) + 1e-2 (evtc run --check's idea: the interpreter rounds every
 * node, a fused group only its stores, so where the two differ the exact answer decides; a wrong binding is
 * far from both). */
static double cpu_model_error(evt_graph *g, const evt_exec_plan *p, int seed, int shift, double bound, int *worst) {
  int n = g->nnodes;
  evt_tensor *v = calloc((size_t)n, sizeof *v), *w = calloc((size_t)n, sizeof *w), *x = calloc((size_t)n, sizeof *x);
  EVT_ASSERT(v && w && x);
  double err = INFINITY;
  *worst = -1;
  if (evt_interp_init_inputs(g, v, (uint64_t)seed) == EVT_OK) {
    for (int i = 0; i < n; i++)
      if (g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM) {
        if (g->nodes[i].type.dtype != EVT_I64)
          for (int64_t j = 0; j < v[i].numel; j++) v[i].data[j] = ldexp(v[i].data[j], shift);
        for (evt_tensor *t = w; t; t = t == w ? x : NULL)
          if (evt_tensor_alloc(&t[i], v[i].dtype, v[i].rank, v[i].shape) == EVT_OK)
            memcpy(t[i].data, v[i].data, sizeof(double) * (size_t)v[i].numel);
      }
    if (evt_exec_plan_run_cpu(g, p, w) == EVT_OK && evt_interp_run(g, v, 0, 0) == EVT_OK) {
      double scale = evt_test_output_scale(g, v);
      bool exact = false; /* the fp64 run, made when an output needs it */
      err = 0;
      for (int k = 0; k < g->noutputs; k++) {
        int id = g->outputs[k];
        double e = evt_cuda_rel_error(&w[id], &v[id], 0.1 * scale);
        evt_dtype dt = g->nodes[id].type.dtype;
        if (!(e <= bound) && (dt == EVT_BF16 || dt == EVT_F16)) {
          if (!exact) exact = evt_interp_run(g, x, EVT_RUN_FP64, 0) == EVT_OK;
          double sc = exact ? evt_test_output_scale(g, x) : 0;
          double ef = evt_cuda_rel_error(&w[id], &x[id], 0.1 * sc), ei = evt_cuda_rel_error(&v[id], &x[id], 0.1 * sc);
          if (exact && evt_test_near_exact(ef, ei)) e = 0;
        }
        if (!(e <= err)) err = e, *worst = id;
      }
    }
  }
  free_values3(v, w, x, n);
  return err;
}

/* The bf16 rule for a plan's CPU model against the interpreter (rel error <= 1.5e-2), naming the worst node. */
static void check_model_bf16(evt_graph *g, const evt_exec_plan *p, int seed, int shift, const char *what) {
  int worst;
  double e = cpu_model_error(g, p, seed, shift, 1.5e-2, &worst);
  CHECK_MSG(e <= 1.5e-2, "%s: %%%s rel error %g", what, worst >= 0 ? g->nodes[worst].name : "?", e);
}

/* A graph from test text (NULL, with a failed check, if it does not parse). */
static evt_graph *parse_text(const char *text, const char *name) {
  char *err = NULL;
  evt_graph *g = evt_parse(text, name, &err);
  CHECK_MSG(g, "%s: %s", name, err ? err : "");
  free(err);
  return g;
}

/* The CPU model of the fused step (fused groups through their spec's reference, bound exactly as the GPU
 * binds them) reproduces the interpreter: f32 to rounding noise on every output; bf16 within 1.5e-2
 * on a first step (the model keeps f32 inside a group, the interpreter rounds every node to bf16). A
 * wrong pointer binding (a swapped input, a store into the wrong tensor) fails the f32 bound. */
TEST(exec_plan_cpu_model_matches_interpreter) {
  const char *files[] = {"examples/mlp.evt",        "examples/vit.evt",          "examples/bert_layer.evt",
                         "examples/bert_layer_sdpa.evt", "examples/gcn.evt",     "examples/resnet_block.evt",
                         "examples/xmlcnn.evt",     "bench/graphs/mlp_bf16.evt", "bench/graphs/vit_bf16.evt",
                         "bench/graphs/bert_layer_bf16.evt"}; /* bert_layer_bf16: 6 batched GEMM groups */
  for (int f = 0; f < (int)EVT_ARRAY_LEN(files); f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int nf, nb;
    evt_exec_plan_counts(&p, &nf, &nb);
    CHECK_MSG(nf > 0 || strstr(files[f], "gcn"), "%s", files[f]); /* gcn f32: nothing lowers */
    bool bf = strstr(files[f], "bf16") != NULL;
    int worst;
    double e = cpu_model_error(g, &p, 0, 0, bf ? 1.5e-2 : 1e-5, &worst);
    /* bf16: 1.5e-2. With exp/log/max fused (the loss's log-sum-exp in f32) vit's bf16 gradients differ from
     * the interpreter's by up to 1.01e-2, while both are 0.5-3e-2 from the f32 graph's values (e.g.
     * grad.b0.mlp.fc2.w: fused 0.64e-2, interpreter 1.02e-2 from f32): rounding, not a binding error. */
    CHECK_MSG(e <= (bf ? 1.5e-2 : 1e-5), "%s: %%%s rel error %g", files[f], worst >= 0 ? g->nodes[worst].name : "?", e);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
}

/* A later training step's dropout masks: the fused plan's CPU model draws the graph's RNG step as the
 * interpreter does (evt_rspec_reference_at), and that step changes the loss (the masks are its). */
TEST(exec_plan_cpu_model_draws_the_rng_step) {
  const char *files[] = {"examples/bert_layer.evt", "bench/graphs/bert_layer_bf16.evt"};
  for (int f = 0; f < (int)EVT_ARRAY_LEN(files); f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int rand_groups = 0; /* fused groups whose kernel draws the numbers */
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_rspec *s = p.groups[gi].fused && p.groups[gi].kernel >= 0 ? p.kspec[p.groups[gi].kernel] : NULL;
      for (int i = 0; s && i < s->nnodes; i++) rand_groups += s->nodes[i].op == EVT_V_RAND;
    }
    CHECK_MSG(rand_groups > 0, "%s: no fused group draws the dropout numbers", files[f]);
    double loss[2];
    for (int k = 0; k < 2; k++) {
      evt_graph_set_rng_step(g, k ? 5 : 0);
      int worst;
      bool bf = strstr(files[f], "bf16") != NULL;
      double e = cpu_model_error(g, &p, 3, 0, bf ? 1.5e-2 : 1e-5, &worst);
      CHECK_MSG(e <= (bf ? 1.5e-2 : 1e-5), "%s step %d: %%%s rel error %g", files[f], k ? 5 : 0,
                worst >= 0 ? g->nodes[worst].name : "?", e);
      evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
      CHECK(evt_interp_init_inputs(g, v, 3) == EVT_OK && evt_interp_run(g, v, 0, 0) == EVT_OK);
      loss[k] = v[g->loss].data[0];
      for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
      free(v);
    }
    CHECK_MSG(loss[0] != loss[1], "%s: the loss %.17g is the same at RNG steps 0 and 5", files[f], loss[0]);
    evt_graph_set_rng_step(g, 0);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
}

/* The rand key of group gi's row launch (its own spec: evt_rspec_launch_rng), or {0, 0} without a rand node. */
static evt_rng_key group_rng_key(const evt_exec_plan *p, int gi) {
  const evt_rspec *s = &p->low.k[gi].rspec;
  evt_row_launch_args a;
  memset(&a, 0, sizeof a);
  evt_rspec_launch_rng(s, &a);
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND) return a.rng[i];
  return (evt_rng_key){0, 0};
}

/* Dropout sites that differ only in seed share one row kernel (the key is a launch argument), and each group's
 * launch carries its own seed; the CPU model, which runs every group through its own spec, still matches the
 * interpreter (exec_plan_cpu_model_draws_the_rng_step). */
TEST(exec_plan_dropouts_share_a_kernel_with_their_own_seeds) {
  evt_graph *g = load_opt("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int shared = 0;
  for (int i = 0; i < p.ngroups; i++)
    for (int j = i + 1; j < p.ngroups; j++) {
      const evt_group_exec *x = &p.groups[i], *y = &p.groups[j];
      if (!x->fused || !y->fused || x->kernel < 0 || x->kernel != y->kernel || evt_group_exec_cutlass(x)) continue;
      evt_rng_key a = group_rng_key(&p, i), b = group_rng_key(&p, j);
      if (a.seed && b.seed && a.seed != b.seed) shared++;
    }
  CHECK_MSG(shared > 0, "no two dropout groups with different seeds share a kernel");
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* A dropout's mask after a GEMM is drawn by a row kernel, never in the GEMM's epilogue: no GEMM spec has a rand
 * node. */
TEST(exec_plan_gemm_epilogues_never_draw_dropout) {
  const char *files[] = {"bench/graphs/mlp_bf16.evt", "bench/graphs/bert_layer_bf16.evt"};
  for (int f = 0; f < (int)EVT_ARRAY_LEN(files); f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int gemm_rand = 0;
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_kspec *s = &p.low.k[gi].spec;
      for (int i = 0; p.groups[gi].fused && p.groups[gi].kind == EVT_LK_GEMM_EVT && i < s->nnodes; i++)
        gemm_rand += s->nodes[i].op == EVT_V_RAND;
    }
    CHECK_MSG(gemm_rand == 0, "%s: %d GEMM epilogues draw rand", files[f], gemm_rand);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
}

/* The binding checks of a GEMM+EVT group refuse operands, D and visitor tensors that do not match the
 * graph, each with a reason naming the group; a D nobody reads is bound to scratch memory. */
TEST(exec_bind_gemm_refusals) {
  evt_graph *g = load_opt("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int gi = 0;
  while (gi < p.ngroups && !(p.groups[gi].fused && p.groups[gi].kind == EVT_LK_GEMM_EVT && p.groups[gi].d_node >= 0)) gi++;
  CHECK(gi < p.ngroups);
  if (gi < p.ngroups) {
    evt_lowered *L = malloc(sizeof *L);
    evt_group_exec *x = calloc(1, sizeof *x);
    const int *grp = p.part.group;
    char tag[32];
    snprintf(tag, sizeof tag, "group %d:", gi);
    *L = p.low.k[gi];
    CHECK(evt_exec_bind(g, grp, L, x) && x->a_node == L->a_node && x->d_node == L->d_tensor);
    /* operand dtype */
    L->spec.ab_dtype = EVT_F16;
    CHECK(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "operand A") && strstr(x->why, tag));
    /* unbound operand */
    *L = p.low.k[gi];
    L->b_node = -1;
    CHECK(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "operand B is not bound"));
    /* K that does not match A's element count */
    *L = p.low.k[gi];
    L->k += 8;
    CHECK(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "elements"));
    /* D dtype */
    *L = p.low.k[gi];
    L->spec.d_dtype = L->spec.d_dtype == EVT_F32 ? EVT_BF16 : EVT_F32;
    CHECK(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "D needs"));
    /* D read outside but left to scratch: the value leaves unwritten */
    *L = p.low.k[gi];
    L->d_tensor = -1;
    CHECK(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "leaves the group"));
    /* A with as many elements but rows of 4 x bf16 (8 bytes): not 16-byte aligned */
    *L = p.low.k[gi];
    if (L->spec.layout == EVT_LAYOUT_NN && (L->m * L->k) % 4 == 0) {
      L->m = L->m * L->k / 4;
      L->k = 4;
      CHECK_MSG(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "16 bytes") && strstr(x->why, "operand A"), "%s", x->why);
    }
    /* an empty problem */
    *L = p.low.k[gi];
    L->m = 0;
    CHECK(!evt_exec_bind(g, grp, L, x) && strstr(x->why, "empty"));
    free(L);
    free(x);
  }
  /* a load bound to a member of its own group (members are not in memory before the kernel): refused */
  int tried = 0;
  for (int k = 0; k < p.ngroups && !tried; k++) {
    const evt_group_exec *y = &p.groups[k];
    if (!y->fused || y->kind != EVT_LK_GEMM_EVT) continue;
    evt_lowered *L = malloc(sizeof *L);
    evt_group_exec *x = calloc(1, sizeof *x);
    *L = p.low.k[k];
    for (int i = 0; i < L->spec.nnodes && !tried; i++) {
      if (L->spec.nodes[i].op != EVT_V_AUX_LOAD) continue;
      for (int m = 0; m < y->nmembers && !tried; m++) {
        int v = y->members[m];
        if (g->nodes[v].type.dtype != L->spec.nodes[i].dtype || evt_type_numel(&g->nodes[v].type) != L->m * L->n) continue;
        L->vtensor[i] = v;
        CHECK_MSG(!evt_exec_bind(g, p.part.group, L, x) && strstr(x->why, "member of its own group"), "%s", x->why);
        tried = 1;
      }
    }
    free(L);
    free(x);
  }
  CHECK(tried);
  /* a D tile nobody reads: scratch, sized for the largest such D */
  int64_t need = 0;
  for (int k = 0; k < p.ngroups; k++)
    if (p.groups[k].fused && p.groups[k].kind == EVT_LK_GEMM_EVT && p.groups[k].d_node < 0)
      need = need > p.groups[k].m * p.groups[k].n * 2 ? need : p.groups[k].m * p.groups[k].n * 2;
  CHECK(p.scratch_bytes >= need);
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* The CPU model of the fused step on copies (in w) of v's inputs and params; its outputs go to gpu[k]. */
static void fused_cpu_step(evt_graph *g, const evt_exec_plan *p, const evt_tensor *v, evt_tensor *w, evt_tensor *gpu) {
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM) {
      evt_tensor_free(&w[i]);
      CHECK(evt_tensor_alloc(&w[i], v[i].dtype, v[i].rank, v[i].shape) == EVT_OK);
      memcpy(w[i].data, v[i].data, sizeof(double) * (size_t)v[i].numel);
    }
  CHECK_MSG(evt_exec_plan_run_cpu(g, p, w) == EVT_OK, "%s", evt_graph_error(g));
  for (int k = 0; k < g->noutputs; k++) {
    gpu[k] = w[g->outputs[k]];
    memset(&w[g->outputs[k]], 0, sizeof(evt_tensor));
  }
  evt_train_release(g, w);
}

/* The --check rule (evt_check_step, compile.h) on the CPU model of the fused step, trained 3 SGD steps on its own
 * gradients as `evtc run --fused` does: every bf16 graph passes the rule (the GPU must), and the quantities it
 * reports are consistent; a gradient off by 5% and a negated one fail it; f32 stays tight. (The plans are the
 * default, unrefined ones. With refine_partition 1 resnet_block_bf16 fails the rule at step 2 - its ReLU
 * masks flip under bf16 rounding: the model flips 5 signs of b0.res against fp64 where the interpreter flips 3;
 * src/compile/fused_plan.c, refine().) */
TEST(check_rule_on_the_fused_cpu_model) {
  const char *files[] = {"bench/graphs/mlp_bf16.evt",          "bench/graphs/bert_layer_bf16.evt",
                         "bench/graphs/bert_layer_sdpa_bf16.evt", "bench/graphs/gcn_bf16.evt",
                         "bench/graphs/resnet_block_bf16.evt",    "bench/graphs/vit_bf16.evt",
                         "bench/graphs/xmlcnn_bf16.evt",          "examples/mlp.evt",
                         "tests/graphs/resnet_block_nhwc_bf16.evt"}; /* fprop, dgrad, wgrad CONV+EVT groups */
  for (int f = 0; f < (int)EVT_ARRAY_LEN(files); f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    bool bf = strstr(files[f], "bf16") != NULL;
    int n = g->nnodes, no = g->noutputs;
    evt_tensor *v = calloc((size_t)n, sizeof *v), *w = calloc((size_t)n, sizeof *w), *gpu = calloc((size_t)no, sizeof *gpu);
    /* resnet_block_nhwc_bf16: seed 0 (evtc run's default). Its 2x2 max pool over a tiny batch flips windows under
     * bf16: with seeds 1-5 the model (convolutions and their batch-norm sums in f32) and the per-node interpreter each
     * pick 0-2 of 1024 windows unlike fp64, and a step where only the model flips fails the rule (seeds 1, 2, 3, 5;
     * at steps where nothing flips the model's outputs are 0.4-0.7% from fp64) */
    CHECK(evt_interp_init_inputs(g, v, strstr(files[f], "nhwc") ? 0 : 1) == EVT_OK);
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    FILE *sink = fopen("/dev/null", "w");
    for (long step = 1; step <= 3; step++) {
      fused_cpu_step(g, &p, v, w, gpu);
      evt_check_result r;
      CHECK(evt_check_step(g, v, gpu, step, sink, &r) == EVT_OK);
      CHECK_MSG(r.mismatches == 0, "%s step %ld: gpu-exact %g bound %g ref-exact %g gpu-ref %g f32 %g", files[f], step,
                r.gpu_exact, r.bound, r.ref_exact, r.gpu_ref, r.f32_ref);
      if (bf) CHECK(r.bound >= 1e-2 && r.ref_exact > 0 && r.gpu_exact > 0 && r.gpu_exact <= r.bound);
      else CHECK(r.bound == 0 && r.f32_ref <= 1e-5);
      /* a gradient 5% off (caught where the bound is below 2.5%: not where bf16 flips max-pool / comparison
       * decisions and the per-node interpreter itself is 0.1-0.4 from exact), then a negated one: caught */
      int last = no - 1; /* the output holding the largest gradient (the floor cannot hide its error) */
      double big = 0;
      for (int k = 0; k < no; k++)
        for (int64_t i = 0; i < gpu[k].numel && g->outputs[k] != g->loss; i++)
          if (fabs(gpu[k].data[i]) > big) big = fabs(gpu[k].data[i]), last = k;
      double bound = r.bound;
      for (int64_t i = 0; i < gpu[last].numel; i++) gpu[last].data[i] *= 1.05;
      CHECK(evt_check_step(g, v, gpu, step, sink, &r) == EVT_OK && (bound > 0.025 || r.mismatches == 1));
      for (int64_t i = 0; i < gpu[last].numel; i++) gpu[last].data[i] = -gpu[last].data[i];
      CHECK(evt_check_step(g, v, gpu, step, sink, &r) == EVT_OK && r.mismatches == 1);
      for (int64_t i = 0; i < gpu[last].numel; i++) gpu[last].data[i] = -gpu[last].data[i] / 1.05;
      /* SGD on the model's gradients, as evtc run does with the GPU's */
      for (int k = 0; k < no; k++) {
        evt_tensor_free(&v[g->outputs[k]]);
        v[g->outputs[k]] = gpu[k];
        memset(&gpu[k], 0, sizeof(evt_tensor));
      }
      CHECK(evt_train_sgd_update(g, v, 0.01, 0) == EVT_OK);
      evt_train_release(g, v);
    }
    fclose(sink);
    for (int i = 0; i < n; i++) {
      evt_tensor_free(&v[i]);
      evt_tensor_free(&w[i]);
    }
    free(v);
    free(w);
    free(gpu);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
}

/* The check rule by ancestry: an f32 output computed from a bf16 value carries bf16 error and is judged
 * against the exact answer (bound >= 1e-2); an f32 output of f32 values only keeps the 1e-4 rule. */
TEST(check_rule_f32_outputs_of_bf16_values) {
  char *err = NULL;
  evt_graph *g = evt_parse("graph t {\n  %h: bf16[64] = input(init=uniform, lo=-2, hi=2)\n"
                           "  %x: f32[64] = input(init=uniform, lo=-2, hi=2)\n"
                           "  %hf = cast(%h, dtype=f32)\n  %a = mul(%hf, %hf)\n  %b = mul(%x, %x)\n"
                           "  output %a\n  output %b\n}\n", "t", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  int n = g->nnodes;
  evt_tensor *v = calloc((size_t)n, sizeof *v), gpu[2];
  CHECK(evt_interp_init_inputs(g, v, 3) == EVT_OK);
  CHECK(evt_interp_run(g, v, 0, 0) == EVT_OK);
  for (int k = 0; k < 2; k++) {
    const evt_tensor *o = &v[g->outputs[k]];
    CHECK(evt_tensor_alloc(&gpu[k], o->dtype, o->rank, o->shape) == EVT_OK);
    for (int64_t i = 0; i < o->numel; i++) gpu[k].data[i] = o->data[i] * 1.003; /* a bf16-sized difference */
  }
  FILE *sink = fopen("/dev/null", "w");
  evt_check_result r;
  CHECK(evt_check_step(g, v, gpu, 1, sink, &r) == EVT_OK);
  CHECK_MSG(r.mismatches == 1 && r.bound >= 1e-2 && r.f32_ref > 1e-4, "mismatches %d bound %g f32 %g", r.mismatches,
            r.bound, r.f32_ref); /* %b (f32 only) is caught, %a (from bf16) is within its bound */
  for (int64_t i = 0; i < gpu[0].numel; i++) gpu[0].data[i] *= 1.05; /* 5% off is caught on %a too */
  CHECK(evt_check_step(g, v, gpu, 1, sink, &r) == EVT_OK && r.mismatches == 2);
  fclose(sink);
  for (int k = 0; k < 2; k++) evt_tensor_free(&gpu[k]);
  for (int i = 0; i < n; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
}

/* The fp8 rule on the CPU model of the fused fp8_mlp step with the fp8 pass (seed 2: a value crosses an fp8 rounding
 * boundary, 4.3e-3 of a gradient's largest element apart): every output is judged by it and passes; a gradient 5%
 * off and one with 1% of its elements negated fail. */
TEST(check_rule_fp8_on_the_fused_cpu_model) {
  char *err = NULL;
  evt_graph *g = evt_parse_file("tests/graphs/fp8_mlp.evt", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  CHECK(evt_passes_run_all(g, EVT_PASS_FP8, 0) == EVT_OK);
  int n = g->nnodes, no = g->noutputs, last = no - 1;
  evt_tensor *v = calloc((size_t)n, sizeof *v), *w = calloc((size_t)n, sizeof *w), *gpu = calloc((size_t)no, sizeof *gpu);
  CHECK(evt_interp_init_inputs(g, v, 2) == EVT_OK);
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  fused_cpu_step(g, &p, v, w, gpu);
  FILE *sink = fopen("/dev/null", "w");
  evt_check_result r;
  CHECK(evt_check_step(g, v, gpu, 1, sink, &r) == EVT_OK);
  CHECK_MSG(r.mismatches == 0 && r.fp8_outputs == no && r.fp8_ref > 1e-4 && r.fp8_ref < 1e-3 && r.bound == 0 &&
                r.fp8_noise == 0, /* within 1e-2: no perturbed reference ran */
            "mismatches %d of %d, fp8 %g, noise %g", r.mismatches, r.fp8_outputs, r.fp8_ref, r.fp8_noise);
  for (int64_t i = 0; i < gpu[last].numel; i++) gpu[last].data[i] *= 1.05;
  CHECK(evt_check_step(g, v, gpu, 1, sink, &r) == EVT_OK && r.mismatches == 1);
  for (int64_t i = 0; i < gpu[last].numel; i++) gpu[last].data[i] /= 1.05;
  for (int64_t i = 0; i < gpu[last].numel; i += 97) gpu[last].data[i] = -gpu[last].data[i];
  CHECK(evt_check_step(g, v, gpu, 1, sink, &r) == EVT_OK && r.mismatches == 1);
  fclose(sink);
  for (int k = 0; k < no; k++) evt_tensor_free(&gpu[k]);
  for (int i = 0; i < n; i++) evt_tensor_free(&v[i]), evt_tensor_free(&w[i]);
  free(v), free(w), free(gpu);
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* ---- the GEMM launch path without a GPU: a fake nvcc builds each evt_kernel_<hash> as a stub launcher that
 * logs the evt_launch_args it gets and returns $EVT_TEST_LAUNCH_RC ------------------------------------- */
static char gl_dir[256];

static void gl_write_nvcc(const char *name, bool fail) {
  char path[400], cwd[256];
  snprintf(path, sizeof path, "%s/%s", gl_dir, name);
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fprintf(f, "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\n");
  if (fail) fprintf(f, "echo 'x.cu(1): error: this nvcc always fails'; exit 2\n");
  fprintf(f,
          "out=''; src=''\n"
          "while [ $# -gt 0 ]; do case \"$1\" in -o) out=$2; shift;; *.cu) src=$1;; esac; shift; done\n"
          "name=$(sed -n 's/^extern \"C\" int \\(evt_kernel_[0-9a-f]*\\)(.*/\\1/p' \"$src\")\n"
          "cat > \"$out.c\" <<EOT\n"
          "#include <stdio.h>\n#include <stdlib.h>\n#include \"evt_launch.h\"\n"
          "int $name(const evt_launch_args *a) {\n"
          "  FILE *f = fopen(getenv(\"EVT_TEST_LAUNCH_LOG\"), \"a\");\n"
          "  fprintf(f, \"$name %%d %%d %%d %%lu %%lu %%lu\", a->m, a->n, a->k, (unsigned long)a->a, (unsigned long)a->b,"
          " (unsigned long)a->d);\n"
          "  for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++) fprintf(f, \" %%lu\", (unsigned long)a->ptrs[i]);\n"
          "  fprintf(f, \" %%d %%d %%ld %%ld %%ld %%ld %%ld %%ld %%ld %%ld %%ld\", a->l, a->l_outer, (long)a->lda, (long)a->ldb,"
          " (long)a->ldd, (long)a->bs_a, (long)a->bs_b, (long)a->bs_d, (long)a->os_a, (long)a->os_b, (long)a->os_d);\n"
          "  for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++)\n"
          "    fprintf(f, \" %%ld %%ld %%ld\", (long)a->ld_ptrs[i], (long)a->bs_ptrs[i], (long)a->os_ptrs[i]);\n"
          "  fprintf(f, \"\\\\n\");\n  fclose(f);\n  return atoi(getenv(\"EVT_TEST_LAUNCH_RC\"));\n}\nEOT\n"
          "cc -shared -fPIC -I'%s/kernels' -o \"$out\" \"$out.c\"\n",
          cwd);
  fclose(f);
  chmod(path, 0755);
}

static void *gl_ptr(void *ctx, int v) {
  const int *misalign = ctx;
  return (void *)(uintptr_t)(0x100000 + (uintptr_t)v * 256 + (v == *misalign ? 8 : 0));
}

/* Reads the last logged launch; returns false if there is none. */
static bool gl_last(const char *log, char *name, long *vals, int nvals) {
  FILE *f = fopen(log, "r");
  if (!f) return false;
  char line[4096], last[4096] = "";
  while (fgets(line, sizeof line, f)) snprintf(last, sizeof last, "%s", line);
  fclose(f);
  char *p = last;
  int used = 0;
  if (sscanf(p, "%63s%n", name, &used) != 1) return false;
  p += used;
  for (int i = 0; i < nvals; i++) {
    if (sscanf(p, "%ld%n", &vals[i], &used) != 1) return false;
    p += used;
  }
  return true;
}


/* The compile driver's kernels of p, then the runtime's loading of its GEMM+EVT ones. */
static evt_gemm_kernels *compile_and_load_gemms(evt_exec_plan *p) {
  char **so = evt_compile_kernels(p);
  evt_gemm_kernels *gk = evt_gemm_kernels_load(p, so);
  evt_compile_kernels_free(so, p->nkernels);
  return gk;
}

/* resnet_block_nhwc_bf16's CONV+EVT groups through the stub launchers (log in `log`): 3 distinct kernels (fprop,
 * dgrad, wgrad) for 5 groups, each launched with its GEMM view and its operands, D and visitor tensors' pointers,
 * batch fields 0; a launcher that refuses (CANNOT_IMPLEMENT) demotes its group alone, the plan text naming the conv
 * node and the kernel. */
static void conv_launches(evt_graph *g, const char *log) {
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  evt_gemm_kernels *gk = compile_and_load_gemms(&p);
  int misalign = -1, nconv = 0, first = -1, wanted, loaded;
  evt_gemm_kernels_counts(gk, &wanted, &loaded);
  CHECK_MSG(wanted == 3 && loaded == 3, "%d conv kernels wanted, %d loaded", wanted, loaded);
  void *scratch = (void *)(uintptr_t)0x900000;
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_group_exec *x = &p.groups[gi];
    if (x->kind != EVT_LK_CONV_EVT) continue;
    CHECK_MSG(x->fused && !x->blas && !x->unf && !x->ab, "group %d: %s", gi, x->why);
    CHECK_MSG(evt_gemm_group_run(gk, &p, gi, gl_ptr, &misalign, scratch, NULL), "%s", x->why);
    enum { NV = 6 + EVT_LAUNCH_MAX_PTRS + 11 };
    char name[64];
    long v[NV];
    CHECK(gl_last(log, name, v, NV));
    CHECK(!strcmp(name, p.kname[x->kernel]) && v[0] == x->m && v[1] == x->n && v[2] == x->k);
    CHECK(v[3] == (long)(uintptr_t)gl_ptr(&misalign, x->a_node) && v[4] == (long)(uintptr_t)gl_ptr(&misalign, x->b_node));
    CHECK(v[5] == (long)(uintptr_t)(x->d_node >= 0 ? gl_ptr(&misalign, x->d_node) : scratch));
    for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++)
      CHECK(v[6 + i] == (x->ptr_node[i] >= 0 ? (long)(uintptr_t)gl_ptr(&misalign, x->ptr_node[i]) : 0));
    for (int i = 0; i < 11; i++) CHECK(v[6 + EVT_LAUNCH_MAX_PTRS + i] == 0);
    if (first < 0) first = gi;
    nconv++;
  }
  CHECK_MSG(nconv == 5, "%d conv groups", nconv);
  if (first >= 0) {
    setenv("EVT_TEST_LAUNCH_RC", "1", 1);
    CHECK(!evt_gemm_group_run(gk, &p, first, gl_ptr, &misalign, scratch, NULL));
    setenv("EVT_TEST_LAUNCH_RC", "0", 1);
    CHECK_MSG(!p.groups[first].fused && strstr(p.groups[first].why, "cannot implement") &&
              strstr(p.groups[first].why, p.kname[p.groups[first].kernel]), "%s", p.groups[first].why);
    char *text = NULL, want[96];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    evt_exec_plan_print(g, &p, f);
    fclose(f);
    snprintf(want, sizeof want, "group %d conv+evt fallback (%%%s)", first, g->nodes[p.low.k[first].nucleus].name);
    CHECK_MSG(text && strstr(text, want), "%s", text ? text : "");
    free(text);
  }
  evt_gemm_kernels_free(gk);
  evt_exec_plan_free(&p);
}

TEST(gemm_launch_binds_args_and_falls_back) {
  snprintf(gl_dir, sizeof gl_dir, "/tmp/evt-gemmrt-test-%ld", (long)getpid());
  char cmd[2048], log[400], cache[400], cut[400], nvcc[400], bad[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/cut/include/cutlass %s/cut/tools/util/include %s/cache && touch %s/cut/include/cutlass/cutlass.h",
           gl_dir, gl_dir, gl_dir, gl_dir, gl_dir);
  CHECK(system(cmd) == 0);
  gl_write_nvcc("nvcc", false);
  gl_write_nvcc("nvcc_bad", true);
  snprintf(log, sizeof log, "%s/launches.txt", gl_dir);
  snprintf(cache, sizeof cache, "%s/cache", gl_dir);
  snprintf(cut, sizeof cut, "%s/cut", gl_dir);
  snprintf(nvcc, sizeof nvcc, "%s/nvcc", gl_dir);
  snprintf(bad, sizeof bad, "%s/nvcc_bad", gl_dir);
  const char *keys[] = {"EVT_NVCC", "EVT_CACHE_DIR", "CUTLASS_PATH", "EVT_TEST_LAUNCH_LOG", "EVT_TEST_LAUNCH_RC"};
  char *saved[5];
  for (int i = 0; i < 5; i++) saved[i] = getenv(keys[i]) ? strdup(getenv(keys[i])) : NULL;
  setenv("EVT_NVCC", nvcc, 1);
  setenv("EVT_CACHE_DIR", cache, 1);
  setenv("CUTLASS_PATH", cut, 1);
  setenv("EVT_TEST_LAUNCH_LOG", log, 1);
  setenv("EVT_TEST_LAUNCH_RC", "0", 1);
  evt_graph *g = load_opt("bench/graphs/mlp_bf16.evt");
  if (g) {
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int ngemm = 0, wanted, loaded, misalign = -1;
    for (int k = 0; k < p.nkernels; k++) ngemm += p.gspec[k] != NULL;
    evt_gemm_kernels *gk = compile_and_load_gemms(&p);
    evt_gemm_kernels_counts(gk, &wanted, &loaded);
    CHECK_MSG(ngemm > 0 && wanted == ngemm && loaded == ngemm, "%d %d %d", ngemm, wanted, loaded);
    void *scratch = (void *)(uintptr_t)0x900000;
    int ran = 0, first = -1;
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_group_exec *x = &p.groups[gi];
      if (!x->fused || x->kind != EVT_LK_GEMM_EVT || x->blas) continue; /* (plain GEMMs: cuBLAS) */
      if (first < 0) first = gi;
      CHECK(evt_gemm_group_run(gk, &p, gi, gl_ptr, &misalign, scratch, NULL));
      char name[64];
      long v[6 + EVT_LAUNCH_MAX_PTRS];
      CHECK(gl_last(log, name, v, 6 + EVT_LAUNCH_MAX_PTRS));
      CHECK(!strcmp(name, p.kname[x->kernel]) && v[0] == x->m && v[1] == x->n && v[2] == x->k);
      CHECK(v[3] == (long)(uintptr_t)gl_ptr(&misalign, x->a_node) && v[4] == (long)(uintptr_t)gl_ptr(&misalign, x->b_node));
      CHECK(v[5] == (long)(uintptr_t)(x->d_node >= 0 ? gl_ptr(&misalign, x->d_node) : scratch));
      for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++)
        CHECK(v[6 + i] == (x->ptr_node[i] >= 0 ? (long)(uintptr_t)gl_ptr(&misalign, x->ptr_node[i]) : 0));
      ran++;
    }
    CHECK(ran > 0 && first >= 0);
    /* the launcher refuses (CANNOT_IMPLEMENT): that group alone falls back, with the reason */
    if (first >= 0) {
      int nf, nb, nf2, nb2;
      evt_exec_plan_counts(&p, &nf, &nb);
      setenv("EVT_TEST_LAUNCH_RC", "1", 1);
      CHECK(!evt_gemm_group_run(gk, &p, first, gl_ptr, &misalign, scratch, NULL));
      evt_exec_plan_counts(&p, &nf2, &nb2);
      CHECK(nf2 == nf - 1 && nb2 == nb + 1 && !p.groups[first].fused);
      CHECK_MSG(strstr(p.groups[first].why, "cannot implement") && strstr(p.groups[first].why, p.kname[p.groups[first].kernel]),
                "%s", p.groups[first].why);
      /* a misaligned tensor: refused before the launcher runs */
      setenv("EVT_TEST_LAUNCH_RC", "0", 1);
      int second = first + 1;
      while (second < p.ngroups && !(p.groups[second].fused && p.groups[second].kind == EVT_LK_GEMM_EVT)) second++;
      if (second < p.ngroups) {
        misalign = p.groups[second].a_node;
        CHECK(!evt_gemm_group_run(gk, &p, second, gl_ptr, &misalign, scratch, NULL));
        CHECK(strstr(p.groups[second].why, "16-byte aligned"));
      }
    }
    evt_gemm_kernels_free(gk);
    evt_exec_plan_free(&p);
    /* every kernel fails to compile: all GEMM groups fall back, naming the kernel and nvcc's error */
    setenv("EVT_NVCC", bad, 1);
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    gk = compile_and_load_gemms(&p);
    evt_gemm_kernels_counts(gk, &wanted, &loaded);
    CHECK(wanted == ngemm && loaded == 0);
    for (int gi = 0; gi < p.ngroups; gi++)
      if (p.groups[gi].kind == EVT_LK_GEMM_EVT && p.low.k[gi].ok && !p.groups[gi].blas) /* (cuBLAS: no kernel) */
        CHECK_MSG(!p.groups[gi].fused && strstr(p.groups[gi].why, "always fails"), "%s", p.groups[gi].why);
    evt_gemm_kernels_free(gk);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
  /* batched GEMMs (bert_layer_bf16's attention bmm groups): the launcher gets the lowered batch fields */
  setenv("EVT_NVCC", nvcc, 1);
  g = load_opt("bench/graphs/bert_layer_bf16.evt");
  if (g) {
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    evt_gemm_kernels *gk = compile_and_load_gemms(&p);
    int misalign = -1, nbat = 0;
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_group_exec *x = &p.groups[gi];
      const evt_lowered *L = &p.low.k[gi];
      if (!x->fused || x->kind != EVT_LK_GEMM_EVT || x->blas) continue; /* (plain GEMMs: cuBLAS) */
      CHECK_MSG(evt_gemm_group_run(gk, &p, gi, gl_ptr, &misalign, (void *)(uintptr_t)0x900000, NULL), "%s", x->why);
      enum { NV = 6 + EVT_LAUNCH_MAX_PTRS + 11 + 3 * EVT_LAUNCH_MAX_PTRS };
      char name[64];
      long v[NV];
      CHECK(gl_last(log, name, v, NV));
      CHECK(!strcmp(name, p.kname[x->kernel]) && v[0] == x->m && v[1] == x->n && v[2] == x->k);
      const long *b = v + 6 + EVT_LAUNCH_MAX_PTRS;
      long want[11] = {L->l, L->l_outer, L->lda, L->ldb, L->ldd, L->bs_a, L->bs_b, L->bs_d, L->os_a, L->os_b, L->os_d};
      for (int i = 0; i < 11; i++) CHECK_MSG(b[i] == want[i], "group %d batch field %d: %ld, want %ld", gi, i, b[i], want[i]);
      for (int i = 0; i < EVT_KSPEC_MAX_NODES; i++)
        CHECK(b[11 + 3 * i] == L->ld_ptrs[i] && b[12 + 3 * i] == L->bs_ptrs[i] && b[13 + 3 * i] == L->os_ptrs[i]);
      if (L->spec.batched) {
        CHECK(b[0] == 4 && b[1] == 2);
        nbat++;
      } else {
        for (int i = 0; i < 11; i++) CHECK(b[i] == 0);
      }
    }
    CHECK(nbat == 6);
    evt_gemm_kernels_free(gk);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
  g = load_opt("tests/graphs/resnet_block_nhwc_bf16.evt"); /* conv groups: launched like GEMMs */
  if (g) conv_launches(g, log);
  evt_graph_free(g);
  for (int i = 0; i < 5; i++) {
    if (saved[i]) setenv(keys[i], saved[i], 1);
    else unsetenv(keys[i]);
    free(saved[i]);
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", gl_dir);
  CHECK(system(cmd) == 0);
}

/* The runtime dlopens only verified JIT objects: a compiled kernel changed after its compile (one byte appended:
 * still a loadable library) is not loaded, and its groups fall back naming the entry. */
TEST(gemm_launch_loads_only_verified_objects) {
  snprintf(gl_dir, sizeof gl_dir, "/tmp/evt-gemmrt-verify-%ld", (long)getpid());
  char cmd[2048], v[3][400];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/cut/include/cutlass %s/cut/tools/util/include && touch %s/cut/include/cutlass/cutlass.h",
           gl_dir, gl_dir, gl_dir, gl_dir);
  CHECK(system(cmd) == 0);
  gl_write_nvcc("nvcc", false);
  const char *keys[] = {"EVT_NVCC", "EVT_CACHE_DIR", "CUTLASS_PATH"};
  char *saved[3];
  evt_test_env_save(keys, 3, saved);
  snprintf(v[0], sizeof v[0], "%s/nvcc", gl_dir);
  snprintf(v[1], sizeof v[1], "%s/cache", gl_dir);
  snprintf(v[2], sizeof v[2], "%s/cut", gl_dir);
  for (int i = 0; i < 3; i++) setenv(keys[i], v[i], 1);
  evt_graph *g = load_opt("bench/graphs/mlp_bf16.evt");
  if (g) {
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    char **so = evt_compile_kernels(&p);
    int bad = -1, wanted, loaded;
    for (int k = 0; k < p.nkernels && bad < 0; k++)
      if (p.gspec[k] && so[k]) bad = k;
    CHECK(bad >= 0);
    if (bad >= 0) {
      snprintf(cmd, sizeof cmd, "printf x >> '%s'", so[bad]);
      CHECK(system(cmd) == 0);
    }
    evt_gemm_kernels *gk = evt_gemm_kernels_load(&p, so);
    evt_gemm_kernels_counts(gk, &wanted, &loaded);
    CHECK_MSG(wanted > 1 && loaded == wanted - 1, "%d of %d loaded", loaded, wanted);
    for (int gi = 0; gi < p.ngroups; gi++)
      if (p.groups[gi].kernel == bad && p.groups[gi].kind == EVT_LK_GEMM_EVT)
        CHECK_MSG(!p.groups[gi].fused && strstr(p.groups[gi].why, "not loaded"), "%s", p.groups[gi].why);
    evt_gemm_kernels_free(gk);
    evt_compile_kernels_free(so, p.nkernels);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
  evt_test_env_restore(keys, 3, saved);
  snprintf(cmd, sizeof cmd, "rm -rf %s", gl_dir);
  CHECK(system(cmd) == 0);
}

/* `evtc prefetch` (src/cli/cmd_prefetch.c) compiles exactly the kernels `evtc run --fused` later asks the JIT
 * for: after a prefetch of two graphs with a stand-in nvcc, the runtime's plan of each graph (parse, joint,
 * passes, evt_exec_plan_build as run does) finds every GEMM and row kernel in the cache, even with an nvcc
 * that always fails; a kernel shared by both graphs is listed once. */
/* Every kernel the fused plans of `files` need is in the JIT cache (compiling through the current EVT_NVCC,
 * which the callers make fail, would not be a hit); returns how many were checked. */
static int check_prefetched(const char *const *files, int nf) {
  int total = 0;
  for (int f = 0; f < nf; f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    for (int gemm = 0; gemm < 2; gemm++) {
      evt_jit_job jobs[64];
      char *src[64];
      int nj = 0;
      char err[256];
      for (int k = 0; k < p.nkernels && nj < 64; k++) {
        if ((p.gspec[k] != NULL) != gemm) continue;
        src[nj] = gemm ? evt_emit_cutlass(p.gspec[k], err, sizeof err) : evt_emit_rows(p.kspec[k], err, sizeof err);
        CHECK(src[nj] != NULL);
        if (!src[nj]) continue;
        memset(&jobs[nj], 0, sizeof jobs[nj]);
        jobs[nj].name = p.kname[k];
        jobs[nj].source = src[nj];
        nj++;
      }
      evt_jit_options jo = {0};
      jo.no_cutlass = !gemm;
      jo.quiet = 1;
      char msg[512] = "";
      CHECK_MSG(!nj || evt_jit_compile(jobs, nj, &jo, msg, sizeof msg) == EVT_OK, "%s: %s", files[f], msg);
      for (int j = 0; j < nj; j++) {
        CHECK_MSG(jobs[j].ok && jobs[j].cached, "%s: %s not prefetched", files[f], jobs[j].name);
        free(src[j]);
      }
      total += nj;
    }
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
  return total;
}

/* Fake toolchain for the prefetch tests in dir: nvcc (writes the .so), nvcc_bad (fails), an empty CUTLASS. */
static void prefetch_toolchain(const char *dir) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "rm -rf %s && mkdir -p %s/cut/include/cutlass %s/cut/tools/util/include %s/cache && touch %s/cut/include/cutlass/cutlass.h && "
           "printf '#!/bin/sh\\n[ \"$1\" = --version ] && exit 0\\nout=\\nwhile [ $# -gt 0 ]; do case \"$1\" in -o) out=$2; shift;; esac; shift; done\\necho so > \"$out\"\\n' > %s/nvcc && "
           "printf '#!/bin/sh\\n[ \"$1\" = --version ] && exit 0\\necho \"x.cu(1): error: no compile expected\"; exit 2\\n' > %s/nvcc_bad && chmod +x %s/nvcc %s/nvcc_bad",
           dir, dir, dir, dir, dir, dir, dir, dir, dir);
  CHECK(system(cmd) == 0);
}

static const char *const pf_keys[] = {"EVT_NVCC", "EVT_CACHE_DIR", "CUTLASS_PATH"};

static void prefetch_env(const char *dir, char **saved) {
  char v[3][200];
  snprintf(v[0], sizeof v[0], "%s/nvcc", dir);
  snprintf(v[1], sizeof v[1], "%s/cache", dir);
  snprintf(v[2], sizeof v[2], "%s/cut", dir);
  for (int i = 0; i < 3; i++) {
    saved[i] = getenv(pf_keys[i]) ? strdup(getenv(pf_keys[i])) : NULL;
    setenv(pf_keys[i], v[i], 1);
  }
}

static void prefetch_restore(char **saved) {
  for (int i = 0; i < 3; i++) {
    if (saved[i]) setenv(pf_keys[i], saved[i], 1);
    else unsetenv(pf_keys[i]);
    free(saved[i]);
  }
}

TEST(prefetch_fills_the_runtime_jit_cache) {
  char dir[128], cmd[8192];
  snprintf(dir, sizeof dir, "/tmp/evt-prefetch-test-%ld", (long)getpid());
  prefetch_toolchain(dir);
  const char *files[] = {"bench/graphs/bert_layer_bf16.evt", "examples/mlp.evt"};
  snprintf(cmd, sizeof cmd,
           "EVT_NVCC=%s/nvcc EVT_CACHE_DIR=%s/cache CUTLASS_PATH=%s/cut %s prefetch %s %s > %s/out.txt 2>&1",
           dir, dir, dir, evt_test_evtc(), files[0], files[1], dir);
  CHECK_MSG(system(cmd) == 0, "%s", cmd);
  char *saved[3];
  prefetch_env(dir, saved);
  snprintf(cmd, sizeof cmd, "cp %s/nvcc_bad %s/nvcc", dir, dir); /* the same nvcc path (part of the cache key), now failing */
  CHECK(system(cmd) == 0);
  CHECK(check_prefetched(files, 2) > 20);
  snprintf(cmd, sizeof cmd, "grep -q 'distinct kernels' %s/out.txt && grep -q 'prefetch: 0 failed' %s/out.txt", dir, dir);
  CHECK(system(cmd) == 0);
  prefetch_restore(saved);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

/* The library entry (what the torch backend calls before creating its segments' programs): one batch for
 * several graphs, deduplicated; afterwards each plan's kernels are cache hits. Without FUSED: nothing. */
TEST(program_prefetch_compiles_every_graph_once) {
  char dir[128], cmd[512];
  snprintf(dir, sizeof dir, "/tmp/evt-prefetch-lib-%ld", (long)getpid());
  prefetch_toolchain(dir);
  char *saved[3];
  prefetch_env(dir, saved);
  const char *files[] = {"bench/graphs/bert_layer_bf16.evt", "examples/mlp.evt", "bench/graphs/mlp_bf16.evt"};
  evt_graph *gs[3];
  for (int f = 0; f < 3; f++) gs[f] = load_opt(files[f]);
  CHECK(evt_program_prefetch(gs, 3, EVT_PROGRAM_NO_OPT) == 0);
  int n = evt_program_prefetch(gs, 3, EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT);
  snprintf(cmd, sizeof cmd, "cp %s/nvcc_bad %s/nvcc", dir, dir);
  CHECK(system(cmd) == 0);
  int checked = check_prefetched(files, 3);
  CHECK_MSG(n > 20 && n < checked, "%d distinct kernels prefetched, %d plan kernels checked", n, checked);
  /* (n < checked: kernels shared by the graphs were compiled once) */
  CHECK(evt_program_prefetch(gs, 3, EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT) == n); /* all cache hits now */
  for (int f = 0; f < 3; f++) evt_graph_free(gs[f]);
  prefetch_restore(saved);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

/* A one-level batched GEMM (6 heads packed, NT) whose epilogue has a per-batch mask, a bias shared by every
 * batch, a per-batch Σ_n and a Σ over every batch (shared sum): bound with each shared node's tensor as one
 * tensor (no batch strides), and the CPU model of the plan (through the launch's strides) matches the
 * interpreter on every output. A shared sum bound across two launch levels is refused. */
TEST(exec_plan_batched_shared_nodes_match_interpreter) {
  const char *text =
      "graph att {\n"
      "  %qh: bf16[2,3,16,8] = input(init=normal)\n  %k: bf16[2,3,16,8] = input(init=normal)\n"
      "  %mask: bf16[2,3,16,16] = input(init=normal)\n  %bias: bf16[16] = param(init=normal)\n"
      "  %kt = transpose(%k, dims=[2,3])\n"
      "  %s = bmm(%qh, %kt)\n  %c: bf16[] = scalar(value=0.125)\n  %sc = mul(%s, %c)\n"
      "  %z = add(%sc, %mask)\n  %z2 = add(%z, %bias)\n  %zf = cast(%z2, dtype=f32)\n"
      "  %rs = sum(%zf, dims=[3])\n  %cs = sum(%zf, dims=[0,1,2])\n"
      "  output %z2\n  output %rs\n  output %cs\n}\n";
  evt_graph *g = parse_text(text, "att.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK_MSG(evt_exec_plan_build(g, topt(), &p) == EVT_OK, "%s", evt_graph_error(g));
  int gi = p.part.group[evt_graph_find(g, "s")], shared = 0;
  CHECK(gi >= 0);
  if (gi >= 0) {
    const evt_group_exec *x = &p.groups[gi];
    const evt_lowered *L = &p.low.k[gi];
    CHECK_MSG(x->fused && L->spec.batched && L->l == 6 && L->l_outer == 1, "%s", x->why);
    for (int i = 0; i < L->spec.nnodes; i++) {
      if (!L->spec.nodes[i].shared) continue;
      shared++;
      CHECK(x->ptr_node[i] >= 0 && L->bs_ptrs[i] == 0 && L->os_ptrs[i] == 0);
      CHECK(x->ptr_node[i] == evt_graph_find(g, L->spec.nodes[i].op == EVT_V_ROW_BCAST ? "bias" : "cs"));
    }
    /* the same spec as two launch levels (3 x 2): its shared sum would restart per launch */
    evt_lowered *T = malloc(sizeof *T);
    evt_group_exec *y = calloc(1, sizeof *y);
    *T = *L;
    T->l = 3, T->l_outer = 2;
    T->os_a = 3 * T->bs_a, T->os_b = 3 * T->bs_b, T->os_d = 3 * (T->bs_d ? T->bs_d : 256);
    for (int i = 0; i < T->spec.nnodes; i++)
      if (!T->spec.nodes[i].shared && evt_vop_has_memory(T->spec.nodes[i].op)) T->os_ptrs[i] = 3 * T->bs_ptrs[i];
    CHECK_MSG(!evt_exec_bind(g, p.part.group, T, y) && strstr(y->why, "sums over every batch with 2 launches"), "%s", y->why);
    free(T);
    free(y);
  }
  CHECK(shared == 2);
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v), *w = calloc((size_t)g->nnodes, sizeof *w);
  CHECK(evt_interp_init_inputs(g, v, 3) == EVT_OK);
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM) {
      CHECK(evt_tensor_alloc(&w[i], v[i].dtype, v[i].rank, v[i].shape) == EVT_OK);
      memcpy(w[i].data, v[i].data, sizeof(double) * (size_t)v[i].numel);
    }
  CHECK_MSG(evt_exec_plan_run_cpu(g, &p, w) == EVT_OK, "%s", evt_graph_error(g));
  CHECK(evt_interp_run(g, v, EVT_RUN_FP64, 0) == EVT_OK);
  for (int k = 0; k < g->noutputs; k++) {
    int id = g->outputs[k];
    double scale = 0;
    for (int64_t i = 0; i < v[id].numel; i++) scale = fmax(scale, fabs(v[id].data[i]));
    double e = evt_cuda_rel_error(&w[id], &v[id], 0.1 * scale);
    CHECK_MSG(e <= 1e-2, "%%%s rel error %g", g->nodes[id].name, e);
  }
  for (int i = 0; i < g->nnodes; i++) {
    evt_tensor_free(&v[i]);
    evt_tensor_free(&w[i]);
  }
  free(v);
  free(w);
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}


/* A group the lowering refuses ran every member node by node; with EVT_REFINE_PARTITION=1 refine() isolates
 * the node the refusal names and partitions again: vit_bf16's plan then leaves fewer nodes (and elements)
 * node by node; unset, the plan is the unrefined one. The refined plans' CPU model against the interpreter
 * and an fp64 run (EVT_RUN_FP64): every output of mlp_bf16 / bert_layer_bf16 / vit_bf16 is no further
 * from fp64 than max(the interpreter's distance, 1e-2) + 1e-2 (measured: vit's grad.cls 1.61e-2 from fp64
 * refined, 2.01e-2 interpreter, 2.80e-2 unrefined). */
static void unfused_nodes(evt_graph *g, long *nodes, long *elems) {
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  *nodes = *elems = 0;
  for (int gi = 0; gi < p.ngroups; gi++)
    if (!p.groups[gi].fused)
      for (int k = 0; k < p.groups[gi].nmembers; k++) {
        (*nodes)++;
        *elems += evt_type_numel(&g->nodes[p.groups[gi].members[k]].type);
      }
  evt_exec_plan_free(&p);
}

/* The fused plan of g on the CPU model against the interpreter, both against fp64: each output as close to the
 * exact answer as the interpreter's own (evt_test_near_exact). */
static void check_plan_cpu_vs_fp64(evt_graph *g, const char *name) {
  int n = g->nnodes;
  evt_tensor *v = calloc((size_t)n, sizeof *v), *w = calloc((size_t)n, sizeof *w), *x = calloc((size_t)n, sizeof *x);
  CHECK(evt_interp_init_inputs(g, v, 0) == EVT_OK);
  for (int i = 0; i < n; i++)
    if (g->nodes[i].op == EVT_OP_INPUT || g->nodes[i].op == EVT_OP_PARAM)
      for (evt_tensor *t = w; t; t = t == w ? x : NULL) {
        CHECK(evt_tensor_alloc(&t[i], v[i].dtype, v[i].rank, v[i].shape) == EVT_OK);
        memcpy(t[i].data, v[i].data, sizeof(double) * (size_t)v[i].numel);
      }
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  CHECK_MSG(evt_exec_plan_run_cpu(g, &p, w) == EVT_OK, "%s", evt_graph_error(g));
  CHECK(evt_interp_run(g, v, 0, 0) == EVT_OK);
  CHECK(evt_interp_run(g, x, EVT_RUN_FP64, 0) == EVT_OK);
  double sc = evt_test_output_scale(g, x);
  for (int k = 0; k < g->noutputs; k++) {
    int id = g->outputs[k];
    double ef = evt_cuda_rel_error(&w[id], &x[id], 0.1 * sc), ei = evt_cuda_rel_error(&v[id], &x[id], 0.1 * sc);
    CHECK_MSG(evt_test_near_exact(ef, ei), "%s: %%%s fused %g, interpreter %g from fp64", name, g->nodes[id].name, ef, ei);
  }
  free_values3(v, w, x, n);
  evt_exec_plan_free(&p);
}

TEST(exec_plan_refines_refused_groups) {
  evt_graph *g = load_opt("bench/graphs/vit_bf16.evt");
  if (!g) return;
  long n1, e1, n0, e0;
  unfused_nodes(g, &n0, &e0);
  topt()->refine_partition = 1;
  unfused_nodes(g, &n1, &e1);
  topt()->refine_partition = 0;
  CHECK_MSG(n1 < n0 && e1 < e0, "refined %ld nodes / %ld elements, unrefined %ld / %ld", n1, e1, n0, e0);
  evt_graph_free(g);
  /* resnet_block: the refined plan fuses its batch norms (f32 inside a group) and lets a view of a stored rstd
   * share its memory (the CPU model materializes it); its bf16 gradients are then far closer to fp64 than
   * the interpreter's (seed 0: grad.b0.c2.w 0.008 vs 0.102, ReLU masks flipped by bf16 rounding) */
  const char *files[] = {"bench/graphs/mlp_bf16.evt", "bench/graphs/bert_layer_bf16.evt", "bench/graphs/vit_bf16.evt",
                         "bench/graphs/resnet_block_bf16.evt", "examples/resnet_block.evt"};
  topt()->refine_partition = 1;
  for (int f = 0; f < 5; f++) {
    g = load_opt(files[f]);
    if (!g) continue;
    check_plan_cpu_vs_fp64(g, files[f]);
    evt_graph_free(g);
  }
  topt()->refine_partition = 0;
}

/* A channels-last batch norm as the torch.compile backend declares it (the input in memory order, permuted to
 * NCHW; the output permuted back): the layout pass carries the permutes through the statistics (mean over
 * N, H, W of the logical tensor = a Σ over the rows of the [N·H·W, C] memory order) and the per-channel
 * broadcasts, so no permute is left, forward or backward; the refined plan lowers every group (column sums,
 * per-channel math, the apply) and computes what the interpreter does. */
TEST(batch_norm_channels_last_lowers_as_column_sums) {
  const char *text = "graph bn_cl {\n"
                     "  %xp: f32[4,4,4,16] = input(init=normal, std=1.0)\n"
                     "  %x: f32[4,16,4,4] = permute(%xp, dims=[0,3,1,2])\n"
                     "  %w: f32[16] = param(init=normal, std=1.0)\n"
                     "  %b: f32[16] = param(init=normal, std=1.0)\n"
                     "  %y: f32[4,16,4,4] = batch_norm(%x, %w, %b)\n"
                     "  %r: f32[4,16,4,4] = relu(%y)\n"
                     "  %rp: f32[4,4,4,16] = permute(%r, dims=[0,2,3,1])\n"
                     "  %t: f32[4,4,4,16] = input(init=normal, std=1.0)\n"
                     "  %d: f32[4,4,4,16] = sub(%rp, %t)\n"
                     "  %sq: f32[4,4,4,16] = mul(%d, %d)\n"
                     "  %loss: f32[] = mean(%sq)\n"
                     "  loss %loss\n"
                     "}\n";
  evt_graph *g = load_opt_text(text, "bn_cl");
  if (!g) return;
  int permutes = 0, colstats = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    permutes += n->op == EVT_OP_PERMUTE;
    colstats += (n->op == EVT_OP_MEAN || n->op == EVT_OP_SUM) && n->attr.dims.n == 3 && n->attr.dims.v[0] == 0 &&
                n->attr.dims.v[1] == 1 && n->attr.dims.v[2] == 2 && g->nodes[n->inputs[0]].type.rank == 4;
  }
  CHECK_MSG(permutes == 0, "%d permutes left", permutes);
  CHECK_MSG(colstats >= 4, "%d sums / means over N, H, W in memory order", colstats); /* mean, E[x²], dγ, dβ */
  topt()->refine_partition = 2; /* (as the torch backend refines with EVT_BATCH_NORM=evt) */
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int nf, nb;
  evt_exec_plan_counts(&p, &nf, &nb);
  for (int gi = 0; gi < p.ngroups; gi++)
    CHECK_MSG(p.groups[gi].fused, "group %d not lowered: %s", gi, p.low.k[gi].reason);
  CHECK_MSG(nb == 0 && nf == p.ngroups, "%d fused, %d fallback", nf, nb);
  /* the per-channel math between the sums and the apply ([16]-sized element-wise nodes, taken out of the apply's
   * group) is one kernel: no such node in a group apart from a same-sized element-wise input */
  int apart = 0;
  for (int v = 0; v < g->nnodes; v++) {
    const evt_node *n = &g->nodes[v];
    if (!evt_op_is_elementwise(n->op) || evt_type_numel(&n->type) != 16 || p.part.group[v] < 0) continue;
    for (int k = 0; k < n->ninputs; k++) {
      const evt_node *u = &g->nodes[n->inputs[k]];
      apart += evt_op_is_elementwise(u->op) && evt_type_numel(&u->type) == 16 && p.part.group[n->inputs[k]] >= 0 &&
               p.part.group[n->inputs[k]] != p.part.group[v];
    }
  }
  CHECK_MSG(apart == 0, "%d per-channel inputs in another group", apart);
  evt_exec_plan_free(&p);
  check_plan_cpu_vs_fp64(g, "bn_cl");
  topt()->refine_partition = 0;
  evt_graph_free(g);
}

/* Plain-epilogue GEMM groups (D = acc) run as one cuBLAS call (evt_exec_plain_blas) unless a tuning record
 * measured the CUTLASS kernel faster (FUSED): on mlp_bf16's backward every GEMM group whose spec is just the
 * accumulator is `blas` with no generated kernel (so the JIT and prefetch never compile one), every group with a
 * real epilogue keeps its CUTLASS kernel. */
TEST(plain_gemm_groups_run_through_cublas) {
  evt_graph *g = load_opt("bench/graphs/mlp_bf16.evt");
  if (!g) return;
  int plain = 0, epi = 0, blas_plan = 0;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_group_exec *x = &p.groups[gi];
    const evt_lowered *L = &p.low.k[gi];
    if (!x->fused || x->kind != EVT_LK_GEMM_EVT) continue;
    bool is_plain = L->spec.nnodes == 1 && L->spec.d_node == 0 && !(L->spec.batched && L->l_outer > 1);
    CHECK(evt_exec_plain_blas(L, EVT_TUNE_UNFUSED) == is_plain && evt_exec_plain_blas(L, EVT_TUNE_NONE) == is_plain);
    CHECK(!evt_exec_plain_blas(L, EVT_TUNE_FUSED)); /* measured faster: CUTLASS */
    plain += is_plain;
    epi += !is_plain;
    blas_plan += x->blas;
    CHECK_MSG(x->blas == is_plain, "group %d: blas %d, plain %d", gi, x->blas, is_plain);
    CHECK(x->blas ? x->kernel < 0 : (x->kernel >= 0 && p.gspec[x->kernel] && !strcmp(p.kname[x->kernel], L->kernel)));
  }
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  evt_exec_plan_print(g, &p, f);
  fclose(f);
  CHECK_MSG(strstr(buf, "cuBLAS (plain epilogue)"), "%s", buf);
  free(buf);
  evt_exec_plan_free(&p);
  CHECK_MSG(plain >= 2 && epi >= 2 && blas_plan == plain, "plain %d, with an epilogue %d", plain, epi);
  evt_graph_free(g);
}

/* evt_program_tune (the torch backend's {"tune": N}): the distinct GEMM problems of several plans, a graph
 * listed twice adds none; without a GPU nothing is measured or written and the reason says so (on a machine
 * with one, the test has nothing to check); without FUSED there is nothing to tune. */
TEST(program_tune_collects_distinct_problems_and_needs_a_gpu) {
  if (access("/dev/nvidiactl", F_OK) == 0) return;
  char dir[128];
  evt_test_tmpdir(dir, sizeof dir, "program-tune");
  const char *keys[] = {"EVT_CACHE_DIR"};
  char *saved[1];
  evt_test_env_save(keys, 1, saved);
  setenv("EVT_CACHE_DIR", dir, 1);
  evt_graph *mlp = load_opt("bench/graphs/mlp_bf16.evt"), *bert = load_opt("bench/graphs/bert_layer_bf16.evt");
  if (mlp && bert) {
    const unsigned fl = EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT;
    evt_graph *one[1] = {mlp}, *two[2] = {mlp, bert}, *three[3] = {mlp, bert, mlp};
    int n1 = -1, n2 = -1, n3 = -1, n0 = -1;
    char msg[512];
    CHECK(evt_program_tune(two, 2, EVT_PROGRAM_NO_OPT, 2, &n0, msg, sizeof msg) == EVT_OK && n0 == 0);
    CHECK(evt_program_tune(one, 1, fl, 2, &n1, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(msg, "no CUDA device"), "%s", msg);
    CHECK(evt_program_tune(two, 2, fl, 2, &n2, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
    CHECK(evt_program_tune(three, 3, fl, 2, &n3, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
    CHECK_MSG(n1 >= 4 && n2 > n1 && n3 == n2, "problems: mlp %d, mlp+bert %d, mlp+bert+mlp %d", n1, n2, n3);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s/tune 2>/dev/null)\"", dir);
    CHECK(system(cmd) == 0); /* nothing written */
  }
  evt_graph_free(mlp);
  evt_graph_free(bert);
  evt_test_env_restore(keys, 1, saved);
  evt_test_rmdir(dir);
}

/* The default tuning level (one config) leaves out a GEMM group the untuned plan already runs unfused by rule
 * (long K over few output tiles: no split-K in the generated kernel); asked for more configs it measures it. */
TEST(program_tune_at_one_config_skips_rule_unfused_groups) {
  if (access("/dev/nvidiactl", F_OK) == 0) return; /* (counts problems through the no-GPU refusal) */
  char dir[128];
  evt_test_tmpdir(dir, sizeof dir, "program-tune-1");
  const char *keys[] = {"EVT_CACHE_DIR"};
  char *saved[1];
  evt_test_env_save(keys, 1, saved);
  setenv("EVT_CACHE_DIR", dir, 1);
  char *err = NULL;
  /* 128 x 256 output (one 128x256 tile) over K = 16384, and a 4096 x 4096 one over K = 1024 */
  evt_graph *g = evt_parse("graph t {\n  %x: bf16[128,16384] = input()\n  %w: bf16[16384,256] = input()\n"
                           "  %b: bf16[256] = input()\n  %h = mm(%x, %w)\n  %y = add(%h, %b)\n  %z = relu(%y)\n"
                           "  %p: bf16[4096,1024] = input()\n  %q: bf16[1024,4096] = input()\n  %c: bf16[4096] = input()\n"
                           "  %r = mm(%p, %q)\n  %s = add(%r, %c)\n  %u = relu(%s)\n  output %z, %u\n}\n",
                           "<tune1>", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (g) {
    CHECK(evt_passes_run_all(g, 0, 0) == EVT_OK);
    evt_graph *one[1] = {g};
    const unsigned fl = EVT_PROGRAM_FUSED | EVT_PROGRAM_NO_OPT;
    int n1 = -1, n2 = -1;
    char msg[512];
    CHECK(evt_program_tune(one, 1, fl, 1, &n1, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
    CHECK(evt_program_tune(one, 1, fl, 2, &n2, msg, sizeof msg) == EVT_ERR_UNSUPPORTED);
    CHECK_MSG(n1 == 1 && n2 == 2, "problems at one config %d, at two %d", n1, n2);
  }
  evt_graph_free(g);
  evt_test_env_restore(keys, 1, saved);
  evt_test_rmdir(dir);
}

/* The XML-CNN loss head (tests/graphs/xmlcnn_bce_head_bf16.evt: bf16 GEMM + bias, BCE with logits in f32, mean
 * over both dims): the decomposition splits the mean into a row mean and the mean of that vector, so the GEMM
 * group keeps the whole loss in its epilogue (a row reduction) and nothing runs node by node (before: the group
 * was refused, and the runtime ran the mean and the elementwise chain in the reference library: 539 ms per
 * step of xmlcnn_paper on the H200); the CPU model of the plan matches the interpreter within the bf16 rule. */
TEST(mean_over_both_dims_fuses_as_row_mean) {
  char *err = NULL;
  evt_graph *g = evt_parse_file("tests/graphs/xmlcnn_bce_head_bf16.evt", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (g && evt_passes_run_all(g, 0, 0) == EVT_OK) {
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int nf, nb, gemm_row_sums = 0;
    evt_exec_plan_counts(&p, &nf, &nb);
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_lowered *L = &p.low.k[gi];
      CHECK_MSG(p.groups[gi].fused, "%s", p.groups[gi].why);
      if (L->ok && L->kind == EVT_LK_GEMM_EVT)
        for (int i = 0; i < L->spec.nnodes; i++) gemm_row_sums += L->spec.nodes[i].op == EVT_V_COL_SUM; /* (Σ over N: per row of M) */
    }
    CHECK_MSG(nb == 0 && gemm_row_sums == 1, "%d groups node by node, %d row sums in GEMM epilogues", nb, gemm_row_sums);
    check_model_bf16(g, &p, 0, 0, "plan");
    evt_exec_plan_free(&p);
  }
  evt_graph_free(g);
}

/* Parses `text` and builds its exec plan under the current environment; returns the plan's last GEMM+EVT group
 * (a test failure and -1 when it has none), *g NULL when the text does not parse. Finish with plan_check_free. */
static int plan_last_gemm(const char *text, const char *file, evt_graph **g, evt_exec_plan *p) {
  *g = parse_text(text, file);
  if (!*g) return -1;
  CHECK(evt_exec_plan_build(*g, topt(), p) == EVT_OK);
  int gemm = -1;
  for (int gi = 0; gi < p->ngroups; gi++)
    if (p->low.k[gi].kind == EVT_LK_GEMM_EVT) gemm = gi;
  CHECK(gemm >= 0);
  return gemm;
}

/* The CPU model of the plan (as the GPU runs it) against the interpreter, then frees both. */
static void plan_check_free(evt_graph *g, evt_exec_plan *p) {
  check_model_bf16(g, p, 0, 0, "plan");
  evt_exec_plan_free(p);
  evt_graph_free(g);
}

/* A GEMM with an epilogue whose output has few tiles for a long K (M = N = 64, K = 4096: one 128x256 tile) runs
 * as cuBLAS into T + a row kernel without any tuning record (evt_exec_split_k_starved: the generated mainloop has
 * no split-K; XML-CNN's input gradient ran 4 CTAs down K = 670208 for 6 ms on the H200); the epilogue here is a
 * ReLU backward (a where, which the unfused row spec takes since this change); the CPU model of that plan
 * matches the interpreter. */
TEST(split_k_starved_gemm_runs_unfused) {
  const char *text =
      "graph t {\n"
      "  %a: bf16[64,4096] = input()\n"
      "  %b: bf16[4096,64] = input()\n"
      "  %y: bf16[64,64] = input()\n"
      "  %mm: bf16[64,64] = mm(%a, %b)\n"
      "  %z: bf16[] = scalar()\n"
      "  %gt: bool[64,64] = gt(%y, %z)\n"
      "  %dx: bf16[64,64] = where(%gt, %mm, %z)\n"
      "  output %dx\n"
      "}\n";
  evt_graph *g;
  evt_exec_plan p;
  int gemm = plan_last_gemm(text, "split_k.evt", &g, &p);
  if (!g) return;
  if (gemm >= 0) {
    const evt_group_exec *x = &p.groups[gemm];
    CHECK_MSG(x->fused && x->unf && !x->blas, "unf %d blas %d: %s", x->unf, x->blas, x->tune_desc);
    CHECK_MSG(strstr(x->tune_desc, "no split-K") != NULL, "%s", x->tune_desc);
  }
  plan_check_free(g, &p);
}

/* A bias gradient (Σ over M of the GEMM's result) stays in the GEMM's epilogue (with the partition
 * refinement too); the CPU model of the plan matches the interpreter. */
TEST(gemm_row_sums_stay_in_the_epilogue) {
  const char *text =
      "graph t {\n"
      "  %a: bf16[256,512] = input()\n"
      "  %b: bf16[512,256] = input()\n"
      "  %dz: bf16[256,256] = mm(%a, %b)\n"
      "  %c: f32[256,256] = cast(%dz, dtype=f32)\n"
      "  %db: f32[256] = sum(%c, dims=[0])\n"
      "  output %dz, %db\n"
      "}\n";
  topt()->refine_partition = 1;
  evt_graph *g;
  evt_exec_plan p;
  int gemm = plan_last_gemm(text, "row_sums.evt", &g, &p);
  topt()->refine_partition = 0;
  if (!g) return;
  int db = evt_graph_find(g, "db");
  if (gemm >= 0 && db >= 0) {
    const evt_lowered *L = &p.low.k[gemm];
    CHECK_MSG(p.groups[gemm].fused && evt_kspec_has_sums(&L->spec), "sums %d", evt_kspec_has_sums(&L->spec));
    CHECK(L->spec.cfg.schedule == EVT_SCHED_PINGPONG); /* a row sum runs on evt_nodes::RowSum */
    CHECK(p.part.group[db] == gemm);
  }
  plan_check_free(g, &p);
}

/* An elementwise-only group over a 1-D tensor (one row: one CTA of the row kernel did all of it), over rows
 * too long for a register-resident row (40000 > 32768: refused before) or over short rows (64) launches as
 * [M·N / n', n'] rows (n' = 4000, 4096 here); a group with a broadcast vector keeps its shape; the CPU model of the plan, bound as the GPU
 * launch is, matches the interpreter. */
TEST(elementwise_groups_launch_reshaped) {
  const char *text =
      "graph t {\n"
      "  %x: f32[40000] = input()\n"
      "  %y: f32[40000] = input()\n"
      "  %s: f32[40000] = mul(%x, %y)\n"
      "  %e: f32[40000] = exp(%s)\n"
      "  %h: bf16[40000] = cast(%e, dtype=bf16)\n"
      "  %a: f32[64,512] = input()\n"
      "  %v: f32[512] = input()\n"
      "  %b: f32[64,512] = add(%a, %v)\n"
      "  %c: f32[4096,64] = input()\n"
      "  %r: f32[4096,64] = relu(%c)\n"
      "  output %h, %b, %r\n"
      "}\n";
  evt_graph *g = parse_text(text, "reshape.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int long_rows = 0, bcast = 0, short_rows = 0;
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_group_exec *x = &p.groups[gi];
    const evt_lowered *L = &p.low.k[gi];
    if (L->kind != EVT_LK_POINTWISE) continue;
    CHECK_MSG(x->fused, "%s", x->why);
    if (L->n == 40000) long_rows += x->m == 10 && x->n == 4000;
    if (L->n == 512) bcast += x->m == 64 && x->n == 512; /* (a per-column vector ties elements to columns) */
    if (L->n == 64) short_rows += x->m == 64 && x->n == 4096;
  }
  CHECK_MSG(long_rows == 1 && bcast == 1 && short_rows == 1, "%d + %d reshaped, %d kept", long_rows, short_rows, bcast);
  check_model_bf16(g, &p, 0, 0, "plan");
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* Rows longer than a register-resident row-group (a vocabulary-wide softmax and its backward, 40000 classes) bind
 * as fused row groups (the generated kernel's long-row form); the CPU model of the plan matches the interpreter. */
TEST(exec_plan_binds_long_rows) {
  const char *text =
      "graph t {\n"
      "  %x: bf16[6,40000] = input()\n"
      "  %dy: bf16[6,40000] = input()\n"
      "  %y: bf16[6,40000] = softmax(%x, dim=1)\n"
      "  %dx: bf16[6,40000] = softmax_backward(%dy, %y, dim=1)\n"
      "  output %y, %dx\n"
      "}\n";
  evt_graph *g = parse_text(text, "long_rows.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int long_rows = 0;
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_group_exec *x = &p.groups[gi];
    if (p.low.k[gi].kind != EVT_LK_ROW) continue;
    CHECK_MSG(x->fused, "%s", x->why);
    long_rows += x->fused && x->n == 40000 && x->m == 6;
  }
  CHECK_MSG(long_rows >= 1, "%d long-row groups fused", long_rows);
  check_model_bf16(g, &p, 0, 0, "plan");
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* A language-model head with a bias over 40000 classes: the bias gradient (a sum over the rows of dlogits) stays out
 * of the softmax's group (the long-row kernel has no Σ over M: evt_lower_compat), so the softmax group runs fused
 * and that sum runs as the generated column-block kernel; every group binds; the CPU model of the plan matches
 * the interpreter. */
TEST(exec_plan_long_rows_keep_sums_over_m_apart) {
  const char *text =
      "graph t {\n"
      "  %h: bf16[64,64] = input(init=normal, std=1.0)\n"
      "  %y: i64[64] = input(init=randint, lo=0, hi=40000)\n"
      "  %w: bf16[64,40000] = param(init=normal, std=0.125)\n"
      "  %b: bf16[40000] = param(init=zeros)\n"
      "  %mm: bf16[64,40000] = mm(%h, %w)\n"
      "  %logits: bf16[64,40000] = add(%mm, %b)\n"
      "  %lf: f32[64,40000] = cast(%logits, dtype=f32)\n"
      "  %loss: f32[] = cross_entropy(%lf, %y)\n"
      "  loss %loss\n"
      "}\n";
  evt_graph *g = load_opt_text(text, "lm_bias.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int soft = 0, refused = 0;
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_group_exec *x = &p.groups[gi];
    const evt_lowered *L = &p.low.k[gi];
    if (L->kind == EVT_LK_ROW && L->n == 40000) soft += x->fused;
    if (!x->fused) {
      refused++;
      CHECK_MSG(strstr(x->why, "sum over rows") != NULL, "group %d: %s", gi, x->why);
    }
  }
  CHECK_MSG(soft == 1 && refused == 0, "%d fused softmax groups, %d refused", soft, refused);
  check_model_bf16(g, &p, 0, 0, "plan");
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* UNFUSED tuning records for every GEMM group that has an epilogue (the cuBLASLt(bias) variant where cuBLASLt can
 * add the bias), measured 50% faster than fused: those groups run as cuBLAS into T + the tuner's row kernel of
 * the rest, bound through the GEMM spec's tensors, or, for D = acc + bias, as cuBLASLt alone; the CPU model of
 * that plan (T rounded to the operand dtype, then the row spec) matches the interpreter within the bf16 rule on
 * mlp_bf16 and bert_layer_bf16. Records only 5% faster (within EVT_EXEC_UNFUSED_MIN_GAIN) stay fused. */
static int unfused_groups(const evt_exec_plan *p) {
  int u = 0;
  for (int gi = 0; gi < p->ngroups; gi++)
    u += p->groups[gi].fused && (p->groups[gi].unf || (p->groups[gi].blas && p->groups[gi].unf_bias >= 0));
  return u;
}

/* The records the test below wrote (in $EVT_CACHE_DIR/tune), rewritten with another unfused time; how many. */
static int rewrite_unfused_ms(double ms) {
  char dir[900];
  evt_tune_dir(NULL, dir, sizeof dir);
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strstr(e->d_name, ".txt")) continue;
    evt_tune_record r;
    uint64_t h;
    long long m, nn, k;
    if (sscanf(e->d_name, "%16" SCNx64 "-%lldx%lldx%lld-", &h, &m, &nn, &k) != 4) continue;
    if (evt_tune_record_read(NULL, h, m, nn, k, NULL, &r) != EVT_OK || r.choice != EVT_TUNE_UNFUSED) continue;
    r.unfused_ms = ms;
    char msg[256];
    n += evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK;
  }
  closedir(d);
  return n;
}

TEST(unfused_epilogue_groups_match_interpreter) {
  char dir[128];
  evt_test_tmpdir(dir, sizeof dir, "unfused");
  const char *keys[] = {"EVT_CACHE_DIR"};
  char *saved[1];
  evt_test_env_save(keys, 1, saved);
  setenv("EVT_CACHE_DIR", dir, 1);
  topt()->fusion_ab = 0; /* (the records decide alone) */
  const char *files[] = {"bench/graphs/mlp_bf16.evt", "bench/graphs/bert_layer_bf16.evt"};
  for (int f = 0; f < 2; f++) {
    evt_graph *g = load_opt(files[f]);
    if (!g) continue;
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int want = 0;
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_lowered *L = &p.low.k[gi];
      const evt_group_exec *x = &p.groups[gi];
      if (!x->fused || L->kind != EVT_LK_GEMM_EVT || L->spec.batched || L->spec.nnodes == 1 || x->d_node < 0) continue;
      evt_tune_record r;
      memset(&r, 0, sizeof r);
      r.spec_hash = evt_kspec_epilogue_hash(&L->spec);
      r.m = x->m, r.n = x->n, r.k = x->k;
      snprintf(r.gpu, sizeof r.gpu, "Test GPU");
      r.choice = EVT_TUNE_UNFUSED;
      r.cfg = EVT_TILE_CONFIG_DEFAULT;
      r.fused_ms = 0.2, r.unfused_ms = 0.1;
      evt_rspec tmp; /* the bias variant where cuBLASLt can add the bias (as the tuner would have measured) */
      int map[EVT_RSPEC_MAX_NODES], tn, dn, bn;
      char e[256];
      evt_tune_unfused_rspec(&L->spec, L->spec.ab_dtype, 1, &tmp, map, &tn, &dn, &bn, e, sizeof e);
      snprintf(r.unfused_how, sizeof r.unfused_how, "%s", bn >= 0 ? "cublasLt(bias) + row kernel" : "cublasLt + row kernel");
      char msg[256];
      r.source_hash = evt_tune_sources_hash(&L->spec, &r);
      CHECK(evt_tune_record_write(NULL, &r, msg, sizeof msg) == EVT_OK);
      want++;
    }
    evt_exec_plan_free(&p);
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int unf = 0, biased = 0, alone = 0;
    for (int gi = 0; gi < p.ngroups; gi++) {
      const evt_group_exec *x = &p.groups[gi];
      unf += x->fused && (x->unf || (x->blas && x->unf_bias >= 0));
      biased += x->fused && x->unf_bias >= 0;
      alone += x->fused && x->blas && x->unf_bias >= 0; /* D = acc + bias: cuBLASLt alone */
    }
    CHECK_MSG(want > 0 && unf == want && biased > 0, "%s: %d records, %d unfused groups (%d with the bias, %d alone)",
              files[f], want, unf, biased, alone);
    check_model_bf16(g, &p, 3, 0, files[f]);
    evt_exec_plan_free(&p);
    /* records that measured the pair 5% faster (0.19 vs 0.2 ms): fused */
    CHECK(rewrite_unfused_ms(0.19) > 0); /* (groups of one spec and shape share a record) */
    CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
    int u = unfused_groups(&p);
    CHECK_MSG(u == 0, "%s: 5%% gain: %d unfused of %d records", files[f], u, want);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
  topt()->fusion_ab = 1;
  evt_test_env_restore(keys, 1, saved);
  evt_test_rmdir(dir);
}

/* Edge-list GCN after the edge-spmm pass (tests/gpu/graphs/gcn_edges.evt): every coo_perm / coo_rowptr is a group of
 * its own for the kernel library, every spmm a fused row-kernel group; the plan's CPU model matches the interpreter. */
TEST(exec_plan_edge_list_gcn_coo_groups) {
  evt_graph *g = load_opt("tests/gpu/graphs/gcn_edges.evt");
  if (!g) return;
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, topt(), &p) == EVT_OK);
  int coo = 0, spmm = 0;
  for (int gi = 0; gi < p.ngroups; gi++) {
    const evt_group_exec *x = &p.groups[gi];
    for (int k = 0; k < x->nmembers; k++) {
      evt_op op = g->nodes[x->members[k]].op;
      bool is_coo = op == EVT_OP_COO_PERM || op == EVT_OP_COO_ROWPTR;
      coo += is_coo;
      spmm += op == EVT_OP_SPMM;
      CHECK(!is_coo || (!x->fused && x->nmembers == 1));
      CHECK(op != EVT_OP_SPMM || x->fused);
    }
  }
  CHECK_MSG(coo == 4 && spmm == 4, "%d coo nodes, %d spmm", coo, spmm);
  evt_exec_plan_free(&p);
  check_plan_cpu_vs_fp64(g, "gcn_edges");
  evt_graph_free(g);
}
