/* A^T's CSR on the device (evt_fb_csr_transpose; contract in evt_fallback.h): the operand of spmm_t's generated row
 * kernel, rebuilt every step from A's rowptr / col (device inputs that may change between steps).
 *
 * The order is evt_csr_transpose's (src/codegen/csr.c): column by column, each column's entries in increasing
 * position q of A, so every output row of spmm_t sums in the interpreter's order. Three passes over the context's
 * csr scratch, nothing allocated:
 *   keys    key[q] = col[q] for an entry of A (q in [rowptr[0], rowptr[m])) with a column in [0, k), else k (sorted
 *           past the last column); val[q] = q. Checks rowptr (in [0, nnz], never decreasing) and the column of every
 *           entry of A (evt_csr_transpose's checks; positions outside A's rows are not read): a bad one sets the
 *           run-time index flag with the node (evt_fb_sync reports it).
 *   sort    CUB's DeviceRadixSort::SortPairs over the key bits of k: stable, so equal columns keep increasing q;
 *           the sorted values are perm.
 *   finish  colptr[c] = the number of keys below c (a binary search of the sorted keys), rowidx[t] = the row of
 *           A holding entry perm[t] (a binary search of rowptr).
 * Positions past colptr[k] hold the entries left out (outside A's rows or with a bad column), also in q order. */
#include <cub/device/device_radix_sort.cuh> /* (before internal.h, whose macro R would rename CUB's parameters) */

#include "internal.h"

/* Byte offsets of one transpose's arrays in the context's csr scratch (each 256-aligned), keys of K. */
struct csr_layout {
  size_t colptr, rowidx, perm, keys_in, keys_out, vals_in, temp, temp_bytes, total;
};

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

/* The bits of key values 0 .. k (at least one). */
static int key_bits(ll k) {
  int b = 1;
  while (b < 63 && (k >> b) != 0) b++;
  return b;
}

/* ---- kernels ----------------------------------------------------------------------------------------- */

template <class I> static __device__ __forceinline__ ll clamp_pos(I v, ll nnz) { return v < 0 ? 0 : v > nnz ? nnz : (ll)v; }

template <class I, class K>
__global__ void k_csr_keys(const I *rowptr, const I *col, ll m, ll k, ll nnz, K *keys, I *vals, int *flag, int code) {
  const ll p0 = clamp_pos(rowptr[0], nnz), p1 = clamp_pos(rowptr[m], nnz);
  GRID_FOR(i, m + 1 > nnz ? m + 1 : nnz) {
    if (i <= m) {
      const I r = rowptr[i];
      if (r < 0 || r > nnz || (i > 0 && r < rowptr[i - 1])) atomicCAS(flag, 0, code);
    }
    if (i < nnz) {
      const I c = col[i];
      const bool in_a = i >= p0 && i < p1, bad = c < 0 || c >= k;
      if (in_a && bad) atomicCAS(flag, 0, code);
      keys[i] = (K)(in_a && !bad ? (ll)c : k);
      vals[i] = (I)i;
    }
  }
}

