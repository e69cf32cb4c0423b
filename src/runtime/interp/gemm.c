/* Interpreter: matrix products and attention.
 * - mm [M,K]x[K,N]; bmm [...,M,K]x[...,K,N] (batch dims broadcast numpy-style if they differ);
 *   addmm(c, a, b) = a @ b + c with c broadcast to [M,N]. Each output element is a dot product of its k terms
 *   in double: through the BLAS (OpenBLAS dgemm) when M x N x K >= EVT_INTERP_BLAS_MIN, in the BLAS's fixed
 *   order of summation (products may be fused with the additions); smaller products sum in increasing k with
 *   the i-k-j loops below. Either way the error is far below an f32 ulp before the f32 rounding. With the
 *   perturbed reference (evt_fp8_noise, interp.h) a product of two fp8 operands is scaled by 1 + eps u per element.
 * - spmm(rowptr, col, val, x) = A x with A in CSR form ([M,K], K = rows of x); spmm_t(...) = A^T dy with
 *   shape [K,N]. rowptr must start at >= 0, never decrease and end at <= nnz; col in [0, K).
 * - sdpa(q, k, v[, mask]) [..., S, D] = softmax(q k^T * scale + mask) v with scale = 1/sqrt(D) when the
 *   attribute is 0, as PyTorch's scaled_dot_product_attention: a float mask is added to the scaled scores, a
 *   bool mask keeps the keys where it is true (the others score -inf), causal drops key j > query i. A row
 *   whose every key is dropped (all scores -inf) has probabilities 0, so its output and gradients are 0
 *   (PyTorch's kernels and its math path's safe softmax give 0, not NaN). sdpa_backward_{q,k,v}(dout, q, k,
 *   v[, mask]) are the exact gradients, recomputing the probabilities row by row. */
#include "runtime/interp/internal.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One BLAS thread: the interpreter runs between PyTorch's parallel ops on the same cores, where OpenBLAS's
 * worker threads compete with PyTorch's spinning ones (a step measured 2.3x slower on 2 cores), and a single
 * thread keeps each product's order of summation independent of the machine's core count. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_one_thread(void) { openblas_set_num_threads(1); }
void evt_interp_blas_ready(void) { pthread_once(&blas_once, blas_one_thread); }

/* out[M,N] += a[M,K] @ b[K,N] (all contiguous). */
static void matmul_acc(double *out, const double *a, const double *b, int64_t M, int64_t K, int64_t N) {
  if (evt_interp_use_blas(M, N, K)) {
    evt_interp_blas_ready();
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, 1.0, a, (blasint)K, b,
                (blasint)N, 1.0, out, (blasint)N);
    return;
  }
  for (int64_t i = 0; i < M; i++) {
    double *orow = out + i * N;
    const double *arow = a + i * K;
    for (int64_t k = 0; k < K; k++) {
      double av = arow[k];
      const double *brow = b + k * N;
      for (int64_t j = 0; j < N; j++) orow[j] += av * brow[j];
    }
  }
}

/* Matrix offset of an operand for every batch index of the output, numpy broadcast over batch dims;
 * false if the operand's batch dims do not broadcast to the output's. */
static bool batch_offsets(const evt_tensor *t, const evt_tensor *out, int64_t *offsets) {
  int rb = out->rank - 2, tb = t->rank - 2;
  if (tb > rb) return false;
  int64_t mat = t->shape[t->rank - 2] * t->shape[t->rank - 1];
  int64_t stride[EVT_MAX_RANK] = {0}, s = mat;
  for (int i = rb - 1; i >= 0; i--) {
    int j = i - (rb - tb);
    if (j < 0) continue;
    if (t->shape[j] != out->shape[i] && t->shape[j] != 1) return false;
    stride[i] = (t->shape[j] == 1 && out->shape[i] != 1) ? 0 : s;
    s *= t->shape[j];
  }
  int64_t nb = interp_prod(out->shape, 0, rb), idx[EVT_MAX_RANK] = {0}, o = 0;
  for (int64_t b = 0; b < nb; b++) {
    offsets[b] = o;
    for (int d = rb - 1; d >= 0; d--) {
      o += stride[d];
      if (++idx[d] < out->shape[d]) break;
      o -= stride[d] * idx[d];
      idx[d] = 0;
    }
  }
  return true;
}

