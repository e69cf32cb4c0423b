/* Batched GEMM + epilogue visitor trees (kernel spec batch mode, batched CPU reference, emitter, lowering
 * of bmm groups). The nvcc front-end check runs only where nvcc and CUTLASS are installed. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/examples.h"
#include "codegen/kspec.h"
#include "runtime/jit/jit.h"
#include "test.h"

static const evt_tile_config bcfg = {128, 128, 64, 1, 1, EVT_SCHED_COOPERATIVE};

TEST(bmm_kspec_text_and_check) {
  evt_kspec s;
  char err[256], text[2048];
  CHECK(evt_kspec_example(&s, "bmm_scale_mask_stats", bcfg) == EVT_OK);
  CHECK(s.batched == 1);
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_OK);
  evt_kspec_text(&s, text, sizeof text);
  CHECK(strstr(text, "\nbatched\n") != NULL);
  CHECK(strstr(text, "bias:bf16 shared") != NULL && strstr(text, "colstat:f32 shared") != NULL);
  CHECK(strstr(text, "mask:bf16 shared") == NULL);
  /* the batch mode and sharing are part of the kernel's name */
  uint64_t h = evt_kspec_hash(&s);
  s.nodes[2].shared = 1;
  CHECK(evt_kspec_hash(&s) != h);
  s.nodes[2].shared = 0;
  s.batched = 0;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_INVALID && strstr(err, "'shared' needs a batched spec"));
  /* an unbatched spec's text has no batch line (existing kernel names do not change) */
  evt_kspec p;
  CHECK(evt_kspec_example(&p, "plain", bcfg) == EVT_OK);
  evt_kspec_text(&p, text, sizeof text);
  CHECK(strstr(text, "batched") == NULL);
  /* a shared aux store would race between batches */
  CHECK(evt_kspec_example(&s, "bmm_plain", bcfg) == EVT_OK);
  int st = evt_kspec_add(&s, EVT_V_AUX_STORE, 0, -1, EVT_BF16, "z");
  s.nodes[st].shared = 1;
  s.d_node = st;
  CHECK(evt_kspec_check(&s, err, sizeof err) == EVT_ERR_UNSUPPORTED && strstr(err, "batches would race"));
}

static uint64_t rng_state = 88172645463325252ull;
static double urand(double lo, double hi) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}
static double bf(double x) { return evt_round_to_dtype(x, EVT_BF16); }

/* The batched reference against a naive per-batch evaluation written here for each example, over every
 * layout: A, B per batch; mask / p / rowdot per batch; bias and colstat shared by all batches. */
TEST(bmm_reference_matches_naive_per_batch) {
  const char *names[] = {"bmm_plain", "bmm_scale", "bmm_scale_mask_stats", "bmm_softmax_bwd"};
  const int64_t L = 3, M = 5, N = 4, K = 6;
  for (int e = 0; e < 4; e++)
    for (int lay = 0; lay < 3; lay++) {
      evt_kspec s;
      CHECK(evt_kspec_example(&s, names[e], bcfg) == EVT_OK);
      s.layout = (evt_gemm_layout)lay;
      int at = lay == EVT_LAYOUT_TN, bt = lay == EVT_LAYOUT_NT;
      double a[L * M * K], b[L * K * N], d[L * M * N];
      for (int64_t i = 0; i < L * M * K; i++) a[i] = bf(urand(-1, 1));
      for (int64_t i = 0; i < L * K * N; i++) b[i] = bf(urand(-1, 1));
      double *tens[EVT_KSPEC_MAX_NODES] = {0};
      double store[EVT_KSPEC_MAX_NODES][L * M * N];
      for (int v = 0; v < s.nnodes; v++) {
        int64_t n = evt_vnode_numel(&s, v, M, N) * (s.nodes[v].shared ? 1 : L);
        if (!n) continue;
        tens[v] = store[v];
        for (int64_t i = 0; i < n; i++) store[v][i] = evt_vop_class(s.nodes[v].op) == 'L' ? bf(urand(-2, 2)) : 1e30;
      }
      evt_kspec_reference_batched(&s, L, M, N, K, a, b, tens, d);
      double rowstat[L * M], colstat[N];
      memset(rowstat, 0, sizeof rowstat);
      memset(colstat, 0, sizeof colstat);
      for (int64_t l = 0; l < L; l++)
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
              acc += a[l * M * K + (at ? k * M + i : i * K + k)] * b[l * K * N + (bt ? j * K + k : k * N + j)];
            acc = (double)(float)acc;
            double want = acc;
            if (e == 1) want = acc * 0.125;
            if (e == 2) {
              want = acc * 0.125 + store[2][l * M * N + i * N + j] + store[3][j];
              rowstat[l * M + i] += want;
              colstat[j] += want;
            }
            if (e == 3) want = store[2][l * M * N + i * N + j] * (acc - store[1][l * M + i]) * 0.125;
            CHECK_NEAR(d[l * M * N + i * N + j], bf(want), 1e-12);
          }
      if (e == 2) {
        for (int64_t i = 0; i < L * M; i++) CHECK_NEAR(store[7][i], rowstat[i], 1e-9);
        for (int64_t j = 0; j < N; j++) CHECK_NEAR(store[8][j], colstat[j], 1e-9);
      }
    }
}

