/* CUDA C++ emitter for GEMM + epilogue-visitor-tree kernels (contract in kspec.h, evt_emit_cutlass).
 * Output, in order (the same spec gives the same bytes, so the JIT cache hits): a banner with the spec's text;
 * in `namespace evt_gen_<hash>` element types, layouts, tile / cluster / schedules, the epilogue descriptor, one
 * `using N<i>` per visitor node (the bare CUTLASS node), one `using T<i>` per tree node (Sm90EVT, or the
 * Sm90TopologicalVisitor for the shared region), `using EVT = T<d>`, the collective builders (epilogue first: its
 * shared storage is carved out of the mainloop's stages) and GemmUniversalAdapter; then the launcher
 * (emit_cutlass_launch.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit_cutlass_internal.h"


const char *evt_cutlass_compute_fn(evt_vop op) {
  switch (op) {
    case EVT_V_ADD: return "cutlass::plus";
    case EVT_V_SUB: return "cutlass::minus";
    case EVT_V_MUL: return "cutlass::multiplies";
    case EVT_V_DIV: return "cutlass::divides";
    case EVT_V_RELU: return "cutlass::epilogue::thread::ReLu";
    case EVT_V_SIGMOID: return "cutlass::epilogue::thread::Sigmoid";
    case EVT_V_GELU_ERF: return "evt_ops::GeluErf";
    case EVT_V_GELU_TANH: return "evt_ops::GeluTanh";
    case EVT_V_GELU_TANH_GRAD: return "evt_ops::GeluTanhGrad";
    case EVT_V_GELU_ERF_GRAD: return "evt_ops::GeluErfGrad";
    case EVT_V_RELU_GRAD: return "evt_ops::ReluGrad";
    case EVT_V_NEG: return "evt_ops::Neg";
    case EVT_V_EXP: return "evt_ops::Exp";
    case EVT_V_LOG: return "evt_ops::Log";
    case EVT_V_ERF: return "evt_ops::Erf";
    case EVT_V_TANH: return "evt_ops::Tanh";
    case EVT_V_SQRT: return "evt_ops::Sqrt";
    case EVT_V_RSQRT: return "evt_ops::Rsqrt";
    case EVT_V_RECIPROCAL: return "evt_ops::Reciprocal";
    case EVT_V_ABS: return "evt_ops::Abs";
    case EVT_V_SIGN: return "evt_ops::Sign";
    case EVT_V_ROUND_BF16: return "evt_ops::RoundBf16";
    case EVT_V_ROUND_F16: return "evt_ops::RoundF16";
    case EVT_V_MAXIMUM: return "evt_ops::Maximum";
    case EVT_V_MINIMUM: return "evt_ops::Minimum";
    case EVT_V_EQ: return "evt_ops::Eq";
    case EVT_V_NE: return "evt_ops::Ne";
    case EVT_V_LT: return "evt_ops::Lt";
    case EVT_V_LE: return "evt_ops::Le";
    case EVT_V_GT: return "evt_ops::Gt";
    case EVT_V_GE: return "evt_ops::Ge";
    case EVT_V_WHERE: return "evt_ops::Where";
    case EVT_V_KEEP: return "evt_ops::Keep";
    default: return NULL;
  }
}

/* Row/col sums: atomics into the output, or (WORKSPACE) partials in CUTLASS's workspace that the last CTA
 * of each tile column/row adds in order (FinalReduction with a non-atomic global reduce). */
static const char *gmem_reduce(const evt_kspec *s) {
  return s->cfg.reduction == EVT_RED_WORKSPACE ? "cutlass::plus" : "cutlass::atomic_add";
}

/* Is node v exactly 0 (not NaN) wherever the tile runs past the problem (rows past M, columns past N)?
 * The accumulator is (TMA fills the operands' out-of-bounds elements with zeros) and so is a TMA aux load;
 * a compute is when its inputs all are and f(0, ..., 0) == 0; broadcasts, scalars and random numbers are
 * not. A row/column sum over such a value needs no per-element bounds check: the padding adds zeros
 * (CUTLASS's VisitCheckOOB = false: the check is a large share of the epilogue's instructions). */
