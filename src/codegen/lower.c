/* lower.c — partition groups → kernel specs (contract in lower.h): the driver (evt_lower_plan dispatches each group
 * by its nucleus to lower_gemm.c, lower_bmm.c or lower_rows.c; the epilogue is built by lower_epilogue.c), the
 * strides of operands in memory, and the partitioner's hook with the lowering's rules. Strides of an operand look
 * through views of sources (the partitioner puts permutes/reshapes/expands of inputs and params in no group: nobody
 * materializes them), so a bias reached through `expand` is a row broadcast and a transposed input is refused as a
 * tile. */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_internal.h"
#include "evt_row_config.h"
#include "partition/partition.h"

const char *evt_lower_kind_name(evt_lower_kind k) {
  static const char *names[EVT_LK_COUNT] = {"gemm+evt", "row", "pointwise", "unfused", "conv+evt"};
  return (unsigned)k < EVT_LK_COUNT ? names[k] : "?";
}

bool evt_lower_refuse(lctx *c, int node, const char *fmt, ...) {
  if (c->bad >= 0) return false; /* keep the first reason */
  c->bad = node;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->why && c->whylen) {
    const evt_node *nd = &c->g->nodes[node];
    if (c->group)
      snprintf(c->why, c->whylen, "group %d: %%%s (%s): %s", c->gi, nd->name, evt_op_table[nd->op].name, msg);
    else snprintf(c->why, c->whylen, "%%%s (%s): %s", nd->name, evt_op_table[nd->op].name, msg);
  }
  return false;
}

bool evt_lower_mem_strides(const evt_graph *g, const int *group, int through, int x, int64_t *st, int *base) {
  const evt_node *nd = &g->nodes[x];
  int r = nd->type.rank;
  bool look = is_view_op(nd->op) && (group ? group[x] == through || (group[x] < 0 && source_view(g, x))
                                            : through == -1 && source_view(g, x));
  if (!look) {
    *base = x;
    for (int i = 0; i < r; i++) st[i] = nd->type.stride[i];
    return true;
  }
  int in = nd->inputs[0];
  const evt_type *it = &g->nodes[in].type;
  int64_t ist[EVT_MAX_RANK];
  if (!evt_lower_mem_strides(g, group, through, in, ist, base)) return false;
  switch (nd->op) {
  case EVT_OP_PERMUTE:
    for (int i = 0; i < r; i++) st[i] = ist[nd->attr.dims.v[i] < 0 ? nd->attr.dims.v[i] + r : nd->attr.dims.v[i]];
    return true;
  case EVT_OP_TRANSPOSE: {
    for (int i = 0; i < r; i++) st[i] = ist[i];
    int64_t a = nd->attr.dims.v[0], b = nd->attr.dims.v[1];
    if (a < 0) a += r;
    if (b < 0) b += r;
    int64_t t = st[a];
    st[a] = st[b];
    st[b] = t;
    return true;
  }
  case EVT_OP_EXPAND:
    for (int i = 0; i < r; i++) {
      int j = i - (r - it->rank);
      st[i] = (j < 0 || it->shape[j] != nd->type.shape[i] || it->shape[j] == 1) ? 0 : ist[j];
    }
    return true;
  default: { /* reshape / squeeze / unsqueeze: carry strides if only unit dims move, else need contiguity */
    int i = 0, j = 0;
    bool same = true;
    for (;;) {
      while (i < it->rank && it->shape[i] == 1) i++;
      while (j < r && nd->type.shape[j] == 1) j++;
      if (i == it->rank || j == r) {
        same = i == it->rank && j == r;
        break;
      }
      if (it->shape[i] != nd->type.shape[j]) {
        same = false;
        break;
      }
      i++, j++;
    }
    if (same) {
      i = 0;
      for (j = 0; j < r; j++) {
        if (nd->type.shape[j] == 1) {
          st[j] = 0;
          continue;
        }
        while (it->shape[i] == 1) i++;
        st[j] = ist[i++];
      }
      return true;
    }
    int64_t want = 1;
    for (int d = it->rank - 1; d >= 0; d--) {
      if (it->shape[d] != 1 && ist[d] != want) return false;
      want *= it->shape[d];
    }
    want = 1;
    for (int d = r - 1; d >= 0; d--) st[d] = want, want *= nd->type.shape[d];
    return true;
  }
  }
}

/* A group of a single library op (pool, embedding, sdpa, conv wgrad, ...: no NUCLEUS flag): its node, or -1. */
static int singleton(const evt_graph *g, const evt_part_plan *plan, int gi) {
  for (int v = 0; v < g->nnodes; v++) {
    if (plan->group[v] != gi) continue;
    unsigned f = evt_part_op_flags(g, v);
    if ((f & EVT_PN_CUT_IN) && (f & EVT_PN_CUT_OUT)) return v;
  }
  return -1;
}

