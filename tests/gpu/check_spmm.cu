// GPU check of the generated spmm row kernels (nucleus spmm: src/codegen/rspec.h, kernels/evt_spmm.cuh) against the
// CPU reference (evt_rspec_reference_csr); run by tests/gpu/run.sh (kernels group).
//   check_spmm emit DIR    writes the generated sources (the spmm examples of src/codegen/examples_spmm.c)
//   check_spmm check DIR   runs the checks on DIR/<kernel>.so; prints one ok / FAIL line per case, "N passed, N failed"
// Random CSR matrices with an empty row, a row of many entries, duplicate columns; N = 1, 8, 64, 100 (N % 8 != 0:
// element path), 349 and 1000; f32 within 1e-5 relative (Frobenius), bf16 / f16 within 1e-2, bool masks exact, a
// NaN / inf never passes (outputs are NaN-poisoned first). Every case launches twice and the results must agree bit
// for bit (spmm_t: no atomics). spmm_t runs over A^T's CSR built by evt_csr_transpose (values through perm), then
// over the one the kernel library builds on the device (evt_fb_csr_transpose, $EVT_FALLBACK_LIB, else
// build/libevt_fallback.so): that structure must equal the host's bit for bit (also with rowptr not starting at 0,
// entries outside A's rows, a long column, empty rows and columns, no entries) and the kernel's outputs over it must
// equal the host structure's bit for bit. An index out of range sets the error flag (the library's: with the node); a
// missing flag pointer is refused (EVT_LAUNCH_BAD_ARGS), and so is a transpose whose scratch was not reserved.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "codegen/csr.h"
#include "codegen/examples.h"
#include "codegen/rspec.h"
#include "evt_fallback.h"
#include "evt_row_launch.h"
}

#include "check_report.h"

#include "cuda_check.h"

typedef int (*row_fn)(const evt_row_launch_args *);

struct SpmmCase {
  evt_rspec spec;
  std::string name, label;
  evt_dtype dt;
  row_fn fn = nullptr;
};

static const char *dt_name(evt_dtype d) { return d == EVT_BF16 ? "bf16" : d == EVT_F16 ? "f16" : "f32"; }

static std::vector<SpmmCase> all_cases() {
  std::vector<SpmmCase> v;
  for (int k = 0; evt_rspec_spmm_example_names[k]; k++)
    for (evt_dtype dt : {EVT_BF16, EVT_F32, EVT_F16}) {
      SpmmCase c;
      if (evt_rspec_spmm_example(&c.spec, evt_rspec_spmm_example_names[k], dt) != EVT_OK) exit(2);
      char nm[40];
      evt_rspec_kernel_name(&c.spec, nm);
      c.name = nm;
      c.dt = dt;
      c.label = std::string(evt_rspec_spmm_example_names[k]) + " " + dt_name(dt);
      v.push_back(c);
    }
  return v;
}

static size_t dt_bytes(evt_dtype dt) {
  return dt == EVT_F32 || dt == EVT_I32 ? 4 : dt == EVT_I64 ? 8 : dt == EVT_BOOL ? 1 : 2;
}

// Values as dtype dt in device memory; `vals` becomes what was stored (16-bit rounding).
static void *upload(std::vector<double> &vals, evt_dtype dt) {
  std::vector<unsigned char> b(vals.size() * dt_bytes(dt) + 16);
  for (size_t i = 0; i < vals.size(); i++) {
    if (dt == EVT_I64) {
      long long x = (long long)vals[i];
      memcpy(&b[8 * i], &x, 8);
    } else if (dt == EVT_I32) {
      int x = (int)vals[i];
      memcpy(&b[4 * i], &x, 4);
    } else if (dt == EVT_BF16) {
      __nv_bfloat16 h = __float2bfloat16((float)vals[i]);
      memcpy(&b[2 * i], &h, 2);
      vals[i] = __bfloat162float(h);
    } else if (dt == EVT_F16) {
      __half h = __float2half((float)vals[i]);
      memcpy(&b[2 * i], &h, 2);
      vals[i] = __half2float(h);
    } else {
      float f = (float)vals[i];
      memcpy(&b[4 * i], &f, 4);
      vals[i] = f;
    }
  }
  void *d;
  CUDA_CHECK(cudaMalloc(&d, b.size()));
  CUDA_CHECK(cudaMemcpy(d, b.data(), b.size(), cudaMemcpyHostToDevice));
  return d;
}