/* The batched launcher: problem (M, N, K, L), strides from the launch's leading dims / batch strides,
 * shared nodes with batch stride 0, the outer batch loop. */
TEST(bmm_emitted_launcher) {
  evt_kspec s;
  char err[256];
  CHECK(evt_kspec_example(&s, "bmm_scale_mask_stats", bcfg) == EVT_OK);
  s.layout = EVT_LAYOUT_NT;
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK_MSG(src != NULL, "%s", err);
  if (!src) return;
  CHECK(strstr(src, "{M, N, K, L}") != NULL);
  CHECK(strstr(src, "bstride<typename GemmKernel::StrideA>(lda, bsa)") != NULL);
  CHECK(strstr(src, "int64_t ldb = a->ldb ? a->ldb : (int64_t)K") || strstr(src, "ldb = a->ldb ? a->ldb : (int64_t)K"));
  CHECK(strstr(src, "int64_t bs3 = 0, os3 = 0;  // bias: shared by all batches") != NULL);
  CHECK(strstr(src, "bs2 = a->bs_ptrs[2] ? a->bs_ptrs[2] : (int64_t)M * ld2") != NULL);
  /* a batched sum keeps CUTLASS's node; its input (acc·scale + mask) is not 0 past the edges: bounds checked */
  CHECK(strstr(src, "Sm90ColReduction<cutlass::plus, cutlass::plus, cutlass::atomic_add, 0, TileShape, float, float, RN, "
                    "Stride<_1, _0, int64_t>, 4, true, true, true>") != NULL);
  CHECK(strstr(src, "if (LO > 1) return EVT_LAUNCH_CANNOT_IMPLEMENT;") != NULL); /* a shared sum */
  CHECK(strstr(src, "for (int64_t o = 0; o < LO; o++)") != NULL);
  free(src);
  /* without shared sums, two batch levels are fine */
  CHECK(evt_kspec_example(&s, "bmm_softmax_bwd", bcfg) == EVT_OK);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && !strstr(src, "if (LO > 1)"));
  free(src);
  /* unbatched kernels are emitted as before */
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", bcfg) == EVT_OK);
  src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && !strstr(src, "bstride") && strstr(src, "{M, N, K, 1}"));
  free(src);
}

/* nvcc front end (parsing + every template instantiation) over one batched kernel: attention scores
 * (layout NT) with scale, a per-batch aux mask, a shared bias and per-batch / shared sums. */
TEST(ci_nvcc_frontend_accepts_batched_kernel) {
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bmm_scale_mask_stats", bcfg) == EVT_OK);
  s.layout = EVT_LAYOUT_NT;
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_batched_kernel", &s);
}

/* nvcc front end over a stream-K kernel (the tuner's candidate for few tiles over a long K): a bias-gradient
 * row sum with atomics under CUTLASS's StreamKScheduler. */
