/* FP8 conversions (src/ir/fp8.c): every code of both formats, ties to even, saturation, NaN, dtype tables. */
#include "test.h"

#include <string.h>

static uint8_t enc(float x, evt_dtype dt) { return evt_fp8_from_f32(x, dt); }
static float dec(uint8_t c, evt_dtype dt) { return evt_fp8_to_f32(c, dt); }

/* Decoding then encoding gives the code back; a NaN code gives the canonical NaN of its sign, e5m2's infinity
 * the largest finite code of its sign (the cast saturates). */
static void check_every_code(evt_dtype dt, uint8_t maxc) {
  for (int c = 0; c < 256; c++) {
    float v = dec((uint8_t)c, dt);
    uint8_t want = isnan(v) ? (uint8_t)((c & 0x80) | 0x7f) : isinf(v) ? (uint8_t)((c & 0x80) | maxc) : (uint8_t)c;
    CHECK_MSG(enc(v, dt) == want, "%s code 0x%02x -> %g -> 0x%02x", evt_dtype_name(dt), c, v, enc(v, dt));
    CHECK_MSG(!isfinite(v) || (float)evt_round_to_dtype(v, dt) == v, "%s code 0x%02x", evt_dtype_name(dt), c);
  }
}

TEST(fp8_every_code_roundtrips) {
  check_every_code(EVT_F8E4M3, 0x7e);
  check_every_code(EVT_F8E5M2, 0x7b);
  int nan4 = 0, nan5 = 0, inf5 = 0;
  for (int c = 0; c < 256; c++) {
    nan4 += isnan(dec((uint8_t)c, EVT_F8E4M3));
    nan5 += isnan(dec((uint8_t)c, EVT_F8E5M2));
    inf5 += isinf(dec((uint8_t)c, EVT_F8E5M2)) != 0; /* glibc: -1 for -inf */
  }
  CHECK(nan4 == 2 && nan5 == 6 && inf5 == 2);
}

TEST(fp8_decode_known_values) {
  CHECK(dec(0x38, EVT_F8E4M3) == 1.0f && dec(0x7e, EVT_F8E4M3) == 448.0f && dec(0xfe, EVT_F8E4M3) == -448.0f);
  CHECK(dec(0x01, EVT_F8E4M3) == 0x1p-9f && dec(0x07, EVT_F8E4M3) == 7 * 0x1p-9f && dec(0x08, EVT_F8E4M3) == 0x1p-6f);
  CHECK(dec(0x3c, EVT_F8E5M2) == 1.0f && dec(0x7b, EVT_F8E5M2) == 57344.0f && dec(0x7c, EVT_F8E5M2) == INFINITY);
  CHECK(dec(0x01, EVT_F8E5M2) == 0x1p-16f && dec(0x04, EVT_F8E5M2) == 0x1p-14f && dec(0xfc, EVT_F8E5M2) == -INFINITY);
  CHECK(dec(0x80, EVT_F8E4M3) == 0.0f && signbit(dec(0x80, EVT_F8E4M3)));
}

TEST(fp8_ties_to_even) {
  /* e4m3: ulp of [1,2) is 1/8; subnormal quantum 2^-9 */
  CHECK(dec(enc(1.0f + 0x1p-4f, EVT_F8E4M3), EVT_F8E4M3) == 1.0f);            /* 1.0 | 1.125: even 1.0 */
  CHECK(dec(enc(1.0f + 3 * 0x1p-4f, EVT_F8E4M3), EVT_F8E4M3) == 1.25f);       /* 1.125 | 1.25: even 1.25 */
  CHECK(dec(enc(1.0f + 0x1p-4f + 0x1p-20f, EVT_F8E4M3), EVT_F8E4M3) == 1.125f); /* past the tie: up */
  CHECK(enc(0x1p-10f, EVT_F8E4M3) == 0x00);                                  /* 0 | 2^-9: even 0 */
  CHECK(enc(3 * 0x1p-10f, EVT_F8E4M3) == 0x02);                              /* 2^-9 | 2^-8: even 2^-8 */
  CHECK(enc(7.5f * 0x1p-9f, EVT_F8E4M3) == 0x08);                            /* last subnormal | 2^-6: into the normals */
  CHECK(enc(-0x1p-11f, EVT_F8E4M3) == 0x80);                                 /* underflow keeps the sign */
  CHECK(enc(464.0f, EVT_F8E4M3) == 0x7e);                                    /* 448 | (480): even 448 */
  /* e5m2: ulp of [1,2) is 1/4; subnormal quantum 2^-16 */
  CHECK(dec(enc(1.125f, EVT_F8E5M2), EVT_F8E5M2) == 1.0f);
  CHECK(dec(enc(1.375f, EVT_F8E5M2), EVT_F8E5M2) == 1.5f);
  CHECK(enc(0x1p-17f, EVT_F8E5M2) == 0x00 && enc(3 * 0x1p-17f, EVT_F8E5M2) == 0x02);
  CHECK(enc(3.5f * 0x1p-16f, EVT_F8E5M2) == 0x04);                           /* 3 * 2^-16 | 2^-14 */
}

