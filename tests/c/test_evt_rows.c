/* Row-kernel specs (src/codegen/rspec.c), the row emitter (src/codegen/emit_rows.c) and the CPU reference of
 * reduce-apply nuclei and nucleus-free groups. No GPU needed; tests/gpu/check_rows.cu runs the kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/examples.h"
#include "codegen/kspec.h"
#include "codegen/rspec.h"
#include "philox.h"
#include "evt_row_config.h"
#include "test.h"

TEST(rspec_add_rejects_bad_inputs) {
  evt_rspec s;
  evt_rspec_init(&s, EVT_ROWN_SOFTMAX, EVT_BF16);
  int acc = evt_rspec_acc(&s, EVT_RV_OUT);
  CHECK(acc == 0);
  CHECK(evt_rspec_add(&s, EVT_V_ADD, acc, 3, EVT_F32, NULL) == -1);    /* forward reference */
  CHECK(evt_rspec_add(&s, EVT_V_RELU, acc, acc, EVT_F32, NULL) == -1); /* unary with two inputs */
  CHECK(evt_rspec_add(&s, EVT_V_MUL, acc, -1, EVT_F32, NULL) == -1);   /* binary with one */
  CHECK(evt_rspec_add(&s, EVT_V_ROW_SUM, acc, -1, EVT_BF16, "s") == 1);
  CHECK(s.nodes[1].dtype == EVT_BF16); /* sums keep their storage dtype (f32 accumulation, rounded at the store) */
  CHECK(evt_rspec_add(&s, EVT_V_EXP, acc, -1, EVT_BF16, NULL) == 2 && s.nodes[2].dtype == EVT_F32); /* computes: f32 */
  CHECK(evt_rspec_add(&s, EVT_V_WHERE, acc, 2, EVT_F32, NULL) == -1);           /* ternary with two inputs */
  CHECK(evt_rspec_add3(&s, EVT_V_ADD, acc, 2, 2, EVT_F32, NULL) == -1);         /* binary with three */
  CHECK(evt_rspec_add3(&s, EVT_V_WHERE, acc, 2, acc, EVT_F32, NULL) == 3);
}

static evt_status chk(const evt_rspec *s, char *err) { return evt_rspec_check(s, err, 256); }

TEST(rspec_check_messages) {
  evt_rspec s;
  char err[256];
  evt_rspec_init(&s, EVT_ROWN_SOFTMAX, EVT_BF16);
  evt_rspec_acc(&s, EVT_RV_OUT);
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "no outputs"));
  evt_rspec_add(&s, EVT_V_AUX_STORE, 0, -1, EVT_BF16, "y");
  CHECK(chk(&s, err) == EVT_OK);
  s.nodes[0].sel = EVT_RV_XHAT;
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "softmax has no value 'xhat'"));
  s.nodes[0].sel = EVT_RV_IN1;
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "'in1'"));
  s.nucleus = EVT_ROWN_SOFTMAX_BWD;
  CHECK(chk(&s, err) == EVT_OK);
  s.nucleus = EVT_ROWN_NONE;
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "acc in a nucleus-free group"));
  s.nucleus = EVT_ROWN_SOFTMAX;
  s.nodes[0].sel = EVT_RV_OUT;
  s.in_dtype = EVT_I32;
  CHECK(chk(&s, err) == EVT_ERR_UNSUPPORTED && strstr(err, "bf16, f16 or f32"));
  s.in_dtype = EVT_BF16;
  s.has_w = 1;
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "softmax takes no weight"));
  s.has_w = 0;
  s.store_stats = 1;
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "only layernorm stores statistics"));
  s.store_stats = 0;
  s.nodes[1].dtype = EVT_I64; /* integer stores are fine in row kernels (values in doubles); one_hot storage is not */
  CHECK(chk(&s, err) == EVT_OK);
  s.nodes[1].dtype = EVT_F16;
  int oh = evt_rspec_add(&s, EVT_V_ONE_HOT, -1, -1, EVT_F32, "oh");
  CHECK(chk(&s, err) == EVT_ERR_UNSUPPORTED && strstr(err, "one_hot oh") && strstr(err, "dtype f32"));
  s.nnodes = oh;
  s.nodes[1].dtype = EVT_F16;
  evt_rspec_add(&s, EVT_V_AUX_LOAD, -1, -1, EVT_BF16, "y");
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "name 'y' used twice"));
  snprintf(s.nodes[2].name, sizeof s.nodes[2].name, "1bad");
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "not an identifier"));

  evt_rspec_init(&s, EVT_ROWN_LAYERNORM, EVT_F32);
  s.store_stats = 1; /* statistics alone are an output */
  CHECK(chk(&s, err) == EVT_OK);
  s.has_b = 1;
  CHECK(chk(&s, err) == EVT_ERR_UNSUPPORTED && strstr(err, "bias needs a weight"));
  s.has_w = 1;
  CHECK(chk(&s, err) == EVT_OK);
  s.eps = 0;
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "eps"));
  evt_rspec_init(&s, EVT_ROWN_LAYERNORM_BWD, EVT_F32);
  s.has_b = 1;
  evt_rspec_add(&s, EVT_V_AUX_STORE, evt_rspec_acc(&s, EVT_RV_OUT), -1, EVT_F32, "dx");
  CHECK(chk(&s, err) == EVT_ERR_INVALID && strstr(err, "layernorm_bwd takes no bias"));
}

TEST(rspec_examples_valid_and_hash_stable) {
  char err[256];
  for (int k = 0; evt_rspec_example_names[k]; k++) {
    evt_rspec a, b;
    CHECK(evt_rspec_example(&a, evt_rspec_example_names[k], EVT_BF16) == EVT_OK);
    CHECK_MSG(evt_rspec_check(&a, err, sizeof err) == EVT_OK, "%s: %s", evt_rspec_example_names[k], err);
    evt_rspec_example(&b, evt_rspec_example_names[k], EVT_BF16);
    CHECK(evt_rspec_hash(&a) == evt_rspec_hash(&b));
    evt_rspec_example(&b, evt_rspec_example_names[k], EVT_F32);
    CHECK(evt_rspec_hash(&a) != evt_rspec_hash(&b));
  }
  evt_rspec s, t;
  CHECK(evt_rspec_example(&s, "nope", EVT_BF16) == EVT_ERR_INVALID);
  evt_rspec_example(&s, "layernorm", EVT_BF16);
  t = s;
  t.eps = 1e-6;
  CHECK(evt_rspec_hash(&s) != evt_rspec_hash(&t));
  t = s;
  t.store_stats = 0;
  CHECK(evt_rspec_hash(&s) != evt_rspec_hash(&t));
  char name[40], text[1024];
  evt_rspec_kernel_name(&s, name);
  CHECK(strncmp(name, "evt_rowkernel_", 14) == 0 && strlen(name) == 14 + 16);
  evt_rspec_text(&s, text, sizeof text);
  CHECK(strstr(text, "rows layernorm in:bf16 w:bf16 +w +b +stats eps 1") != NULL);
  CHECK(strstr(text, "%0 = acc.out\n%1 = aux_store %0 y:bf16\n") != NULL);
}

/* Whether text a has fmt with the integer v in it. */
static bool has_int(const char *a, const char *fmt, int v) {
  char line[128];
  snprintf(line, sizeof line, fmt, v);
  return a && strstr(a, line) != NULL;
}