TEST(ci_nvcc_frontend_accepts_stream_k_kernel) {
  evt_tile_config c = {128, 256, 64, 1, 1, EVT_SCHED_COOPERATIVE, 0, EVT_RED_ATOMIC, 0, 1};
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_relu_dbias", c) == EVT_OK);
  /* CUTLASS 4.2's stream-K scheduler does not compile with grid dependency control: a plain launch */
  char err[256], *src = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(src && strstr(src, "#define EVT_GEMM_PDL 0 ") != NULL);
  free(src);
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_stream_k_kernel", &s);
}

/* nvcc front end over a kernel with its own epilogue store stages (cfg.epi_stages: StagesD = 4 through
 * CUTLASS's builder implementation): bias + GELU + aux store, ping-pong. */
TEST(ci_nvcc_frontend_accepts_epilogue_stages_kernel) {
  evt_tile_config c = {128, 128, 64, 1, 1, EVT_SCHED_PINGPONG, 0, EVT_RED_ATOMIC, 0, 0, 4};
  evt_kspec s;
  CHECK(evt_kspec_example(&s, "bias_gelu_aux", c) == EVT_OK);
  evt_test_nvcc_frontend("ci_nvcc_frontend_accepts_epilogue_stages_kernel", &s);
}

/* ---- lowering of bmm groups ------------------------------------------------------------------------ */
#include "codegen/lower.h"
#include "partition/partition.h"
#include "passes/passes.h"
#include "compile/train.h"

typedef struct bgraph {
  evt_graph *g;
  evt_part_plan part;
  evt_lower_result low;
} bgraph;

/* parse (text or file), optionally bf16 + joint + passes, partition greedily (lowering's rules or the
 * partitioner's), lower */
static bool bgraph_build(bgraph *b, const char *text, const char *file, bool train, bool lower_rules) {
  char *err = NULL;
  memset(b, 0, sizeof *b);
  b->g = file ? evt_parse_file(file, &err) : evt_parse(text, "bmm", &err);
  CHECK_MSG(b->g, "parse: %s", err ? err : "?");
  free(err);
  if (!b->g) return false;
  if (train) {
    CHECK(evt_lower_retype(b->g, EVT_BF16) == EVT_OK);
    CHECK(evt_train_ensure_joint(b->g, NULL) == EVT_OK);
    CHECK(evt_passes_run_all(b->g, 0, 0) == EVT_OK);
  }
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  o.use_ilp = 0;
  evt_status st = lower_rules ? evt_lower_partition(b->g, &o, EVT_PART_LAMBDA_DEFAULT, &b->part)
                              : evt_part_plan_build(b->g, &o, EVT_PART_LAMBDA_DEFAULT, &b->part);
  CHECK(st == EVT_OK);
  if (st != EVT_OK) return false;
  CHECK(evt_lower_plan(b->g, &b->part, &b->low) == EVT_OK);
  return true;
}

static void bgraph_free(bgraph *b) {
  evt_lower_free(&b->low);
  evt_part_plan_free(&b->part);
  evt_graph_free(b->g);
}

static const evt_lowered *bgroup(const bgraph *b, const char *node) {
  int id = evt_graph_find(b->g, node);
  CHECK_MSG(id >= 0 && b->part.group[id] >= 0, "node %s has no group", node);
  return id >= 0 && b->part.group[id] >= 0 ? &b->low.k[b->part.group[id]] : NULL;
}

/* Every lowered batched group: the CPU reference run through the lowered launch layout (leading dims,
 * batch and outer strides over the whole tensors) against the interpreter's D and stored tensors.
 * Returns the number of batched groups checked. */