static std::vector<unsigned char> raw(const void *d, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  if (!bytes) return h;
  CUDA_CHECK(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
  return h;
}

static std::vector<double> values(const std::vector<unsigned char> &h, size_t n, evt_dtype dt) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; i++) {
    if (dt == EVT_F32) {
      float f;
      memcpy(&f, &h[4 * i], 4);
      out[i] = f;
    } else if (dt == EVT_BOOL) {
      out[i] = h[i];
    } else if (dt == EVT_F16) {
      __half x;
      memcpy(&x, &h[2 * i], 2);
      out[i] = __half2float(x);
    } else {
      __nv_bfloat16 x;
      memcpy(&x, &h[2 * i], 2);
      out[i] = __bfloat162float(x);
    }
  }
  return out;
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (double)((next() >> 11) * (1.0 / 9007199254740992.0)); }
};

// A [m, k] in CSR: row 0 empty, row 1 `longrow` entries (if m > 1), others 0..12; every fourth column repeats the one
// before it (duplicates).
struct Csr {
  int64_t m, k;
  std::vector<double> rowptr, col, val;
};
static Csr random_csr(int64_t m, int64_t k, int64_t longrow, Rng &r) {
  Csr a{m, k, {0}, {}, {}};
  for (int64_t i = 0; i < m; i++) {
    int64_t cnt = i == 0 ? 0 : i == 1 ? longrow : (int64_t)(r.next() % 13);
    for (int64_t e = 0; e < cnt; e++) {
      bool dup = e % 4 == 3;
      a.col.push_back(dup ? a.col.back() : (double)(r.next() % (uint64_t)k));
      a.val.push_back(r.uniform(-1, 1));
    }
    a.rowptr.push_back((double)a.col.size());
  }
  return a;
}