/* The first position in keys[0 .. n) holding a key >= c (keys ascending). */
template <class K> static __device__ ll lower_bound(const K *keys, ll n, ll c) {
  ll lo = 0, hi = n;
  while (lo < hi) {
    const ll mid = lo + (hi - lo) / 2;
    if ((ll)keys[mid] < c) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The last row i in [0, m) with rowptr[i] <= q (0 if none): the row holding entry q of a valid CSR. */
template <class I> static __device__ ll row_of(const I *rowptr, ll m, ll q) {
  ll lo = 0, hi = m; /* answer in [lo, hi) once rowptr[lo] <= q */
  if (m <= 0 || (ll)rowptr[0] > q) return 0;
  while (hi - lo > 1) {
    const ll mid = lo + (hi - lo) / 2;
    if ((ll)rowptr[mid] <= q) lo = mid;
    else hi = mid;
  }
  return lo;
}

template <class I, class K>
__global__ void k_csr_finish(const I *rowptr, ll m, ll k, ll nnz, const K *keys, const I *perm, I *colptr, I *rowidx) {
  GRID_FOR(i, k + 1 > nnz ? k + 1 : nnz) {
    if (i <= k) colptr[i] = (I)lower_bound(keys, nnz, i);
    if (i < nnz) rowidx[i] = (I)row_of(rowptr, m, (ll)perm[i]);
  }
}

/* ---- host side ------------------------------------------------------------------------------------------ */

/* CUB's temporary bytes for sorting nnz pairs (keys K, values I) over `bits` bits. */
template <class I, class K> static int sort_bytes(ll nnz, int bits, size_t *bytes, char *err, size_t errlen) {
  *bytes = 0;
  if (nnz == 0) return 0;
  CK(cub::DeviceRadixSort::SortPairs(nullptr, *bytes, (const K *)nullptr, (K *)nullptr, (const I *)nullptr, (I *)nullptr,
                                     nnz, 0, bits));
  return 0;
}

template <class I, class K> static int layout_of(const evt_fb_csr_transpose_args *t, csr_layout *L, char *err, size_t errlen) {
  const size_t w = sizeof(I), kw = sizeof(K), n = (size_t)t->nnz;
  if (sort_bytes<I, K>(t->nnz, key_bits(t->k), &L->temp_bytes, err, errlen)) return 2;
  L->colptr = 0;
  L->rowidx = L->colptr + align256(w * (size_t)(t->k + 1));
  L->perm = L->rowidx + align256(w * n);
  L->keys_in = L->perm + align256(w * n);
  L->keys_out = L->keys_in + align256(kw * n);
  L->vals_in = L->keys_out + align256(kw * n);
  L->temp = L->vals_in + align256(w * n);
  L->total = L->temp + align256(L->temp_bytes);
  return 0;
}

/* The arguments' sizes and dtype, or 1 with the reason. */
static int check_args(const evt_fb_csr_transpose_args *t, char *err, size_t errlen) {
  if (t->idx_dtype != EVT_FB_I64 && t->idx_dtype != EVT_FB_I32) UNSUPPORTED("CSR indices must be i64 or i32");
  if (t->m < 0 || t->k < 0 || t->nnz < 0) UNSUPPORTED("negative CSR sizes");
  if (t->idx_dtype == EVT_FB_I32 && (t->nnz > 2147483647 || t->k >= 2147483647 || t->m >= 2147483647))
    UNSUPPORTED("A^T's CSR does not fit i32 indices");
  return 0;
}

static int layout(const evt_fb_csr_transpose_args *t, csr_layout *L, char *err, size_t errlen) {
  int r = check_args(t, err, errlen);
  if (r) return r;
  return t->idx_dtype == EVT_FB_I64 ? layout_of<ll, unsigned long long>(t, L, err, errlen)
                                    : layout_of<int, unsigned int>(t, L, err, errlen);
}

extern "C" int evt_fb_csr_reserve(evt_fb_ctx *c, const evt_fb_csr_transpose_args *t, char *err, size_t errlen) {
  csr_layout L;
  int r = layout(t, &L, err, errlen);
  if (r) return r;
  if (!c->index_flag && evt_fb_index_flag(&c->index_flag, err, errlen)) return 2;
  if (L.total <= c->csr_bytes) return 0;
  cudaFree(c->csr); /* (waits for the device: reserve before a step, never inside one) */
  c->csr = NULL;
  c->csr_bytes = 0;
  CK(cudaMalloc(&c->csr, L.total));
  c->csr_bytes = L.total;
  return 0;
}

template <class I, class K>
static int transpose(evt_fb_ctx *ctx, const evt_fb_csr_transpose_args *t, const csr_layout &L, char *err, size_t errlen) {
  char *base = (char *)ctx->csr;
  I *colptr = (I *)(base + L.colptr), *rowidx = (I *)(base + L.rowidx), *perm = (I *)(base + L.perm);
  K *keys_in = (K *)(base + L.keys_in), *keys_out = (K *)(base + L.keys_out);
  I *vals_in = (I *)(base + L.vals_in);
  const I *rowptr = (const I *)t->rowptr, *col = (const I *)t->col;
  const ll m = t->m, k = t->k, nnz = t->nnz;
  k_csr_keys<I, K><<<blocks(m + 1 > nnz ? m + 1 : nnz), 256, 0, ST>>>(rowptr, col, m, k, nnz, keys_in, vals_in,
                                                                        ctx->index_flag, t->node + 1);
  CK(cudaGetLastError());
  size_t temp_bytes = L.temp_bytes;
  if (nnz > 0) {
    ctx->launches++; /* (the sort: counted as one launch, as a cuBLAS call is) */
    CK(cub::DeviceRadixSort::SortPairs((void *)(base + L.temp), temp_bytes, (const K *)keys_in, keys_out,
                                       (const I *)vals_in, perm, nnz, 0, key_bits(k), ctx->stream));
  }
  k_csr_finish<I, K><<<blocks(k + 1 > nnz ? k + 1 : nnz), 256, 0, ST>>>(rowptr, m, k, nnz, keys_out, perm, colptr, rowidx);
  CK(cudaGetLastError());
  return 0;
}

extern "C" int evt_fb_csr_transpose(evt_fb_ctx *ctx, evt_fb_csr_transpose_args *t, void *stream, char *err,
                                    size_t errlen) {
  csr_layout L;
  int r = layout(t, &L, err, errlen);
  if (r) return r;
  if (L.total > ctx->csr_bytes || !ctx->index_flag)
    UNSUPPORTED("A^T's CSR scratch was not reserved (evt_fb_csr_reserve before the step)");
  ctx->stream = (cudaStream_t)stream;
  char *base = (char *)ctx->csr;
  t->colptr = base + L.colptr;
  t->rowidx = base + L.rowidx;
  t->perm = base + L.perm;
  return t->idx_dtype == EVT_FB_I64 ? transpose<ll, unsigned long long>(ctx, t, L, err, errlen)
                                    : transpose<int, unsigned int>(ctx, t, L, err, errlen);
}