static int batched_vs_interp(bgraph *b, const char *what) {
  evt_graph *g = b->g;
  evt_tensor *val = calloc((size_t)g->nnodes, sizeof *val);
  CHECK(evt_interp_init_inputs(g, val, 5) == EVT_OK);
  CHECK(evt_interp_run(g, val, 0, 1) == EVT_OK);
  int checked = 0;
  for (int gi = 0; gi < b->low.n; gi++) {
    const evt_lowered *L = &b->low.k[gi];
    if (!L->ok || L->kind != EVT_LK_GEMM_EVT || !L->spec.batched) continue;
    double *mem[EVT_KSPEC_MAX_NODES] = {0};
    for (int i = 0; i < L->spec.nnodes; i++) {
      if (L->vtensor[i] < 0) continue;
      const evt_tensor *t = &val[L->vtensor[i]];
      mem[i] = evt_vop_class(L->spec.nodes[i].op) == 'S' ? calloc((size_t)t->numel, sizeof(double)) : t->data;
    }
    CHECK(L->d_tensor >= 0);
    if (L->d_tensor < 0) continue;
    int64_t dn = val[L->d_tensor].numel;
    double *d = malloc(sizeof(double) * (size_t)dn);
    for (int64_t i = 0; i < dn; i++) d[i] = NAN; /* every element must be written */
    evt_lower_gemm_reference(L, val[L->a_node].data, val[L->b_node].data, mem, d, 0);
    double worst = 0, scale = 1e-3;
    for (int64_t i = 0; i < dn; i++) scale = fmax(scale, fabs(val[L->d_tensor].data[i]));
    for (int64_t i = 0; i < dn; i++) {
      double e = fabs(d[i] - val[L->d_tensor].data[i]) / scale;
      if (!(e <= worst)) worst = e;
    }
    CHECK_MSG(worst < 3e-2, "%s group %d (%s %%%s): D vs %%%s: relative error %g", what, gi, L->kernel,
              g->nodes[L->nucleus].name, g->nodes[L->d_tensor].name, worst);
    for (int i = 0; i < L->spec.nnodes; i++) {
      if (L->vtensor[i] < 0 || evt_vop_class(L->spec.nodes[i].op) != 'S') continue;
      const evt_tensor *t = &val[L->vtensor[i]];
      double w = 0, sc = 1e-3;
      for (int64_t j = 0; j < t->numel; j++) sc = fmax(sc, fabs(t->data[j]));
      for (int64_t j = 0; j < t->numel; j++) {
        double e = fabs(mem[i][j] - t->data[j]) / sc;
        if (!(e <= w)) w = e;
      }
      CHECK_MSG(w < 3e-2, "%s group %d: store %s vs %%%s: relative error %g", what, gi, L->spec.nodes[i].name,
                g->nodes[L->vtensor[i]].name, w);
      free(mem[i]);
    }
    free(d);
    checked++;
  }
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&val[i]);
  free(val);
  return checked;
}

/* bert_layer's six attention bmms (scores q·k^T scaled; context p·v; the four backward bmms) with the
 * lowering's partition rules: all lower to batched kernels; heads of [B,S,H,D] views are two batch levels
 * (B = 2 outer launches of H = 4 batches); the dK bmm, whose D is stored transposed, is computed as
 * B^T A^T. Every one reproduces the interpreter through its launch layout. */
TEST(bmm_lowering_bert_layer) {
  bgraph b;
  if (!bgraph_build(&b, NULL, "examples/bert_layer.evt", true, true)) return;
  int nbmm = 0, lowered = 0;
  for (int gi = 0; gi < b.low.n; gi++) {
    const evt_lowered *L = &b.low.k[gi];
    if (L->nucleus < 0 || b.g->nodes[L->nucleus].op != EVT_OP_BMM) continue;
    nbmm++;
    CHECK_MSG(L->ok, "group %d: %s", gi, L->reason);
    lowered += L->ok;
    if (!L->ok) continue;
    CHECK(L->spec.batched && L->l == 4 && L->l_outer == 2 && L->m == 16 && L->n == 16 && L->k == 16);
  }
  CHECK_MSG(nbmm == 6 && lowered == 6, "%d bmm groups, %d lowered", nbmm, lowered);
  const evt_lowered *S = bgroup(&b, "attn.scores");
  if (S && S->ok) {
    /* q heads: rows H*D = 64 apart, head h at h*D = 16, batch b at S*H*D = 1024; k^T the same, transposed */
    CHECK(S->spec.layout == EVT_LAYOUT_NT && S->lda == 64 && S->ldb == 64 && S->bs_a == 16 && S->os_a == 1024);
    CHECK(S->ldd == 16 && S->bs_d == 256 && S->os_d == 1024);
    /* the bounds check the runtime binding uses: fine as lowered, and it catches a layout reaching past A */
    char why[200];
    CHECK_MSG(evt_lower_batched_check(b.g, S, why, sizeof why), "%s", why);
    evt_lowered *bad = malloc(sizeof *bad);
    *bad = *S;
    bad->os_a = 2048;
    CHECK(!evt_lower_batched_check(b.g, bad, why, sizeof why) && strstr(why, "A (") && strstr(why, "reaches element"));
    free(bad);
    bool scale = false;
    for (int i = 0; i < S->spec.nnodes; i++) scale |= S->spec.nodes[i].op == EVT_V_SCALAR && S->spec.nodes[i].value == 0.25;
    CHECK(scale);
  }
  const evt_lowered *C = bgroup(&b, "attn.ctx");
  if (C && C->ok) {
    /* the context is written straight into the merged [B*S, H*D] layout */
    CHECK(C->spec.layout == EVT_LAYOUT_NN && C->ldd == 64 && C->bs_d == 16 && C->os_d == 1024);
    CHECK(C->d_tensor == evt_graph_find(b.g, "attn.ctx.flat"));
  }
  int checked = batched_vs_interp(&b, "bert_layer");
  CHECK_MSG(checked == 6, "%d batched groups checked against the interpreter", checked);
  bgraph_free(&b);
}

