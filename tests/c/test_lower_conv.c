/* Convolution nuclei with a generated epilogue (src/codegen/lower_conv.c, kspec_conv.c, emit_cutlass_conv.c): the
 * spec a conv2d group lowers to (geometry, GEMM view, epilogue nodes), the refusals that name the conv node, the
 * spec's rules and hash, and the emitted source (deterministic, CUTLASS's Sm90 conv API). */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower.h"
#include "partition/partition.h"
#include "test.h"

typedef struct conv_lowered {
  evt_graph *g;
  evt_part_plan part;
  evt_lower_result low;
} conv_lowered;

/* body inside `graph t { ... }`, partitioned with the lowering's rules and lowered; false if it does not parse */
static bool lower_body(const char *body, conv_lowered *cl) {
  char text[4096], *err = NULL;
  snprintf(text, sizeof text, "graph t {\n%s}\n", body);
  memset(cl, 0, sizeof *cl);
  cl->g = evt_parse(text, "conv", &err);
  CHECK_MSG(cl->g, "parse: %s", err ? err : "?");
  free(err);
  if (!cl->g) return false;
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  CHECK(evt_lower_partition(cl->g, &o, EVT_PART_LAMBDA_DEFAULT, &cl->part) == EVT_OK);
  CHECK(evt_lower_plan(cl->g, &cl->part, &cl->low) == EVT_OK);
  return true;
}

static void conv_free(conv_lowered *cl) {
  evt_lower_free(&cl->low);
  evt_part_plan_free(&cl->part);
  evt_graph_free(cl->g);
}

static const evt_lowered *group_of(const conv_lowered *cl, const char *node) {
  int id = evt_graph_find(cl->g, node);
  CHECK_MSG(id >= 0 && cl->part.group[id] >= 0, "node %s has no group", node);
  return id >= 0 && cl->part.group[id] >= 0 ? &cl->low.k[cl->part.group[id]] : NULL;
}

/* index of the first node of op in L's spec, or -1 */
static int find_vop(const evt_lowered *L, evt_vop op) {
  for (int i = 0; i < L->spec.nnodes; i++)
    if (L->spec.nodes[i].op == op) return i;
  return -1;
}

#define BIAS_RELU_AUX(X, W, B, CONV)                                                                              \
  "  %x: bf16" X " = input()\n  %w: bf16" W " = param()\n  %b: bf16" B " = param()\n  %c = conv2d(%x, %w, " CONV \
  ", layout=nhwc)\n  %y = add(%c, %b)\n  %r = relu(%y)\n  output %r\n  output %y\n"

TEST(lower_conv_bias_relu_aux_store) {
  conv_lowered cl;
  if (!lower_body(BIAS_RELU_AUX("[2,8,8,16]", "[32,3,3,16]", "[32]", "padding=[1,1]"), &cl)) return;
  CHECK_MSG(cl.low.n == 1, "%d groups: conv, bias, relu and the store are one kernel", cl.low.n);
  const evt_lowered *L = group_of(&cl, "c");
  if (!L) {
    conv_free(&cl);
    return;
  }
  CHECK_MSG(L->ok && L->kind == EVT_LK_CONV_EVT, "%s", L->reason);
  const evt_conv_geom *g = &L->spec.conv;
  CHECK(g->kind == EVT_CONV_FPROP && g->n == 2 && g->h == 8 && g->w == 8 && g->c == 16 && g->o == 32);
  CHECK(g->kh == 3 && g->kw == 3 && g->stride_h == 1 && g->pad_h == 1 && g->pad_w == 1 && g->p == 8 && g->q == 8);
  CHECK(L->m == 2 * 8 * 8 && L->n == 32 && L->k == 3 * 3 * 16);
  CHECK(L->a_node == evt_graph_find(cl.g, "x") && L->b_node == evt_graph_find(cl.g, "w"));
  CHECK(L->spec.layout == EVT_LAYOUT_NT && L->spec.cfg.tile_k == 16 && L->spec.cfg.schedule == EVT_SCHED_PINGPONG);
  int rb = find_vop(L, EVT_V_ROW_BCAST), st = find_vop(L, EVT_V_AUX_STORE), re = find_vop(L, EVT_V_RELU);
  CHECK_MSG(rb >= 0 && L->vtensor[rb] == evt_graph_find(cl.g, "b"), "the bias is a row broadcast of an O-vector");
  CHECK_MSG(st >= 0 && L->vtensor[st] == evt_graph_find(cl.g, "y"), "the pre-activation is an aux store");
  CHECK(re >= 0 && L->spec.d_node == re && L->d_tensor == evt_graph_find(cl.g, "r"));
  CHECK(evt_kspec_check(&L->spec, NULL, 0) == EVT_OK);
  conv_free(&cl);
}