TEST(fp8_saturates_and_keeps_nan) {
  CHECK(enc(449.0f, EVT_F8E4M3) == 0x7e && enc(1e6f, EVT_F8E4M3) == 0x7e && enc(INFINITY, EVT_F8E4M3) == 0x7e);
  CHECK(enc(-1e30f, EVT_F8E4M3) == 0xfe && enc(-INFINITY, EVT_F8E4M3) == 0xfe);
  CHECK(enc(60000.0f, EVT_F8E5M2) == 0x7b && enc(INFINITY, EVT_F8E5M2) == 0x7b && enc(-INFINITY, EVT_F8E5M2) == 0xfb);
  CHECK(enc(NAN, EVT_F8E4M3) == 0x7f && enc(-NAN, EVT_F8E4M3) == 0xff);
  CHECK(enc(NAN, EVT_F8E5M2) == 0x7f && enc(-NAN, EVT_F8E5M2) == 0xff);
  CHECK(evt_round_to_dtype(500.0, EVT_F8E4M3) == 448.0 && evt_round_to_dtype(-1e9, EVT_F8E5M2) == -57344.0);
  CHECK(isnan(evt_round_to_dtype(NAN, EVT_F8E4M3)) && isnan(evt_round_to_dtype(NAN, EVT_F8E5M2)));
}

TEST(fp8_dtype_tables) {
  CHECK(evt_dtype_from_name("f8e4m3", 6) == EVT_F8E4M3 && evt_dtype_from_name("f8e5m2", 6) == EVT_F8E5M2);
  CHECK(!strcmp(evt_dtype_name(EVT_F8E4M3), "f8e4m3") && !strcmp(evt_dtype_name(EVT_F8E5M2), "f8e5m2"));
  CHECK(evt_dtype_size(EVT_F8E4M3) == 1 && evt_dtype_size(EVT_F8E5M2) == 1);
  CHECK(evt_dtype_is_float(EVT_F8E4M3) && evt_dtype_is_fp8(EVT_F8E5M2) && !evt_dtype_is_fp8(EVT_BF16));
}

/* Runs text's graph with input %a (and %b) set to the given values; returns the values of output 0 in out. */
static void run_fp8_graph(const char *text, const double *a, const double *b, double *out, int nout) {
  evt_graph *g = evt_test_parse_ok(text);
  if (!g) return;
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, 0) == EVT_OK);
  int ia = evt_graph_find(g, "a"), ib = evt_graph_find(g, "b");
  for (int64_t i = 0; i < v[ia].numel; i++) v[ia].data[i] = a[i];
  for (int64_t i = 0; ib >= 0 && i < v[ib].numel; i++) v[ib].data[i] = b[i];
  CHECK_MSG(evt_interp_run(g, v, 0, 0) == EVT_OK, "%s", evt_graph_error(g));
  const evt_tensor *o = &v[evt_graph_output(g, 0)];
  for (int i = 0; i < nout && o->data; i++) out[i] = o->data[i];
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
}