static int zero_out_of_bounds(const evt_kspec *s, int v) {
  const evt_vnode *nd = &s->nodes[v];
  switch (nd->op) {
    case EVT_V_ACC:
    case EVT_V_AUX_LOAD: return 1;
    case EVT_V_ADD: case EVT_V_SUB: case EVT_V_MUL: case EVT_V_RELU: case EVT_V_GELU_ERF: case EVT_V_GELU_TANH:
    case EVT_V_GELU_ERF_GRAD: case EVT_V_GELU_TANH_GRAD: case EVT_V_RELU_GRAD: case EVT_V_NEG: case EVT_V_ERF:
    case EVT_V_TANH: case EVT_V_SQRT: case EVT_V_ABS: case EVT_V_SIGN: case EVT_V_ROUND_BF16: case EVT_V_ROUND_F16:
    case EVT_V_MAXIMUM: case EVT_V_MINIMUM: case EVT_V_AUX_STORE: case EVT_V_ROW_SUM: case EVT_V_COL_SUM:
      for (int j = 0; j < evt_vop_arity(nd->op); j++)
        if (!zero_out_of_bounds(s, nd->in[j])) return 0;
      return 1;
    case EVT_V_WHERE: return zero_out_of_bounds(s, nd->in[1]) && zero_out_of_bounds(s, nd->in[2]);
    case EVT_V_KEEP: return zero_out_of_bounds(s, nd->in[0]);
    default: return 0;
  }
}

/* A sum's "check the edges" template argument: false when its input is 0 past them. */
static const char *sum_checks_edges(const evt_vtree *t, const evt_vnode *v) {
  return zero_out_of_bounds(&t->spec, v->in[0]) ? "false" : "true";
}

/* The template arguments of a CUTLASS row/column sum after the round style. */
static void emit_sum_tail(sbuf *b, const evt_vtree *t, const evt_vnode *v) {
  int rows = v->op == EVT_V_ROW_SUM;
  const char *stride = t->spec.batched ? (rows ? "Stride<_0, _1, int64_t>" : "Stride<_1, _0, int64_t>")
                                       : (rows ? "Stride<_0, _1, _0>" : "Stride<_1, _0, _0>");
  /* StrideMNL, Alignment, EnableNullptr, FinalReduction, VisitCheckOOB */
  sb_printf(b, ", %s, 4, true, true, %s", stride, sum_checks_edges(t, v));
}

static int uses_own_row_sum(const evt_kspec *s) {
  if (!own_row_sum(s)) return 0;
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_ROW_SUM) return 1;
  return 0;
}

/* The project's nodes header is included only where a node needs it (kernels without keep their source and hash) */
static int uses_own_nodes(const evt_kspec *s) {
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND) return 1;
  return uses_own_row_sum(s);
}

int evt_emit_cutlass_sums(const evt_kspec *s) {
  int n = 0;
  for (int i = 0; i < s->nnodes; i++)
    n += s->nodes[i].op == EVT_V_COL_SUM || (s->nodes[i].op == EVT_V_ROW_SUM && !own_row_sum(s));
  return n;
}

