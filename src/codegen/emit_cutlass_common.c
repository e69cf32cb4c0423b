/* What the Sm90 and Sm80 CUTLASS emitters write the same way (contract in emit_cutlass_internal.h): the order of a
 * kernel's parts, element types, the visitor tree's types and nested Arguments, and the launchers' common lines.
 * A generation's own text comes in through its cutlass_gen. */
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

/* ---- topological visitor ---------------------------------------------------------------------------------- */

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

void evt_cutlass_topo_ops(const evt_vtree *t, topo_ops *o) {
  memset(o, 0, sizeof *o);
  if (t->topo_root < 0) return;
  int seen[EVT_KSPEC_MAX_NODES] = {0};
  topo_collect(t, t->topo_root, seen, o);
}

/* ---- types ------------------------------------------------------------------------------------------------ */

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

static const char *layout_tag(int transposed) {
  return transposed ? "cutlass::layout::ColumnMajor" : "cutlass::layout::RowMajor";
}

void evt_cutlass_emit_elements(sbuf *b, const evt_kspec *s, const char *hash) {
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  sb_printf(b, "namespace evt_gen_%s {\nusing namespace cute;\n\n", hash);
  sb_printf(b, "using ElementA = %s;\nusing LayoutA = %s;  // A stored %s\n", cxx_type(s->ab_dtype), layout_tag(at),
            at ? "K x M" : "M x K");
  sb_printf(b, "using ElementB = %s;\nusing LayoutB = %s;  // B stored %s\n", cxx_type(evt_kspec_b_dtype(s)), layout_tag(bt),
            bt ? "N x K" : "K x N");
  sb_printf(b, "using ElementD = %s;\nusing LayoutD = cutlass::layout::RowMajor;\n", cxx_type(s->d_dtype));
  sb_printf(b, "using ElementAccumulator = float;\n[[maybe_unused]] constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;\n");
  sb_printf(b, "constexpr int AlignmentAB = 16 / sizeof(ElementA);\nconstexpr int AlignmentD = 16 / sizeof(ElementD);\n");
}

/* The comment after `using N<i> = ...;` naming the spec's node: op, inputs, memory, value (a rand's key is a launch
 * argument: no seed in the source). */
static void node_comment(sbuf *b, const evt_vnode *v, int i) {
  sb_printf(b, "  // %%%d = %s", i, evt_vop_name(v->op));
  for (int j = 0; j < evt_vop_arity(v->op); j++) sb_printf(b, " %%%d", v->in[j]);
  if (evt_vop_has_memory(v->op)) sb_printf(b, " %s:%s", v->name, evt_dtype_name(v->dtype));
  if (v->op == EVT_V_SCALAR) sb_printf(b, " %.17g", v->value);
  if (v->op == EVT_V_RAND) sb_printf(b, " (seed, offset: launch argument rng[%d])", i);
  sb_printf(b, "\n");
}

/* `using T<root> = <visitor>TopologicalVisitor<...>` over the region's ops (outside subtrees first). */
static void emit_topo_type(sbuf *b, const evt_vtree *t, int v, const topo_ops *o, const char *visitor) {
  sb_printf(b, "using T%d = %sTopologicalVisitor<float,\n    cute::tuple<", v, visitor);
  for (int k = 0; k < o->n; k++) {
    sb_printf(b, "%scute::seq<", k ? ", " : "");
    if (!o->subtree[k]) {
      const evt_vnode *on = &t->spec.nodes[o->node[k]];
      for (int j = 0; j < evt_vop_arity(on->op); j++) sb_printf(b, "%s%d", j ? ", " : "", evt_cutlass_topo_index(o, on->in[j]));
    }
    sb_printf(b, ">");
  }
  sb_printf(b, ">");
  for (int k = 0; k < o->n; k++) sb_printf(b, ",\n    %c%d", o->subtree[k] ? 'T' : 'N', o->node[k]);
  sb_printf(b, ">;  // topological visitor for shared values\n");
}

