/* The CUTLASS kernels' launchers (contract in emit_cutlass_internal.h): the nested fusion Arguments filled with
 * braces (children first, node last; the topological visitor lists its ops in order), then can_implement,
 * workspace, initialize (resets atomic reduction outputs) and run(stream). Each node's memory comes from
 * args->ptrs[node id] (kernels/evt_launch.h). */
#include <stdbool.h>

#include "codegen/emit_cutlass_internal.h"

/* run()'s arguments: a programmatic dependent launch where the source and the runtime allow it */
#define PDL_RUN "stream, nullptr, EVT_GEMM_PDL != 0 && evt_pdl_enabled()"

/* A batched node's Arguments: its pointer advanced to the outer batch `o`, its strides from ld<v> / bs<v>
 * (variables of the generated launcher). */
static void emit_node_args_batched(sbuf *b, const evt_vnode *nd, int v) {
  const char *e = cxx_type(nd->dtype);
  switch (nd->op) {
    case EVT_V_ROW_BCAST:
    case EVT_V_COL_BCAST:
      sb_printf(b, "{static_cast<%s const *>(a->ptrs[%d]) + o * os%d, %s(0), bstride<Stride<%s, int64_t>>(0, bs%d)}", e, v, v,
                e, nd->op == EVT_V_ROW_BCAST ? "_0, _1" : "_1, _0", v);
      break;
    case EVT_V_AUX_LOAD:
      sb_printf(b, "{static_cast<%s const *>(a->ptrs[%d]) + o * os%d, %s(0), bstride<Aux%dDesc::Stride>(ld%d, bs%d)}", e, v,
                v, e, v, v, v);
      break;
    case EVT_V_AUX_STORE:
      sb_printf(b, "{static_cast<%s *>(a->ptrs[%d]) + o * os%d, bstride<Aux%dDesc::Stride>(ld%d, bs%d)}", e, v, v, v, v, v);
      break;
    case EVT_V_ROW_SUM:
    case EVT_V_COL_SUM:
      sb_printf(b, "{static_cast<float *>(a->ptrs[%d]) + o * os%d, 0.0f, bstride<Stride<%s, int64_t>>(0, bs%d)}", v, v,
                nd->op == EVT_V_ROW_SUM ? "_0, _1" : "_1, _0", v);
      break;
    default: EVT_ASSERT(!"emit_node_args_batched: no memory"); break;
  }
}

void evt_cutlass_sm90_node_args(sbuf *b, const evt_vtree *t, int v, int last) {
  const evt_vnode *nd = &t->spec.nodes[v];
  const char *e = cxx_type(nd->dtype);
  if (t->spec.batched && evt_vop_has_memory(nd->op)) {
    emit_node_args_batched(b, nd, v);
    evt_cutlass_node_args_end(b, nd, v, last);
    return;
  }
  char num[32];
  switch (nd->op) {
    case EVT_V_ROW_BCAST:
    case EVT_V_COL_BCAST: sb_printf(b, "{static_cast<%s const *>(a->ptrs[%d]), %s(0), {}}", e, v, e); break;
    case EVT_V_SCALAR: sb_printf(b, "{{float(%s)}, {}, {}}", evt_cxx_double(nd->value, num)); break;
    case EVT_V_RAND:  /* ptrs[v]: the run's RNG step (device memory; NULL: 0); rng[v]: the launch's seed, offset */
      sb_printf(b, "{static_cast<const unsigned long long *>(a->ptrs[%d]), a->rng[%d].seed, a->rng[%d].offset}", v, v, v);
      break;
    case EVT_V_SCALAR_LOAD: sb_printf(b, "{{}, {static_cast<%s const *>(a->ptrs[%d])}, {}}", e, v); break;
    case EVT_V_AUX_LOAD:
      sb_printf(b, "{static_cast<%s const *>(a->ptrs[%d]), %s(0), cutlass::make_cute_packed_stride(Aux%dDesc::Stride{}, mn1)}",
                e, v, e, v);
      break;
    case EVT_V_AUX_STORE:
      sb_printf(b, "{static_cast<%s *>(a->ptrs[%d]), cutlass::make_cute_packed_stride(Aux%dDesc::Stride{}, mn1)}", e, v, v);
      break;
    case EVT_V_ROW_SUM:
      if (own_row_sum(&t->spec)) {
        sb_printf(b, "{a->ptrs[%d]}", v);
        break;
      }
      /* fall through */
    case EVT_V_COL_SUM: sb_printf(b, "{a->ptrs[%d], 0.0f, {}}", v); break;
    case EVT_V_COL_MAX: sb_printf(b, "{a->ptrs[%d], -cutlass::platform::numeric_limits<float>::infinity(), {}}", v); break;
    default: sb_printf(b, "{}"); break;
  }
  evt_cutlass_node_args_end(b, nd, v, last);
}

