/* Losses (nll, cross entropy, bce with logits, mse; their backwards), gathers and scatters by index (one_hot,
 * embedding, index_select; their backwards) and CSR spmm. Every kernel that reads an index checks it: an index
 * out of range (or a CSR row pointer not monotone) skips the element and sets the run-time index-error flag, a
 * device variable of this file only (kernels of other files cannot see it: the library is built without
 * relocatable device code), which fb_take_bad_node reads. */
#include "internal.h"

__device__ int g_bad_node; /* 0, or node id + 1 of the first run-time index error */

static __device__ void flag_bad(int node) { atomicCAS(&g_bad_node, 0, node + 1); }

/* index value v in [0, limit) and integral, else flags the node and returns -1 */
static __device__ __forceinline__ ll as_index(double v, ll limit, int node) {
  if (!(v >= 0 && v < (double)limit) || v != floor(v)) {
    flag_bad(node);
    return -1;
  }
  return (ll)v;
}

/* The flag's device address, for generated kernels that check indices (the spmm row kernels: evt_row_launch.h csr) */
extern "C" int evt_fb_index_flag(int **flag, char *err, size_t errlen) {
  CK(cudaGetSymbolAddress((void **)flag, g_bad_node));
  return 0;
}

int fb_take_bad_node(int *bad_plus_one, char *err, size_t errlen) {
  int b = 0;
  CK(cudaMemcpyFromSymbol(&b, g_bad_node, sizeof b));
  *bad_plus_one = b;
  if (b) {
    int zero = 0;
    CK(cudaMemcpyToSymbol(g_bad_node, &zero, sizeof zero));
  }
  return 0;
}

/* ---- losses ---------------------------------------------------------------------------------------- */

/* Class losses, per (n, i) position: term and counted flag into T[2*k], T[2*k+1]. */
__global__ void k_class_terms(double *T, int op, ll ignore, tv x, tv t, int soft, ll N, ll C, ll inner, int node) {
  GRID_FOR(k, N * inner) {
    ll n = k / inner, i = k % inner;
    ll rb = n * C * inner + i;
    double lse = 0;
    if (op == EVT_FB_OP_CROSS_ENTROPY) {
      double mx = -INFINITY, s = 0;
      for (ll c = 0; c < C; c++) {
        double v = ld(x.p, x.dt, rb + c * inner);
        if (isnan(v) || v > mx) mx = isnan(mx) ? mx : v;
      }
      for (ll c = 0; c < C; c++) s += exp(ld(x.p, x.dt, rb + c * inner) - mx);
      lse = mx + log(s);
    }
    if (soft) {
      double s = 0;
      for (ll c = 0; c < C; c++) s -= ld(t.p, t.dt, rb + c * inner) * (ld(x.p, x.dt, rb + c * inner) - lse);
      T[2 * k] = s;
      T[2 * k + 1] = 1;
      continue;
    }
    double tv_ = ld(t.p, t.dt, k);
    if (tv_ == (double)ignore) {
      T[2 * k] = 0;
      T[2 * k + 1] = 0;
      continue;
    }
    ll c = as_index(tv_, C, node);
    if (c < 0) {
      T[2 * k] = NAN;
      T[2 * k + 1] = 0;
      continue;
    }
    T[2 * k] = -(ld(x.p, x.dt, rb + c * inner) - lse);
    T[2 * k + 1] = 1;
  }
}

/* One thread: sums the terms in order (reduction mean/sum) into S[0], or copies them (none). Also used
 * by the backward op to get the counted total into *counted. */
__global__ void k_class_reduce(double *S, const double *T, ll m, int reduction, double *counted) {
  if (blockIdx.x || threadIdx.x) return;
  double s = 0, c = 0;
  for (ll k = 0; k < m; k++) {
    if (reduction == 0 && S) S[k] = T[2 * k];
    s += T[2 * k];
    c += T[2 * k + 1];
  }
  if (S && reduction != 0) S[0] = reduction == 1 ? s / c : s;
  if (counted) *counted = c;
}

__global__ void k_nll_backward(double *S, const double *counted, ll ignore, int reduction, tv dy, tv t, ll N, ll C,
                               ll inner) {
  GRID_FOR(k, N * inner) {
    ll n = k / inner, i = k % inner;
    double tv_ = ld(t.p, t.dt, k);
    if (tv_ == (double)ignore) continue;
    ll c = (ll)tv_;
    if (c < 0 || c >= C) continue; /* flagged by k_class_terms */
    double d = reduction == 0 ? ld(dy.p, dy.dt, k) : reduction == 1 ? ld(dy.p, dy.dt, 0) / *counted : ld(dy.p, dy.dt, 0);
    S[(n * C + c) * inner + i] = -d;
  }
}

__global__ void k_pointwise_loss(double *T, int bce, tv x, tv y, ll m) {
  GRID_FOR(i, m) {
    double xv = ld(x.p, x.dt, i), yv = ld(y.p, y.dt, i);
    T[2 * i] = bce ? fmax(xv, 0.0) - xv * yv + log1p(exp(-fabs(xv))) : (xv - yv) * (xv - yv);
    T[2 * i + 1] = 1;
  }
}