/* `using T<v> = ...;` for v and everything below it not yet written (children first). */
static void emit_tree_types(sbuf *b, const evt_vtree *t, int v, int *done, const topo_ops *o, const char *visitor) {
  if (done[v]) return;
  done[v] = 1;
  const evt_vnode *nd = &t->spec.nodes[v];
  if (v == t->topo_root) {
    for (int k = 0; k < o->n; k++)
      if (o->subtree[k]) emit_tree_types(b, t, o->node[k], done, o, visitor);
    emit_topo_type(b, t, v, o, visitor);
    return;
  }
  int ar = evt_vop_arity(nd->op);
  for (int j = 0; j < ar; j++) emit_tree_types(b, t, nd->in[j], done, o, visitor);
  if (ar == 0) {
    sb_printf(b, "using T%d = N%d;\n", v, v);
    return;
  }
  sb_printf(b, "using T%d = %sEVT<N%d", v, visitor, v);
  for (int j = 0; j < ar; j++) sb_printf(b, ", T%d", nd->in[j]);
  sb_printf(b, ">;\n");
}

/* The visitor nodes (bare, in id order, every node the tree uses), then the tree (children first). */
static void emit_visitor_tree(sbuf *b, const evt_vtree *t, const topo_ops *o, const cutlass_gen *g) {
  sb_printf(b, "// visitor nodes (bare)\n");
  for (int v = 0; v < t->spec.nnodes; v++)
    if (t->live[v]) {
      g->node_type(b, t, v);
      node_comment(b, &t->spec.nodes[v], v);
    }
  sb_printf(b, "%s", g->tree_heading);
  int done[EVT_KSPEC_MAX_NODES] = {0};
  emit_tree_types(b, t, t->spec.d_node, done, o, g->visitor);
}

char *evt_cutlass_emit(const evt_kspec *s, const cutlass_gen *g, char *err, size_t errlen) {
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
  g->banner(&out, s, name);
  g->types(&out, s, hash);
  topo_ops o;
  evt_cutlass_topo_ops(t, &o);
  emit_visitor_tree(&out, t, &o, g);
  g->kernel(&out, t, hash);
  g->launcher(&out, t, &o, name, hash);
  free(t);
  return out.p;
}

/* ---- launchers -------------------------------------------------------------------------------------------- */

static void indent(sbuf *b, int depth) { sb_printf(b, "%*s", 4 + 2 * depth, ""); }

void evt_emit_tree_args(sbuf *b, const evt_vtree *t, int v, const topo_ops *o, int depth, int last, evt_node_args_fn node_args) {
  const evt_vnode *nd = &t->spec.nodes[v];
  int ar = evt_vop_arity(nd->op);
  indent(b, depth);
  if (v == t->topo_root) {
    sb_printf(b, "{  // topological visitor rooted at %%%d\n", v);
    for (int k = 0; k < o->n; k++) {
      if (o->subtree[k])
        evt_emit_tree_args(b, t, o->node[k], o, depth + 1, k == o->n - 1, node_args);
      else {
        indent(b, depth + 1);
        node_args(b, t, o->node[k], k == o->n - 1);
      }
    }
    indent(b, depth);
    sb_printf(b, "}%s\n", last ? "" : ",");
    return;
  }
  if (ar == 0) {
    node_args(b, t, v, last);
    return;
  }
  sb_printf(b, "{  // %%%d %s\n", v, evt_vop_name(nd->op));
  for (int j = 0; j < ar; j++) evt_emit_tree_args(b, t, nd->in[j], o, depth + 1, 0, node_args);
  indent(b, depth + 1);
  node_args(b, t, v, 1);
  indent(b, depth);
  sb_printf(b, "}%s\n", last ? "" : ",");
}

void evt_cutlass_node_args_end(sbuf *b, const evt_vnode *nd, int v, int last) {
  int mem = evt_vop_has_memory(nd->op);
  sb_printf(b, "%s  // %%%d %s%s%s%s\n", last ? "" : ",", v, evt_vop_name(nd->op), mem ? " " : "", mem ? nd->name : "",
            nd->shared ? " (shared)" : "");
}

void evt_cutlass_emit_launcher_entry(sbuf *b, const evt_vtree *t, const char *name, const char *hash) {
  const evt_kspec *s = &t->spec;
  sb_printf(b, "extern \"C\" int %s(const evt_launch_args *a) {\n  using namespace evt_gen_%s;\n", name, hash);
  sb_printf(b, "  if (!a || !a->a || !a->b || !a->d) return EVT_LAUNCH_BAD_ARGS;\n");
  for (int v = 0; v < s->nnodes; v++)
    if (t->live[v] && evt_vop_has_memory(s->nodes[v].op))
      sb_printf(b, "  if (!a->ptrs[%d]) return EVT_LAUNCH_BAD_ARGS;  // %s\n", v, s->nodes[v].name);
}