/* `using N<i> = <bare CUTLASS node>;` */
static void emit_node_type(sbuf *b, const evt_vtree *t, int i) {
  const evt_vnode *v = &t->spec.nodes[i];
  const char *e = cxx_type(v->dtype);
  const char *fus = "cutlass::epilogue::fusion::";
  switch (v->op) {
    case EVT_V_ACC: sb_printf(b, "using N%d = %sSm90AccFetch;", i, fus); break;
    case EVT_V_ROW_BCAST:
      sb_printf(b, "using N%d = %sSm90RowBroadcast<0, TileShape, %s, float, Stride<_0, _1, int64_t>>;", i, fus, e);
      break;
    case EVT_V_COL_BCAST:
      sb_printf(b, "using N%d = %sSm90ColBroadcast<0, TileShape, %s, float, Stride<_1, _0, int64_t>>;", i, fus, e);
      break;
    case EVT_V_SCALAR: sb_printf(b, "using N%d = %sSm90ScalarBroadcast<float>;", i, fus); break;
    case EVT_V_RAND: sb_printf(b, "using N%d = evt_nodes::Philox<%s>;", i, e); break;
    case EVT_V_SCALAR_LOAD: sb_printf(b, "using N%d = %sSm90ScalarBroadcast<%s>;", i, fus, e); break;
    case EVT_V_AUX_LOAD:
      sb_printf(b,
                "using Aux%dDesc = cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpiDesc, "
                "cutlass::layout::RowMajor, %s>;\n",
                i, e);
      sb_printf(b,
                "using N%d = %sSm90AuxLoad<Aux%dDesc::Stages, EpiDesc::EpilogueTile, %s, Aux%dDesc::Stride,\n"
                "    Aux%dDesc::SmemLayoutAtom, Aux%dDesc::CopyOpS2R>;",
                i, fus, i, e, i, i, i);
      break;
    case EVT_V_AUX_STORE:
      sb_printf(b,
                "using Aux%dDesc = cutlass::epilogue::collective::detail::AuxStoreDescriptor<EpiDesc, "
                "cutlass::layout::RowMajor, %s>;\n",
                i, e);
      sb_printf(b,
                "using N%d = %sSm90AuxStore<Aux%dDesc::Stages, EpiDesc::EpilogueTile, %s, RN, Aux%dDesc::Stride,\n"
                "    Aux%dDesc::SmemLayoutAtom, Aux%dDesc::CopyOpR2S>;",
                i, fus, i, e, i, i, i);
      break;
    case EVT_V_ROW_SUM:
      if (own_row_sum(&t->spec)) {
        sb_printf(b, "using N%d = evt_nodes::RowSum<TileShape, %s>;", i, sum_checks_edges(t, v));
        break;
      }
      /* fall through */
    case EVT_V_COL_SUM:
      sb_printf(b, "using N%d = %sSm90%sReduction<cutlass::plus, cutlass::plus, %s, 0, TileShape, float, float, RN", i,
                fus, v->op == EVT_V_ROW_SUM ? "Row" : "Col", gmem_reduce(&t->spec));
      emit_sum_tail(b, t, v);
      sb_printf(b, ">;");
      break;
    default: {
      const char *fn = evt_cutlass_compute_fn(v->op);
      EVT_ASSERT(fn);
      /* the node that produces D converts to D's element type itself (direct register → smem copy) */
      const char *out = i == t->spec.d_node ? "ElementD" : "float";
      sb_printf(b, "using N%d = %sSm90Compute<%s, %s, float, RN>;", i, fus, fn, out);
    }
  }
  sb_printf(b, "  // %%%d = %s", i, evt_vop_name(v->op));
  for (int j = 0; j < evt_vop_arity(v->op); j++) sb_printf(b, " %%%d", v->in[j]);
  if (evt_vop_has_memory(v->op)) sb_printf(b, " %s:%s", v->name, evt_dtype_name(v->dtype));
  if (v->op == EVT_V_SCALAR) sb_printf(b, " %.17g", v->value);
  if (v->op == EVT_V_RAND) sb_printf(b, " seed %llu offset %llu", (unsigned long long)v->seed, (unsigned long long)v->offset);
  sb_printf(b, "\n");
}

int evt_cutlass_topo_index(const topo_ops *o, int node) {
  for (int k = 0; k < o->n; k++)
    if (o->node[k] == node) return k;
  return -1;
}

static void topo_collect(const evt_vtree *t, int v, int *seen, topo_ops *o) {
  if (seen[v]) return;
  seen[v] = 1;
  const evt_vnode *nd = &t->spec.nodes[v];
  for (int j = 0; j < evt_vop_arity(nd->op); j++) {
    int c = nd->in[j];
    if (t->in_region[c])
      topo_collect(t, c, seen, o);
    else if (!seen[c]) {
      seen[c] = 1;
      o->node[o->n] = c;
      o->subtree[o->n++] = 1;
    }
  }
  o->node[o->n] = v;
  o->subtree[o->n++] = 0;
}