/* rand in row kernels: the register and column-block kernels draw a thread's 8 consecutive elements before the
 * element loop, four per Philox call (evt_rows::rand8); the long-row kernel, whose elements may be T apart, one
 * call per element; the CPU reference is the interpreter's convention (kernels/philox.h) */
TEST(emit_rows_draws_rand_before_the_element_loop) {
  char err[256];
  evt_rspec s;
  CHECK(evt_rspec_example(&s, "cmp_where", EVT_BF16) == EVT_OK);
  char *a = evt_emit_rows(&s, err, sizeof err);
  CHECK_MSG(a != NULL, "%s", err);
  int r89 = -1, r0 = -1;
  for (int i = 0; i < s.nnodes; i++)
    if (s.nodes[i].op == EVT_V_RAND) *(s.nodes[i].offset ? &r89 : &r0) = i;
  CHECK(r89 >= 0 && r0 >= 0);
  char want[160];
  snprintf(want, sizeof want, "evt_rows::rand8<__nv_bfloat16>(p.seed%d, p.offset%d, rng_step, (unsigned long long)row * n + j0, R%d);",
           r0, r0, r0); /* seed and offset: launch arguments (evt_row_launch_args.rng) */
  const char *first = a ? strstr(a, want) : NULL, *second = first ? strstr(first + 1, want) : NULL;
  CHECK(first && second && !strstr(second + 1, want)); /* the register and the column-block kernels */
  snprintf(want, sizeof want, "const auto v%d = R%d[e];  // rand", r0, r0);
  CHECK(a && strstr(a, want));
  snprintf(want, sizeof want, "evt_rows::rand_u<__nv_bfloat16>(p.seed%d, p.offset%d, rng_step, (unsigned long long)row * n + j0 + e * es);",
           r89, r89);
  const char *lg = a ? strstr(a, want) : NULL;
  CHECK(lg && !strstr(lg + 1, want)); /* the long-row kernel only */
  /* the reference: element (i, j) of a row of n is stream element offset + i·n + j */
  CHECK(evt_vop_rand(424242, 0, 3, EVT_F32, 7 * 1024 + 5) == (double)evt_philox_uniform(424242, 0, 3, 7 * 1024 + 5));
  free(a);
}

/* A scalar of -inf / nan (HF BERT's masks compare with -inf) is emitted as an expression nvcc takes: printf's "inf"
 * is no C++ identifier (the kernel failed to compile and its group ran node by node). */
TEST(emit_rows_infinite_scalars) {
  char num[32], err[256];
  CHECK(!strcmp(evt_cxx_double(-INFINITY, num), "-__builtin_huge_val()"));
  CHECK(!strcmp(evt_cxx_double(INFINITY, num), "__builtin_huge_val()"));
  CHECK(!strcmp(evt_cxx_double(NAN, num), "__builtin_nan(\"\")"));
  CHECK(!strcmp(evt_cxx_double(0.5, num), "0.5"));
  evt_rspec s;
  evt_rspec_init(&s, EVT_ROWN_SOFTMAX, EVT_BF16);
  int sc = evt_rspec_scalar(&s, -INFINITY);
  CHECK(sc >= 0);
  int mx = evt_rspec_add(&s, EVT_V_MAXIMUM, evt_rspec_acc(&s, EVT_RV_OUT), sc, EVT_F32, NULL);
  evt_rspec_add(&s, EVT_V_AUX_STORE, mx, -1, EVT_BF16, "y");
  CHECK_MSG(evt_rspec_check(&s, err, sizeof err) == EVT_OK, "%s", err);
  char *a = evt_emit_rows(&s, err, sizeof err);
  CHECK_MSG(a != NULL, "%s", err);
  CHECK(a && strstr(a, "(float)(-__builtin_huge_val())") && !strstr(a, "(-inf)"));
  free(a);
}