/* L for a group no kernel spec takes: a library singleton or a nucleus without a spec (conv, SpMM). */
static void lower_unfused(const evt_graph *g, int gi, int single, int nu, evt_lowered *L) {
  L->kind = EVT_LK_UNFUSED;
  if (single >= 0) {
    L->bad_node = single;
    evt_op sop = g->nodes[single].op;
    evt_dtype sdt = g->nodes[single].type.dtype;
    bool attn = evt_op_table[sop].cls == EVT_CLASS_ATTENTION;
    snprintf(L->reason, sizeof L->reason, "group %d: %%%s (%s): a library kernel of its own%s; no kernel spec", gi,
             g->nodes[single].name, evt_op_table[sop].name,
             !attn ? "" : sdt == EVT_BF16 || sdt == EVT_F16 ? " (on CUDA: cuDNN's fused flash attention)"
                                                           : " (on CUDA: the reference kernel; cuDNN takes bf16/f16)");
  } else {
    evt_op_class cls = evt_op_table[g->nodes[nu].op].cls;
    L->bad_node = nu;
    snprintf(L->reason, sizeof L->reason, "group %d: %%%s (%s): no kernel spec for a %s nucleus", gi, g->nodes[nu].name,
             evt_op_table[g->nodes[nu].op].name, evt_op_class_names[cls]);
  }
}

evt_status evt_lower_plan(const evt_graph *g, const evt_part_plan *plan, evt_lower_result *out) {
  return evt_lower_plan_flags(g, plan, 0, out);
}

unsigned evt_lower_flags(const evt_options *o) { return o && o->tf32 ? EVT_LOWER_TF32 : 0; }

evt_status evt_lower_plan_flags(const evt_graph *g, const evt_part_plan *plan, unsigned flags, evt_lower_result *out) {
  memset(out, 0, sizeof *out);
  if (!plan || !plan->group || plan->ngroups < 0) return EVT_ERR_INVALID;
  int n = g->nnodes;
  out->n = plan->ngroups;
  out->k = calloc((size_t)plan->ngroups + 1, sizeof *out->k);
  int *vid = malloc(((size_t)n + 1) * sizeof *vid);
  EVT_ASSERT(out->k && vid);
  for (int gi = 0; gi < plan->ngroups; gi++) {
    evt_lowered *L = &out->k[gi];
    L->group = gi;
    L->nucleus = plan->nucleus[gi];
    L->bad_node = -1;
    L->a_node = L->b_node = L->d_tensor = -1;
    L->rin[0] = L->rin[1] = L->rin[2] = L->rin[3] = -1;
    for (int i = 0; i < EVT_KSPEC_MAX_NODES; i++) L->vtensor[i] = -1;
    for (int v = 0; v < n; v++) vid[v] = -1;
    int nu = L->nucleus;
    if (nu >= n) {
      free(vid);
      return EVT_ERR_INVALID;
    }
    int single = singleton(g, plan, gi);
    evt_op_class cls = nu >= 0 ? evt_op_table[g->nodes[nu].op].cls : EVT_CLASS_COUNT;
    if (single >= 0 && g->nodes[single].op == EVT_OP_CONV2D_BACKWARD_WEIGHT) {
      L->nucleus = single; /* wgrad: a library singleton to the partitioner, a GEMM-shaped conv kernel here */
      evt_lower_conv(g, plan->group, gi, single, L, vid);
    } else if (single >= 0) {
      lower_unfused(g, gi, single, nu, L);
    } else if (nu >= 0 && cls == EVT_CLASS_GEMM) {
      evt_lower_gemm(g, plan->group, gi, nu, flags, L, vid);
    } else if (nu >= 0 && (g->nodes[nu].op == EVT_OP_CONV2D || g->nodes[nu].op == EVT_OP_CONV2D_BACKWARD_INPUT)) {
      evt_lower_conv(g, plan->group, gi, nu, L, vid);
    } else if (nu < 0 || cls == EVT_CLASS_ROW || cls == EVT_CLASS_SPARSE) {
      evt_lower_rows(g, plan->group, gi, nu, L, vid);
    } else {
      lower_unfused(g, gi, -1, nu, L);
    }
    out->count[L->kind]++;
    out->lowered += L->ok;
  }
  free(vid);
  return EVT_OK;
}

int evt_lowered_alias_base(const evt_lowered *L, int v) {
  for (int i = 0; L && i < L->nalias; i++)
    if (L->alias_view[i] == v) return L->alias_base[i];
  return -1;
}

void evt_lower_free(evt_lower_result *r) {
  free(r->k);
  r->k = NULL;
  r->n = 0;
}