__global__ void k_pointwise_loss_bwd(double *S, int bce, int reduction, tv dy, tv x, tv y, ll m) {
  GRID_FOR(i, m) {
    double xv = ld(x.p, x.dt, i), yv = ld(y.p, y.dt, i);
    double d = reduction == 0 ? ld(dy.p, dy.dt, i) : reduction == 1 ? ld(dy.p, dy.dt, 0) / (double)m : ld(dy.p, dy.dt, 0);
    double sig = xv >= 0 ? 1.0 / (1.0 + exp(-xv)) : exp(xv) / (1.0 + exp(xv));
    S[i] = bce ? (sig - yv) * d : 2.0 * (xv - yv) * d;
  }
}

/* ---- gathers / scatters ---------------------------------------------------------------------------- */

__global__ void k_one_hot(double *S, tv idx, ll n, ll C, int node) {
  GRID_FOR(i, n) {
    ll c = as_index(ld(idx.p, idx.dt, i), C, node);
    if (c >= 0) S[i * C + c] = 1;
  }
}

/* index_select over (outer, len, inner) with n indices; embedding is outer=1, dim 0. fwd gathers,
 * bwd scatter-adds. */
__global__ void k_index_select(double *S, int fwd, tv src, tv idx, ll outer, ll len, ll inner, ll n, int node) {
  GRID_FOR(e, outer * n * inner) {
    ll i = e % inner, j = (e / inner) % n, o = e / (inner * n);
    ll r = as_index(ld(idx.p, idx.dt, j), len, node);
    if (r < 0) continue;
    ll f = (o * len + r) * inner + i;
    if (fwd) S[e] = ld(src.p, src.dt, f);
    else atomicAdd(&S[f], ld(src.p, src.dt, e));
  }
}

/* the gather in the tensors' own dtype (internal.h); an index out of range writes zero (the double path leaves
 * its zeroed scratch) and sets the error flag */
template <class T>
__global__ void k_move_index(T *out, const T *src, tv idx, ll outer, ll len, ll inner, ll n, int node) {
  GRID_FOR(e, outer * n * inner) {
    ll i = e % inner, j = (e / inner) % n, o = e / (inner * n);
    ll r = as_index(ld(idx.p, idx.dt, j), len, node);
    out[e] = r < 0 ? T(0) : src[(o * len + r) * inner + i];
  }
}

/* ---- CSR spmm -------------------------------------------------------------------------------------- */

__global__ void k_csr_check(tv rowptr, tv col, ll M, ll nnz, ll K, int node) {
  GRID_FOR(i, M + 1 > nnz ? M + 1 : nnz) {
    if (i <= M) {
      ll r = as_index(ld(rowptr.p, rowptr.dt, i), nnz + 1, node);
      if (r >= 0 && i > 0 && r < ld(rowptr.p, rowptr.dt, i - 1)) flag_bad(node);
      if (i == 0 && r < 0) flag_bad(node);
    }
    if (i < nnz) as_index(ld(col.p, col.dt, i), K, node);
  }
}

__global__ void k_spmm(double *S, int transposed, tv rowptr, tv col, tv val, tv x, ll M, ll N, ll K, ll nnz) {
  GRID_FOR(e, M * N) {
    ll i = e / N, j = e % N;
    double p0 = ld(rowptr.p, rowptr.dt, i), p1 = ld(rowptr.p, rowptr.dt, i + 1);
    if (!(p0 >= 0 && p1 <= (double)nnz)) continue;
    double acc = 0;
    for (ll p = (ll)p0; p < (ll)p1; p++) {
      double cv = ld(col.p, col.dt, p);
      if (!(cv >= 0 && cv < (double)K)) continue;
      ll c = (ll)cv;
      double v = ld(val.p, val.dt, p);
      if (!transposed) acc += v * ld(x.p, x.dt, c * N + j);
      else atomicAdd(&S[c * N + j], v * ld(x.p, x.dt, i * N + j));
    }
    if (!transposed) S[e] = acc;
  }
}

/* ---- host side -------------------------------------------------------------------------------------- */

int fb_class_loss(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_attrs &a = nd->a;
  int op = nd->op;
  bool bwd = op == EVT_FB_OP_NLL_LOSS_BACKWARD;
  const evt_fb_tensor &x = nd->in[bwd ? 1 : 0], &t = nd->in[bwd ? 2 : 1];
  bool soft = op == EVT_FB_OP_CROSS_ENTROPY && is_float_dtype(t.dtype);
  ll N, C, inner;
  if (x.rank == 1) { N = 1; C = x.shape[0]; inner = 1; }
  else if (x.rank >= 2) { N = x.shape[0]; C = x.shape[1]; inner = prod(x.shape, 2, x.rank); }
  else UNSUPPORTED("the input needs a class dimension");
  ll m = N * inner;
  double *T = ctx->s2, *counted = ctx->s2 + 2 * m;
  k_class_terms<<<blocks(m), 256, 0, ST>>>(T, bwd ? EVT_FB_OP_NLL_LOSS : op, a.ignore_index, view(x), view(t), soft, N,
                                           C, inner, nd->id);
  if (!bwd) {
    k_class_reduce<<<1, 1, 0, ST>>>(S, T, m, a.reduction, NULL);
  } else {
    k_class_reduce<<<1, 1, 0, ST>>>(NULL, T, m, a.reduction, counted);
    k_nll_backward<<<blocks(m), 256, 0, ST>>>(S, counted, a.ignore_index, a.reduction, view(nd->in[0]), view(t), N, C,
                                              inner);
  }
  return 0;
}