TEST(emit_rows_structure) {
  char err[256], name[40];
  evt_rspec s;
  evt_rspec_example(&s, "layernorm_bwd", EVT_BF16);
  char *a = evt_emit_rows(&s, err, sizeof err), *b = evt_emit_rows(&s, err, sizeof err);
  CHECK(a && b && strcmp(a, b) == 0); /* deterministic */
  evt_rspec_kernel_name(&s, name);
  char sig[96];
  snprintf(sig, sizeof sig, "extern \"C\" int %s(const evt_row_launch_args *a)", name);
  CHECK(strncmp(a, "// GENERATED by evt", 19) == 0);
  CHECK(strstr(a, sig) != NULL);
  CHECK(strstr(a, "#include \"evt_rows.cuh\"") != NULL);
  CHECK(strstr(a, "evt_rows::layernorm_bwd<WARPS, VPT, true>(nu_in0, nu_in1, nu_w,") != NULL);
  /* the next row's dy and x are fetched before the current row is reduced */
  const char *pf = strstr(a, "evt_rows::fetch_row<T, VPT, EXF>(p.x + (nlive ? nrow * n : 0)");
  CHECK(pf && strstr(pf, "layernorm_bwd<WARPS") != NULL);
  /* EX kernels (the row fills the group exactly) take every chunk as a full vector without a bounds test */
  CHECK(strstr(a, "const bool full = EXF || (vec && j0 + 8 <= n);") != NULL);
  CHECK(strstr(a, "evt_rows::load_row<T, VPT>(p.w, n, t, true, vec, nu_w);") != NULL);
  CHECK(strstr(a, "launch_rowsum_finalize(dim3((p.n + 31) / 32, 2), st,") != NULL);
  /* the finalize may launch early (PDL) only after the partial flush begins */
  const char *trig = strstr(a, "evt_rows::trigger_dependents();");
  CHECK(trig && strstr(trig, "rsum.flush(p.ws + (size_t)blockIdx.x * n, (size_t)gridDim.x * n, n, g, t);") != NULL);
  /* a chunk's row-sum terms (0 past the row) are added with one vector read-modify-write per sum */
  CHECK(strstr(a, "RS5[e] = ok ? (float)v4 : 0.f;  // dgamma") != NULL);
  CHECK(strstr(a, "RS6[e] = ok ? (float)v2 : 0.f;  // dbeta") != NULL);
  CHECK(strstr(a, "rsum.add8(0, v, RS5);") != NULL);
  CHECK(strstr(a, "rsum.add8(1, v, RS6);") != NULL);
  /* w is staged in shared memory only from EVT_ROWS_WB_SMEM_VPT chunks per thread, for rows of <= 2048 */
  CHECK(strstr(a, "constexpr bool WB_SMEM = !LN_LATE && VPT >= EVT_ROWS_WB_SMEM_VPT && T * VPT <= 256;") != NULL);
  /* EVT_ROWS_LNB_LATE (a measured knob, off): w read per chunk by the reductions and again for dx */
  CHECK(has_int(a, "#define EVT_ROWS_LNB_LATE %d\n", EVT_ROWS_DEFAULT_LNB_LATE));
  CHECK(strstr(a, "constexpr bool LN_LATE = EVT_ROWS_LNB_LATE != 0;") != NULL);
  CHECK(strstr(a, "evt_rows::layernorm_bwd_stats<WARPS, VPT, true>(nu_in0, nu_in1, p.w, vec, p.eps,") != NULL);
  CHECK(strstr(a, "nu_out[v][e] = ok ? lnb_rs * (__fmul_rn(nu_in0[v][e], w8[e]) - lnb_mg - nu_in1[v][e] * lnb_mgx) : 0.f;") != NULL);
  CHECK(strstr(a, "evt_rows::smem_row<T, VPT>(wb_s[0], t, nu_w);") != NULL);
  CHECK(strstr(a, "using RSumsOf = evt_rows::RowSums<WARPS * 32, VPT, R, 2,") != NULL);
  CHECK(strstr(a, "evt_rows::launch_main(row_kernel<WARPS, VPT, R, EX>, grid, WARPS * 32 * R, SMEM, st, p);") != NULL);
  /* programmatic dependent launch: the wait comes before the first global access (w, then the first rows); with
   * row sums the next kernel is released only at the flush (the finalize reads the partials) */
  const char *wt = strstr(a, "evt_rows::wait_prior_grids();");
  CHECK(wt && strstr(a, "p.w") > wt && strstr(a, "evt_rows::fetch_row") > wt);
  CHECK(strstr(a, "evt_rows::release_dependents();") == NULL);
  CHECK(strstr(a, "return EVT_ROWS_EXACT && p.vec && p.n == 1024 ? launch<4, 1, EVT_ROWS_EXACT != 0>(p, st) : launch<4, 1, false>(p, st);") != NULL);
  CHECK(strstr(a, "const auto v4 = v2 * v3;") != NULL); /* auto: float, or double for integer tensors */
  CHECK(strstr(a, "evt_rows::store8(p.n1_dx + ro, j0, n, full, S1);") != NULL);
  CHECK(strstr(a, "atomic") == NULL); /* row sums are a deterministic two-pass */
  CHECK(strstr(a, "__launch_bounds__(WARPS * 32 * R, EVT_ROWS_MINB_SUM) row_kernel") != NULL);
  /* row sums: no long-row kernel; rows past 32768 are refused */
  CHECK(strstr(a, "row_kernel_long") == NULL && strstr(a, "launch_long") == NULL);
  CHECK(strstr(a, "&warps, &vpt)) return EVT_LAUNCH_CANNOT_IMPLEMENT;\n") != NULL);
  /* every tuning macro gets its default from evt_row_config.h */
  CHECK(has_int(a, "#define EVT_ROWS_MINB_SUM %d\n", EVT_ROWS_DEFAULT_MINB_SUM));
  CHECK(has_int(a, "#define EVT_ROWS_EXACT %d\n", EVT_ROWS_DEFAULT_EXACT));
  CHECK(has_int(a, "#define EVT_ROWS_WAVES_W1 %d\n", EVT_ROWS_DEFAULT_WAVES_W1));
  /* row sums: the grid is capped at EVT_ROWS_WAVES_SUM waves whatever the warps per row (partials per CTA) */
  CHECK(strstr(a, "constexpr int WAVES = EVT_ROWS_WAVES_SUM;") != NULL);
  /* layer-norm backward (row sums): the heavy rule for one warp per row */
  CHECK(has_int(a, "constexpr int kWarpVpt = %d;\n", EVT_ROWS_DEFAULT_WARP_VPT));
  /* a layer norm without other M×N inputs: at least EVT_ROWS_DEFAULT_MIN_VPT_LN chunks per thread past one warp;
   * the (2, 2) / (4, 2) kernels instantiated for it, the several-warp single-chunk ones only on request */
  CHECK(has_int(a, "constexpr int kMinVpt = %d;\n", EVT_ROWS_DEFAULT_MIN_VPT_LN));
  CHECK(strstr(a, "evt_row_pick_config(p.n, kWarpVpt, EVT_ROWS_W1CAP, kMinVpt, &warps, &vpt)") != NULL);
  CHECK(strstr(a, "#if EVT_ROWS_INST(2, 2) && (!defined(EVT_ROWS_MIN_VPT) || EVT_ROWS_MIN_VPT == 2)\n  if (warps == 2 && vpt == 2)\n") != NULL);
  CHECK(strstr(a, "#if EVT_ROWS_INST(4, 1) && defined(EVT_ROWS_MIN_VPT) && EVT_ROWS_MIN_VPT != 2\n") != NULL);
  CHECK(strstr(a, "#if EVT_ROWS_INST(16, 4)\n") != NULL);
  /* row sums: the first EVT_ROWS_SUM_REGS (EX kernels: EVT_ROWS_SUM_REGS_EX) in registers, the rest in shared
   * memory when it fits */
  CHECK(strstr(a, "constexpr int kSumRegsOf = (EX ? EVT_ROWS_SUM_REGS_EX : EVT_ROWS_SUM_REGS) < 2\n"
                  "                                ? (EX ? EVT_ROWS_SUM_REGS_EX : EVT_ROWS_SUM_REGS) : 2;") != NULL);
  CHECK(strstr(a, "template <int WARPS, int VPT, int R, bool EX, int K = kSumRegsOf<EX && VPT >= 2>>") != NULL);
  CHECK(strstr(a, "(size_t)(2 - K) * VPT * 8 * WARPS * 32 * R * 4 <= 98304 ? K : 2>;") != NULL);
  CHECK(strstr(a, "using RSums = RSumsOf<WARPS, VPT, R, EX>;") != NULL &&
        strstr(a, "constexpr size_t SMEM = RSumsOf<WARPS, VPT, R, EX>::smem_bytes();") != NULL);
  /* exact-size kernels of 16-bit rows keep EVT_ROWS_DEFAULT_SUM_REGS_EX sums in registers; f32 rows (twice the
   * registers) and mixed ones the default of the others */
  char want[96];
  snprintf(want, sizeof want, "#define EVT_ROWS_SUM_REGS_EX %d\n", EVT_ROWS_DEFAULT_SUM_REGS_EX);
  CHECK(strstr(a, want) != NULL);
  {
    const char *const others[] = {"layernorm_bwd", "layernorm_bwd_mixed"};
    const evt_dtype dts[] = {EVT_F32, EVT_BF16};
    snprintf(want, sizeof want, "#define EVT_ROWS_SUM_REGS_EX %d\n", EVT_ROWS_DEFAULT_SUM_REGS);
    for (int k = 0; k < 2; k++) {
      evt_rspec o;
      evt_rspec_example(&o, others[k], dts[k]);
      char *c = evt_emit_rows(&o, err, sizeof err);
      CHECK_MSG(c && strstr(c, want), "%s: f32 rows keep their sums in shared memory", others[k]);
      free(c);
    }
  }
  free(a);
  free(b);
  evt_rspec_example(&s, "ln_residual", EVT_BF16);
  a = evt_emit_rows(&s, err, sizeof err);
  /* LN_LATE (off by default with a residual input): mean / rstd only, then per chunk x̂ and y = x̂·w + b with that
   * chunk's w / b loaded there */
  CHECK(a && strstr(a, "constexpr bool kLnLate = EVT_ROWS_LN_LATE >= 0 ? EVT_ROWS_LN_LATE != 0 : false;") != NULL);
  CHECK(a && strstr(a, "constexpr bool LN_LATE = kLnLate;") != NULL);
  CHECK(a && strstr(a, "evt_rows::ln_moments<WARPS, VPT>(nu_in0, p.eps, &mean, &rstd, n, t, rk);") != NULL);
  CHECK(a && strstr(a, "evt_rows::load8(p.b, j0, n, full, b8);") != NULL);
  CHECK(a && strstr(a, "nu_xhat[v][e] = j0 + e < n ? (nu_in0[v][e] - mean) * rstd : 0.f;") != NULL);
  CHECK(a && strstr(a, "nu_out[v][e] = nu_xhat[v][e] * w8[e] + b8[e];") != NULL);
  CHECK(a && has_int(a, "constexpr int kCtaWarpsW1 = EVT_ROWS_CTA_WARPS_W1 > 0 ? EVT_ROWS_CTA_WARPS_W1 : %d;\n",
                     EVT_ROWS_DEFAULT_CTA_WARPS));
  CHECK(a && strstr(a, "constexpr int kMinVpt = 1;\n") != NULL); /* a residual input: one chunk per thread */
  CHECK(a && strstr(a, "#if EVT_ROWS_INST(2, 2) && defined(EVT_ROWS_MIN_VPT) && EVT_ROWS_MIN_VPT == 2\n") != NULL);
  CHECK(a && strstr(a, "#if EVT_ROWS_INST(4, 1) && (!defined(EVT_ROWS_MIN_VPT) || EVT_ROWS_MIN_VPT != 2)\n") != NULL);
  free(a);
  /* a plain layer norm: one warp x 4 chunks, late w / b, 4-warp CTAs, at least 8 per SM */
  evt_rspec_example(&s, "layernorm", EVT_BF16);
  a = evt_emit_rows(&s, err, sizeof err);
  CHECK(a && has_int(a, "constexpr int kWarpVpt = %d;\n", EVT_ROWS_DEFAULT_WARP_VPT_LN));
  CHECK(a && strstr(a, "constexpr bool kLnLate = EVT_ROWS_LN_LATE >= 0 ? EVT_ROWS_LN_LATE != 0 : true;") != NULL);
  CHECK(a && has_int(a, "constexpr int kMinbW1 = EVT_ROWS_MINB_W1 > 0 ? EVT_ROWS_MINB_W1 : %d;\n", EVT_ROWS_DEFAULT_MINB_W1_LN));
  CHECK(a && has_int(a, "constexpr int kCtaWarpsW1 = EVT_ROWS_CTA_WARPS_W1 > 0 ? EVT_ROWS_CTA_WARPS_W1 : %d;\n",
                     EVT_ROWS_DEFAULT_CTA_WARPS_W1));
  /* one pass: no prefetch of a second row unless asked for, and the row loop left after its only row */
  CHECK(a && strstr(a, "constexpr bool ONE = WARPS == 1 && EVT_ROWS_WAVES_W1 == 0 && EVT_ROWS_ONE_RING == 0;") != NULL);
  CHECK(a && strstr(a, "    if constexpr (ONE) break;") != NULL);
  free(a);
  evt_rspec_example(&s, "softmax_bwd", EVT_BF16); /* no other M×N input: one warp per row up to 4 chunks per lane */
  a = evt_emit_rows(&s, err, sizeof err);
  CHECK(a && has_int(a, "constexpr int kWarpVpt = %d;\n", EVT_ROWS_DEFAULT_WARP_VPT_LIGHT));
  free(a);
  /* nucleus-free with a Σ over M and no per-row reduction: rows past 32768 run as the column-block kernel (the sums
   * in registers over a slice of rows, one partial per slice, then the finalize); no long-row kernel */
  evt_rspec_example(&s, "bce_bias_grad", EVT_BF16);
  a = evt_emit_rows(&s, err, sizeof err);
  CHECK(a && strstr(a, "row_kernel_long") == NULL);
  CHECK(a && strstr(a, "&warps, &vpt))  // longer than the register configurations take\n    return launch_cols(p, st);\n"));
  const char *ck = a ? strstr(a, "row_kernel_cols(Params p) {") : NULL;
  CHECK(ck != NULL);
  if (ck) {
    CHECK(strstr(ck, "const int j0 = (blockIdx.x * cw + c) * 8;  // this thread's 8 columns") != NULL);
    /* U rows' loads issued before their epilogues; short rows side by side, their sums added in order */
    const char *f = strstr(ck, "evt_rows::fetch8s(p.n0_x + (ok ? row * n : 0), j0, es, ok ? lim : 0, full && ok, f_L0[u]);");
    CHECK(f && strstr(ck, "evt_rows::Raw8<__nv_bfloat16> c_L0[1] = {f_L0[u]};") > f);
    CHECK(strstr(ck, "for (int q = 0; q < S; q++) a += cred[e * T + q * cw + c];") != NULL);
    CHECK(strstr(ck, "for (int e = 0; e < 8; e++) rsa0[e] += RS7[e];") != NULL);
    CHECK(strstr(ck, "p.ws[((size_t)0 * gridDim.y + blockIdx.y) * n + j0 + e] = rsa0[e];") != NULL);
    const char *cw = strstr(ck, "evt_rows::wait_prior_grids();"), *tr = strstr(ck, "evt_rows::trigger_dependents();");
    CHECK(cw && strstr(ck, "p.n0_x") > cw && tr && strstr(ck, "p.ws[") > tr);
  }
  CHECK(a && strstr(a, "evt_rows::launch_rowsum_finalize(dim3((p.n + 31) / 32, 1), st, p.ws, parts, p.n, outs);") != NULL);
  /* with sums over M every row the register configurations would take goes to the same kernel (by default), before
   * they are considered; short rows in one wave of resident CTAs */
  const char *pk = a ? strstr(a, "if (EVT_ROWS_PACK_CHUNKS_SUM > 0 && (p.n + 7) / 8 <= EVT_ROWS_PACK_CHUNKS_SUM)") : NULL;
  CHECK(pk && strstr(pk, "evt_row_pick_config(") != NULL);
  CHECK(a && strstr(a, "long long gy = S > 1 && EVT_ROWS_PACK_ONE_WAVE ? (long long)sms * occ : ((long long)sms * 8 + gx - 1) / gx,"));
  free(a);
  /* nucleus-free without sums: short rows in the column-block kernel (no workspace, no finalize; it releases the
   * next kernel at once), long rows still in the long-row kernel, row broadcasts loaded once per thread */
  evt_rspec_example(&s, "gelu_bwd", EVT_BF16);
  a = evt_emit_rows(&s, err, sizeof err);
  CHECK(a && strstr(a, "row_kernel_long") != NULL && strstr(a, "g_ws") == NULL && strstr(a, "launch_rowsum_finalize") == NULL);
  ck = a ? strstr(a, "row_kernel_cols(Params p) {") : NULL;
  CHECK(ck && strstr(ck, "evt_rows::release_dependents();") != NULL);
  CHECK(ck && strstr(ck, "evt_rows::load8s(p.n2_bias, j0, es, lim, full, L2[0]);") < strstr(ck, "for (long long rb ="));
  CHECK(a && strstr(a, "if (EVT_ROWS_PACK_CHUNKS > 0 && (p.n + 7) / 8 <= EVT_ROWS_PACK_CHUNKS)") != NULL);
  free(a);
  evt_rspec_example(&s, "chain_rowsum", EVT_F32);
  a = evt_emit_rows(&s, err, sizeof err);
  CHECK(has_int(a, "constexpr int kWarpVpt = %d;\n", EVT_ROWS_DEFAULT_WARP_VPT_LIGHT)); /* no Σ over M: the light rule */
  CHECK(a && strstr(a, "const float cb1 = live ? evt_rows::to_f(p.n1_scale[row]) : 0.f;"));
  CHECK(strstr(a, "cs10 = evt_rows::group_sum1<WARPS>(cs10, rk);") != NULL); /* one-barrier reduction */
  CHECK(strstr(a, "const auto v5 = evt_rows::relu(v4);") != NULL);
  CHECK(strstr(a, "rowsum_finalize") == NULL && strstr(a, "g_ws") == NULL);
  CHECK(strstr(a, "row_kernel_cols") == NULL); /* a per-row reduction: rows stay in row-groups */
  /* no row sums: the next kernel may be scheduled as soon as this one waited for its predecessor */
  const char *w2 = strstr(a, "evt_rows::wait_prior_grids();"), *r2 = strstr(a, "evt_rows::release_dependents();");
  CHECK(w2 && r2 > w2 && strstr(a, "evt_rows::fetch_row") > r2);
  /* no row sums: one warp per row runs one pass (no grid cap), several warps per row one wave */
  CHECK(strstr(a, "constexpr int WAVES = WARPS == 1 ? EVT_ROWS_WAVES_W1 : EVT_ROWS_WAVES;") != NULL);
  CHECK(strstr(a, "const long long cap = WAVES > 0 ? (long long)resident * WAVES : blocks;") != NULL);
  CHECK(strstr(a, "1024 / (WARPS * 32 * R)") != NULL); /* one-chunk rows: >= 1024 resident threads */
  CHECK(strstr(a, "const float *n0_a;") != NULL);
  CHECK(strstr(a, "evt_rows::unpack8(c_L0[v], L0);") != NULL); /* aux loads come from the prefetched row */
  /* no row sums: rows past 32768 run as the long-row kernel (one CTA per row, chunk by chunk), its M×N loads per
   * chunk, its per-row reduction as in the register kernel, PDL wait before any global access */
  const char *lk = strstr(a, "row_kernel_long(Params p) {");
  CHECK(lk && strstr(a, "&warps, &vpt))  // longer than the register configurations take\n    return launch_long(p, st);\n"));
  if (lk) {
    const char *lw = strstr(lk, "evt_rows::wait_prior_grids();");
    CHECK(lw && strstr(lk, "p.n1_scale") > lw);
    CHECK(strstr(lk, "for (long long row = blockIdx.x; row < p.m; row += gridDim.x) {") != NULL);
    /* a head chunk up to the first input's 16-byte boundary, then aligned chunks of 8 (or, h = -1, 8 elements T
     * apart: scalar accesses contiguous across a warp) */
    CHECK(strstr(lk, "const int h = evt_rows::long_head(p.n0_a + ro);") != NULL);
    CHECK(strstr(lk, "for (int jb = h > 0 ? h - 8 * T : 0; jb < n; jb += 8 * T) {") != NULL);
    CHECK(strstr(lk, "const int v = 0, j0 = head ? 0 : jb + (h >= 0 ? t * 8 : t), es = h >= 0 ? 1 : T, lim = head ? h : n;") != NULL);
    CHECK(strstr(lk, "if (head ? t != 0 : j0 >= n) continue;") != NULL);
    CHECK(strstr(lk, "evt_rows::fetch8s(p.n0_a + ro, j0, es, lim, full, c_L0[0]);") != NULL);
    CHECK(strstr(lk, "const bool ok = j0 + e * es < lim;") != NULL);
    CHECK(strstr(lk, "evt_rows::store8s(p.") != NULL && strstr(lk, "evt_rows::store8(") == NULL);
    CHECK(strstr(lk, "cs10 = evt_rows::group_sum1<WARPS>(cs10, rk);") != NULL);
  }
  CHECK(strstr(a, "evt_rows::launch_main(row_kernel_long<W>, grid, W * 32, 0, st, p);") != NULL);
  free(a);
  const char *const nuc[][2] = {{"softmax", "evt_rows::long_softmax_stats<WARPS>(p.x + ro, n, h, t, rk, sm_m2, sm_inv);"},
                                {"softmax_bwd", "evt_rows::long_softmax_bwd_stats<WARPS>(p.dy + ro, p.y + ro, n, h, t, rk);"},
                                {"layernorm", "evt_rows::long_ln_stats<WARPS>(p.x + ro, n, h, p.eps, t, rk, mean, rstd);"}};
  for (int k = 0; k < 3; k++) {
    evt_rspec_example(&s, nuc[k][0], EVT_BF16);
    a = evt_emit_rows(&s, err, sizeof err);
    CHECK_MSG(a && strstr(a, nuc[k][1]), "%s: long-row statistics", nuc[k][0]);
    free(a);
  }
  evt_rspec_example(&s, "chain_rowsum", EVT_F32);
  s.nnodes = 1; /* only a load: no outputs */
  CHECK(evt_emit_rows(&s, err, sizeof err) == NULL && strstr(err, "no outputs"));
}

