/* Layout ops: reshape, squeeze, unsqueeze, permute, transpose, expand, slice and its gradient, concat. In the
 * output's dtype when the data operands have it (fb_layout_native), else through the double scratch. */
#include "internal.h"

/* ---- double path ------------------------------------------------------------------------------------ */

/* S[e] = x[base + strided(e)] (gather); or S[base + strided(e)] = x[e] (scatter, distinct targets) */
__global__ void k_strided(double *S, tv x, ll n, shape_t sh, strides stv, ll base, int scatter) {
  GRID_FOR(e, n) {
    ll o = base + strided_off(e, sh, stv);
    if (scatter) S[o] = ld(x.p, x.dt, e);
    else S[e] = ld(x.p, x.dt, o);
  }
}

__global__ void k_concat_part(double *S, tv x, ll outer, ll chunk, ll row, ll at) {
  GRID_FOR(e, outer * chunk) {
    ll o = e / chunk, c = e % chunk;
    S[o * row + at + c] = ld(x.p, x.dt, e);
  }
}

/* ---- native path (see internal.h) -------------------------------------------------------------------------- */

template <class T>
__global__ void k_move_gather(T *out, const T *x, ll n, shape_t sh, strides stv, ll base) {
  GRID_FOR(e, n) out[e] = x[base + strided_off(e, sh, stv)];
}

template <class T>
__global__ void k_move_scatter(T *out, const T *x, ll n, shape_t sh, strides stv, ll base) {
  GRID_FOR(e, n) out[base + strided_off(e, sh, stv)] = x[e];
}

template <class T>
__global__ void k_move_concat(T *out, const T *x, ll outer, ll chunk, ll row, ll at) {
  GRID_FOR(e, outer * chunk) out[(e / chunk) * row + at + e % chunk] = x[e];
}

/* out[b][x][y] = in[b][y][x] for in [nb, Y, X]: a batched transpose through a 32 x 33 shared tile, so that
 * reads and writes are both coalesced (the strided gather reads one element per 32-byte sector when the
 * innermost dim moves). Blocks of 32 x 8 threads; grid (ceil(X/32), ceil(Y/32), nb). */
template <class T>
__global__ void k_move_transpose(T *out, const T *in, ll Y, ll X) {
  __shared__ T tile[32][33];
  ll b = blockIdx.z, x0 = (ll)blockIdx.x * 32, y0 = (ll)blockIdx.y * 32;
  const T *src = in + b * Y * X;
  T *dst = out + b * Y * X;
  for (int j = threadIdx.y; j < 32; j += 8) {
    ll y = y0 + j, x = x0 + threadIdx.x;
    if (y < Y && x < X) tile[j][threadIdx.x] = src[y * X + x];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    ll x = x0 + j, y = y0 + threadIdx.x;
    if (x < X && y < Y) dst[x * Y + y] = tile[threadIdx.x][j];
  }
}

/* ---- plans shared by both paths ------------------------------------------------------------------------ */

/* A permute / transpose node: its permutation (out dim d reads input dim perm[d]) and the gather strides of
 * its input at the output's shape. Returns NULL, or why the node is malformed. */
static const char *permute_plan(const evt_fb_node *nd, int *perm, strides *s1) {
  const evt_fb_tensor &x = nd->in[0], &out = nd->out;
  const evt_fb_attrs &a = nd->a;
  for (int d = 0; d < x.rank; d++) perm[d] = d;
  if (nd->op == EVT_FB_OP_PERMUTE) {
    if (a.ndims != x.rank) return "permute needs one dim per input dim";
    for (int d = 0; d < x.rank; d++) perm[d] = normdim(a.dims[d], x.rank);
  } else if (x.rank > 0) {
    int p0 = a.ndims == 2 ? normdim(a.dims[0], x.rank) : -1, p1 = a.ndims == 2 ? normdim(a.dims[1], x.rank) : -1;
    if (p0 < 0 || p1 < 0) return "transpose needs dims=[a,b]";
    perm[p0] = p1;
    perm[p1] = p0;
  }
  ll xs[R];
  contig(x, xs);
  memset(s1, 0, sizeof *s1);
  for (int d = 0; d < x.rank; d++) {
    if (perm[d] < 0 || out.shape[d] != x.shape[perm[d]]) return "bad permutation";
    s1->s[d] = xs[perm[d]];
  }
  return NULL;
}

/* A slice / slice_backward node: the strides and base offset of the part (the slice) within the full tensor
 * (contiguous), indexed row-major over the part's shape. Returns NULL, or why the node is malformed. */