/* The launcher of a batched spec: problem (M, N, K, L) with leading dims and batch strides from the launch
 * arguments (0 = packed), per-node strides (shared nodes: batch stride 0), and l_outer launches, each with
 * every pointer advanced by its outer stride. */
static void emit_batched_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash) {
  evt_cutlass_emit_launcher_entry(b, t, name, hash);
  sb_printf(b,
            "  int M = a->m, N = a->n, K = a->k;\n"
            "  int L = a->l > 0 ? a->l : 1, LO = a->l_outer > 1 ? a->l_outer : 1;\n"
            "  if (M < 0 || N < 0 || K < 0) return EVT_LAUNCH_BAD_ARGS;\n");
  evt_cutlass_emit_batch_strides(b, &t->spec);
  if (evt_cutlass_emit_node_strides(b, t))
    sb_printf(b, "  if (LO > 1) return EVT_LAUNCH_CANNOT_IMPLEMENT;  // initialize() would reset the shared sums per launch\n");
  sb_printf(b,
            "  cudaStream_t stream = static_cast<cudaStream_t>(a->stream);\n"
            "  static int sm_count = 0;\n"
            "  if (sm_count == 0) sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);\n"
            "  for (int64_t o = 0; o < LO; o++) {\n"
            "  typename EVT::Arguments fusion_args =\n");
  evt_emit_tree_args(b, t, t->spec.d_node, o, 0, 1, evt_cutlass_sm90_node_args);
  sb_printf(b,
            "  ;\n"
            "  typename Gemm::Arguments args{\n"
            "      cutlass::gemm::GemmUniversalMode::kGemm,\n"
            "      {M, N, K, L},\n"
            "      {static_cast<ElementA const *>(a->a) + o * a->os_a,\n"
            "       bstride<typename GemmKernel::StrideA>(lda, bsa),\n"
            "       static_cast<ElementB const *>(a->b) + o * a->os_b,\n"
            "       bstride<typename GemmKernel::StrideB>(ldb, bsb)},\n"
            "      {fusion_args, nullptr,\n"
            "       bstride<typename GemmKernel::StrideC>(ldd, bsd),\n"
            "       static_cast<ElementD *>(a->d) + o * a->os_d,\n"
            "       bstride<typename GemmKernel::StrideD>(ldd, bsd)}};\n"
            "  if (a->swizzle > 1) args.scheduler.max_swizzle_size = a->swizzle;\n"
            "  if (a->raster == 1 || a->raster == 2)\n"
            "    args.scheduler.raster_order = static_cast<decltype(args.scheduler.raster_order)>(a->raster);\n"
            "  args.hw_info.sm_count = sm_count;\n");
  evt_cutlass_emit_gemm_run(b, 0, PDL_RUN);
  sb_printf(b, "  }\n  return EVT_LAUNCH_OK;\n}\n");
}

/* Launch cache (specs without sums: their launches need nothing from initialize() but the kernel's parameters; a
 * sum's output is reset by it): the initialized Gemm of the last kLaunchCache launches with byte-identical
 * arguments and no workspace runs again directly, skipping can_implement and initialize (TMA descriptors: host
 * time). A training step launches each group with the same pointers and shapes every time. */
static void emit_launch_cache_state(sbuf *b, const char *hash) {
  sb_printf(b,
            "namespace evt_gen_%s {\n"
            "constexpr int kLaunchCache = 8;  // launch cache (not thread-safe, like g_workspace)\n"
            "static Gemm g_cache[kLaunchCache];\n"
            "static evt_launch_args g_cache_key[kLaunchCache];\n"
            "static bool g_cache_used[kLaunchCache];\n"
            "static int g_cache_next = 0;\n"
            "}  // namespace evt_gen_%s\n\n",
            hash, hash);
}