/* Attention-style epilogue over [B, H, S, S] (q packed, k transposed: NT, one batch level of 6): scale, a
 * per-batch mask, a bias shared by every batch, a per-batch Σ_n (softmax-like row statistic) and a Σ over
 * every batch and row; lowered with the shared flags and checked against the interpreter. */
TEST(bmm_lowering_epilogue_matches_interpreter) {
  const char *text =
      "graph att {\n"
      "  %qh: bf16[2,3,16,8] = input()\n  %k: bf16[2,3,16,8] = input()\n"
      "  %mask: bf16[2,3,16,16] = input()\n  %bias: bf16[16] = param()\n"
      "  %kt = transpose(%k, dims=[2,3])\n"
      "  %s = bmm(%qh, %kt)\n  %c: bf16[] = scalar(value=0.125)\n  %sc = mul(%s, %c)\n"
      "  %z = add(%sc, %mask)\n  %z2 = add(%z, %bias)\n  %zf = cast(%z2, dtype=f32)\n"
      "  %rs = sum(%zf, dims=[3])\n  %cs = sum(%zf, dims=[0,1,2])\n"
      "  output %z2\n  output %rs\n  output %cs\n}\n";
  bgraph b;
  if (!bgraph_build(&b, text, NULL, false, true)) return;
  const evt_lowered *L = bgroup(&b, "s");
  CHECK_MSG(L && L->ok, "%s", L ? L->reason : "");
  if (L && L->ok) {
    int mask = 0, bias = 0, rs = 0, cs = 0;
    for (int i = 0; i < L->spec.nnodes; i++) {
      const evt_vnode *v = &L->spec.nodes[i];
      mask += v->op == EVT_V_AUX_LOAD && !v->shared;
      bias += v->op == EVT_V_ROW_BCAST && v->shared;
      rs += v->op == EVT_V_COL_SUM && !v->shared; /* Σ over N per batch: an M-vector per batch */
      cs += v->op == EVT_V_ROW_SUM && v->shared;  /* Σ over M and every batch: one N-vector */
    }
    CHECK(mask == 1 && bias == 1 && rs == 1 && cs == 1);
    CHECK(L->spec.layout == EVT_LAYOUT_NT && L->l == 6 && L->l_outer == 1); /* [B,H] packed: one level */
    CHECK(batched_vs_interp(&b, "att") == 1);
  }
  bgraph_free(&b);
}