void evt_cutlass_emit_batch_strides(sbuf *b, const evt_kspec *s) {
  int at = s->layout == EVT_LAYOUT_TN, bt = s->layout == EVT_LAYOUT_NT;
  sb_printf(b,
            "  int64_t lda = a->lda ? a->lda : %s, ldb = a->ldb ? a->ldb : %s, ldd = a->ldd ? a->ldd : N;\n"
            "  int64_t bsa = a->bs_a ? a->bs_a : %s * lda, bsb = a->bs_b ? a->bs_b : %s * ldb;\n"
            "  int64_t bsd = a->bs_d ? a->bs_d : (int64_t)M * ldd;\n",
            at ? "(int64_t)M" : "(int64_t)K", bt ? "(int64_t)K" : "(int64_t)N", at ? "(int64_t)K" : "(int64_t)M",
            bt ? "(int64_t)N" : "(int64_t)K");
}

/* bs<v> and os<v> of one node with memory; tile: an M x N aux tensor (ld<v> is set), else an N- or M-vector. */
static void emit_batch_stride(sbuf *b, const evt_kspec *s, const evt_vnode *nd, int v, int tile) {
  const char *vec = nd->op == EVT_V_ROW_BCAST || nd->op == EVT_V_ROW_SUM ? "(int64_t)N" : "(int64_t)M";
  if (nd->shared)
    sb_printf(b, "  int64_t bs%d = 0, os%d = 0;  // %s: shared by all batches\n", v, v, nd->name);
  else if (!s->batched)
    sb_printf(b, "  int64_t bs%d = %s, os%d = 0;\n", v, tile ? "(int64_t)M * N" : vec, v);
  else if (tile)
    sb_printf(b, "  int64_t bs%d = a->bs_ptrs[%d] ? a->bs_ptrs[%d] : (int64_t)M * ld%d, os%d = a->os_ptrs[%d];\n", v, v, v, v,
              v, v);
  else
    sb_printf(b, "  int64_t bs%d = a->bs_ptrs[%d] ? a->bs_ptrs[%d] : %s, os%d = a->os_ptrs[%d];\n", v, v, v, vec, v, v);
}

int evt_cutlass_emit_node_strides(sbuf *b, const evt_vtree *t) {
  const evt_kspec *s = &t->spec;
  int shared_sum = 0;
  for (int v = 0; v < s->nnodes; v++) {
    const evt_vnode *nd = &s->nodes[v];
    if (!t->live[v] || !evt_vop_has_memory(nd->op) || nd->op == EVT_V_SCALAR_LOAD) continue;
    int tile = nd->op == EVT_V_AUX_LOAD || nd->op == EVT_V_AUX_STORE;
    if (tile && s->batched) sb_printf(b, "  int64_t ld%d = a->ld_ptrs[%d] ? a->ld_ptrs[%d] : N;\n", v, v, v);
    else if (tile) sb_printf(b, "  int64_t ld%d = N;\n", v);
    emit_batch_stride(b, s, nd, v, tile);
    shared_sum |= nd->shared && evt_vop_class(nd->op) == 'S';
  }
  return shared_sum;
}

void evt_cutlass_emit_gemm_run(sbuf *b, int keep_old, const char *run_args) {
  sb_printf(b,
            "  Gemm gemm;\n"
            "  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return EVT_LAUNCH_CANNOT_IMPLEMENT;\n"
            "  size_t ws = Gemm::get_workspace_size(args);\n"
            "  if (ws > g_workspace_bytes) {\n"
            "%s"
            "    g_workspace = nullptr;\n"
            "    g_workspace_bytes = 0;\n"
            "    if (cudaMalloc(&g_workspace, ws) != cudaSuccess) return EVT_LAUNCH_WORKSPACE;\n"
            "    g_workspace_bytes = ws;\n"
            "  }\n"
            "  if (gemm.initialize(args, g_workspace, stream) != cutlass::Status::kSuccess) return EVT_LAUNCH_INIT;\n"
            "  if (gemm.run(%s) != cutlass::Status::kSuccess) return EVT_LAUNCH_RUN;\n"
            "  if (cudaPeekAtLastError() != cudaSuccess) return EVT_LAUNCH_RUN;\n",
            keep_old ? "    // (the old buffer stays allocated: a CUDA graph captured with it may still replay)\n"
                     : "    if (g_workspace) cudaFree(g_workspace);\n",
            run_args);
}