/* 3x3 stride 2 and a 7x7 stride-2 stem: output extents, K tiles from C, and a sum over N, P, Q (batch-norm
 * statistics) as a row sum; a residual of the output's shape is an aux load */
TEST(lower_conv_strided_stem_and_statistics) {
  conv_lowered cl;
  if (!lower_body("  %x: bf16[2,15,15,32] = input()\n  %w: bf16[64,3,3,32] = param()\n  %res: bf16[2,8,8,64] = input()\n"
                  "  %c = conv2d(%x, %w, stride=[2,2], padding=[1,1], layout=nhwc)\n  %y = add(%c, %res)\n"
                  "  %f = cast(%y, dtype=f32)\n  %s = sum(%f, dims=[0,1,2])\n  output %y\n  output %s\n",
                  &cl))
    return;
  const evt_lowered *L = group_of(&cl, "c");
  if (L) {
    CHECK_MSG(L->ok && L->kind == EVT_LK_CONV_EVT, "%s", L->reason);
    CHECK(L->spec.conv.p == 8 && L->spec.conv.q == 8 && L->spec.cfg.tile_k == 32 && L->m == 128 && L->n == 64);
    int rs = find_vop(L, EVT_V_ROW_SUM), al = find_vop(L, EVT_V_AUX_LOAD);
    CHECK_MSG(rs >= 0 && L->vtensor[rs] == evt_graph_find(cl.g, "s"), "Σ over N, P, Q is a row sum");
    CHECK_MSG(al >= 0 && L->vtensor[al] == evt_graph_find(cl.g, "res"), "the residual is an aux load");
    CHECK(cl.part.group[evt_graph_find(cl.g, "s")] == cl.part.group[evt_graph_find(cl.g, "c")]);
  }
  conv_free(&cl);
  if (!lower_body(BIAS_RELU_AUX("[2,32,32,16]", "[64,7,7,16]", "[64]", "stride=[2,2], padding=[3,3]"), &cl)) return;
  L = group_of(&cl, "c");
  if (L) {
    CHECK_MSG(L->ok, "%s", L->reason);
    CHECK(L->spec.conv.p == 16 && L->spec.conv.q == 16 && L->spec.conv.kh == 7 && L->k == 7 * 7 * 16);
  }
  conv_free(&cl);
}

