// GPU check of generated row kernels (src/codegen/emit_rows.c) against the CPU reference (evt_rspec_reference,
// src/codegen/rspec.c); run by tests/gpu/run.sh.
//   check_rows emit DIR    writes the generated sources
//   check_rows check DIR   runs the checks on DIR/<kernel>.so; prints "N passed, N failed"
// Every case of all_row_cases() (softmax and its backward, layer norms with affine, stats, residual, the layer-norm
// backward with fused dγ/dβ sums, nucleus-free chains with row sums; bf16, f32, f16) at sizes that reach every
// kernel path (element path, several rows per warp, every (warps, chunks) configuration, long rows, column blocks):
// NaN-poisoned outputs, two launches that must agree bit for bit, every output within a relative Frobenius error of
// 1e-2 for 16-bit storage and 1e-5 for f32 (a NaN/inf never passes). A kernel with row sums must reject an N beyond
// the register-resident limit (EVT_LAUNCH_CANNOT_IMPLEMENT), and every kernel a NULL tensor (EVT_LAUNCH_BAD_ARGS).
#include <cstdarg>

#include "rows_gpu.h"

#include "check_report.h"

static double rel_err(const std::vector<double> &out, const std::vector<double> &ref, double *maxabs) {
  double num = 0, den = 0;
  *maxabs = 0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i])) {
      *maxabs = INFINITY;
      return INFINITY;
    }
    double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (fabs(d) > *maxabs) *maxabs = fabs(d);
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_case(const RowCase &c, int m, int n, uint64_t seed) {
  RowProblem P(&c.spec, m, n, seed);
  const evt_rspec &s = c.spec;
  const double tol = store_tol(c.dt, EVT_F32);  // (mean / rstd)
  int rc = c.fn(&P.args);
  CUDA_CHECK(cudaDeviceSynchronize());
  if (rc != EVT_LAUNCH_OK) {
    report(false, "%-22s %6dx%-6d: launcher returned %d", c.label.c_str(), m, n, rc);
    return;
  }
  // first results, then a second launch into re-poisoned outputs
  std::vector<std::vector<double>> first(s.nnodes);
  for (int i = 0; i < s.nnodes; i++)
    if (evt_vop_class(s.nodes[i].op) == 'S')
      first[i] = download(P.args.ptrs[i], (size_t)evt_rspec_node_elems(&s, i, m, n), s.nodes[i].dtype);
  P.poison();
  rc = c.fn(&P.args);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaGetLastError());
  P.reference();
  double mx;
  for (int i = 0; i < s.nnodes; i++) {
    if (evt_vop_class(s.nodes[i].op) != 'S') continue;
    auto out = download(P.args.ptrs[i], (size_t)evt_rspec_node_elems(&s, i, m, n), s.nodes[i].dtype);
    double e = rel_err(out, P.node_h[i], &mx);
    const double tol_i = store_tol(c.dt, s.nodes[i].dtype);
    bool same = out.size() == first[i].size() && memcmp(out.data(), first[i].data(), out.size() * sizeof(double)) == 0;
    report(e <= tol_i && same && rc == 0, "%-22s %6dx%-6d: %-7s (%s) rel err %.3e max abs %.3e%s", c.label.c_str(), m, n,
           s.nodes[i].name, evt_vop_name(s.nodes[i].op), e, mx, same ? "" : "  (second launch differs)");
  }
  if (s.store_stats) {
    double e1 = rel_err(download(P.args.mean, m, EVT_F32), P.mean_h, &mx);
    double e2 = rel_err(download(P.args.rstd, m, EVT_F32), P.rstd_h, &mx);
    report(e1 <= tol && e2 <= tol, "%-22s %6dx%-6d: mean/rstd rel err %.3e / %.3e", c.label.c_str(), m, n, e1, e2);
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: check_rows emit|check DIR\n");
    return 2;
  }
  std::vector<RowCase> cases = all_row_cases();
  if (!strcmp(argv[1], "emit")) {
    emit_all(cases, argv[2]);
    printf("%zu sources written\n", cases.size());
    return 0;
  }
  load_all(cases, argv[2]);
  // (M, N): aligned BERT-like; N % 8 != 0 (element path); short rows (1 warp); N = 1; 2 and 4 chunks per thread
  // short rows of nucleus-free kernels without per-row reductions (row_kernel_cols, several rows side by side): 64
  // (32 per CTA), 128, 24 (10 of 256 threads idle), 8 with many row slices; each M leaves a partial last step
  const int sizes[][2] = {{300, 1024}, {37, 1000}, {129, 100}, {5, 1},     {64, 520},   {17, 5000},
                          {9, 20000},  {4099, 64}, {2001, 128}, {333, 24}, {70001, 8}};
  uint64_t seed = 1;
  for (auto &c : cases) {
    if (!c.fn) {
      report(false, "%-22s: not compiled", c.label.c_str());
      continue;
    }
    for (auto &sz : sizes) check_case(c, sz[0], sz[1], seed++);
  }
  // long rows (N > 32768: the streamed one-CTA-per-row kernel) for every kernel without a sum over rows: aligned,
  // N % 8 != 0 (element path), and more rows than one wave of resident CTAs (the grid-stride loop)
  const int long_sizes[][2] = {{6, 40000}, {5, 50257}, {300, 33000}};
  // (kernels with sums over M too when nucleus-free without a per-row reduction: the column-block kernel)
  for (auto &c : cases) {
    if (!c.fn || !evt_rspec_long_rows(&c.spec)) continue;
    for (auto &sz : long_sizes) check_case(c, sz[0], sz[1], seed++);
  }
  // launcher refusals
  for (auto &c : cases) {
    if (c.example != "layernorm_bwd" || c.dt != EVT_BF16 || !c.fn) continue;
    RowProblem P(&c.spec, 4, 64, 99);
    evt_row_launch_args a = P.args;
    a.n = 40000;
    int rc = c.fn(&a);
    report(rc == EVT_LAUNCH_CANNOT_IMPLEMENT, "%-22s: N=40000 rejected (rc %d)", c.label.c_str(), rc);
    a = P.args;
    a.in[1] = nullptr;
    rc = c.fn(&a);
    report(rc == EVT_LAUNCH_BAD_ARGS, "%-22s: NULL x rejected (rc %d)", c.label.c_str(), rc);
    a = P.args;
    a.m = 0;
    rc = c.fn(&a);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto dg = download(a.ptrs[5], 64, EVT_F32);
    bool zero = rc == 0;
    for (double v : dg) zero = zero && v == 0;
    report(zero, "%-22s: M=0 gives zero column sums (rc %d)", c.label.c_str(), rc);
  }
  return report_summary();
}