int fb_pointwise_loss(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor *in = nd->in;
  int op = nd->op;
  if (op == EVT_FB_OP_BCE_WITH_LOGITS_BACKWARD || op == EVT_FB_OP_MSE_LOSS_BACKWARD) {
    ll n = nd->out.numel;
    k_pointwise_loss_bwd<<<blocks(n), 256, 0, ST>>>(S, op == EVT_FB_OP_BCE_WITH_LOGITS_BACKWARD, nd->a.reduction,
                                                    view(in[0]), view(in[1]), view(in[2]), n);
    return 0;
  }
  ll m = in[0].numel;
  k_pointwise_loss<<<blocks(m), 256, 0, ST>>>(ctx->s2, op == EVT_FB_OP_BCE_WITH_LOGITS, view(in[0]), view(in[1]), m);
  k_class_reduce<<<1, 1, 0, ST>>>(S, ctx->s2, m, nd->a.reduction, NULL); /* every term counts: mean divides by m */
  return 0;
}

int fb_gather(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out, *in = nd->in;
  int op = nd->op;
  if (op == EVT_FB_OP_ONE_HOT) {
    ll C = out.rank ? out.shape[out.rank - 1] : 0;
    k_one_hot<<<blocks(in[0].numel), 256, 0, ST>>>(S, view(in[0]), in[0].numel, C, nd->id);
    return 0;
  }
  bool fwd = op == EVT_FB_OP_EMBEDDING || op == EVT_FB_OP_INDEX_SELECT;
  const evt_fb_tensor &full = fwd ? in[0] : out, &idx = in[1];
  ll outer, len, inner;
  if (op == EVT_FB_OP_EMBEDDING || op == EVT_FB_OP_EMBEDDING_BACKWARD) {
    if (full.rank != 2) UNSUPPORTED("the embedding table must be [V, D]");
    outer = 1, len = full.shape[0], inner = full.shape[1];
  } else {
    int d = normdim(nd->a.dim, full.rank);
    if (d < 0) UNSUPPORTED("dim out of range");
    outer = prod(full.shape, 0, d), len = full.shape[d], inner = prod(full.shape, d + 1, full.rank);
  }
  k_index_select<<<blocks(outer * idx.numel * inner), 256, 0, ST>>>(S, fwd, view(in[0]), view(idx), outer, len, inner,
                                                                    idx.numel, nd->id);
  return 0;
}

int fb_gather_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out, &src = nd->in[0], &idx = nd->in[1];
  int op = nd->op;
  if (op != EVT_FB_OP_EMBEDDING && op != EVT_FB_OP_INDEX_SELECT) return -1;
  int bytes = fb_move_bytes(nd, 1);
  if (!bytes) return -1;
  ll n = out.numel;
  if (n == 0) return 0;
  if (nd->ninputs < 2) return -1;
  ll outer, len, inner;
  if (op == EVT_FB_OP_EMBEDDING) {
    if (src.rank != 2) return -1;
    outer = 1, len = src.shape[0], inner = src.shape[1];
  } else {
    int d = normdim(nd->a.dim, src.rank);
    if (d < 0) return -1;
    outer = prod(src.shape, 0, d), len = src.shape[d], inner = prod(src.shape, d + 1, src.rank);
  }
  if (outer * idx.numel * inner != n) return -1;
  MOVE_DISPATCH(bytes, k_move_index, blocks(n), out.ptr, src.ptr, view(idx), outer, len, inner, idx.numel, nd->id);
  CK(cudaGetLastError());
  return 0;
}

int fb_spmm(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out, *in = nd->in;
  bool tr = nd->op == EVT_FB_OP_SPMM_T;
  const evt_fb_tensor &x = in[3];
  if (x.rank != 2 || out.rank != 2 || in[0].rank != 1 || in[1].numel != in[2].numel)
    UNSUPPORTED("expects rowptr[M+1], col[nnz], val[nnz] and a rank-2 dense operand");
  ll M = in[0].numel - 1, N = x.shape[1], nnz = in[1].numel, K = tr ? out.shape[0] : x.shape[0];
  if (M < 0 || (tr ? x.shape[0] : out.shape[0]) != M || out.shape[1] != N)
    UNSUPPORTED("rowptr does not match the dense shapes");
  k_csr_check<<<blocks(M + 1 > nnz ? M + 1 : nnz), 256, 0, ST>>>(view(in[0]), view(in[1]), M, nnz, K, nd->id);
  k_spmm<<<blocks(M * N), 256, 0, ST>>>(S, tr, view(in[0]), view(in[1]), view(in[2]), view(x), M, N, K, nnz);
  return 0;
}