static const char *slice_plan(const evt_fb_node *nd, strides *s1, ll *base) {
  bool fwd = nd->op == EVT_FB_OP_SLICE;
  const evt_fb_tensor &full = fwd ? nd->in[0] : nd->out, &part = fwd ? nd->out : nd->in[0];
  const evt_fb_attrs &a = nd->a;
  int d = normdim(a.dim, full.rank);
  if (d < 0 || part.rank != full.rank || a.step < 1) return "bad slice dim or step";
  ll fs[R];
  contig(full, fs);
  ll size = full.shape[d];
  ll s0 = a.start < 0 ? a.start + size : a.start;
  s0 = s0 < 0 ? 0 : s0 > size ? size : s0;
  memset(s1, 0, sizeof *s1);
  for (int k = 0; k < full.rank; k++) s1->s[k] = k == d ? fs[k] * a.step : fs[k];
  *base = s0 * fs[d];
  return NULL;
}

/* ---- native path, host side ------------------------------------------------------------------------------ */

int fb_move_bytes(const evt_fb_node *nd, int ndata) {
  const evt_fb_tensor &out = nd->out;
  if (nd->ninputs < 1) return 0;
  for (int k = 0; k < ndata; k++)
    if (nd->in[k].dtype != out.dtype) return 0;
  int bytes = evt_fb_dtype_bytes(out.dtype);
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) return 0;
  if (out.numel == 0) return bytes;
  const char *ob = static_cast<const char *>(out.ptr), *oe = ob + (size_t)out.numel * bytes;
  for (int k = 0; k < ndata; k++) {
    const char *ib = static_cast<const char *>(nd->in[k].ptr), *ie = ib + (size_t)nd->in[k].numel * bytes;
    if (ib < oe && ob < ie) return 0;
  }
  return bytes;
}

/* A permute that is a batched transpose (perm = [0 .. b-1, then the dims b+k .. r-1, then b .. b+k-1]) through
 * k_move_transpose: 0 when launched, -1 when it is not one (or too big for the grid). */
static int move_transpose(evt_fb_ctx *ctx, const evt_fb_node *nd, const int *perm, int bytes, char *err,
                          size_t errlen) {
  const evt_fb_tensor &t = nd->in[0];
  int r = t.rank, b0 = 0;
  while (b0 < r && perm[b0] == b0) b0++;
  if (b0 >= r - 1) return -1;
  int k = perm[b0] - b0; /* the first moved output dim starts the input's second block */
  bool two_blocks = k > 0 && k < r - b0;
  for (int j = 0; two_blocks && j < r - b0; j++)
    two_blocks = perm[b0 + j] == (j < r - b0 - k ? b0 + k + j : b0 + j - (r - b0 - k));
  if (!two_blocks) return -1;
  ll nb = prod(t.shape, 0, b0), Y = prod(t.shape, b0, b0 + k), X = prod(t.shape, b0 + k, r);
  if (nb > 65535 || (Y + 31) / 32 > 65535) return -1;
  dim3 grid((unsigned)((X + 31) / 32), (unsigned)((Y + 31) / 32), (unsigned)nb), block(32, 8);
  void *o = nd->out.ptr;
  const void *x = t.ptr;
  switch (bytes) {
  case 1: k_move_transpose<uint8_t><<<grid, block, 0, ST>>>(static_cast<uint8_t *>(o), static_cast<const uint8_t *>(x), Y, X); break;
  case 2: k_move_transpose<uint16_t><<<grid, block, 0, ST>>>(static_cast<uint16_t *>(o), static_cast<const uint16_t *>(x), Y, X); break;
  case 4: k_move_transpose<uint32_t><<<grid, block, 0, ST>>>(static_cast<uint32_t *>(o), static_cast<const uint32_t *>(x), Y, X); break;
  default: k_move_transpose<uint64_t><<<grid, block, 0, ST>>>(static_cast<uint64_t *>(o), static_cast<const uint64_t *>(x), Y, X); break;
  }
  CK(cudaGetLastError());
  return 0;
}

static int move_concat(evt_fb_ctx *ctx, const evt_fb_node *nd, int bytes, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out;
  int d = normdim(nd->a.dim, out.rank);
  if (d < 0) return -1;
  ll outer = prod(out.shape, 0, d), inner = prod(out.shape, d + 1, out.rank), row = out.shape[d] * inner, at = 0;
  for (int k = 0; k < nd->ninputs; k++)
    if ((at += nd->in[k].shape[d] * inner) > row) return -1;
  at = 0;
  for (int k = 0; k < nd->ninputs; k++) {
    ll chunk = nd->in[k].shape[d] * inner;
    if (outer * chunk)
      MOVE_DISPATCH(bytes, k_move_concat, blocks(outer * chunk), out.ptr, nd->in[k].ptr, outer, chunk, row, at);
    at += chunk;
  }
  CK(cudaGetLastError());
  return 0;
}

