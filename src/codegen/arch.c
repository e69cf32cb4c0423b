/* GPU targets of GEMM kernel specs (contract in kspec.h, "arch.c"): which mainloop configs an Ampere / Ada
 * (sm_8x) kernel may take and which epilogue nodes it can hold. The rules follow CUTLASS 4.2's 2.x multistage
 * tensor-op GEMM (cutlass/gemm/kernel/default_gemm_universal_with_visitor.h) and the Sm80 visitor nodes of
 * cutlass/epilogue/threadblock/fusion/. */
#include <stdarg.h>
#include <stdio.h>

#include "codegen/kspec.h"
#include "ir/ir.h"

bool evt_arch_valid(int arch) { return arch == 0 || arch == 90 || arch == 80 || arch == 86 || arch == 89; }

bool evt_arch_sm8x(int arch) { return arch == 80 || arch == 86 || arch == 89; }

const char *evt_arch_name(int arch) {
  switch (arch) {
    case 80: return "sm_80";
    case 86: return "sm_86";
    case 89: return "sm_89";
    default: return "sm_90a";
  }
}

/* sm_80 (A100): 163 KiB of shared memory per CTA; sm_86 / sm_89 (GA10x, AD10x): 99 KiB */
long evt_arch_smem_bytes(int arch) { return arch == 80 ? 163L * 1024 : 99L * 1024; }

void evt_arch_warp_shape(const evt_tile_config *c, int *wm, int *wn) {
  *wm = c->tile_m / 2 < 64 ? c->tile_m / 2 : 64;
  *wn = c->tile_n / 2 < 64 ? c->tile_n / 2 : 64;
}

static evt_status refuse(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static evt_status refuse(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return EVT_ERR_UNSUPPORTED;
}

/* The Hopper-only fields of a config, all at their zero value on sm_8x. */
static const char *hopper_field(const evt_tile_config *c) {
  if (c->cluster_m != 1 || c->cluster_n != 1) return "thread-block clusters (sm_90)";
  if (c->schedule != EVT_SCHED_COOPERATIVE) return "the ping-pong warp-specialized schedule (sm_90)";
  if (c->stream_k) return "CUTLASS 3.x's stream-K tile scheduler";
  if (c->epi_n || c->epi_stages) return "TMA epilogue subtiles / store stages (sm_90)";
  if (c->reduction != EVT_RED_ATOMIC) return "the workspace reduction of the Sm90 reduction nodes";
  return NULL;
}

evt_status evt_tile_config_check_sm80(const evt_kspec *s, const evt_tile_config *c, char *err, size_t errlen) {
  char lab[64];
  evt_tile_config_label(c, lab, sizeof lab);
  const char *an = evt_arch_name(s->arch);
  int tm = c->tile_m, tn = c->tile_n, tk = c->tile_k;
  const char *hf = hopper_field(c);
  if (hf) return refuse(err, errlen, "kernel spec: config %s: %s has no %s", lab, an, hf);
  if (!((tm == 64 || tm == 128 || tm == 256) && (tn == 64 || tn == 128 || tn == 256)) || tm * tn > 256 * 128)
    return refuse(err, errlen, "kernel spec: config %s: %s tile %dx%d (64, 128 or 256 each, at most 8 warps of 64x64)", lab,
                  an, tm, tn);
  if (tk != 32 && tk != 64) return refuse(err, errlen, "kernel spec: config %s: %s tile_k %d (32 or 64)", lab, an, tk);
  int stages = c->stages ? c->stages : 3;
  if (stages < 3 || stages > 6)
    return refuse(err, errlen, "kernel spec: config %s: %s stages %d (0 = 3, or 3..6)", lab, an, c->stages);
  long bytes = (long)stages * (tm + tn) * tk * 2;
  if (bytes > evt_arch_smem_bytes(s->arch))
    return refuse(err, errlen, "kernel spec: config %s: %d stages x %ld bytes of A+B tiles exceed %s's %ld KiB of shared memory",
                  lab, stages, (long)(tm + tn) * tk * 2, an, evt_arch_smem_bytes(s->arch) / 1024);
  return EVT_OK;
}

evt_tile_config evt_arch_untuned_config(int arch, int64_t n) {
  evt_tile_config c = EVT_TILE_CONFIG_DEFAULT;
  if (!evt_arch_sm8x(arch)) return c;
  c.tile_n = n <= 64 ? 64 : 128;
  c.tile_k = 32;
  c.stages = arch == 80 ? 4 : 3;
  return c;
}

evt_status evt_kspec_retarget(evt_kspec *s, int arch, int64_t n, int *bad, char *err, size_t errlen) {
  if (bad) *bad = -1;
  if (!evt_arch_sm8x(arch)) {
    s->arch = 0;
    return EVT_OK;
  }
  if (evt_dtype_is_fp8(s->ab_dtype))
    return refuse(err, errlen, "%s: fp8 operands (%s; evt's fp8 GEMMs are sm_90a's)", evt_arch_name(arch),
                  arch == 89 ? "the sm_8x kernels are CUTLASS 2.x GEMMs without fp8 operands" : "no FP8 tensor cores");
  if (s->ab_dtype == EVT_F32) /* CUTLASS 2.x could (16x8x8 TF32 MMA); evt's Sm80 emitter has 16-bit instruction shapes only */
    return refuse(err, errlen, "%s: f32 (TF32) operands (evt's TF32 GEMMs are sm_90a's; the sm_8x kernels take bf16 / f16 "
                  "operands)", evt_arch_name(arch));
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND) {
      if (bad) *bad = i;
      return refuse(err, errlen, "%s: no Sm80 visitor for rand / dropout in a GEMM epilogue (the Philox node is Sm90's)",
                    evt_arch_name(arch));
    }
  s->arch = arch;
  s->cfg = evt_arch_untuned_config(arch, n);
  return EVT_OK;
}