/* Both operands fp8: the product the perturbed reference (interp.h, evt_fp8_noise) perturbs. */
static bool fp8_operands(const evt_tensor *a, const evt_tensor *b) {
  return evt_dtype_is_fp8(a->dtype) && evt_dtype_is_fp8(b->dtype);
}

/* The perturbed reference: p[i] *= 1 + eps u_i, u_i uniform in [-1, 1] from (seed, node id, i) only. */
static void perturb_product(const evt_interp_ctx *ctx, double *p, int64_t n) {
  uint64_t key = ctx->noise->seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)ctx->id + 1));
  for (int64_t i = 0; i < n; i++) p[i] *= 1 + ctx->noise->eps * (2 * evt_interp_counter_uniform(key, (uint64_t)i, 0) - 1);
}

static evt_status gemm(evt_interp_ctx *ctx) {
  evt_op op = ctx->n->op;
  const evt_tensor *a = ctx->in[op == EVT_OP_ADDMM ? 1 : 0], *b = ctx->in[op == EVT_OP_ADDMM ? 2 : 1];
  evt_tensor *out = ctx->out;
  if (a->rank < 2 || b->rank < 2 || out->rank < 2) return interp_fail(ctx, "operands must have rank >= 2");
  int64_t M = a->shape[a->rank - 2], K = a->shape[a->rank - 1], N = b->shape[b->rank - 1];
  if (b->shape[b->rank - 2] != K || out->shape[out->rank - 2] != M || out->shape[out->rank - 1] != N)
    return interp_fail(ctx, "operand shapes do not match the output");
  int64_t nb = interp_prod(out->shape, 0, out->rank - 2);
  int64_t *oa = malloc(sizeof(int64_t) * (size_t)(nb ? nb : 1)), *ob = malloc(sizeof(int64_t) * (size_t)(nb ? nb : 1));
  if (!oa || !ob) {
    free(oa);
    free(ob);
    return interp_fail(ctx, "out of memory");
  }
  if (!batch_offsets(a, out, oa) || !batch_offsets(b, out, ob)) {
    free(oa);
    free(ob);
    return interp_fail(ctx, "batch dims of the operands do not match the output");
  }
  for (int64_t bi = 0; bi < nb; bi++) matmul_acc(out->data + bi * M * N, a->data + oa[bi], b->data + ob[bi], M, K, N);
  free(oa);
  free(ob);
  if (ctx->noise && fp8_operands(a, b)) perturb_product(ctx, out->data, out->numel);
  if (op == EVT_OP_ADDMM) {
    const evt_tensor *c = ctx->in[0];
    int64_t cs[EVT_MAX_RANK];
    if (out->rank != 2 || !evt_interp_bcast_strides(c, 2, out->shape, cs))
      return interp_fail(ctx, "addmm bias does not broadcast to the product");
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) out->data[i * N + j] += c->data[i * cs[0] + j * cs[1]];
  }
  return EVT_OK;
}

/* ---- CSR sparse x dense ---------------------------------------------------------------------------- */

static evt_status spmm(evt_interp_ctx *ctx) {
  const evt_tensor *rowptr = ctx->in[0], *col = ctx->in[1], *val = ctx->in[2], *x = ctx->in[3];
  evt_tensor *out = ctx->out;
  bool transposed = ctx->n->op == EVT_OP_SPMM_T;
  if (x->rank != 2 || out->rank != 2 || rowptr->rank != 1 || col->numel != val->numel)
    return interp_fail(ctx, "expects rowptr[M+1], col[nnz], val[nnz] and a rank-2 dense operand");
  int64_t M = rowptr->numel - 1, N = x->shape[1], nnz = col->numel;
  int64_t K = transposed ? out->shape[0] : x->shape[0];
  if (M < 0 || (transposed ? x->shape[0] : out->shape[0]) != M || out->shape[1] != N)
    return interp_fail(ctx, "rowptr has %lld entries, which does not match the dense shapes", (long long)rowptr->numel);
  int64_t prev = 0;
  for (int64_t i = 0; i <= M; i++) {
    int64_t r = evt_interp_index(ctx, rowptr, i, nnz + 1, "CSR rowptr");
    if (r < 0) return EVT_ERR_INVALID;
    if (r < prev) return interp_fail(ctx, "CSR rowptr is not monotone: rowptr[%lld] = %lld < %lld", (long long)i, (long long)r, (long long)prev);
    prev = r;
  }
  for (int64_t p = 0; p < nnz; p++)
    if (evt_interp_index(ctx, col, p, K, "CSR column index") < 0) return EVT_ERR_INVALID;
  for (int64_t i = 0; i < M; i++) {
    for (int64_t p = (int64_t)rowptr->data[i]; p < (int64_t)rowptr->data[i + 1]; p++) {
      int64_t c = (int64_t)col->data[p];
      double v = val->data[p];
      if (!transposed) {
        double *o = out->data + i * N;
        const double *xr = x->data + c * N;
        for (int64_t j = 0; j < N; j++) o[j] += v * xr[j];
      } else {
        double *o = out->data + c * N;
        const double *dr = x->data + i * N;
        for (int64_t j = 0; j < N; j++) o[j] += v * dr[j];
      }
    }
  }
  return EVT_OK;
}