static double rel_err(const std::vector<double> &out, const std::vector<double> &ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

// One problem: A (spmm) or A^T through perm (spmm_t) times x, every epilogue tensor, the error flag.
struct Problem {
  const evt_rspec *s;
  int64_t rows, n;
  evt_row_launch_args a;
  std::vector<double> rp, cl, pm, vl, x;  // (the operand as the kernel reads it: A^T's for spmm_t)
  std::vector<std::vector<double>> node_h;
  std::vector<void *> owned;
  int *err = nullptr;
  int64_t k = 0;

  Problem(const evt_rspec *spec, const Csr &A, int64_t n_, Rng &r) : s(spec), n(n_) {
    memset(&a, 0, sizeof a);
    const evt_dtype it = s->idx_dtype;
    const int64_t nnz = (int64_t)A.col.size();
    vl = A.val;
    if (!s->has_perm) {
      rows = A.m, k = A.k, rp = A.rowptr, cl = A.col;
    } else {  // A^T: rows = A's columns, x = dy [A.m, n]
      std::vector<int64_t> irp(A.rowptr.begin(), A.rowptr.end()), icl(A.col.begin(), A.col.end());
      std::vector<int64_t> cp(A.k + 1), ri(nnz + 1), p(nnz + 1);
      char why[160];
      if (evt_csr_transpose(A.m, A.k, nnz, irp.data(), icl.data(), cp.data(), ri.data(), p.data(), why, sizeof why) != EVT_OK) {
        fprintf(stderr, "evt_csr_transpose: %s\n", why);
        exit(2);
      }
      rows = A.k, k = A.m;
      rp.assign(cp.begin(), cp.end());
      cl.assign(ri.begin(), ri.begin() + nnz);
      pm.assign(p.begin(), p.begin() + nnz);
    }
    x.resize((size_t)(k * n));
    for (auto &v : x) v = r.uniform(-1, 1);
    a.m = (int)rows, a.n = (int)n;
    a.csr.rowptr = own(upload(rp, it));
    a.csr.col = own(upload(cl, it));
    a.csr.val = own(upload(vl, s->val_dtype));
    a.csr.x = own(upload(x, s->in_dtype));
    if (s->has_perm) a.csr.perm = own(upload(pm, it));
    a.csr.k = k, a.csr.nnz = nnz;
    CUDA_CHECK(cudaMalloc(&err, sizeof(int)));
    owned.push_back(err);
    a.csr.err = err;
    a.csr.err_code = 42;  // (the runtime would pass the node's id + 1)
    node_h.resize(s->nnodes);
    for (int i = 0; i < s->nnodes; i++) {
      size_t cnt = (size_t)evt_rspec_node_elems(s, i, rows, n);
      if (!cnt) continue;
      node_h[i].assign(cnt, 0.0);
      if (evt_vop_class(s->nodes[i].op) == 'L')
        for (auto &v : node_h[i]) v = r.uniform(-1, 1);
      a.ptrs[i] = evt_vop_class(s->nodes[i].op) == 'L' ? own(upload(node_h[i], s->nodes[i].dtype))
                                                       : own(alloc(cnt * dt_bytes(s->nodes[i].dtype)));
    }
    poison();
  }
  void *own(void *p) {
    owned.push_back(p);
    return p;
  }
  static void *alloc(size_t bytes) {
    void *d;
    CUDA_CHECK(cudaMalloc(&d, bytes + 16));
    return d;
  }
  size_t store_bytes(int i) const { return (size_t)evt_rspec_node_elems(s, i, rows, n) * dt_bytes(s->nodes[i].dtype); }
  void poison() {  // NaN (0xFF bytes) in every output, the error flag cleared
    for (int i = 0; i < s->nnodes; i++)
      if (evt_vop_class(s->nodes[i].op) == 'S') CUDA_CHECK(cudaMemset(a.ptrs[i], 0xFF, store_bytes(i)));
    CUDA_CHECK(cudaMemset(err, 0, sizeof(int)));
  }
  int flag() const {
    int f = -1;
    CUDA_CHECK(cudaMemcpy(&f, err, sizeof f, cudaMemcpyDeviceToHost));
    return f;
  }
  bool reference() {
    evt_rspec_csr c = {k, (int64_t)vl.size(), rp.data(), cl.data(), s->has_perm ? pm.data() : nullptr, vl.data(), x.data()};
    std::vector<double *> t(s->nnodes, nullptr);
    for (int i = 0; i < s->nnodes; i++) t[i] = node_h[i].empty() ? nullptr : node_h[i].data();
    return evt_rspec_reference_csr(s, rows, n, &c, t.data(), 0) == EVT_OK;
  }
  ~Problem() {
    for (void *p : owned) cudaFree(p);
  }
};

static double tol_of(evt_dtype case_dt, evt_dtype store) {
  if (store == EVT_BOOL) return 0;
  return case_dt == EVT_F32 && store == EVT_F32 ? 1e-5 : 1e-2;
}

static void check_case(const SpmmCase &c, int64_t m, int64_t k, int64_t n, int64_t longrow, uint64_t seed) {
  Rng r(seed);
  Csr A = random_csr(m, k, longrow, r);
  Problem P(&c.spec, A, n, r);
  const evt_rspec &s = c.spec;
  int rc1 = c.fn(&P.a);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<unsigned char>> first(s.nnodes);
  for (int i = 0; i < s.nnodes; i++)
    if (evt_vop_class(s.nodes[i].op) == 'S') first[i] = raw(P.a.ptrs[i], P.store_bytes(i));
  P.poison();
  int rc2 = c.fn(&P.a);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaGetLastError());
  const int flag = P.flag();
  const bool ref_ok = P.reference();
  for (int i = 0; i < s.nnodes; i++) {
    if (evt_vop_class(s.nodes[i].op) != 'S') continue;
    auto bytes = raw(P.a.ptrs[i], P.store_bytes(i));
    auto out = values(bytes, (size_t)evt_rspec_node_elems(&s, i, P.rows, n), s.nodes[i].dtype);
    double e = rel_err(out, P.node_h[i]);
    bool same = bytes == first[i];
    report(rc1 == 0 && rc2 == 0 && flag == 0 && ref_ok && same && e <= tol_of(c.dt, s.nodes[i].dtype),
           "%-18s %6lldx%-5lld nnz %-6zu: %-6s (%s) rel err %.3e%s%s (rc %d/%d)", c.label.c_str(), (long long)P.rows,
           (long long)n, A.col.size(), s.nodes[i].name, evt_vop_name(s.nodes[i].op), e,
           same ? "" : "  (second launch differs)", flag ? "  (error flag set)" : "", rc1, rc2);
  }
}