/* Every f32 tensor becomes `dt`: source types, cast/one_hot targets and mm out_dtype, then types are re-inferred. */
evt_status evt_lower_retype(evt_graph *g, evt_dtype dt) {
  for (int i = 0; i < g->nnodes; i++) {
    evt_node *n = &g->nodes[i];
    bool typed = evt_op_table[n->op].flags & EVT_OPF_TYPED;
    bool has_dtype = (evt_op_table[n->op].attrs >> EVT_ATTR_DTYPE) & 1u;
    if ((typed || has_dtype) && n->attr.dtype == EVT_F32 && (typed ? n->type.dtype == EVT_F32 : true))
      n->attr.dtype = dt;
    if (n->op == EVT_OP_CAST && n->attr.dtype == EVT_F32) n->attr.dtype = dt;
    if (n->attr.out_dtype == EVT_F32) n->attr.out_dtype = dt; /* mm's f32 output too (infer drops it as the default) */
    evt_status st = evt_infer_node(g, n, i);
    if (st != EVT_OK) return st;
  }
  return EVT_OK;
}

/* A sum (or mean) over the leading dims of a tensor whose rows are longer than a register-resident row kernel takes:
 * in a row nucleus's group it would be a Σ-over-M row sum, which the long-row kernel has none of (the group would
 * run node by node); on its own it runs as the fallback's column reduction while the nucleus keeps its kernel. */
static bool long_row_sum_over_m(const evt_graph *eg, int nucleus, int member) {
  const evt_node *nn = &eg->nodes[nucleus], *m = &eg->nodes[member];
  if (nn->op != EVT_OP_SOFTMAX && nn->op != EVT_OP_SOFTMAX_BACKWARD && nn->op != EVT_OP_LAYER_NORM &&
      nn->op != EVT_OP_LAYER_NORM_BACKWARD_INPUT)
    return false;
  if (nn->type.rank < 1 || nn->type.shape[nn->type.rank - 1] <= EVT_ROW_MAX_N) return false;
  if ((m->op != EVT_OP_SUM && m->op != EVT_OP_MEAN) || m->ninputs < 1) return false;
  const evt_type *xt = &eg->nodes[m->inputs[0]].type;
  if (xt->rank < 2) return false;
  if (m->attr.dims.n == 0) return true; /* every dim: the M dims too */
  for (int i = 0; i < m->attr.dims.n; i++) {
    int d = (int)(m->attr.dims.v[i] < 0 ? m->attr.dims.v[i] + xt->rank : m->attr.dims.v[i]);
    if (d < xt->rank - 1 && xt->shape[d] > 1) return true;
  }
  return false;
}

static bool member_fuses(const evt_pgraph *g, int nucleus, int member, bool tf32);

static bool compat(const evt_pgraph *g, int nucleus, int member, bool tf32) {
  if (!evt_part_compat_evt(g, nucleus, member)) return false;
  const evt_graph *eg = g->src;
  if (!eg || member == nucleus) return true;
  if (long_row_sum_over_m(eg, nucleus, member)) return false;
  const evt_node *nn = &eg->nodes[nucleus];
  bool bmm = nn->op == EVT_OP_BMM && nn->type.rank >= 3;
  if (nn->op == EVT_OP_CONV2D || nn->op == EVT_OP_CONV2D_BACKWARD_INPUT) { /* one that cannot lower gains nothing */
    evt_conv_geom geo;
    char why[160];
    return !evt_lower_conv_geometry(eg, nucleus, &geo, why, sizeof why) || member_fuses(g, nucleus, member, tf32);
  }
  if (nn->op != EVT_OP_MM && nn->op != EVT_OP_ADDMM && !bmm) return true;
  /* a GEMM that cannot lower anyway (operand dtypes, alignment) gains nothing from smaller groups */
  int ai = nn->op == EVT_OP_ADDMM ? 1 : 0, md = bmm ? nn->type.rank - 2 : 0;
  const evt_type *ta = &eg->nodes[nn->inputs[ai]].type, *tb = &eg->nodes[nn->inputs[ai + 1]].type;
  bool ab16 = ta->dtype == tb->dtype && (ta->dtype == EVT_BF16 || ta->dtype == EVT_F16);
  bool ab8 = !bmm && evt_dtype_is_fp8(ta->dtype) && evt_dtype_is_fp8(tb->dtype);
  bool ab32 = tf32 && ta->dtype == EVT_F32 && tb->dtype == EVT_F32;
  int64_t m = nn->type.shape[md], n = nn->type.shape[md + 1], k = ta->shape[md + 1];
  bool dims = bmm ? m % 8 == 0 && n % 8 == 0 && k % 8 == 0
            : ab8 ? n % 8 == 0 && k % 16 == 0
                  : evt_lower_gemm_dims_ok(m, n, k, evt_lower_transposed_operand(eg, nn->inputs[ai]),
                                           evt_lower_transposed_operand(eg, nn->inputs[ai + 1]));
  if (!(ab16 || ab8 || ab32) || !dims) return true;
  return member_fuses(g, nucleus, member, tf32);
}

