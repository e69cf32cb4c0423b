/* CUDA C++ emitter for GEMM + epilogue-visitor-tree kernels (contract in kspec.h, evt_emit_cutlass).
 * Output, in order (the same spec gives the same bytes, so the JIT cache hits): a banner with the spec's text;
 * in `namespace evt_gen_<hash>` element types, layouts, tile / cluster / schedules, the epilogue descriptor, one
 * `using N<i>` per visitor node (the bare CUTLASS node), one `using T<i>` per tree node (Sm90EVT, or the
 * Sm90TopologicalVisitor for the shared region), `using EVT = T<d>`, the collective builders (epilogue first: its
 * shared storage is carved out of the mainloop's stages) and GemmUniversalAdapter; then the launcher
 * (emit_cutlass_launch.c). The order, element types, node comments and tree types: emit_cutlass_common.c. */
#include <stdio.h>

#include "codegen/emit_cutlass_internal.h"


/* Row/col sums: atomics into the output, or (WORKSPACE) partials in CUTLASS's workspace that the last CTA
 * of each tile column/row adds in order (FinalReduction with a non-atomic global reduce). A max within rows
 * (col_max) likewise, through CUTLASS's atomic_maximum (f32 bits: an int max for non-negative values, an
 * unsigned min for negative ones) into an output that initialize() fills with -inf; it checks the tile's edges
 * always (a zero past them is no identity of max). */
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
    case EVT_V_ACC: return !s->conv.kind; /* a conv's rows past M: im2col TMA, not measured to be 0, so checked */
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
    n += s->nodes[i].op == EVT_V_COL_SUM || s->nodes[i].op == EVT_V_COL_MAX ||
         (s->nodes[i].op == EVT_V_ROW_SUM && !own_row_sum(s));
  return n;
}

/* A conv's aux nodes and column reductions are wrapped in evt_nodes::FlatM (kernels/evt_visitor_nodes.h): the conv
 * epilogue's M is (Q, P, N). */
static const char *flat_open(const evt_vtree *t) { return t->spec.conv.kind ? "evt_nodes::FlatM<" : ""; }
static const char *flat_close(const evt_vtree *t) { return t->spec.conv.kind ? ">" : ""; }

/* `using N<i> = <bare CUTLASS node>;` (the comment naming the node follows: emit_cutlass_common.c) */
void evt_cutlass_sm90_node_type(sbuf *b, const evt_vtree *t, int i) {
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
    case EVT_V_AUX_LOAD: /* a conv's aux loads and stores are built over the flattened M (evt_nodes::FlatM) */
      sb_printf(b,
                "using Aux%dDesc = cutlass::epilogue::collective::detail::AuxLoadDescriptor<EpiDesc, "
                "cutlass::layout::RowMajor, %s>;\n",
                i, e);
      sb_printf(b,
                "using N%d = %s%sSm90AuxLoad<Aux%dDesc::Stages, EpiDesc::EpilogueTile, %s, Aux%dDesc::Stride,\n"
                "    Aux%dDesc::SmemLayoutAtom, Aux%dDesc::CopyOpS2R>%s;",
                i, flat_open(t), fus, i, e, i, i, i, flat_close(t));
      break;
    case EVT_V_AUX_STORE:
      sb_printf(b,
                "using Aux%dDesc = cutlass::epilogue::collective::detail::AuxStoreDescriptor<EpiDesc, "
                "cutlass::layout::RowMajor, %s>;\n",
                i, e);
      sb_printf(b,
                "using N%d = %s%sSm90AuxStore<Aux%dDesc::Stages, EpiDesc::EpilogueTile, %s, RN, Aux%dDesc::Stride,\n"
                "    Aux%dDesc::SmemLayoutAtom, Aux%dDesc::CopyOpR2S>%s;",
                i, flat_open(t), fus, i, e, i, i, i, flat_close(t));
      break;
    case EVT_V_ROW_SUM:
      if (own_row_sum(&t->spec)) {
        sb_printf(b, "using N%d = evt_nodes::RowSum<TileShape, %s>;", i, sum_checks_edges(t, v));
        break;
      }
      /* fall through */
    case EVT_V_COL_SUM: /* a conv's column reductions are an [N*P*Q] vector: FlatM, as its aux nodes */
      sb_printf(b, "using N%d = %s%sSm90%sReduction<cutlass::plus, cutlass::plus, %s, 0, TileShape, float, float, RN", i,
                flat_open(t), fus, v->op == EVT_V_ROW_SUM ? "Row" : "Col", gmem_reduce(&t->spec));
      emit_sum_tail(b, t, v);
      sb_printf(b, ">%s;", flat_close(t));
      break;
    case EVT_V_COL_MAX: /* NaN-propagating max (max.NaN gives a positive NaN, which wins the atomic max) */
      sb_printf(b,
                "using N%d = %s%sSm90ColReduction<cutlass::maximum_with_nan_propagation, "
                "cutlass::maximum_with_nan_propagation,\n    %s, 0, TileShape, float, float, RN, "
                "Stride<_1, _0, _0>, 4, true, true, true>%s;",
                i, flat_open(t), fus,
                t->spec.cfg.reduction == EVT_RED_WORKSPACE ? "cutlass::maximum_with_nan_propagation"
                                                           : "cutlass::atomic_maximum",
                flat_close(t));
      break;
    default: {
      const char *fn = evt_cutlass_compute_fn(v->op);
      EVT_ASSERT(fn);
      /* the node that produces D converts to D's element type itself (direct register → smem copy) */
      const char *out = i == t->spec.d_node ? "ElementD" : "float";
      sb_printf(b, "using N%d = %sSm90Compute<%s, %s, float, RN>;", i, fus, fn, out);
    }
  }
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
  int coop = s->cfg.schedule == EVT_SCHED_COOPERATIVE;
  evt_cutlass_emit_elements(b, s, hash);
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

/* After the tree: its root as EVT, then the collectives. */
static void emit_kernel(sbuf *b, const evt_vtree *t, const char *hash) {
  sb_printf(b, "using EVT = T%d;\n\n", t->spec.d_node);
  emit_collectives(b, &t->spec, hash);
}

static const cutlass_gen sm90 = {
    .visitor = "cutlass::epilogue::fusion::Sm90",
    .tree_heading = "\n// the tree (children first)\n",
    .banner = emit_banner,
    .types = emit_types,
    .node_type = evt_cutlass_sm90_node_type,
    .kernel = emit_kernel,
    .launcher = evt_emit_cutlass_launcher,
};

char *evt_emit_cutlass(const evt_kspec *s, char *err, size_t errlen) {
  if (evt_arch_sm8x(s->arch)) return evt_emit_cutlass_sm80(s, err, errlen);
  if (s->conv.kind) return evt_emit_cutlass_conv(s, err, errlen);
  return evt_cutlass_emit(s, &sm90, err, errlen);
}