/* Which kernels take rows past EVT_ROW_MAX_N: without row sums the long-row kernel, nucleus-free with row sums and
 * no per-row reduction the column-block kernel, else none (the plan and the emitter both ask this). */
TEST(rspec_long_rows) {
  const char *const names[] = {"softmax", "layernorm", "chain_rowsum", "bce_bias_grad", "layernorm_bwd", "softmax_xent"};
  const int want[] = {1, 1, 1, 2, 0, 0};
  for (int k = 0; k < 6; k++) {
    evt_rspec s;
    CHECK(evt_rspec_example(&s, names[k], EVT_BF16) == EVT_OK);
    CHECK_MSG(evt_rspec_long_rows(&s) == want[k], "%s: %d", names[k], evt_rspec_long_rows(&s));
  }
}

/* Row-major M×N values, deterministic pseudo-random in [lo, hi). */
static double *rnd(int64_t count, unsigned *st, double lo, double hi) {
  double *p = malloc(sizeof(double) * (size_t)count);
  for (int64_t i = 0; i < count; i++) {
    *st = *st * 1664525u + 1013904223u;
    p[i] = lo + (hi - lo) * ((*st >> 8) / 16777216.0);
  }
  return p;
}

TEST(reference_softmax_hand_values) {
  evt_rspec s;
  evt_rspec_example(&s, "softmax", EVT_F32);
  double x[6] = {0, log(2.0), 5, 5, 5, 5}, y[6], mean, rstd;
  const double *in[3] = {x, NULL, NULL};
  double *t[2] = {NULL, y};
  evt_rspec_reference(&s, 3, 2, in, t, &mean, &rstd);
  CHECK_NEAR(y[0], 1.0 / 3, 1e-7);
  CHECK_NEAR(y[1], 2.0 / 3, 1e-7);
  for (int k = 2; k < 6; k++) CHECK_NEAR(y[k], 0.5, 0);
}

