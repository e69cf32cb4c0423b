/* Named spmm row-kernel specs: test fixtures for the CPU tests, the arch CI compile and tests/gpu/check_spmm.cu, not
 * compiler code (contract in examples.h). Kept apart from the row examples: their launches take a CSR operand. */
#include <string.h>

#include "codegen/examples.h"

/* GCN layer 1: h = relu(A x + b), dropout p = 0.1 drawn in the kernel; h, the masked output and the mask stored. */
static void ex_spmm_gcn1(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SPMM, dt);
  s->val_dtype = dt;
  int b = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, dt, "b");
  int h = evt_rspec_add(s, EVT_V_RELU, evt_rspec_add(s, EVT_V_ADD, evt_rspec_acc(s, EVT_RV_OUT), b, EVT_F32, NULL), -1,
                        EVT_F32, NULL);
  int keep = evt_rspec_add(s, EVT_V_GE, evt_rspec_rand(s, 1, 0, EVT_F32), evt_rspec_scalar(s, 0.1), EVT_F32, NULL);
  int y = evt_rspec_add(s, EVT_V_MUL, evt_rspec_add(s, EVT_V_MUL, h, keep, EVT_F32, NULL), evt_rspec_scalar(s, 1.0 / 0.9),
                        EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, h, -1, dt, "h");
  evt_rspec_add(s, EVT_V_AUX_STORE, y, -1, dt, "y");
  evt_rspec_add(s, EVT_V_AUX_STORE, keep, -1, EVT_BOOL, "mask");
}

/* GCN layer 2: logits = A x + b stored, with the row max the cross entropy starts from (f32). */
static void ex_spmm_gcn2(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SPMM, dt);
  s->val_dtype = dt;
  int b = evt_rspec_add(s, EVT_V_ROW_BCAST, -1, -1, dt, "b");
  int z = evt_rspec_add(s, EVT_V_ADD, evt_rspec_acc(s, EVT_RV_OUT), b, EVT_F32, NULL);
  evt_rspec_add(s, EVT_V_AUX_STORE, z, -1, dt, "z");
  evt_rspec_add(s, EVT_V_COL_MAX, z, -1, EVT_F32, "zmax");
}

/* spmm_t: dx = A^T dy (values through perm), stored, with a sum over its rows (f32). */
static void ex_spmm_t(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SPMM, dt);
  s->val_dtype = dt;
  s->has_perm = 1;
  int a = evt_rspec_acc(s, EVT_RV_OUT);
  evt_rspec_add(s, EVT_V_AUX_STORE, a, -1, dt, "dx");
  evt_rspec_add(s, EVT_V_ROW_SUM, a, -1, EVT_F32, "dxsum");
}

/* i32 indices, f32 values over a dt x: y = A x stored as dt. */
static void ex_spmm_i32(evt_rspec *s, evt_dtype dt) {
  evt_rspec_init(s, EVT_ROWN_SPMM, dt);
  s->val_dtype = EVT_F32;
  s->idx_dtype = EVT_I32;
  evt_rspec_add(s, EVT_V_AUX_STORE, evt_rspec_acc(s, EVT_RV_OUT), -1, dt, "y");
}

/* spmm_t with i32 indices and f32 values over a dt dy: dx = A^T dy stored as dt (A^T's CSR in i32 too). */
static void ex_spmm_t_i32(evt_rspec *s, evt_dtype dt) {
  ex_spmm_i32(s, dt);
  s->has_perm = 1;
}

#define SPMM_EXAMPLES(X) X(spmm_gcn1) X(spmm_gcn2) X(spmm_t) X(spmm_i32) X(spmm_t_i32)

#define NAME(e) #e,
const char *const evt_rspec_spmm_example_names[] = {SPMM_EXAMPLES(NAME) NULL};
#undef NAME

#define BUILDER(e) ex_##e,
static void (*const builders[])(evt_rspec *s, evt_dtype dt) = {SPMM_EXAMPLES(BUILDER)};
#undef BUILDER

evt_status evt_rspec_spmm_example(evt_rspec *s, const char *name, evt_dtype dt) {
  for (int i = 0; evt_rspec_spmm_example_names[i]; i++)
    if (!strcmp(name, evt_rspec_spmm_example_names[i])) {
      builders[i](s, dt);
      return EVT_OK;
    }
  return EVT_ERR_INVALID;
}