static void emit_tree_types(sbuf *b, const evt_vtree *t, int v, int *done, const topo_ops *o) {
  if (done[v]) return;
  done[v] = 1;
  const evt_vnode *nd = &t->spec.nodes[v];
  if (v == t->topo_root) {
    for (int k = 0; k < o->n; k++)
      if (o->subtree[k]) emit_tree_types(b, t, o->node[k], done, o);
    sb_printf(b, "using T%d = cutlass::epilogue::fusion::Sm90TopologicalVisitor<float,\n    cute::tuple<", v);
    for (int k = 0; k < o->n; k++) {
      sb_printf(b, "%scute::seq<", k ? ", " : "");
      if (!o->subtree[k]) {
        const evt_vnode *on = &t->spec.nodes[o->node[k]];
        for (int j = 0; j < evt_vop_arity(on->op); j++)
          sb_printf(b, "%s%d", j ? ", " : "", evt_cutlass_topo_index(o, on->in[j]));
      }
      sb_printf(b, ">");
    }
    sb_printf(b, ">");
    for (int k = 0; k < o->n; k++) sb_printf(b, ",\n    %c%d", o->subtree[k] ? 'T' : 'N', o->node[k]);
    sb_printf(b, ">;  // topological visitor for shared values\n");
    return;
  }
  int ar = evt_vop_arity(nd->op);
  for (int j = 0; j < ar; j++) emit_tree_types(b, t, nd->in[j], done, o);
  if (ar == 0) {
    sb_printf(b, "using T%d = N%d;\n", v, v);
    return;
  }
  sb_printf(b, "using T%d = cutlass::epilogue::fusion::Sm90EVT<N%d", v, v);
  for (int j = 0; j < ar; j++) sb_printf(b, ", T%d", nd->in[j]);
  sb_printf(b, ">;\n");
}

/* Batched kernels: a stride type S (M/N/K, M/N/K, L modes) with its run-time modes set: the dynamic one of
 * modes 0 and 1 is the leading dim, mode 2 the batch stride. */
static const char *const bstride_helper =
    "// batched: stride S with its dynamic mode 0 or 1 = ld (leading dim) and its mode 2 = batch (elements)\n"
    "template <class S> static S bstride(int64_t ld, int64_t batch) {\n"
    "  S s{};\n"
    "  if constexpr (!cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) cute::get<0>(s) = ld;\n"
    "  if constexpr (!cute::is_static<cute::remove_cvref_t<decltype(cute::get<1>(s))>>::value) cute::get<1>(s) = ld;\n"
    "  if constexpr (!cute::is_static<cute::remove_cvref_t<decltype(cute::get<2>(s))>>::value) cute::get<2>(s) = batch;\n"
    "  return s;\n"
    "}\n\n";

static const char *layout_tag(int transposed) {
  return transposed ? "cutlass::layout::ColumnMajor" : "cutlass::layout::RowMajor";
}

/* The banner and the includes. */
static void emit_banner(sbuf *b, const evt_kspec *s, const char *name) {
  sb_printf(b, "// GENERATED by evt (src/codegen/emit_cutlass.c) — do not edit; regenerate from the kernel spec.\n");
  sb_printf(b, "// Kernel %s: CUTLASS Sm90 GEMM with an epilogue visitor tree. Spec:\n", name);
  evt_cutlass_banner_spec(b, s);
  sb_printf(b,
            "#include <cuda_runtime.h>\n#include <cstring>\n"
            "#ifndef EVT_GEMM_PDL  // launched as a programmatic dependent launch: CUTLASS's producer warps wait for the\n"
            "#define EVT_GEMM_PDL %d  // previous kernel (griddepcontrol) and the consumers release the next one%s\n"
            "#endif\n"
            "#if EVT_GEMM_PDL && !defined(CUTLASS_ENABLE_GDC_FOR_SM90)\n#define CUTLASS_ENABLE_GDC_FOR_SM90 1\n#endif\n"
            "#include \"cutlass/cutlass.h\"\n"
            "#include \"cute/tensor.hpp\"\n"
            "#include \"cutlass/gemm/device/gemm_universal_adapter.h\"\n"
            "#include \"cutlass/gemm/kernel/gemm_universal.hpp\"\n"
            "#include \"cutlass/gemm/collective/collective_builder.hpp\"\n"
            "#include \"cutlass/epilogue/collective/collective_builder.hpp\"\n"
            "#include \"cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp\"\n"
            "#include \"cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp\"\n"
            "#include \"cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp\"\n"
            "#include \"cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp\"\n"
            "#include \"cutlass/epilogue/thread/activation.h\"\n"
            "#include \"cutlass/util/packed_stride.hpp\"\n"
            "#include \"evt_visitor_ops.h\"\n"
            "%s"
            "#include \"evt_launch.h\"\n"
            "#if EVT_GEMM_PDL && defined(__CUDA_ARCH__) && !defined(CUTLASS_GDC_ENABLED)\n"
            "#error \"EVT_GEMM_PDL: CUTLASS grid dependency control is off for this target (sm_90a only)\"\n"
            "#endif\n\n",
            /* CUTLASS 4.2's stream-K scheduler does not compile with grid dependency control (is_last_tile) */
            s->cfg.stream_k ? 0 : 1, s->cfg.stream_k ? " (not with stream-K: CUTLASS 4.2 cannot)" : "",
            uses_own_nodes(s) ? "#include \"evt_visitor_nodes.h\"\n" : "");
}