/* L(x) = Σ dy · softmax(x): dL/dx must equal softmax_bwd(dy, softmax(x)). */
TEST(reference_softmax_bwd_matches_finite_differences) {
  const int m = 2, n = 7;
  unsigned st = 7;
  double *x = rnd(m * n, &st, -2, 2), *dy = rnd(m * n, &st, -1, 1), y[14], dx[14], yp[14], ym[14];
  evt_rspec sf, sb;
  evt_rspec_example(&sf, "softmax", EVT_F32);
  evt_rspec_example(&sb, "softmax_bwd", EVT_F32);
  const double *in[3] = {x, NULL, NULL};
  double *t[2] = {NULL, y};
  evt_rspec_reference(&sf, m, n, in, t, NULL, NULL);
  const double *inb[3] = {dy, y, NULL};
  double *tb[2] = {NULL, dx};
  evt_rspec_reference(&sb, m, n, inb, tb, NULL, NULL);
  for (int k = 0; k < m * n; k++) {
    double h = 1e-3, x0 = x[k], lp = 0, lm = 0; /* y is stored as f32: h must dwarf its rounding */
    double *tp[2] = {NULL, yp}, *tm[2] = {NULL, ym};
    x[k] = x0 + h;
    evt_rspec_reference(&sf, m, n, in, tp, NULL, NULL);
    x[k] = x0 - h;
    evt_rspec_reference(&sf, m, n, in, tm, NULL, NULL);
    x[k] = x0;
    for (int i = 0; i < m * n; i++) {
      lp += dy[i] * yp[i];
      lm += dy[i] * ym[i];
    }
    CHECK_NEAR(dx[k], (lp - lm) / (2 * h), 2e-4 + 1e-3 * fabs(dx[k]));
  }
  free(x);
  free(dy);
}