int fb_layout_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out, &x = nd->in[0];
  int op = nd->op;
  switch (op) {
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: case EVT_FB_OP_PERMUTE:
  case EVT_FB_OP_TRANSPOSE: case EVT_FB_OP_EXPAND: case EVT_FB_OP_SLICE: case EVT_FB_OP_SLICE_BACKWARD:
  case EVT_FB_OP_CONCAT: break;
  default: return -1;
  }
  int bytes = fb_move_bytes(nd, op == EVT_FB_OP_CONCAT ? nd->ninputs : 1);
  if (!bytes) return -1;
  ll n = out.numel;
  if (n == 0) return 0;
  strides s1;
  memset(&s1, 0, sizeof s1);
  ll base = 0;
  switch (op) {
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE:
    if (x.numel != n) return -1;
    CK(cudaMemcpyAsync(out.ptr, x.ptr, (size_t)n * bytes, cudaMemcpyDeviceToDevice, ST));
    return 0;
  case EVT_FB_OP_PERMUTE: case EVT_FB_OP_TRANSPOSE: {
    int perm[R];
    if (permute_plan(nd, perm, &s1)) return -1; /* (the double path reports it) */
    if (move_transpose(ctx, nd, perm, bytes, err, errlen) == 0) return 0;
    break;
  }
  case EVT_FB_OP_EXPAND:
    if (!bcast(x, out, &s1)) return -1;
    break;
  case EVT_FB_OP_SLICE:
    if (slice_plan(nd, &s1, &base)) return -1;
    break;
  case EVT_FB_OP_SLICE_BACKWARD:
    if (slice_plan(nd, &s1, &base)) return -1;
    CK(cudaMemsetAsync(out.ptr, 0, (size_t)n * bytes, ST));
    if (x.numel) MOVE_DISPATCH(bytes, k_move_scatter, blocks(x.numel), out.ptr, x.ptr, x.numel, shape_of(x), s1, base);
    CK(cudaGetLastError());
    return 0;
  case EVT_FB_OP_CONCAT:
    return move_concat(ctx, nd, bytes, err, errlen);
  }
  MOVE_DISPATCH(bytes, k_move_gather, blocks(n), out.ptr, x.ptr, n, shape_of(out), s1, base);
  CK(cudaGetLastError());
  return 0;
}

/* ---- double path, host side -------------------------------------------------------------------------------- */

int fb_layout(evt_fb_ctx *ctx, const evt_fb_node *nd, double *S, char *err, size_t errlen) {
  const evt_fb_tensor &out = nd->out, &x = nd->in[0];
  ll n = out.numel;
  strides s1;
  memset(&s1, 0, sizeof s1);
  switch (nd->op) {
  case EVT_FB_OP_RESHAPE: case EVT_FB_OP_SQUEEZE: case EVT_FB_OP_UNSQUEEZE: {
    if (x.numel != n) UNSUPPORTED("element counts differ");
    shape_t sh = {1, {n, 1, 1, 1, 1, 1}};
    s1.s[0] = 1;
    k_strided<<<blocks(n), 256, 0, ST>>>(S, view(x), n, sh, s1, 0, 0);
    return 0;
  }
  case EVT_FB_OP_PERMUTE: case EVT_FB_OP_TRANSPOSE: {
    int perm[R];
    if (const char *why = permute_plan(nd, perm, &s1)) UNSUPPORTED(why);
    k_strided<<<blocks(n), 256, 0, ST>>>(S, view(x), n, shape_of(out), s1, 0, 0);
    return 0;
  }
  case EVT_FB_OP_EXPAND:
    if (!bcast(x, out, &s1)) UNSUPPORTED("cannot expand to this shape");
    k_strided<<<blocks(n), 256, 0, ST>>>(S, view(x), n, shape_of(out), s1, 0, 0);
    return 0;
  case EVT_FB_OP_SLICE: case EVT_FB_OP_SLICE_BACKWARD: {
    bool fwd = nd->op == EVT_FB_OP_SLICE;
    const evt_fb_tensor &part = fwd ? out : x;
    ll base = 0;
    if (const char *why = slice_plan(nd, &s1, &base)) UNSUPPORTED(why);
    k_strided<<<blocks(part.numel), 256, 0, ST>>>(S, view(x), part.numel, shape_of(part), s1, base, !fwd);
    return 0;
  }
  case EVT_FB_OP_CONCAT: {
    int d = normdim(nd->a.dim, out.rank);
    if (d < 0) UNSUPPORTED("dim out of range");
    ll outer = prod(out.shape, 0, d), inner = prod(out.shape, d + 1, out.rank), row = out.shape[d] * inner, at = 0;
    for (int k = 0; k < nd->ninputs; k++) {
      ll chunk = nd->in[k].shape[d] * inner;
      if (at + chunk > row) UNSUPPORTED("concat input does not fit");
      k_concat_part<<<blocks(outer * chunk), 256, 0, ST>>>(S, view(nd->in[k]), outer, chunk, row, at);
      at += chunk;
    }
    return 0;
  }
  }
  UNSUPPORTED("not a layout op");
}