/* Element types, layouts, tile / cluster shapes, schedules, the epilogue tile and descriptor. */
static void emit_types(sbuf *b, const evt_kspec *s, const char *hash) {
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  int coop = s->cfg.schedule == EVT_SCHED_COOPERATIVE;
  sb_printf(b, "namespace evt_gen_%s {\nusing namespace cute;\n\n", hash);
  sb_printf(b, "using ElementA = %s;\nusing LayoutA = %s;  // A stored %s\n", cxx_type(s->ab_dtype), layout_tag(at),
            at ? "K x M" : "M x K");
  sb_printf(b, "using ElementB = %s;\nusing LayoutB = %s;  // B stored %s\n", cxx_type(s->ab_dtype), layout_tag(bt),
            bt ? "N x K" : "K x N");
  sb_printf(b, "using ElementD = %s;\nusing LayoutD = cutlass::layout::RowMajor;\n", cxx_type(s->d_dtype));
  sb_printf(b, "using ElementAccumulator = float;\n[[maybe_unused]] constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;\n");
  sb_printf(b, "constexpr int AlignmentAB = 16 / sizeof(ElementA);\nconstexpr int AlignmentD = 16 / sizeof(ElementD);\n");
  sb_printf(b, "using TileShape = Shape<_%d, _%d, _%d>;\nusing ClusterShape = Shape<_%d, _%d, _1>;\n", s->cfg.tile_m,
            s->cfg.tile_n, s->cfg.tile_k, s->cfg.cluster_m, s->cfg.cluster_n);
  sb_printf(b, "using MainloopSchedule = cutlass::gemm::%s;\n",
            coop ? "KernelTmaWarpSpecializedCooperative" : "KernelTmaWarpSpecializedPingpong");
  sb_printf(b, "using EpilogueSchedule = cutlass::epilogue::%s;\n", coop ? "TmaWarpSpecializedCooperative" : "TmaWarpSpecialized");
  int epi_n = evt_kspec_epilogue_n(s);
  if (epi_n)
    sb_printf(b, "using EpilogueTileType = Shape<_%d, _%d>;%s\n", coop ? (s->cfg.tile_m < 128 ? s->cfg.tile_m : 128) : 64,
              epi_n, s->cfg.epi_n ? "" : "  // narrow subtiles: more mainloop stages (evt_kspec_epilogue_n)");
  else
    sb_printf(b, "using EpilogueTileType = cutlass::epilogue::collective::EpilogueTileAuto;\n");
  if (s->cfg.epi_stages)
    /* CUTLASS's descriptor with StagesD (buffers of D and of each aux store, i.e. TMA stores in flight) set
     * instead of the builder's min(subtiles, 2); the rest as sm90_get_tma_dispatch_policy with no source C
     * (no smem reuse, TMA stores delayed by one subtile) */
    sb_printf(b,
              "struct EpiDesc {  // StagesD = %d (cfg.epi_stages) instead of the builder's min(subtiles, 2)\n"
              "  using TileShape = evt_gen_%s::TileShape;\n"
              "  using EpilogueTile = decltype(cutlass::epilogue::collective::detail::sm90_compute_tile_shape_or_override<\n"
              "      ElementD, EpilogueTileType, EpilogueSchedule, TileShape>());\n"
              "  static constexpr int EpiTiles = size(shape_div(take<0, 2>(TileShape{}), EpilogueTile{}));\n"
              "  static constexpr int StagesD = %d;\n"
              "  static constexpr int StagesC = EpiTiles < 4 ? EpiTiles : 4;\n"
              "  static_assert(StagesD <= EpiTiles, \"more D buffers than epilogue subtiles\");\n"
              "  using DispatchPolicy = cutlass::epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD,\n"
              "      size(EpilogueTile{}) / %d, false, true>;\n"
              "};\n\n",
              s->cfg.epi_stages, hash, s->cfg.epi_stages, coop ? 256 : 128);
  else
    sb_printf(b,
              "using EpiDesc = cutlass::epilogue::collective::detail::EpilogueDescriptor<TileShape, EpilogueTileType, void, "
              "ElementD, EpilogueSchedule>;\n\n");
}