TEST(fp8_interp_mm_and_elementwise) {
  double a[2] = {448, -3.5}, b[2] = {448, 0.0625}, out[2] = {0};
  /* f8 x f8 products are exact; the f32 accumulator keeps 448 * 448 - 3.5 / 16, an f8 output saturates */
  run_fp8_graph("graph m {\n  %a: f8e4m3[1,2] = input()\n  %b: f8e4m3[2,1] = input()\n"
                "  %y = mm(%a, %b, out_dtype=f32)\n  output %y\n}\n", a, b, out, 1);
  CHECK(out[0] == 448.0 * 448.0 - 3.5 / 16);
  run_fp8_graph("graph m {\n  %a: f8e4m3[1,2] = input()\n  %b: f8e4m3[2,1] = input()\n"
                "  %y = mm(%a, %b)\n  output %y\n}\n", a, b, out, 1);
  CHECK(out[0] == 448.0);
  /* elementwise math on f8 computes in double and rounds to the node's fp8 dtype, as bf16 does */
  double x[2] = {1.0, 0.125}, y[2] = {0.0625, 0.0625};
  run_fp8_graph("graph e {\n  %a: f8e4m3[2] = input()\n  %b: f8e4m3[2] = input()\n"
                "  %y = add(%a, %b)\n  output %y\n}\n", x, y, out, 2);
  CHECK(out[0] == 1.0 && out[1] == 0.1875); /* 1.0625 ties to even 1.0; 0.1875 is exact */
}

/* mm of mixed fp8 operands (the fp8 pass's backward GEMMs): exact products, the f32 accumulator, either order */
TEST(fp8_interp_mm_mixed_formats) {
  double a[2] = {448, -3.5}, b[2] = {0.5, 0.0625}, out[1] = {0};
  run_fp8_graph("graph m {\n  %a: f8e4m3[1,2] = input()\n  %b: f8e5m2[2,1] = input()\n"
                "  %y = mm(%a, %b, out_dtype=f32)\n  output %y\n}\n", a, b, out, 1);
  CHECK(out[0] == 224.0 - 3.5 / 16);
  double c[2] = {57344, -0.0625}, d[2] = {0.25, 448};
  run_fp8_graph("graph m {\n  %a: f8e5m2[1,2] = input()\n  %b: f8e4m3[2,1] = input()\n"
                "  %y = mm(%a, %b, out_dtype=f32)\n  output %y\n}\n", c, d, out, 1);
  CHECK(out[0] == 14336.0 - 28.0);
}

/* Mixed fp8 operands: mm only, and only with out_dtype=f32 */
TEST(fp8_mixed_operands_rules) {
  char *err = NULL;
  evt_graph *g = evt_parse("graph m {\n  %a: f8e4m3[2,2] = input()\n  %b: f8e5m2[2,2] = input()\n"
                           "  %y = mm(%a, %b)\n  output %y\n}\n", "t", &err);
  CHECK_MSG(!g && err && strstr(err, "mixed fp8 operands f8e4m3[2,2] x f8e5m2[2,2] need out_dtype=f32"), "%s", err);
  free(err), err = NULL;
  g = evt_parse("graph m {\n  %a: f8e4m3[1,2,2] = input()\n  %b: f8e5m2[1,2,2] = input()\n"
                "  %y = bmm(%a, %b)\n  output %y\n}\n", "t", &err);
  CHECK_MSG(!g && err && strstr(err, "operands must have the same floating dtype"), "%s", err);
  free(err), err = NULL;
  g = evt_parse("graph m {\n  %a: f8e4m3[2,2] = input()\n  %b: bf16[2,2] = input()\n"
                "  %y = mm(%a, %b, out_dtype=f32)\n  output %y\n}\n", "t", &err);
  CHECK_MSG(!g && err && strstr(err, "operands must have the same floating dtype"), "%s", err);
  free(err);
}

/* A device program with an fp8 tensor is created like any other: it fails only where there is no GPU (or no kernel
 * library), with that reason. */
TEST(fp8_device_program_needs_only_a_device) {
  evt_graph *g = evt_test_parse_ok("graph d {\n  %x: f32[4] = input()\n  %q = cast(%x, dtype=f8e5m2)\n"
                                   "  %y = cast(%q, dtype=f32)\n  output %y\n}\n");
  if (!g) return;
  evt_program *p = NULL;
  evt_status st = evt_program_create(g, 0, &p);
  CHECK_MSG(st == EVT_OK || (st == EVT_ERR_UNSUPPORTED && p == NULL && strstr(evt_graph_error(g), "no CUDA device") &&
                             !strstr(evt_graph_error(g), "f8e5m2")),
            "%d: %s", (int)st, evt_graph_error(g));
  evt_program_destroy(p);
  evt_graph_free(g);
}