/* The epilogue rule for a member of a nucleus that can lower: evt_lower_can_fuse (a view is judged as its producer). */
static bool member_fuses(const evt_pgraph *g, int nucleus, int member, bool tf32) {
  const evt_graph *eg = g->src;
  const evt_node *m = &eg->nodes[member];
  if ((g->nodes[member].flags & EVT_PN_VIEW) && m->ninputs == 1 && evt_pgraph_kernel(g, m->inputs[0]))
    return compat(g, nucleus, m->inputs[0], tf32); /* a view is its producer's tensor */
  return evt_lower_can_fuse(eg, nucleus, member, NULL, 0);
}

bool evt_lower_compat(const evt_pgraph *g, int nucleus, int member) { return compat(g, nucleus, member, false); }
bool evt_lower_compat_tf32(const evt_pgraph *g, int nucleus, int member) { return compat(g, nucleus, member, true); }

bool (*evt_lower_compat_for(unsigned flags))(const evt_pgraph *, int, int) {
  return flags & EVT_LOWER_TF32 ? evt_lower_compat_tf32 : evt_lower_compat;
}

evt_status evt_lower_partition(evt_graph *eg, const evt_part_options *opt, double lambda, evt_part_plan *plan) {
  return evt_part_plan_build_compat(eg, opt, lambda, evt_lower_compat, plan);
}

evt_status evt_lower_partition_flags(evt_graph *eg, const evt_part_options *opt, double lambda, unsigned flags,
                                     evt_part_plan *plan) {
  return evt_part_plan_build_compat(eg, opt, lambda, evt_lower_compat_for(flags), plan);
}

void evt_lower_print(const evt_graph *g, const evt_lower_result *r, FILE *out) {
  static const char *lay[] = {"NN", "NT", "TN"};
  for (int i = 0; i < r->n; i++) {
    const evt_lowered *L = &r->k[i];
    if (L->ok && L->kind == EVT_LK_GEMM_EVT)
      fprintf(out, "group %d %s %s: %%%s %s %s%s%s->%s M=%lld N=%lld K=%lld, %d visitor nodes\n", i,
              evt_lower_kind_name(L->kind), L->kernel, g->nodes[L->nucleus].name, lay[L->spec.layout],
              evt_dtype_name(L->spec.ab_dtype), L->spec.b_mixed ? "x" : "",
              L->spec.b_mixed ? evt_dtype_name(L->spec.b_dtype) : "", evt_dtype_name(L->spec.d_dtype), (long long)L->m,
              (long long)L->n, (long long)L->k, L->spec.nnodes);
    if (L->ok && L->kind == EVT_LK_CONV_EVT)
      fprintf(out, "group %d %s %s: %%%s %s NHWC %s->%s M=%lld N=%lld K=%lld (%dx%d stride %dx%d pad %dx%d), %d visitor nodes\n",
              i, evt_lower_kind_name(L->kind), L->kernel, g->nodes[L->nucleus].name,
              evt_conv_kind_name(L->spec.conv.kind), evt_dtype_name(L->spec.ab_dtype),
              evt_dtype_name(L->spec.d_dtype), (long long)L->m, (long long)L->n, (long long)L->k, L->spec.conv.kh,
              L->spec.conv.kw, L->spec.conv.stride_h, L->spec.conv.stride_w, L->spec.conv.pad_h, L->spec.conv.pad_w,
              L->spec.nnodes);
    else if (L->ok && L->kind == EVT_LK_GEMM_EVT && L->spec.batched)
      fprintf(out,
              "  batched: %d x %d (outer launches x batches per launch), lda %lld ldb %lld ldd %lld, batch strides "
              "A %lld B %lld D %lld, outer A %lld B %lld D %lld\n",
              L->l_outer, L->l, (long long)L->lda, (long long)L->ldb, (long long)L->ldd, (long long)L->bs_a,
              (long long)L->bs_b, (long long)L->bs_d, (long long)L->os_a, (long long)L->os_b, (long long)L->os_d);
    else if (L->ok)
      fprintf(out, "group %d %s %s: %s%s%s M=%lld N=%lld, %d nodes\n", i, evt_lower_kind_name(L->kind), L->kernel,
              L->nucleus >= 0 ? "%" : "", L->nucleus >= 0 ? g->nodes[L->nucleus].name : "nucleus-free",
              L->nucleus >= 0 ? "" : "", (long long)L->m, (long long)L->n, L->rspec.nnodes);
    else fprintf(out, "group %d %s: %s\n", i, evt_lower_kind_name(L->kind), L->reason);
  }
}