/* The visitor nodes (bare, in id order, every node the tree uses), then the tree (children first). */
static void emit_visitor_tree(sbuf *b, const evt_vtree *t, const topo_ops *o) {
  sb_printf(b, "// visitor nodes (bare)\n");
  for (int v = 0; v < t->spec.nnodes; v++)
    if (t->live[v]) emit_node_type(b, t, v);
  sb_printf(b, "\n// the tree (children first)\n");
  int done[EVT_KSPEC_MAX_NODES] = {0};
  emit_tree_types(b, t, t->spec.d_node, done, o);
  sb_printf(b, "using EVT = T%d;\n\n", t->spec.d_node);
}

/* The collective builders, the kernel and its adapter, the workspace; the namespace's end. */
static void emit_collectives(sbuf *b, const evt_kspec *s, const char *hash) {
  char stages[160];
  if (s->cfg.stages)
    snprintf(stages, sizeof stages, "cutlass::gemm::collective::StageCount<%d>", s->cfg.stages);
  else
    snprintf(stages, sizeof stages,
             "cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(\n"
             "        sizeof(typename CollectiveEpilogue::SharedStorage))>");
  if (s->cfg.epi_stages) /* the builder's implementation, with EpiDesc's dispatch policy */
    sb_printf(b,
              "using CollectiveEpilogue = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<\n"
              "    TileShape, EpiDesc::EpilogueTile, ElementAccumulator, float, void, LayoutD, AlignmentD, ElementD,\n"
              "    LayoutD, AlignmentD, EVT, EpiDesc::DispatchPolicy>::CollectiveOp;\n");
  else
    sb_printf(b,
              "using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<\n"
              "    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpilogueTileType,\n"
              "    ElementAccumulator, float, void, LayoutD, AlignmentD, ElementD, LayoutD, AlignmentD,\n"
              "    EpilogueSchedule, EVT>::CollectiveOp;\n");
  sb_printf(b,
            "using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<\n"
            "    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, AlignmentAB, ElementB, LayoutB,\n"
            "    AlignmentAB, ElementAccumulator, TileShape, ClusterShape,\n"
            "    %s,\n"
            "    MainloopSchedule>::CollectiveOp;\n"
            "using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,\n"
            "    CollectiveEpilogue%s>;\n"
            "using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;\n\n"
            "%s"
            "static void *g_workspace = nullptr;\n"
            "static size_t g_workspace_bytes = 0;\n"
            "}  // namespace evt_gen_%s\n\n",
            stages, s->cfg.stream_k ? ", cutlass::gemm::StreamKScheduler" : "", s->batched ? bstride_helper : "", hash);
}

void evt_cutlass_topo_ops(const evt_vtree *t, topo_ops *o) {
  memset(o, 0, sizeof *o);
  if (t->topo_root < 0) return;
  int seen[EVT_KSPEC_MAX_NODES] = {0};
  topo_collect(t, t->topo_root, seen, o);
}

void evt_cutlass_banner_spec(sbuf *b, const evt_kspec *s) {
  char text[4096];
  evt_kspec_text(s, text, sizeof text);
  for (char *line = text; *line;) {
    char *nl = strchr(line, '\n');
    int len = nl ? (int)(nl - line) : (int)strlen(line);
    sb_printf(b, "//   %.*s\n", len, line);
    line += len + (nl ? 1 : 0);
  }
}

char *evt_emit_cutlass(const evt_kspec *s, char *err, size_t errlen) {
  if (evt_arch_sm8x(s->arch)) return evt_emit_cutlass_sm80(s, err, errlen);
  evt_vtree *t = calloc(1, sizeof *t);
  EVT_ASSERT(t);
  if (evt_vtree_build(s, t, err, errlen) != EVT_OK) {
    free(t);
    return NULL;
  }
  char name[40];
  evt_kspec_kernel_name(s, name);
  const char *hash = name + strlen("evt_kernel_");
  sbuf out = {0};
  sbuf *b = &out;
  emit_banner(b, s, name);
  emit_types(b, s, hash);
  topo_ops o;
  evt_cutlass_topo_ops(t, &o);
  emit_visitor_tree(b, t, &o);
  emit_collectives(b, s, hash);
  evt_emit_cutlass_launcher(b, t, &o, name, hash);
  free(t);
  return out.p;
}