// An index out of range writes the error code into the flag; a missing flag pointer or code is refused. (spmm specs
// only: for spmm_t, evt_csr_transpose refuses the bad column on the host.)
static void check_refusals(const SpmmCase &c) {
  if (c.spec.has_perm) return;
  Rng r(77);
  Csr A = random_csr(40, 30, 20, r);
  A.col[5] = 30;  // column k: out of range
  Problem P(&c.spec, A, 16, r);
  int rc = c.fn(&P.a);
  CUDA_CHECK(cudaDeviceSynchronize());
  report(rc == 0 && P.flag() == 42, "%-18s: column index out of range sets the error flag (rc %d, flag %d)",
         c.label.c_str(), rc, P.flag());
  evt_row_launch_args b = P.a;
  b.csr.err = nullptr;
  rc = c.fn(&b);
  report(rc == EVT_LAUNCH_BAD_ARGS, "%-18s: no error flag pointer rejected (rc %d)", c.label.c_str(), rc);
  b = P.a;
  b.csr.err_code = 0;
  rc = c.fn(&b);
  report(rc == EVT_LAUNCH_BAD_ARGS, "%-18s: error code 0 rejected (rc %d)", c.label.c_str(), rc);
}

// ---- A^T's CSR built on the device by the kernel library -------------------------------------------------------

// The library's entries for the transpose, with a context whose scratch is reserved per problem.
struct Library {
  evt_fb_ctx *ctx = nullptr;
  evt_fb_ctx *(*ctx_new)(char *, size_t) = nullptr;
  int (*reserve)(evt_fb_ctx *, const evt_fb_csr_transpose_args *, char *, size_t) = nullptr;
  int (*transpose)(evt_fb_ctx *, evt_fb_csr_transpose_args *, void *, char *, size_t) = nullptr;
  int (*sync)(void *, int *, char *, size_t) = nullptr;
  bool load() {
    const char *path = getenv("EVT_FALLBACK_LIB") ? getenv("EVT_FALLBACK_LIB") : "build/libevt_fallback.so";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    int (*init)(char *, size_t) = nullptr;
    if (h) {
      *(void **)&init = dlsym(h, "evt_fb_init");
      *(void **)&ctx_new = dlsym(h, "evt_fb_ctx_new");
      *(void **)&reserve = dlsym(h, "evt_fb_csr_reserve");
      *(void **)&transpose = dlsym(h, "evt_fb_csr_transpose");
      *(void **)&sync = dlsym(h, "evt_fb_sync");
    }
    char err[256] = "";
    if (!init || !ctx_new || !reserve || !transpose || !sync || init(err, sizeof err) || !(ctx = ctx_new(err, sizeof err))) {
      fprintf(stderr, "kernel library %s: %s %s\n", path, h ? "" : dlerror(), err);
      return false;
    }
    return true;
  }
};

// A's CSR as the library reads it: rowptr / col in the index dtype, uploaded.
static evt_fb_csr_transpose_args transpose_args(const Csr &A, evt_dtype it, int node, std::vector<void *> &owned) {
  evt_fb_csr_transpose_args t;
  memset(&t, 0, sizeof t);
  std::vector<double> rp = A.rowptr, cl = A.col;
  t.node = node;
  t.idx_dtype = it == EVT_I32 ? EVT_FB_I32 : EVT_FB_I64;
  t.m = A.m, t.k = A.k, t.nnz = (int64_t)A.col.size();
  t.rowptr = upload(rp, it);
  t.col = upload(cl, it);
  owned.push_back((void *)t.rowptr);
  owned.push_back((void *)t.col);
  return t;
}

// Builds A^T on the device (reserve, transpose, sync); rc: the transpose's return code, bad: evt_fb_sync's node.
static int device_transpose(Library &L, evt_fb_csr_transpose_args *t, int *bad) {
  char err[256] = "";
  *bad = -2;
  int rc = L.reserve(L.ctx, t, err, sizeof err);
  if (!rc) rc = L.transpose(L.ctx, t, nullptr, err, sizeof err);
  if (!rc) rc = L.sync(nullptr, bad, err, sizeof err);
  if (rc) fprintf(stderr, "device transpose: rc %d: %s\n", rc, err);
  return rc;
}