/* ---- attention ------------------------------------------------------------------------------------- */

/* The optional mask, read broadcast to the scores [..., Sq, Skv] of rank r (stride 0 along broadcast dims). */
typedef struct {
  const evt_tensor *t; /* NULL: no mask */
  int r;
  const int64_t *shape; /* q's shape: the batch dims of the scores */
  int64_t st[EVT_MAX_RANK];
} sdpa_mask;

/* Offset in the mask of score (flat batch b, query i, key 0). */
static int64_t mask_row(const sdpa_mask *m, int64_t b, int64_t i) {
  int64_t off = i * m->st[m->r - 2];
  for (int d = m->r - 3; d >= 0; d--) {
    off += (b % m->shape[d]) * m->st[d];
    b /= m->shape[d];
  }
  return off;
}

/* p[0..nk) = the probabilities of query row qi over keys kb[0..nk) (D wide): the softmax of the scaled dot
 * products plus the mask row at offset `row`; all 0 when every score is -inf (the row fully masked). */
static void sdpa_probs(double *p, const double *qi, const double *kb, int64_t nk, int64_t D, double scale,
                       const sdpa_mask *mk, int64_t row) {
  double m = -INFINITY;
  for (int64_t j = 0; j < nk; j++) {
    double s = 0;
    for (int64_t d = 0; d < D; d++) s += qi[d] * kb[j * D + d];
    p[j] = s * scale;
    if (mk->t) {
      double mv = mk->t->data[row + j * mk->st[mk->r - 1]];
      p[j] = mk->t->dtype == EVT_BOOL ? (mv != 0 ? p[j] : -INFINITY) : p[j] + mv;
    }
    if (isnan(p[j]) || p[j] > m) m = isnan(m) ? m : p[j];
  }
  if (m == -INFINITY) {
    for (int64_t j = 0; j < nk; j++) p[j] = 0;
    return;
  }
  double sum = 0;
  for (int64_t j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - m));
  for (int64_t j = 0; j < nk; j++) p[j] /= sum;
}

/* The mask input of an sdpa node (after q, k, v), checked to broadcast to the scores. */
static evt_status sdpa_mask_of(evt_interp_ctx *ctx, int base, const evt_tensor *q, int64_t Skv, sdpa_mask *mk) {
  memset(mk, 0, sizeof *mk);
  if (ctx->n->ninputs <= base + 3) return EVT_OK;
  int r = q->rank;
  int64_t shape[EVT_MAX_RANK];
  memcpy(shape, q->shape, sizeof(int64_t) * (size_t)r);
  shape[r - 1] = Skv;
  mk->t = ctx->in[base + 3];
  mk->r = r;
  mk->shape = q->shape;
  if (!evt_interp_bcast_strides(mk->t, r, shape, mk->st)) return interp_fail(ctx, "the mask does not broadcast to the scores");
  return EVT_OK;
}