TEST(reference_layernorm_stats_and_affine) {
  const int m = 3, n = 10;
  unsigned st = 3;
  double *x = rnd(m * n, &st, -3, 5), *w = rnd(n, &st, 0.5, 1.5), *b = rnd(n, &st, -1, 1), y[30], mean[3], rstd[3];
  evt_rspec s;
  evt_rspec_example(&s, "layernorm", EVT_F32);
  const double *in[3] = {x, w, b};
  double *t[2] = {NULL, y};
  evt_rspec_reference(&s, m, n, in, t, mean, rstd);
  for (int i = 0; i < m; i++) {
    double mu = 0, var = 0, s1 = 0, s2 = 0;
    for (int j = 0; j < n; j++) mu += x[i * n + j] / n;
    for (int j = 0; j < n; j++) var += (x[i * n + j] - mu) * (x[i * n + j] - mu) / n;
    CHECK_NEAR(mean[i], mu, 1e-6);
    CHECK_NEAR(rstd[i], 1 / sqrt(var + 1e-5), 1e-5);
    for (int j = 0; j < n; j++) {
      double xh = (y[i * n + j] - b[j]) / w[j]; /* y stored as f32: undo the affine map */
      s1 += xh;
      s2 += xh * xh;
    }
    CHECK_NEAR(s1 / n, 0, 1e-5);
    CHECK_NEAR(s2 / n, var / (var + 1e-5), 1e-5);
  }
  free(x);
  free(w);
  free(b);
}

/* L(x, w, b) = Σ dy · (LN(x)·w + b): dx from layernorm_bwd must match finite differences, dgamma = ∂L/∂w
 * and dbeta = ∂L/∂b likewise (the fused Σ-over-M column sums). */
TEST(reference_layernorm_bwd_matches_finite_differences) {
  const int m = 3, n = 6;
  unsigned st = 11;
  double *x = rnd(m * n, &st, -2, 2), *w = rnd(n, &st, 0.5, 1.5), *b = rnd(n, &st, -1, 1), *dy = rnd(m * n, &st, -1, 1);
  evt_rspec sf, sb;
  evt_rspec_example(&sf, "layernorm", EVT_F32);
  sf.store_stats = 0;
  evt_rspec_example(&sb, "layernorm_bwd", EVT_F32);
  double dx[18], dg[6], db[6], y[18];
  const double *inb[3] = {dy, x, w};
  double *tb[7] = {NULL, dx, NULL, NULL, NULL, dg, db};
  evt_rspec_reference(&sb, m, n, inb, tb, NULL, NULL);
  const double *inf[3] = {x, w, b};
  double *tf[2] = {NULL, y};
#define LOSS(out)                                                     \
  do {                                                                \
    evt_rspec_reference(&sf, m, n, inf, tf, NULL, NULL);              \
    out = 0;                                                          \
    for (int i_ = 0; i_ < m * n; i_++) out += dy[i_] * y[i_];         \
  } while (0)
  double h = 1e-3, lp, lm; /* y is stored as f32: h must dwarf its rounding */
  for (int k = 0; k < m * n; k++) {
    double x0 = x[k];
    x[k] = x0 + h;
    LOSS(lp);
    x[k] = x0 - h;
    LOSS(lm);
    x[k] = x0;
    CHECK_NEAR(dx[k], (lp - lm) / (2 * h), 2e-4 + 1e-3 * fabs(dx[k]));
  }
  for (int j = 0; j < n; j++) {
    double w0 = w[j], b0 = b[j];
    w[j] = w0 + h;
    LOSS(lp);
    w[j] = w0 - h;
    LOSS(lm);
    w[j] = w0;
    CHECK_NEAR(dg[j], (lp - lm) / (2 * h), 2e-4 + 1e-3 * fabs(dg[j]));
    b[j] = b0 + h;
    LOSS(lp);
    b[j] = b0 - h;
    LOSS(lm);
    b[j] = b0;
    CHECK_NEAR(db[j], (lp - lm) / (2 * h), 2e-4 + 1e-3 * fabs(db[j]));
  }
#undef LOSS
  free(x);
  free(w);
  free(b);
  free(dy);
}

TEST(reference_nucleus_free_groups) {
  /* chain_rowsum: z = relu(a·scale[i] + b) − 0.5·a, zsum[i] = Σ_j z (rounded to f32) */
  evt_rspec s;
  evt_rspec_example(&s, "chain_rowsum", EVT_BF16);
  double a[6] = {1, -2, 3, 0.5, 4, -1}, sc[2] = {2, -1}, bb[6] = {0, 1, -10, 1, 1, 1}, z[6], zs[2];
  double *t[11] = {a, sc, bb, NULL, NULL, NULL, NULL, NULL, NULL, z, zs};
  CHECK(s.nnodes == 11 && s.nodes[9].op == EVT_V_AUX_STORE && s.nodes[10].op == EVT_V_COL_SUM);
  evt_rspec_reference(&s, 2, 3, (const double *const[3]){NULL, NULL, NULL}, t, NULL, NULL);
  const double want[6] = {2 - 0.5, 0 + 1, 0 - 1.5, 0.5 - 0.25, 0 - 2, 2 + 0.5};
  for (int k = 0; k < 6; k++) CHECK_NEAR(z[k], want[k], 0);
  CHECK_NEAR(zs[0], 1.5 + 1 - 1.5, 0);
  CHECK_NEAR(zs[1], 0.25 - 2 + 2.5, 0);
  /* gelu_bwd: dx = gelu_erf'(x + bias[j]) · dy, stored as bf16 */
  evt_rspec_example(&s, "gelu_bwd", EVT_BF16);
  double dy[4] = {1, -2, 0.5, 3}, x[4] = {-1, 0, 1, 2}, bias[2] = {0.5, -0.25}, dx[4];
  double *t2[6] = {dy, x, bias, NULL, NULL, dx};
  evt_rspec_reference(&s, 2, 2, (const double *const[3]){NULL, NULL, NULL}, t2, NULL, NULL);
  for (int k = 0; k < 4; k++)
    CHECK_NEAR(dx[k], evt_round_to_dtype(evt_vop_apply(EVT_V_GELU_ERF_GRAD, dy[k], x[k] + bias[k % 2]), EVT_BF16), 0);
}