// The host structure (P.rp / cl / pm, evt_csr_transpose's) equals the device's t bit for bit: colptr whole, rowidx
// and perm over A^T's e entries.
static bool same_structure(const Problem &P, const evt_fb_csr_transpose_args &t, evt_dtype it) {
  const size_t w = dt_bytes(it), e = (size_t)P.rp.back();
  std::vector<double> cp = P.rp, ri(P.cl.begin(), P.cl.begin() + e), pm(P.pm.begin(), P.pm.begin() + e);
  void *hc = upload(cp, it), *hr = upload(ri, it), *hp = upload(pm, it);  // (the host's, in the device's bytes)
  bool same = raw(t.colptr, cp.size() * w) == raw(hc, cp.size() * w) && raw(t.rowidx, e * w) == raw(hr, e * w) &&
              raw(t.perm, e * w) == raw(hp, e * w);
  CUDA_CHECK(cudaFree(hc));
  CUDA_CHECK(cudaFree(hr));
  CUDA_CHECK(cudaFree(hp));
  return same;
}

// Every store of one launch, as bytes.
static std::vector<std::vector<unsigned char>> run_stores(const SpmmCase &c, Problem &P, int *rc) {
  P.poison();
  *rc = c.fn(&P.a);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<unsigned char>> out(c.spec.nnodes);
  for (int i = 0; i < c.spec.nnodes; i++)
    if (evt_vop_class(c.spec.nodes[i].op) == 'S') out[i] = raw(P.a.ptrs[i], P.store_bytes(i));
  return out;
}

// A with `before` entries ahead of rowptr[0] and `after` past rowptr[m]: not A's, so left out of A^T and never checked
// (half of their columns are out of range).
static void pad_entries(Csr &A, int before, int after, Rng &r) {
  for (auto &p : A.rowptr) p += before;
  auto junk = [&](int i) { return (double)(i % 2 ? A.k + i : (int64_t)(r.next() % (uint64_t)A.k)); };
  for (int i = 0; i < before; i++) A.col.insert(A.col.begin(), junk(i)), A.val.insert(A.val.begin(), 1.0);
  for (int i = 0; i < after; i++) A.col.push_back(junk(i)), A.val.push_back(1.0);
}

// One spmm_t problem over the device-built structure: equal to the host's, outputs equal to the host structure's and
// to themselves over two launches.
static void check_device_case(Library &L, const SpmmCase &c, Csr A, int64_t n, const char *what, uint64_t seed) {
  Rng r(seed);
  Problem P(&c.spec, A, n, r);
  int rc_host = 0, rc1 = 0, rc2 = 0, bad = 0;
  auto host = run_stores(c, P, &rc_host);
  std::vector<void *> owned;
  evt_fb_csr_transpose_args t = transpose_args(A, c.spec.idx_dtype, 7, owned);
  int rc = device_transpose(L, &t, &bad);
  bool same = rc == 0 && same_structure(P, t, c.spec.idx_dtype);
  P.a.csr.rowptr = t.colptr, P.a.csr.col = t.rowidx, P.a.csr.perm = t.perm;
  auto d1 = run_stores(c, P, &rc1), d2 = run_stores(c, P, &rc2);
  report(rc == 0 && bad == -1 && same && rc_host == 0 && rc1 == 0 && rc2 == 0 && d1 == host && d2 == d1 && P.flag() == 0,
         "%-18s device A^T %-12s %6lldx%-6lld nnz %-7zu: structure %s, outputs %s, second run %s (rc %d/%d/%d, flag %d)",
         c.label.c_str(), what, (long long)A.m, (long long)A.k, A.col.size(), same ? "= host" : "DIFFERS",
         d1 == host ? "= host" : "DIFFER", d2 == d1 ? "same" : "DIFFERS", rc, rc1, rc2, bad);
  for (void *p : owned) cudaFree(p);
}

