/* An edge list's CSR by key on the device: coo_perm and coo_rowptr (src/ir/ops.def; made by the edge-spmm pass,
 * src/passes/edge_spmm.c), native paths of the kernel library (i64 output written directly: no double scratch).
 *
 *   coo_rowptr  a histogram of the keys (integer atomicAdd into counts[key + 1], counts[0] = 0), then CUB's
 *               inclusive prefix sum into the output: rowptr[r] = the number of keys below r. Exact, so any
 *               order of the atomics gives the same result.
 *   coo_perm    CUB's DeviceRadixSort::SortPairs (stable: equal keys keep increasing position) of the keys with
 *               the values 0 .. E-1 over the key bits of `rows`; the sorted values are the permutation.
 * A key outside [0, rows) sets the run-time index flag with the node (evt_fb_sync reports it); it is left out of
 * the histogram and sorted past every valid key. Scratch (counts / keys and values / CUB's temporary storage)
 * lives in the context's coo buffer, sized by fb_coo_reserve before the step (allocates; never inside a capture),
 * so a run only enqueues kernels on the node's stream (graph-capturable). */
#include <cub/device/device_radix_sort.cuh> /* (before internal.h, whose macro R would rename CUB's parameters) */
#include <cub/device/device_scan.cuh>

#include "internal.h"

/* Byte offsets of one node's arrays in the coo scratch (each 256-aligned). */
struct coo_layout {
  size_t counts, keys_in, keys_out, vals_in, temp, temp_bytes, total;
};

static size_t coo_align(size_t b) { return (b + 255) / 256 * 256; }

/* The bits of key values 0 .. rows (at least one): bad keys are sorted as `rows`. */
static int coo_key_bits(ll rows) {
  int b = 1;
  while (b < 63 && (rows >> b) != 0) b++;
  return b;
}

static bool is_coo(int op) { return op == EVT_FB_OP_COO_PERM || op == EVT_FB_OP_COO_ROWPTR; }

/* ---- kernels ----------------------------------------------------------------------------------------- */

template <class I> static __device__ __forceinline__ bool bad_key(I k, ll rows) { return k < 0 || (ll)k >= rows; }

template <class I>
__global__ void k_coo_histogram(const I *key, ll E, ll rows, unsigned long long *counts, int *flag, int code) {
  GRID_FOR(e, E) {
    const I k = key[e];
    if (bad_key(k, rows)) atomicCAS(flag, 0, code);
    else atomicAdd(&counts[(ll)k + 1], 1ull);
  }
}

template <class I, class K>
__global__ void k_coo_keys(const I *key, ll E, ll rows, K *keys, ll *vals, int *flag, int code) {
  GRID_FOR(e, E) {
    const I k = key[e];
    const bool bad = bad_key(k, rows);
    if (bad) atomicCAS(flag, 0, code);
    keys[e] = (K)(bad ? rows : (ll)k);
    vals[e] = e;
  }
}

/* ---- host side ------------------------------------------------------------------------------------------ */

/* Keys of 32 bits while every value 0 .. rows fits (half the sort's traffic), else 64. */
static bool wide_keys(ll rows) { return rows >= 0xffffffffll; }

template <class K> static int sort_bytes(ll E, int bits, size_t *bytes, char *err, size_t errlen) {
  CK(cub::DeviceRadixSort::SortPairs(nullptr, *bytes, (const K *)nullptr, (K *)nullptr, (const ll *)nullptr,
                                     (ll *)nullptr, E, 0, bits));
  return 0;
}

static int scan_bytes(ll n, size_t *bytes, char *err, size_t errlen) {
  CK(cub::DeviceScan::InclusiveSum(nullptr, *bytes, (const unsigned long long *)nullptr, (unsigned long long *)nullptr, n));
  return 0;
}

/* The layout for node nd (its key is in[0]; rows: its attribute), or 1 with the reason. */
static int coo_layout_of(const evt_fb_node *nd, coo_layout *L, char *err, size_t errlen) {
  const evt_fb_tensor &key = nd->in[0];
  const ll E = key.numel, rows = nd->a.rows;
  if (key.dtype != EVT_FB_I64 && key.dtype != EVT_FB_I32) UNSUPPORTED("coo keys must be i64 or i32");
  if (nd->ninputs != 1 || key.rank != 1 || rows <= 0) UNSUPPORTED("coo ops take one key [E] and rows > 0");
  memset(L, 0, sizeof *L);
  const size_t kw = wide_keys(rows) ? 8 : 4, n = (size_t)E;
  int r = 0;
  if (nd->op == EVT_FB_OP_COO_ROWPTR) {
    L->counts = 0;
    L->temp = coo_align(8 * (size_t)(rows + 1));
    r = scan_bytes(rows + 1, &L->temp_bytes, err, errlen);
  } else {
    L->keys_in = 0;
    L->keys_out = coo_align(kw * n);
    L->vals_in = L->keys_out + coo_align(kw * n);
    L->temp = L->vals_in + coo_align(8 * n);
    if (E > 0)
      r = wide_keys(rows) ? sort_bytes<unsigned long long>(E, coo_key_bits(rows), &L->temp_bytes, err, errlen)
                          : sort_bytes<unsigned int>(E, coo_key_bits(rows), &L->temp_bytes, err, errlen);
  }
  L->total = L->temp + coo_align(L->temp_bytes) + 256;
  return r;
}