/* The unbatched launcher's head: pointer checks, the problem, the launch cache's lookup. */
static void emit_launcher_head(sbuf *b, const evt_vtree *t, const char *name, const char *hash, bool cache) {
  evt_cutlass_emit_launcher_entry(b, t, name, hash);
  sb_printf(b,
            "  int M = a->m, N = a->n, K = a->k;\n"
            "  auto mn1 = cute::make_shape(M, N, 1);\n"
            "  (void)mn1;\n"
            "  cudaStream_t stream = static_cast<cudaStream_t>(a->stream);\n");
  if (cache)
    sb_printf(b,
              "  evt_launch_args key;  // the arguments but the stream\n"
              "  memcpy(&key, a, sizeof key);\n"
              "  key.stream = nullptr;\n"
              "  for (int c = 0; c < kLaunchCache; c++)\n"
              "    if (g_cache_used[c] && !memcmp(&g_cache_key[c], &key, sizeof key)) {\n"
              "      if (g_cache[c].run(" PDL_RUN ") != cutlass::Status::kSuccess) return EVT_LAUNCH_RUN;\n"
              "      return cudaPeekAtLastError() == cudaSuccess ? EVT_LAUNCH_OK : EVT_LAUNCH_RUN;\n"
              "    }\n");
}

/* The unbatched launcher: fusion Arguments, GEMM Arguments, can_implement, workspace, initialize, run. */
static void emit_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash) {
  bool cache = !evt_kspec_has_sums(&t->spec);
  if (cache) emit_launch_cache_state(b, hash);
  emit_launcher_head(b, t, name, hash, cache);
  sb_printf(b, "  typename EVT::Arguments fusion_args =\n");
  evt_emit_tree_args(b, t, t->spec.d_node, o, 0, 1, evt_cutlass_sm90_node_args);
  sb_printf(b, "  ;\n");
  sb_printf(b,
            "  typename Gemm::Arguments args{\n"
            "      cutlass::gemm::GemmUniversalMode::kGemm,\n"
            "      {M, N, K, 1},\n"
            "      {static_cast<ElementA const *>(a->a),\n"
            "       cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, cute::make_shape(M, K, 1)),\n"
            "       static_cast<ElementB const *>(a->b),\n"
            "       cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, cute::make_shape(N, K, 1))},\n"
            "      {fusion_args, nullptr,\n"
            "       cutlass::make_cute_packed_stride(typename GemmKernel::StrideC{}, mn1),\n"
            "       static_cast<ElementD *>(a->d),\n"
            "       cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, mn1)}};\n"
            "  if (a->swizzle > 1) args.scheduler.max_swizzle_size = a->swizzle;\n"
            "  if (a->raster == 1 || a->raster == 2)\n"
            "    args.scheduler.raster_order = static_cast<decltype(args.scheduler.raster_order)>(a->raster);\n"
            "  static int sm_count = 0;\n"
            "  if (sm_count == 0) sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);\n"
            "  args.hw_info.sm_count = sm_count;\n");
  /* a kernel whose launches use the workspace (stream-K's partial tiles and locks, the 'workspace' sums) keeps a
   * smaller old buffer alive: a CUDA graph captured with it may replay later (kernels without one keep the text
   * they always had, and with it their JIT cache entries) */
  evt_cutlass_emit_gemm_run(b, t->spec.cfg.stream_k || t->spec.cfg.reduction == EVT_RED_WORKSPACE, PDL_RUN);
  if (cache)
    sb_printf(b,
              "  if (ws == 0) {  // remember the initialized kernel for the next launch with these arguments\n"
              "    g_cache[g_cache_next] = gemm;\n"
              "    g_cache_key[g_cache_next] = key;\n"
              "    g_cache_used[g_cache_next] = true;\n"
              "    g_cache_next = (g_cache_next + 1) %% kLaunchCache;\n"
              "  }\n");
  sb_printf(b, "  return EVT_LAUNCH_OK;\n}\n");
}

void evt_emit_cutlass_launcher(sbuf *b, const evt_vtree *t, const topo_ops *o, const char *name, const char *hash) {
  if (t->spec.batched) emit_batched_launcher(b, t, o, name, hash);
  else emit_launcher(b, t, o, name, hash);
}