TEST(lower_conv_refusals_name_the_node) {
  struct {
    const char *body, *want;
  } cases[] = {
      {"  %x: bf16[2,16,8,8] = input()\n  %w: bf16[32,16,3,3] = param()\n  %c = conv2d(%x, %w, padding=[1,1])\n"
       "  output %c\n", "layout nchw"},
      {"  %x: bf16[2,8,8,8] = input()\n  %w: bf16[32,3,3,8] = param()\n  %c = conv2d(%x, %w, layout=nhwc)\n"
       "  output %c\n", "C=8"},
      {"  %x: bf16[2,8,8,16] = input()\n  %w: bf16[12,3,3,16] = param()\n  %c = conv2d(%x, %w, layout=nhwc)\n"
       "  output %c\n", "O=12"},
      {"  %x: bf16[2,8,8,32] = input()\n  %w: bf16[32,3,3,16] = param()\n  %c = conv2d(%x, %w, groups=2, layout=nhwc)\n"
       "  output %c\n", "groups=2"},
      {"  %x: bf16[2,8,8,16] = input()\n  %w: bf16[32,3,3,16] = param()\n"
       "  %c = conv2d(%x, %w, dilation=[2,2], padding=[2,2], layout=nhwc)\n  output %c\n", "dilation"},
      {"  %x: f32[2,8,8,16] = input()\n  %w: f32[32,3,3,16] = param()\n  %c = conv2d(%x, %w, layout=nhwc)\n"
       "  output %c\n", "operands f32 x f32"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    conv_lowered cl;
    if (!lower_body(cases[i].body, &cl)) continue;
    const evt_lowered *L = group_of(&cl, "c");
    if (L) {
      CHECK_MSG(!L->ok && L->kind == EVT_LK_UNFUSED, "case %zu lowered", i);
      CHECK_MSG(strstr(L->reason, "%c (conv2d)") && strstr(L->reason, cases[i].want), "case %zu: %s", i, L->reason);
      CHECK(L->bad_node == evt_graph_find(cl.g, "c"));
    }
    conv_free(&cl);
  }
}

/* A spec built by hand: the conv rules of evt_kspec_check, and a hash that covers the geometry. */
static void conv_spec(evt_kspec *s, int stride) {
  evt_kspec_init(s, EVT_LAYOUT_NT, EVT_BF16, EVT_BF16, (evt_tile_config){128, 128, 64, 1, 1, EVT_SCHED_PINGPONG});
  s->conv = (evt_conv_geom){EVT_CONV_FPROP, 4, 16, 16, 64, 64, 3, 3, stride, stride, 1, 1, 0, 0};
  s->conv.p = evt_conv_out_extent(16, 3, stride, 1);
  s->conv.q = s->conv.p;
  int acc = evt_kspec_add(s, EVT_V_ACC, -1, -1, EVT_F32, NULL);
  int b = evt_kspec_add(s, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "r0");
  int y = evt_kspec_add(s, EVT_V_ADD, acc, b, EVT_F32, NULL);
  int st = evt_kspec_add(s, EVT_V_AUX_STORE, y, -1, EVT_BF16, "s0");
  s->d_node = evt_kspec_add(s, EVT_V_RELU, st, -1, EVT_F32, NULL);
}

TEST(kspec_conv_rules_and_hash) {
  evt_kspec s, t;
  char err[256];
  conv_spec(&s, 1);
  CHECK_MSG(evt_kspec_check(&s, err, sizeof err) == EVT_OK, "%s", err);
  conv_spec(&t, 2);
  CHECK(t.conv.p == 8 && evt_kspec_check(&t, NULL, 0) == EVT_OK);
  CHECK_MSG(evt_kspec_hash(&s) != evt_kspec_hash(&t), "the stride is part of the hash");
  t = s;
  t.conv.q = 15;
  CHECK(evt_kspec_check(&t, err, sizeof err) != EVT_OK && strstr(err, "does not follow"));
  t = s;
  t.cfg.schedule = EVT_SCHED_COOPERATIVE;
  CHECK(evt_kspec_check(&t, err, sizeof err) != EVT_OK && strstr(err, "not persistent"));
  t = s;
  t.conv.c = 48; /* tile_k 64 does not divide it */
  CHECK(evt_kspec_check(&t, err, sizeof err) != EVT_OK && strstr(err, "C=48"));
  t.cfg.tile_k = evt_conv_tile_k(48);
  CHECK(t.cfg.tile_k == 16 && evt_kspec_check(&t, NULL, 0) == EVT_OK);
  t = s;
  t.layout = EVT_LAYOUT_NN;
  CHECK(evt_kspec_check(&t, NULL, 0) != EVT_OK);
  t = s;
  t.cfg.tile_k = 16; /* only a conv takes K tiles of 16 */
  t.conv.kind = EVT_CONV_NONE;
  CHECK(evt_kspec_check(&t, NULL, 0) != EVT_OK);
}

TEST(emit_conv_source_is_deterministic) {
  evt_kspec s;
  conv_spec(&s, 2);
  char err[256];
  char *a = evt_emit_cutlass(&s, err, sizeof err), *b = evt_emit_cutlass(&s, err, sizeof err);
  CHECK_MSG(a && b, "%s", err);
  if (!a || !b) {
    free(a);
    free(b);
    return;
  }
  CHECK(!strcmp(a, b));
  char name[40];
  evt_kspec_kernel_name(&s, name);
  const char *want[] = {"GENERATED by evt", name, "cutlass::conv::Operator::kFprop", "cutlass::conv::kernel::ConvUniversal",
                        "cutlass::conv::ConvProblemShape<kOp, 2>", "cutlass::conv::Operator::kFprop;",
                        "KernelImplicitTmaWarpSpecializedSm90", "evt_nodes::FlatM<",
                        "kStrideH = 2", "a->m != kM"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(a, want[i]), "no `%s` in the source", want[i]);
  free(a);
  free(b);
  s.cfg.schedule = EVT_SCHED_COOPERATIVE; /* the emitter refuses what the spec's rules refuse */
  a = evt_emit_cutlass(&s, err, sizeof err);
  CHECK(a == NULL && strstr(err, "conv"));
  free(a);
}

/* conv2d_backward_input (stride 1): the tile is dx [N*H*W, C], K = kh*kw*O; the previous layer's ReLU mask and the
 * batch-norm backward's sums are its epilogue; a strided dgrad is refused by name */
TEST(lower_conv_dgrad_relu_mask_and_sums) {
  conv_lowered cl;
  if (!lower_body("  %dy: bf16[2,8,8,64] = input()\n  %w: bf16[64,3,3,32] = param()\n  %h: bf16[2,8,8,32] = input()\n"
                  "  %z: bf16[] = scalar(value=0)\n"
                  "  %c = conv2d_backward_input(%dy, %w, padding=[1,1], shape=[2,8,8,32], layout=nhwc)\n"
                  "  %pos = gt(%h, %z)\n  %g = where(%pos, %c, %z)\n  %f = cast(%g, dtype=f32)\n"
                  "  %s = sum(%f, dims=[0,1,2])\n  output %g\n  output %s\n",
                  &cl))
    return;
  const evt_lowered *L = group_of(&cl, "c");
  if (L) {
    CHECK_MSG(L->ok && L->kind == EVT_LK_CONV_EVT, "%s", L->reason);
    CHECK(L->spec.conv.kind == EVT_CONV_DGRAD && L->spec.conv.c == 32 && L->spec.conv.o == 64 && L->spec.conv.p == 8);
    CHECK(L->m == 2 * 8 * 8 && L->n == 32 && L->k == 3 * 3 * 64 && L->spec.cfg.tile_k == 64 && L->spec.cfg.tile_n == 64);
    CHECK(L->a_node == evt_graph_find(cl.g, "dy") && L->b_node == evt_graph_find(cl.g, "w"));
    CHECK(find_vop(L, EVT_V_WHERE) >= 0 && find_vop(L, EVT_V_ROW_SUM) >= 0 && find_vop(L, EVT_V_AUX_LOAD) >= 0);
    CHECK(cl.part.group[evt_graph_find(cl.g, "s")] == cl.part.group[evt_graph_find(cl.g, "c")]);
    char err[256];
    char *src = evt_emit_cutlass(&L->spec, err, sizeof err);
    CHECK_MSG(src && strstr(src, "cutlass::conv::Operator::kDgrad;") && strstr(src, "kM = 128, kNg = 32, kK = 576"), "%s", src ? "" : err);
    CHECK_MSG(src && strstr(src, "CollectiveEpilogue::initialize_workspace(gemm_view"), "the launcher resets the sums");
    free(src);
    evt_kspec fprop = L->spec;
    fprop.conv.kind = EVT_CONV_FPROP;
    CHECK(evt_kspec_hash(&fprop) != evt_kspec_hash(&L->spec));
  }
  conv_free(&cl);
  if (!lower_body("  %dy: bf16[2,4,4,64] = input()\n  %w: bf16[64,3,3,32] = param()\n"
                  "  %c = conv2d_backward_input(%dy, %w, stride=[2,2], padding=[1,1], shape=[2,8,8,32], layout=nhwc)\n"
                  "  output %c\n",
                  &cl))
    return;
  L = group_of(&cl, "c");
  if (L)
    CHECK_MSG(!L->ok && strstr(L->reason, "%c (conv2d_backward_input)") && strstr(L->reason, "stride 2x2"), "%s",
              L->reason);
  conv_free(&cl);
}

/* Per-pixel reductions over the channels are column reductions ([N*P*Q] vectors, CUTLASS's Sm90ColReduction under
 * FlatM: its host functions over the flattened M), a mean over N, P, Q a scaled row sum; all in the conv's group. The
 * launcher resets the sums' outputs itself (the conv kernel's initialize does not reach the epilogue's); a kernel
 * without sums does not. */
TEST(lower_conv_channel_reductions_and_reset) {
  conv_lowered cl;
  if (!lower_body("  %x: bf16[2,14,14,32] = input()\n  %w: bf16[64,3,3,32] = param()\n"
                  "  %c = conv2d(%x, %w, padding=[1,1], layout=nhwc)\n  %r = relu(%c)\n  %f = cast(%c, dtype=f32)\n"
                  "  %s = sum(%f, dims=[3])\n  %m = amax(%f, dims=[3])\n  %u = mean(%f, dims=[0,1,2])\n"
                  "  output %r\n  output %s\n  output %m\n  output %u\n",
                  &cl))
    return;
  const evt_lowered *L = group_of(&cl, "c");
  if (L) {
    CHECK_MSG(L->ok && L->kind == EVT_LK_CONV_EVT, "%s", L->reason);
    CHECK_MSG(cl.low.n == 1, "%d groups: the conv and its three reductions are one kernel", cl.low.n);
    int cs = find_vop(L, EVT_V_COL_SUM), cm = find_vop(L, EVT_V_COL_MAX), rs = find_vop(L, EVT_V_ROW_SUM);
    CHECK(cs >= 0 && L->vtensor[cs] == evt_graph_find(cl.g, "s"));
    CHECK(cm >= 0 && L->vtensor[cm] == evt_graph_find(cl.g, "m"));
    CHECK(rs >= 0 && L->vtensor[rs] == evt_graph_find(cl.g, "u"));
    char err[256];
    char *src = evt_emit_cutlass(&L->spec, err, sizeof err);
    CHECK_MSG(src, "%s", err);
    const char *want[] = {"evt_nodes::FlatM<cutlass::epilogue::fusion::Sm90ColReduction<cutlass::plus",
                          "evt_nodes::FlatM<cutlass::epilogue::fusion::Sm90ColReduction<cutlass::maximum_with_nan",
                          "evt_nodes::RowSum<TileShape, true>",
                          "CollectiveEpilogue::initialize_workspace(gemm_view, args.epilogue, nullptr, stream)"};
    for (size_t i = 0; src && i < sizeof want / sizeof want[0]; i++)
      CHECK_MSG(strstr(src, want[i]), "no `%s` in the source", want[i]);
    free(src);
  }
  conv_free(&cl);
  if (!lower_body(BIAS_RELU_AUX("[2,8,8,16]", "[32,3,3,16]", "[32]", "padding=[1,1]"), &cl)) return;
  L = group_of(&cl, "c");
  if (L) {
    char err[256];
    char *src = evt_emit_cutlass(&L->spec, err, sizeof err);
    CHECK_MSG(src && !strstr(src, "initialize_workspace(gemm_view"), "no reset without sums");
    free(src);
  }
  conv_free(&cl);
}

/* conv2d_backward_weight: a library singleton to the partitioner, a CONV+EVT kernel of its own here: the tile is dw
 * [O, kh*kw*C] (N tiles divide C), K = N*P*Q, operands dy (A) and x (B), the epilogue stores D only */
TEST(lower_conv_wgrad_stores_dw) {
  conv_lowered cl;
  if (!lower_body("  %x: bf16[2,8,8,48] = input()\n  %dy: bf16[2,8,8,32] = input()\n"
                  "  %dw = conv2d_backward_weight(%x, %dy, padding=[1,1], shape=[32,3,3,48], layout=nhwc)\n"
                  "  output %dw\n",
                  &cl))
    return;
  const evt_lowered *L = group_of(&cl, "dw");
  if (L) {
    CHECK_MSG(L->ok && L->kind == EVT_LK_CONV_EVT, "%s", L->reason);
    CHECK(L->spec.conv.kind == EVT_CONV_WGRAD && L->m == 32 && L->n == 3 * 3 * 48 && L->k == 2 * 8 * 8);
    CHECK(L->spec.cfg.tile_n == 16 && L->spec.cfg.tile_k == 64 && L->spec.nnodes == 1 && L->spec.d_dtype == EVT_BF16);
    CHECK(L->a_node == evt_graph_find(cl.g, "dy") && L->b_node == evt_graph_find(cl.g, "x"));
    CHECK(L->d_tensor == evt_graph_find(cl.g, "dw") && L->nucleus == evt_graph_find(cl.g, "dw"));
    char err[256];
    char *src = evt_emit_cutlass(&L->spec, err, sizeof err);
    CHECK_MSG(src && strstr(src, "Operator::kWgrad;") && strstr(src, "cutlass::layout::TensorKCSR") &&
                  strstr(src, "Shape<_128, Shape<_16>, Shape<_64>>"),
              "%s", src ? "" : err);
    free(src);
    evt_kspec t = L->spec; /* a wgrad epilogue stores D only */
    int b = evt_kspec_add(&t, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "r0");
    t.d_node = evt_kspec_add(&t, EVT_V_ADD, 0, b, EVT_F32, NULL);
    CHECK(evt_kspec_check(&t, err, sizeof err) != EVT_OK && strstr(err, "stores D only"));
  }
  conv_free(&cl);
}

/* The partitioner's hook with the lowering's rules (evt_lower_compat) keeps what a conv epilogue cannot hold out of
 * the conv's group, so the conv still lowers; an nchw conv keeps the shape rule only (it cannot lower anyway). */
TEST(partition_conv_epilogue_takes_what_lowers) {
  conv_lowered cl;
  if (!lower_body("  %x: bf16[2,8,8,16] = input()\n  %w: bf16[32,3,3,16] = param()\n  %b: bf16[32] = param()\n"
                  "  %c = conv2d(%x, %w, padding=[1,1], layout=nhwc)\n  %y = add(%c, %b)\n  %e = pow(%y, value=3)\n"
                  "  output %e\n",
                  &cl))
    return;
  int c = evt_graph_find(cl.g, "c"), y = evt_graph_find(cl.g, "y"), e = evt_graph_find(cl.g, "e");
  CHECK(cl.part.group[y] == cl.part.group[c] && cl.part.group[e] != cl.part.group[c]);
  const evt_lowered *L = group_of(&cl, "c");
  if (L) CHECK_MSG(L->ok && L->kind == EVT_LK_CONV_EVT && L->d_tensor == y, "%s", L->reason);
  char why[256];
  CHECK(evt_lower_can_fuse(cl.g, c, y, why, sizeof why));
  CHECK(!evt_lower_can_fuse(cl.g, c, e, why, sizeof why) && strstr(why, "pow"));
  conv_free(&cl);
}

/* Retargeted to sm_80 a conv group runs unfused, its reason naming the conv (the conv kernels are Sm90's). */
TEST(lower_conv_retarget_sm80_is_unfused) {
  conv_lowered cl;
  if (!lower_body(BIAS_RELU_AUX("[2,8,8,16]", "[32,3,3,16]", "[32]", "padding=[1,1]"), &cl)) return;
  int before = cl.low.count[EVT_LK_CONV_EVT], unfused = cl.low.count[EVT_LK_UNFUSED];
  evt_lower_retarget(cl.g, cl.part.group, &cl.low, 80);
  const evt_lowered *L = group_of(&cl, "c");
  CHECK(before == 1 && cl.low.count[EVT_LK_CONV_EVT] == 0 && cl.low.count[EVT_LK_UNFUSED] == unfused + 1);
  if (L) CHECK_MSG(!L->ok && strstr(L->reason, "%c (conv2d)") && strstr(L->reason, "sm_90a"), "%s", L->reason);
  conv_free(&cl);
}
