/* The launcher of an sm_8x GEMM + EVT kernel (contract in emit_cutlass_internal.h): one function for batched and
 * unbatched specs (an unbatched one is L = 1 with packed strides). Per node with memory it keeps a leading dim
 * ld<v>, batch stride bs<v> and outer stride os<v> (the Sm90 launcher's rules: 0 = packed, shared nodes 0); the
 * nested fusion Arguments pass them as the Sm80 nodes' (row, 1, batch) strides. The Sm80 reductions add into
 * their outputs with atomics and do not clear them, so the launcher zeroes every sum's memory on the stream first.
 * Then can_implement, workspace, initialize and run(stream); no programmatic dependent launch (Hopper only). */
#include "codegen/emit_cutlass_internal.h"

/* One node's own Arguments, then `,` unless last, then a comment naming the node. */
static void node_args(sbuf *b, const evt_vtree *t, int v, int last) {
  const evt_vnode *nd = &t->spec.nodes[v];
  const char *e = cxx_type(nd->dtype);
  char num[32];
  switch (nd->op) {
    case EVT_V_ROW_BCAST:
    case EVT_V_COL_BCAST:
      sb_printf(b, "{static_cast<%s const *>(a->ptrs[%d]) + o * os%d, %s(0), {%s, bs%d}}", e, v, v, e,
                nd->op == EVT_V_ROW_BCAST ? "_0{}, _1{}" : "_1{}, _0{}", v);
      break;
    case EVT_V_SCALAR: sb_printf(b, "{{float(%s)}, {}, {}}", evt_cxx_double(nd->value, num)); break;
    case EVT_V_SCALAR_LOAD: sb_printf(b, "{{}, {static_cast<%s const *>(a->ptrs[%d])}, {}}", e, v); break;
    case EVT_V_AUX_LOAD:
      sb_printf(b, "{static_cast<%s *>(a->ptrs[%d]) + o * os%d, %s(0), {ld%d, _1{}, bs%d}}", e, v, v, e, v, v);
      break;
    case EVT_V_AUX_STORE: sb_printf(b, "{static_cast<%s *>(a->ptrs[%d]) + o * os%d, {ld%d, _1{}, bs%d}}", e, v, v, v, v); break;
    case EVT_V_ROW_SUM:
    case EVT_V_COL_SUM:
      sb_printf(b, "{static_cast<float *>(a->ptrs[%d]) + o * os%d, 0.0f, {%s, bs%d}}", v, v,
                nd->op == EVT_V_ROW_SUM ? "_0{}, _1{}" : "_1{}, _0{}", v);
      break;
    default: sb_printf(b, "{}"); break;
  }
  evt_cutlass_node_args_end(b, nd, v, last);
}

/* The problem and the strides of A, B, D: from the launch's batch fields (batched) or packed (unbatched). */
static void emit_problem(sbuf *b, const evt_kspec *s) {
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  sb_printf(b, "  int M = a->m, N = a->n, K = a->k;\n  if (M < 0 || N < 0 || K < 0) return EVT_LAUNCH_BAD_ARGS;\n");
  if (!s->batched) {
    sb_printf(b,
              "  int L = 1, LO = 1;  // unbatched: the batch fields are ignored\n"
              "  int64_t lda = %s, ldb = %s, ldd = N, bsa = 0, bsb = 0, bsd = 0;\n"
              "  int64_t os_a = 0, os_b = 0, os_d = 0;\n",
              at ? "M" : "K", bt ? "K" : "N");
    return;
  }
  sb_printf(b, "  int L = a->l > 0 ? a->l : 1, LO = a->l_outer > 1 ? a->l_outer : 1;\n");
  evt_cutlass_emit_batch_strides(b, s);
  sb_printf(b, "  int64_t os_a = a->os_a, os_b = a->os_b, os_d = a->os_d;\n");
}

/* Zeroes every row / column sum of outer batch o: L vectors of N (row) or M (column) floats, bs<v> apart. */
static void emit_sum_reset(sbuf *b, const evt_vtree *t) {
  for (int v = 0; v < t->spec.nnodes; v++) {
    const evt_vnode *nd = &t->spec.nodes[v];
    if (!t->live[v] || (nd->op != EVT_V_ROW_SUM && nd->op != EVT_V_COL_SUM)) continue;
    const char *len = nd->op == EVT_V_ROW_SUM ? "N" : "M";
    if (nd->shared)
      sb_printf(b, "  if (o == 0 && cudaMemsetAsync(a->ptrs[%d], 0, sizeof(float) * %s, stream) != cudaSuccess) return EVT_LAUNCH_INIT;\n",
                v, len);
    else
      sb_printf(b,
                "  if (cudaMemset2DAsync(static_cast<float *>(a->ptrs[%d]) + o * os%d, sizeof(float) * (L > 1 ? bs%d : %s), 0,\n"
                "                        sizeof(float) * %s, L, stream) != cudaSuccess) return EVT_LAUNCH_INIT;  // %s\n",
                v, v, v, len, len, nd->name);
  }
}

void evt_emit_cutlass_sm80_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash) {
  const evt_kspec *s = &t->spec;
  evt_cutlass_emit_launcher_entry(b, t, name, hash);
  emit_problem(b, s);
  if (evt_cutlass_emit_node_strides(b, t))
    sb_printf(b, "  if (LO > 1) return EVT_LAUNCH_CANNOT_IMPLEMENT;  // a shared sum would be reset per launch\n");
  sb_printf(b,
            "  cudaStream_t stream = static_cast<cudaStream_t>(a->stream);\n"
            "  for (int64_t o = 0; o < LO; o++) {\n");
  emit_sum_reset(b, t);
  sb_printf(b, "  typename EVT::Arguments fusion_args{\n");
  evt_emit_tree_args(b, t, s->d_node, o, 0, 0, node_args);
  sb_printf(b, "    {static_cast<ElementD *>(a->d) + o * os_d, {ldd, _1{}, bsd}}  // D\n  };\n");
  sb_printf(b,
            "  typename Gemm::Arguments args(L > 1 ? cutlass::gemm::GemmUniversalMode::kBatched\n"
            "                                      : cutlass::gemm::GemmUniversalMode::kGemm,\n"
            "      {M, N, K}, L, fusion_args,\n"
            "      static_cast<ElementA const *>(a->a) + o * os_a, static_cast<ElementB const *>(a->b) + o * os_b,\n"
            "      nullptr, nullptr, bsa, bsb, 0, 0, lda, ldb, 0, 0);\n");
  evt_cutlass_emit_gemm_run(b, 0, "stream");
  sb_printf(b, "  }\n  return EVT_LAUNCH_OK;\n}\n");
}