// A bad column or a decreasing rowptr sets the library's flag with the node; a transpose without its scratch reserved
// is refused.
static void check_device_errors(Library &L, evt_dtype it) {
  Rng r(91);
  const char *idx = it == EVT_I32 ? "i32" : "i64";
  for (int bad_rowptr = 0; bad_rowptr < 2; bad_rowptr++) {
    Csr A = random_csr(40, 30, 20, r);
    if (bad_rowptr) A.rowptr[5] = A.rowptr[4] + 100;  // then rowptr[6] < rowptr[5]
    else A.col[5] = 30;                               // column k
    std::vector<void *> owned;
    evt_fb_csr_transpose_args t = transpose_args(A, it, 11, owned);
    int bad = 0, rc = device_transpose(L, &t, &bad);
    report(rc == 0 && bad == 11, "device A^T %s: a %s sets the index flag with the node (rc %d, node %d)", idx,
           bad_rowptr ? "decreasing rowptr" : "column out of range", rc, bad);
    for (void *p : owned) cudaFree(p);
  }
  char err[256] = "";
  evt_fb_ctx *fresh = L.ctx_new(err, sizeof err);
  std::vector<void *> owned;
  Csr A = random_csr(40, 30, 20, r);
  evt_fb_csr_transpose_args t = transpose_args(A, it, 11, owned);
  int rc = fresh ? L.transpose(fresh, &t, nullptr, err, sizeof err) : -1;
  report(rc == 1 && strstr(err, "not reserved"), "device A^T %s: a transpose without reserved scratch is refused (rc %d: %s)",
         idx, rc, err);
  for (void *p : owned) cudaFree(p);  // (the fresh context is left to the process's end)
}

static void check_device_transposes(Library &L, const SpmmCase &c, uint64_t seed) {
  Rng r(seed);
  check_device_case(L, c, random_csr(300, 200, 500, r), 64, "", seed);
  Csr wide = random_csr(50, 5000, 30, r);  // most columns empty
  check_device_case(L, c, wide, 16, "empty cols", seed + 1);
  Csr longcol = random_csr(2000, 300, 40, r);
  for (size_t q = 0; q < longcol.col.size(); q += 2) longcol.col[q] = 17;  // half of all entries in column 17
  check_device_case(L, c, longcol, 100, "long column", seed + 2);
  Csr padded = random_csr(120, 90, 60, r);
  pad_entries(padded, 9, 5, r);
  check_device_case(L, c, padded, 8, "rowptr[0]>0", seed + 3);
  Csr empty{30, 20, std::vector<double>(31, 0.0), {}, {}};
  check_device_case(L, c, empty, 8, "no entries", seed + 4);
  check_device_case(L, c, random_csr(20000, 20000, 7, r), 64, "20000^2", seed + 5);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: check_spmm emit|check DIR\n");
    return 2;
  }
  std::vector<SpmmCase> cases = all_cases();
  if (!strcmp(argv[1], "emit")) {
    for (auto &c : cases) {
      char err[256];
      char *src = evt_emit_rows(&c.spec, err, sizeof err);
      std::string path = std::string(argv[2]) + "/" + c.name + ".cu";
      FILE *f = src ? fopen(path.c_str(), "w") : nullptr;
      if (!f || fputs(src, f) < 0) {
        fprintf(stderr, "emit %s: %s\n", c.label.c_str(), src ? "cannot write" : err);
        return 2;
      }
      fclose(f);
      free(src);
    }
    printf("%zu sources written\n", cases.size());
    return 0;
  }
  for (auto &c : cases) {
    std::string so = std::string(argv[2]) + "/" + c.name + ".so";
    void *h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    c.fn = h ? (row_fn)dlsym(h, c.name.c_str()) : nullptr;
    if (!c.fn) fprintf(stderr, "load %s: %s\n", so.c_str(), dlerror());
  }
  // (M, K, N, long row): GCN-like widths, N % 8 != 0, N = 1, a wide row, more rows than a wave of CTAs
  const int64_t sizes[][4] = {{300, 200, 64, 500}, {257, 257, 349, 40}, {37, 50, 100, 9}, {129, 64, 1, 64},
                              {64, 100, 8, 1000},  {33, 40, 1000, 30},  {20000, 20000, 64, 7}};
  uint64_t seed = 1;
  for (auto &c : cases) {
    if (!c.fn) {
      report(false, "%-18s: not compiled", c.label.c_str());
      continue;
    }
    for (auto &sz : sizes) check_case(c, sz[0], sz[1], sz[2], sz[3], seed++);
    check_refusals(c);
  }
  Library lib;
  bool have_lib = lib.load();
  report(have_lib, "the kernel library's device transpose (evt_fb_csr_transpose) loaded");
  for (auto &c : cases)
    if (have_lib && c.fn && c.spec.has_perm) check_device_transposes(lib, c, seed += 10);
  if (have_lib) check_device_errors(lib, EVT_I64), check_device_errors(lib, EVT_I32);
  return report_summary();
}