/* What the batch mode refuses, with the reason naming the node. */
TEST(bmm_lowering_refusals) {
  struct {
    const char *body, *want;
  } cases[] = {
      /* a tensor per B but shared over H */
      {"  %q: bf16[2,3,16,8] = input()\n  %k: bf16[2,3,8,16] = input()\n  %m: bf16[2,1,16,16] = input()\n"
       "  %s = bmm(%q, %k)\n  %o = add(%s, %m)\n  output %o\n",
       "broadcast over some batch dims but not all"},
      /* three batch dims that no two strides cover */
      {"  %x: bf16[4,3,2,16,8] = input()\n  %q = permute(%x, dims=[2,1,0,3,4])\n  %k: bf16[2,3,4,8,16] = input()\n"
       "  %s = bmm(%q, %k)\n  output %s\n",
       "strided levels"},
      /* a sum over every head and batch of [B,S,H,D] heads: two batch levels, one launch per B restarts it */
      {"  %x: bf16[2,16,3,8] = input()\n  %q = permute(%x, dims=[0,2,1,3])\n  %k: bf16[2,3,8,16] = input()\n"
       "  %s = bmm(%q, %k)\n  %f = cast(%s, dtype=f32)\n  %r = sum(%f, dims=[0,1,2])\n  output %s\n  output %r\n",
       "two batch levels"},
      /* D stored transposed with an M x N aux tile in the epilogue */
      {"  %q: bf16[2,16,8] = input()\n  %k: bf16[2,8,16] = input()\n  %t: bf16[2,16,16] = input()\n"
       "  %s = bmm(%q, %k)\n  %o = add(%s, %t)\n  %p = permute(%o, dims=[0,2,1])\n  output %p\n",
       "stored transposed"},
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    char text[1024];
    snprintf(text, sizeof text, "graph t {\n%s}\n", cases[i].body);
    bgraph b;
    if (!bgraph_build(&b, text, NULL, false, false)) continue;
    bool found = false;
    char first[320] = "";
    for (int k = 0; k < b.low.n; k++) {
      const evt_lowered *L = &b.low.k[k];
      if (L->ok) continue;
      if (!first[0]) snprintf(first, sizeof first, "%s", L->reason);
      if (strstr(L->reason, cases[i].want) && L->bad_node >= 0 && strstr(L->reason, "group ")) found = true;
    }
    CHECK_MSG(found, "case %d: no reason with '%s' (first: %s)", i, cases[i].want, first);
    bgraph_free(&b);
  }
}

/* The partitioner's hook judges single members of a bmm group by the same rules: a sum over B but not H,
 * a sum of a merged-heads view (bert's bias gradients), a bf16 sum are refused; per-batch and all-batch
 * f32 sums, scale and mask are fine. */
TEST(bmm_can_fuse_one_node) {
  char *err = NULL;
  evt_graph *g = evt_parse("graph t {\n"
                           "  %q: bf16[2,3,16,8] = input()\n  %k: bf16[2,3,8,16] = input()\n  %m: bf16[2,3,16,16] = input()\n"
                           "  %s = bmm(%q, %k)\n  %c: bf16[] = scalar(value=0.125)\n  %sc = mul(%s, %c)\n  %z = add(%sc, %m)\n"
                           "  %f = cast(%z, dtype=f32)\n  %r1 = sum(%f, dims=[0,2])\n  %r2 = sum(%f, dims=[3])\n"
                           "  %r3 = sum(%f, dims=[0,1,2])\n  %r4 = sum(%z, dims=[3])\n"
                           "  %p = permute(%z, dims=[0,2,1,3])\n  %v = reshape(%p, shape=[32,48])\n  %vf = cast(%v, dtype=f32)\n"
                           "  %r5 = sum(%vf, dims=[0])\n"
                           "  output %r1\n  output %r2\n  output %r3\n  output %r4\n  output %r5\n}\n",
                           "t", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (!g) return;
  int s = evt_graph_find(g, "s");
  char why[320];
  struct {
    const char *node, *want; /* want NULL: fusable */
  } cases[] = {{"sc", NULL}, {"z", NULL}, {"f", NULL}, {"r2", NULL}, {"r3", NULL}, {"p", NULL},
               {"r1", "some batch dims but not all"}, {"r4", "sum into bf16"},
               {"r5", "not shaped like the batched tile"}};
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    bool ok = evt_lower_can_fuse(g, s, evt_graph_find(g, cases[i].node), why, sizeof why);
    if (!cases[i].want) CHECK_MSG(ok, "%s: %s", cases[i].node, why);
    else CHECK_MSG(!ok && strstr(why, cases[i].want), "%s: %s", cases[i].node, ok ? "fusable" : why);
  }
  evt_graph_free(g);
}