/* CI compile check: every example (bf16, plus f32 / f16 variants) emitted into one translation unit and
 * compiled by nvcc for sm_90a, ptxas included (its -v report kept in the log), warnings as errors (row kernels need
 * no CUTLASS: ~15 s on 2 cores). Cached in build/rows_ci/ by the FNV hash of the text and the command, so repeated
 * runs skip it until the emitter or header change. rows_ci_compile returns 1 with the ptxas log's path, 0 without
 * nvcc (nothing compiled), -1 on failure (checked by the caller's CHECKs). */
#define ROWS_CI_NVCC                                                                                              \
  "nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Ikernels -Xptxas -v " \
  "-Werror all-warnings"
static int rows_ci_compile(char *log, size_t loglen) {
  if (system("nvcc --version >/dev/null 2>&1") != 0) return 0;
  size_t cap = 1 << 20, len = 0;
  char *all = malloc(cap), err[256];
  CHECK(all != NULL);
  if (!all) return -1;
  all[0] = 0;
  const evt_dtype dts[3] = {EVT_BF16, EVT_F32, EVT_F16};
  for (int k = 0; evt_rspec_example_names[k]; k++)
    for (int d = 0; d < 3; d++) {
      if (d == 2 && k > 1) continue; /* f16: softmax, softmax_bwd */
      evt_rspec s;
      evt_rspec_example(&s, evt_rspec_example_names[k], dts[d]);
      char kn[40];
      evt_rspec_kernel_name(&s, kn);
      if (strstr(all, kn)) continue; /* (an example equal to another in this dtype: layernorm_bwd_mixed in f32) */
      char *src = evt_emit_rows(&s, err, sizeof err);
      CHECK_MSG(src != NULL, "%s: %s", evt_rspec_example_names[k], err);
      if (!src) continue;
      size_t n = strlen(src);
      while (len + n + 1 > cap) {
        cap *= 2;
        all = realloc(all, cap);
        if (!all) abort();
      }
      memcpy(all + len, src, n + 1);
      len += n;
      free(src);
    }
  /* the headers and the command are part of what is compiled: hash them too */
  uint64_t h = evt_hash_bytes(0, all, len);
  h = evt_hash_bytes(h, ROWS_CI_NVCC, strlen(ROWS_CI_NVCC));
  const char *headers[] = {"kernels/evt_rows.cuh", "kernels/evt_fp8.cuh"};
  for (int i = 0; i < 2; i++) {
    FILE *hf = fopen(headers[i], "rb");
    CHECK(hf != NULL);
    if (!hf) continue;
    char buf[4096];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, hf)) > 0) h = evt_hash_bytes(h, buf, r);
    fclose(hf);
  }
  char cu[128], obj[128], cmd[2048];
  snprintf(cu, sizeof cu, "build/rows_ci/rows-%016llx.cu", (unsigned long long)h);
  snprintf(obj, sizeof obj, "build/rows_ci/rows-%016llx.o", (unsigned long long)h);
  snprintf(log, loglen, "%s.log", obj);
  struct stat st;
  if (stat(obj, &st) == 0) { /* compiled before */
    free(all);
    return 1;
  }
  int ok = 0;
  CHECK(system("mkdir -p build/rows_ci") == 0);
  FILE *f = fopen(cu, "w");
  CHECK(f != NULL);
  if (f) {
    fputs(all, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, ROWS_CI_NVCC " -c -o %s.%ld.part %s >%s 2>&1 && mv %s.%ld.part %s", obj, (long)getpid(), cu,
             log, obj, (long)getpid(), obj);
    ok = system(cmd) == 0;
    CHECK_MSG(ok, "nvcc rejected the generated row kernels; see %s", log);
  }
  free(all);
  return ok ? 1 : -1;
}

TEST(ci_nvcc_compiles_generated_row_kernels) {
  char log[160];
  if (rows_ci_compile(log, sizeof log) == 0)
    fprintf(stderr, "note: ci_nvcc_compiles_generated_row_kernels: no nvcc here, nothing checked\n");
}

/* Spill stores (bytes per thread) ptxas reported in `log` for kernel `kn`'s row_kernel<W, V, R, EX> (any R), or -1. */
static int rows_ci_spill_stores(const char *log, const char *kn, int w, int v, int ex) {
  FILE *lf = fopen(log, "r");
  if (!lf) return -1;
  char ns[64], line[2048];
  snprintf(ns, sizeof ns, "evt_gen_%s10row_kernelILi", kn + strlen("evt_rowkernel_")); /* (the register kernel) */
  int in_fn = 0, stores = -1;
  while (fgets(line, sizeof line, lf) && stores < 0) {
    if (strstr(line, "Compiling entry function")) {
      const char *q = strstr(line, ns);
      int fw, fv, fr, fex;
      in_fn = q && sscanf(q + strlen(ns), "%dELi%dELi%dELb%d", &fw, &fv, &fr, &fex) == 4 && fw == w && fv == v && fex == ex;
    }
    const char *sp = strstr(line, "bytes stack frame, ");
    if (in_fn && sp) sscanf(sp, "bytes stack frame, %d bytes spill stores", &stores);
  }
  fclose(lf);
  return stores;
}

/* The first numeric value assigned after `key` in src (skipping a macro's: `key EVT_...`), or -1. */
static int emitted_int(const char *src, const char *key) {
  for (const char *q = strstr(src, key); q; q = strstr(q + 1, key)) {
    const char *v = q + strlen(key);
    if (*v >= '0' && *v <= '9') return atoi(v);
  }
  return -1;
}

/* The row kernels of the benchmark workloads' hot rows (BERT-large's and ViT's softmax, layer norms, their backwards,
 * the GELU backward), in the configuration the launcher picks for their widths (evt_row_pick_config with the
 * kernel's kWarpVpt / kMinVpt, exact-size when N fills the group), keep to at most 64 bytes of spill stores per
 * thread in ptxas's report (a spill of a whole row of registers makes a row kernel several times slower; row
 * broadcasts are RB_LATE for that). Reads the CI compile's log (rows_ci_compile: cached). */