int fb_coo_reserve(evt_fb_ctx *c, const evt_fb_node *nd, char *err, size_t errlen) {
  if (!is_coo(nd->op)) return -1;
  coo_layout L;
  int r = coo_layout_of(nd, &L, err, errlen);
  if (r) return r;
  if (!c->index_flag && evt_fb_index_flag(&c->index_flag, err, errlen)) return 2;
  if (L.total <= c->coo_bytes) return 0;
  cudaFree(c->coo); /* (waits for the device: reserve before a step, never inside one) */
  c->coo = NULL;
  c->coo_bytes = 0;
  CK(cudaMalloc(&c->coo, L.total));
  c->coo_bytes = L.total;
  return 0;
}

template <class I>
static int coo_rowptr(evt_fb_ctx *ctx, const evt_fb_node *nd, const coo_layout &L, char *err, size_t errlen) {
  const ll E = nd->in[0].numel, rows = nd->a.rows;
  char *base = (char *)ctx->coo;
  unsigned long long *counts = (unsigned long long *)(base + L.counts);
  CK(cudaMemsetAsync(counts, 0, 8 * (size_t)(rows + 1), ctx->stream));
  k_coo_histogram<I><<<blocks(E), 256, 0, ST>>>((const I *)nd->in[0].ptr, E, rows, counts, ctx->index_flag, nd->id + 1);
  CK(cudaGetLastError());
  size_t temp_bytes = L.temp_bytes;
  ctx->launches++; /* (the scan: counted as one launch, as a cuBLAS call is) */
  CK(cub::DeviceScan::InclusiveSum((void *)(base + L.temp), temp_bytes, (const unsigned long long *)counts,
                                   (unsigned long long *)nd->out.ptr, rows + 1, ctx->stream));
  return 0;
}

template <class I, class K>
static int coo_perm(evt_fb_ctx *ctx, const evt_fb_node *nd, const coo_layout &L, char *err, size_t errlen) {
  const ll E = nd->in[0].numel, rows = nd->a.rows;
  if (E == 0) return 0;
  char *base = (char *)ctx->coo;
  K *keys_in = (K *)(base + L.keys_in), *keys_out = (K *)(base + L.keys_out);
  ll *vals_in = (ll *)(base + L.vals_in);
  k_coo_keys<I, K><<<blocks(E), 256, 0, ST>>>((const I *)nd->in[0].ptr, E, rows, keys_in, vals_in, ctx->index_flag,
                                              nd->id + 1);
  CK(cudaGetLastError());
  size_t temp_bytes = L.temp_bytes;
  ctx->launches++; /* (the sort: one launch, as in csr.cu) */
  CK(cub::DeviceRadixSort::SortPairs((void *)(base + L.temp), temp_bytes, (const K *)keys_in, keys_out,
                                     (const ll *)vals_in, (ll *)nd->out.ptr, E, 0, coo_key_bits(rows), ctx->stream));
  return 0;
}

template <class I> static int coo_run(evt_fb_ctx *ctx, const evt_fb_node *nd, const coo_layout &L, char *err, size_t errlen) {
  if (nd->op == EVT_FB_OP_COO_ROWPTR) return coo_rowptr<I>(ctx, nd, L, err, errlen);
  return wide_keys(nd->a.rows) ? coo_perm<I, unsigned long long>(ctx, nd, L, err, errlen)
                               : coo_perm<I, unsigned int>(ctx, nd, L, err, errlen);
}

int fb_coo_native(evt_fb_ctx *ctx, const evt_fb_node *nd, char *err, size_t errlen) {
  if (!is_coo(nd->op)) return -1;
  if (nd->out.dtype != EVT_FB_I64) UNSUPPORTED("coo ops give i64");
  int r = fb_coo_reserve(ctx, nd, err, errlen); /* no-op when reserved before the step */
  if (r) return r;
  coo_layout L;
  if ((r = coo_layout_of(nd, &L, err, errlen))) return r;
  return nd->in[0].dtype == EVT_FB_I64 ? coo_run<ll>(ctx, nd, L, err, errlen) : coo_run<int>(ctx, nd, L, err, errlen);
}