static evt_status sdpa(evt_interp_ctx *ctx) {
  evt_op op = ctx->n->op;
  int base = op == EVT_OP_SDPA ? 0 : 1;
  const evt_tensor *q = ctx->in[base], *k = ctx->in[base + 1], *v = ctx->in[base + 2];
  const double *dout = base ? ctx->in[0]->data : NULL;
  evt_tensor *out = ctx->out;
  int r = q->rank;
  if (r < 2 || k->rank != r || v->rank != r) return interp_fail(ctx, "q, k, v must have the same rank >= 2");
  int64_t Sq = q->shape[r - 2], D = q->shape[r - 1], Skv = k->shape[r - 2], Dv = v->shape[r - 1];
  int64_t B = interp_prod(q->shape, 0, r - 2);
  if (k->shape[r - 1] != D || v->shape[r - 2] != Skv || interp_prod(k->shape, 0, r - 2) != B ||
      interp_prod(v->shape, 0, r - 2) != B)
    return interp_fail(ctx, "q, k, v shapes do not agree");
  int64_t per_batch = op == EVT_OP_SDPA || op == EVT_OP_SDPA_BACKWARD_Q ? Sq : Skv;
  per_batch *= op == EVT_OP_SDPA || op == EVT_OP_SDPA_BACKWARD_V ? Dv : D;
  if (!interp_numel_is(ctx, out, B * per_batch, "the output") || (base && !interp_numel_is(ctx, ctx->in[0], B * Sq * Dv, "dout")))
    return EVT_ERR_INVALID;
  sdpa_mask mk;
  evt_status st = sdpa_mask_of(ctx, base, q, Skv, &mk);
  if (st != EVT_OK) return st;
  double scale = ctx->n->attr.scale != 0 ? ctx->n->attr.scale : 1.0 / sqrt((double)D);
  bool causal = ctx->n->attr.causal != 0;
  double *p = malloc(sizeof(double) * (size_t)(Skv ? Skv : 1));
  double *dp = malloc(sizeof(double) * (size_t)(Skv ? Skv : 1));
  if (!p || !dp) {
    free(p);
    free(dp);
    return interp_fail(ctx, "out of memory");
  }
  for (int64_t b = 0; b < B; b++) {
    const double *qb = q->data + b * Sq * D, *kb = k->data + b * Skv * D, *vb = v->data + b * Skv * Dv;
    const double *dob = dout ? dout + b * Sq * Dv : NULL;
    double *ob = out->data + b * per_batch;
    for (int64_t i = 0; i < Sq; i++) {
      const double *qi = qb + i * D;
      int64_t nk = causal ? (i + 1 < Skv ? i + 1 : Skv) : Skv; /* keys 0..nk-1 are visible */
      sdpa_probs(p, qi, kb, nk, D, scale, &mk, mk.t ? mask_row(&mk, b, i) : 0);
      if (op == EVT_OP_SDPA) {
        double *oi = ob + i * Dv;
        for (int64_t j = 0; j < nk; j++)
          for (int64_t d = 0; d < Dv; d++) oi[d] += p[j] * vb[j * Dv + d];
        continue;
      }
      const double *doi = dob + i * Dv;
      if (op == EVT_OP_SDPA_BACKWARD_V) { /* dV_j += P_ij dO_i */
        for (int64_t j = 0; j < nk; j++)
          for (int64_t d = 0; d < Dv; d++) ob[j * Dv + d] += p[j] * doi[d];
        continue;
      }
      /* dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij), dP_ij = dO_i . V_j */
      double dot = 0;
      for (int64_t j = 0; j < nk; j++) {
        double s = 0;
        for (int64_t d = 0; d < Dv; d++) s += doi[d] * vb[j * Dv + d];
        dp[j] = s;
        dot += p[j] * s;
      }
      for (int64_t j = 0; j < nk; j++) dp[j] = p[j] * (dp[j] - dot) * scale;
      if (op == EVT_OP_SDPA_BACKWARD_Q) { /* dQ_i = scale sum_j dS_ij K_j */
        double *oi = ob + i * D;
        for (int64_t j = 0; j < nk; j++)
          for (int64_t d = 0; d < D; d++) oi[d] += dp[j] * kb[j * D + d];
      } else { /* dK_j += scale dS_ij Q_i */
        for (int64_t j = 0; j < nk; j++)
          for (int64_t d = 0; d < D; d++) ob[j * D + d] += dp[j] * qi[d];
      }
    }
  }
  free(p);
  free(dp);
  return EVT_OK;
}

evt_status evt_interp_gemm(evt_interp_ctx *ctx) {
  switch (ctx->n->op) {
  case EVT_OP_MM:
  case EVT_OP_BMM:
  case EVT_OP_ADDMM: return gemm(ctx);
  case EVT_OP_SPMM:
  case EVT_OP_SPMM_T: return spmm(ctx);
  default: return sdpa(ctx);
  }
}