TEST(ci_hot_row_kernels_keep_out_of_local_memory) {
  char log[160];
  int rc = rows_ci_compile(log, sizeof log);
  if (rc == 0) {
    fprintf(stderr, "note: ci_hot_row_kernels_keep_out_of_local_memory: no nvcc here, nothing checked\n");
    return;
  }
  CHECK(rc == 1);
  if (rc != 1) return;
  const struct {
    const char *ex;
    evt_dtype dt;
    int n;
  } hot[] = {{"softmax", EVT_BF16, 1024},         {"softmax", EVT_BF16, 512},           {"softmax_bwd", EVT_BF16, 1024},
             {"softmax_bwd", EVT_BF16, 512},      {"layernorm", EVT_BF16, 1024},        {"ln_residual", EVT_BF16, 1024},
             {"layernorm_bwd", EVT_BF16, 1024},   {"layernorm_bwd_mixed", EVT_BF16, 1024}, {"gelu_bwd", EVT_BF16, 4096},
             {"ln_affine_mixed", EVT_F32, 768},   {"ln_affine_mixed", EVT_F32, 1024},   {"ln_affine_mixed", EVT_BF16, 768},
             {"layernorm_bwd", EVT_F32, 768},     {"layernorm_bwd", EVT_F32, 1024},     {"softmax", EVT_F32, 1024}};
  for (size_t i = 0; i < sizeof hot / sizeof hot[0]; i++) {
    evt_rspec s;
    CHECK(evt_rspec_example(&s, hot[i].ex, hot[i].dt) == EVT_OK);
    char err[256], kn[40];
    evt_rspec_kernel_name(&s, kn);
    char *src = evt_emit_rows(&s, err, sizeof err);
    CHECK_MSG(src != NULL, "%s: %s", hot[i].ex, err);
    if (!src) continue;
    /* the launcher's own knobs, as emitted (the numeric default after the macro override) */
    const int wv = emitted_int(src, "constexpr int kWarpVpt = "), mv = emitted_int(src, "constexpr int kMinVpt = ");
    free(src);
    CHECK_MSG(wv > 0 && mv > 0, "%s: kWarpVpt / kMinVpt not found in the emitted source", hot[i].ex);
    int w = 0, v = 0;
    CHECK(evt_row_pick_config(hot[i].n, wv, EVT_ROWS_DEFAULT_W1CAP, mv, &w, &v));
    const int ex = EVT_ROWS_DEFAULT_EXACT && hot[i].n == w * 32 * 8 * v;
    const int stores = rows_ci_spill_stores(log, kn, w, v, ex);
    CHECK_MSG(stores >= 0, "%s %s N = %d: no ptxas report for row_kernel<%d, %d, R, %d> of %s in %s", hot[i].ex,
              evt_dtype_name(hot[i].dt), hot[i].n, w, v, ex, kn, log);
    CHECK_MSG(stores <= 64, "%s %s N = %d: row_kernel<%d, %d, R, %d> spills %d bytes per thread (see %s)", hot[i].ex,
              evt_dtype_name(hot[i].dt), hot[i].n, w, v, ex, stores, log);
  }
}

/* Row broadcasts per chunk (RB_LATE): ViT's autocast layer norm over an f32 residual stream with its affine as two
 * f32 row broadcasts (example ln_affine_mixed) at N = 768 runs one warp per row with 4 chunks per thread under the
 * 64-register cap of one-warp rows. Holding both broadcasts (64 floats) there spilled registers to local memory.
 * The emitted form: their registers sized by RB_LATE, their loads in the chunk
 * loop, their uses reading that one chunk (ci_hot_row_kernels_keep_out_of_local_memory checks ptxas's spill report). */
TEST(emit_rows_row_broadcasts_per_chunk_when_holding_them_costs_registers) {
  evt_rspec s;
  CHECK(evt_rspec_example(&s, "ln_affine_mixed", EVT_F32) == EVT_OK);
  char err[256];
  char *src = evt_emit_rows(&s, err, sizeof err);
  CHECK_MSG(src != NULL, "%s", err);
  if (!src) return;
  CHECK(strstr(src, "constexpr bool RB_LATE = VPT * 8 * 2 >= EVT_ROWS_RB_LATE_FLOATS;") != NULL);
  CHECK(strstr(src, "float L1[RB_LATE ? 1 : VPT][8];") != NULL);
  CHECK(strstr(src, "if constexpr (!RB_LATE) evt_rows::load_row<T, VPT>(p.n1_w, n, t, true, vec, L1);") != NULL);
  CHECK(strstr(src, "if constexpr (RB_LATE) evt_rows::load8(p.n1_w, j0, n, full, L1[0]);") != NULL);
  CHECK(strstr(src, "= L1[RB_LATE ? 0 : v][e];") != NULL);
  free(src);
}

/* Launch-configuration choice (kernels/evt_row_config.h): warp-per-row for short rows up to the knob, else the
 * smallest chunks-per-thread whose warp count fits; every returned pair is instantiated (EVT_ROW_CONFIGS) and
 * covers the row. */
TEST(row_pick_config) {
  int w = 0, v = 0;
  CHECK(evt_row_pick_config(1024, 1, 8, 1, &w, &v) && w == 4 && v == 1);  /* the original rule */
  CHECK(evt_row_pick_config(1024, 2, 8, 1, &w, &v) && w == 4 && v == 1);  /* 128 chunks > 64: not one warp */
  CHECK(evt_row_pick_config(1024, 4, 8, 1, &w, &v) && w == 1 && v == 4);  /* one warp, 4 chunks per lane */
  CHECK(evt_row_pick_config(512, 2, 8, 1, &w, &v) && w == 1 && v == 2);
  CHECK(evt_row_pick_config(512, 1, 8, 1, &w, &v) && w == 2 && v == 1);
  CHECK(evt_row_pick_config(100, 4, 8, 1, &w, &v) && w == 1 && v == 1);   /* 13 chunks: one per lane is enough */
  CHECK(evt_row_pick_config(4096, 4, 8, 1, &w, &v) && w == 8 && v == 2);
  CHECK(evt_row_pick_config(32768, 2, 8, 1, &w, &v) && w == 32 && v == 4);
  CHECK(!evt_row_pick_config(32769, 2, 8, 1, &w, &v));
  CHECK(!evt_row_pick_config(0, 2, 8, 1, &w, &v));
  CHECK(evt_row_pick_config(4096, 2, 16, 1, &w, &v) && w == 16 && v == 1); /* w1cap 16: 512 threads x 1 chunk */
  CHECK(evt_row_pick_config(4104, 2, 16, 1, &w, &v) && w == 16 && v == 2); /* 513 chunks: 2 per thread */
  /* min_vpt 2: rows past one warp get 2 chunks per thread, half the warps (the (2, 2) layer-norm shape) */
  CHECK(evt_row_pick_config(1024, 2, 8, 2, &w, &v) && w == 2 && v == 2);
  CHECK(evt_row_pick_config(2048, 2, 8, 2, &w, &v) && w == 4 && v == 2);
  CHECK(evt_row_pick_config(512, 2, 8, 2, &w, &v) && w == 1 && v == 2);  /* one warp: unchanged */
  CHECK(evt_row_pick_config(1024, 2, 8, 3, &w, &v) && w == 4 && v == 1);  /* other values: 1 */
  for (int mv = 1; mv <= 2; mv++)
    for (int knob = 1; knob <= 4; knob *= 2)
      for (int n = 1; n <= 32768; n += (n < 300 ? 1 : 97)) {
        const int cap = knob == 2 ? 16 : 8;
        CHECK(evt_row_pick_config(n, knob, cap, mv, &w, &v));
        CHECK(w * 32 * v * 8 >= n);                    /* the row fits */
        CHECK(w == 1 || w * 32 * v * 8 / 2 < n || v > mv); /* no group twice as large as needed */
        CHECK(w == 1 || v >= mv);
        int listed = 0;
        for (int k = 0; k < EVT_ROW_NCONFIGS; k++)
          listed |= evt_row_configs[k][0] == w && evt_row_configs[k][1] == v && evt_row_configs[k][2] <= mv;
        CHECK_MSG(listed, "n %d knob %d min_vpt %d: (%d, %d) not instantiated", n, knob, mv, w, v);
      }
}
