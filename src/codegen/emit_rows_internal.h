/* The row-kernel emitter's shared state (internal to src/codegen/; the contract is evt_emit_rows in rspec.h).
 * emit_rows.c: the driver, banner, tuning knobs, Params and the host launchers; emit_rows_kernels.c: the
 * __global__ kernels; emit_rows_epilogue.c: the per-row epilogue the kernels share. */
#ifndef EVT_CODEGEN_EMIT_ROWS_INTERNAL_H
#define EVT_CODEGEN_EMIT_ROWS_INTERNAL_H

#include <stdbool.h>

#include "codegen/rspec.h"
#include "ir/ir.h"

typedef evt_sbuf sbuf;
#define sb evt_sbuf_printf

/* The C++ element type of a dtype in generated row kernels. */
static inline const char *ctype(evt_dtype t) {
  switch (t) {
    case EVT_BF16: return "__nv_bfloat16";
    case EVT_F16: return "__half";
    case EVT_BOOL: return "unsigned char";
    case EVT_I64: return "long long";
    case EVT_I32: return "int";
    case EVT_F8E4M3: return "__nv_fp8_e4m3";
    case EVT_F8E5M2: return "__nv_fp8_e5m2";
    default: return "float";
  }
}

static inline int is_int(evt_dtype t) { return t == EVT_I64 || t == EVT_I32; }
static inline int is_16bit(evt_dtype t) { return t == EVT_BF16 || t == EVT_F16; }

/* Whether the spec draws random numbers (a rand node: the kernel then reads the run's RNG step). */
static inline bool has_rand(const evt_rspec *s) {
  for (int i = 0; i < s->nnodes; i++)
    if (s->nodes[i].op == EVT_V_RAND) return true;
  return false;
}

/* An M×N row input fetched ahead of its row: its Params field, element type and register array. */
typedef struct rows_input {
  char field[40];
  const char *type;
  char arr[16];
} rows_input;

/* One spec's facts, derived once and read by every part of its source. */
typedef struct rows_emit {
  const evt_rspec *s;
  evt_row_nucleus nu;
  char kname[40];                 /* evt_rowkernel_<hash> */
  const char *hash;               /* the <hash> part of kname */
  const char *in_t, *in1_t, *w_t; /* element types of the nucleus's inputs 0 and 1 and of w / b */
  int users[EVT_RSPEC_MAX_NODES]; /* readers of each node */
  int rsk[EVT_RSPEC_MAX_NODES];   /* a row_sum node's index among the row sums */
  int nrowsum;                    /* row_sum nodes (Σ over M: workspace partials and a finalize launch) */
  int nstore;                     /* aux_store nodes (M×N stores) */
  int ncolsum;                    /* col_sum / col_max nodes (per-row reductions: they need the shared slots) */
  int nrb;                        /* row_bcast nodes */
  int aux_rows;                   /* aux_load nodes (M×N inputs of the epilogue) */
  int half_rows;                  /* every row input and w / b 16-bit */
  int min_vpt;                    /* chunks per thread at least, for rows longer than one warp takes */
  int long_form;                  /* evt_rspec_long_rows */
  int cols;                       /* emits the column-block kernel (nucleus-free, no per-row reduction) */
  int nrin;
  rows_input rin[EVT_RSPEC_MAX_NODES + 2]; /* the nucleus's M×N inputs, then the aux loads */
} rows_emit;

/* emit_rows_epilogue.c */
/* The kernel's scalars: rank-0 loads and, with rand nodes, the run's RNG step. */
void evt_emit_rows_scalar_loads(sbuf *b, const evt_rspec *s);
/* The epilogue of one row; form 0: the register kernel, 1: the long-row kernel, 2: the column-block kernel. */
void evt_emit_rows_epilogue(sbuf *b, const rows_emit *ctx, int lng);

/* emit_rows_kernels.c */
void evt_emit_rows_kernel(sbuf *b, const rows_emit *ctx);      /* row_kernel<WARPS, VPT, R, EX> */
void evt_emit_rows_long_kernel(sbuf *b, const rows_emit *ctx); /* row_kernel_long<WARPS> (long_form 1) */
void evt_emit_rows_cols_kernel(sbuf *b, const rows_emit *ctx); /* row_kernel_cols<WARPS, U> (cols) */

#endif
