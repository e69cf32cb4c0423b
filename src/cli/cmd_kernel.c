/* evtc kernel: print the generated CUDA C++ (or the spec text) of a named GEMM + epilogue kernel. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "codegen/examples.h"
#include "codegen/kspec.h"

/* n whole numbers in [0, 65536] joined by 'x' ("128x128x64"), into out; false on anything else (overflow included) */
static bool parse_dims(const char *v, int n, int *out) {
  for (int k = 0; k < n; k++) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || x < 0 || x > 65536 || *end != (k + 1 < n ? 'x' : '\0')) return false;
    out[k] = (int)x;
    v = end + (k + 1 < n);
  }
  return true;
}

EVTC_COMMAND(kernel, "EPILOGUE [--arch ARCH] [--tile MxNxK] [--cluster MxN] [--pingpong] [--stages N] [--reduction atomic|workspace] [--epi-n N] [--epi-stages N] [--stream-k] [--tf32] [--spec]",
             "print the generated CUTLASS GEMM + epilogue-visitor-tree source of a named epilogue\n"
             "  --arch ARCH  GPU target: sm_90a (default: CUTLASS Sm90 collectives), sm_80, sm_86, sm_89 (CUTLASS 2.x GEMM\n"
             "               with Sm80 visitor nodes; its default config 128x128x32, 4 stages on sm_80, 3 on sm_86/89;\n"
             "               --tile and --stages apply, the Hopper-only flags are refused)\n"
             "  EPILOGUE     a named example: plain, bias_gelu_aux, bias_relu_dbias, gelu_bwd, gelu_bwd_dbias, bias_silu,\n"
             "               bias_relu_aux, bias_gelu_aux_f16, mixed_f32, visitor_ops, visitor_cmp, bias_dropout, bias_relu_amax,\n"
             "               tf32_bias_relu, bmm_*\n"
             "  --tile       CTA tile (default 128x128x64)\n"
             "  --cluster    cluster shape (default 1x1)\n"
             "  --pingpong   ping-pong schedule instead of cooperative\n"
             "  --stages N   mainloop pipeline stages (default 0: as many as fit)\n"
             "  --reduction  row/col sums with atomics (default) or a deterministic workspace reduction\n"
             "  --epi-n N    epilogue subtile N: 32, 64 or 128 (default 0: CUTLASS's auto choice)\n"
             "  --epi-stages N  shared-memory buffers of D and each aux store (TMA stores in flight), 2..8\n"
             "               (default 0: CUTLASS's min(subtiles, 2))\n"
             "  --stream-k   CUTLASS's stream-K tile scheduler (cooperative only; the tuner's choice for few tiles\n"
             "               over a long K)\n"
             "  --tf32       f32 operands on TF32 tensor cores (docs/codegen.md \"TF32\"): the example's A and B become\n"
             "               f32, its layout NT, tile_k 32 unless --tile says otherwise (sm_90a)\n"
             "  --spec       print the canonical spec text and the kernel name instead of the source") {
  if (argc < 2) {
    fprintf(stderr, "evtc kernel: which epilogue? (evtc kernel --help)\n");
    return EVTC_EXIT_USER;
  }
  evt_tile_config cfg = EVT_TILE_CONFIG_DEFAULT;
  int spec_only = 0, arch = 0, ptx = 0, tf32 = 0, tile_given = 0;
  for (int i = 2; i < argc; i++) /* the target first: it sets the config the other flags change */
    if (!strcmp(argv[i], "--arch") && i + 1 < argc && evt_arch_parse(argv[i + 1], &arch, &ptx) == EVT_OK)
      cfg = evt_arch_untuned_config(arch, 128);
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--arch") && i + 1 < argc) {
      if (evt_arch_parse(argv[++i], &arch, &ptx) != EVT_OK) goto bad;
    } else if (!strcmp(argv[i], "--tile") && i + 1 < argc) {
      int t[3];
      if (!parse_dims(argv[++i], 3, t)) goto bad;
      cfg.tile_m = t[0], cfg.tile_n = t[1], cfg.tile_k = t[2], tile_given = 1;
    } else if (!strcmp(argv[i], "--cluster") && i + 1 < argc) {
      int c[2];
      if (!parse_dims(argv[++i], 2, c)) goto bad;
      cfg.cluster_m = c[0], cfg.cluster_n = c[1];
    } else if (!strcmp(argv[i], "--pingpong")) {
      cfg.schedule = EVT_SCHED_PINGPONG;
    } else if (!strcmp(argv[i], "--stages") && i + 1 < argc) {
      if (!parse_dims(argv[++i], 1, &cfg.stages)) goto bad;
    } else if (!strcmp(argv[i], "--reduction") && i + 1 < argc) {
      i++;
      if (!strcmp(argv[i], "atomic")) cfg.reduction = EVT_RED_ATOMIC;
      else if (!strcmp(argv[i], "workspace")) cfg.reduction = EVT_RED_WORKSPACE;
      else goto bad;
    } else if (!strcmp(argv[i], "--epi-n") && i + 1 < argc) {
      if (!parse_dims(argv[++i], 1, &cfg.epi_n)) goto bad;
    } else if (!strcmp(argv[i], "--epi-stages") && i + 1 < argc) {
      if (!parse_dims(argv[++i], 1, &cfg.epi_stages)) goto bad;
    } else if (!strcmp(argv[i], "--stream-k")) {
      cfg.stream_k = 1;
    } else if (!strcmp(argv[i], "--tf32")) {
      tf32 = 1;
    } else if (!strcmp(argv[i], "--spec")) {
      spec_only = 1;
    } else {
    bad:
      fprintf(stderr, "evtc kernel: bad argument '%s'\n", argv[i]);
      return EVTC_EXIT_USER;
    }
  }
  evt_kspec s;
  if (evt_kspec_example(&s, argv[1], cfg) != EVT_OK) {
    fprintf(stderr, "evtc kernel: unknown epilogue '%s'\n", argv[1]);
    return EVTC_EXIT_USER;
  }
  s.arch = evt_arch_sm8x(arch) ? arch : 0;
  if (tf32) { /* the same epilogue over f32 operands: TF32 takes them K-major (layout NT) */
    s.ab_dtype = EVT_F32, s.b_mixed = 0, s.layout = EVT_LAYOUT_NT;
    if (!tile_given) s.cfg.tile_k = evt_kspec_tile_k(&s);
  }
  char err[512];
  if (evt_kspec_check(&s, err, sizeof err) != EVT_OK) {
    fprintf(stderr, "evtc kernel: %s\n", err);
    return EVTC_EXIT_USER;
  }
  if (spec_only) {
    char name[40], text[4096];
    evt_kspec_kernel_name(&s, name);
    evt_kspec_text(&s, text, sizeof text);
    printf("%s\n%s", name, text);
    return EVTC_EXIT_OK;
  }
  char *src = evt_emit_cutlass(&s, err, sizeof err);
  if (!src) {
    fprintf(stderr, "evtc kernel: %s\n", err);
    return EVTC_EXIT_USER;
  }
  fputs(src, stdout);
  free(src);
  return EVTC_EXIT_OK;
}
