/* The GPU target of a compilation (contract in compile.h, evt_compile_target; evt_arch_parse in include/evt.h):
 * the options' arch, or the present GPU's; and whether its kernels must be PTX so that the GPU present can run
 * them (the driver JIT-compiles PTX of an older target; machine code of another arch would not load). */
#include <string.h>

#include "codegen/kspec.h"
#include "compile/compile.h"

evt_status evt_arch_parse(const char *text, int *arch, int *ptx) {
  static const struct {
    const char *name;
    int arch, ptx;
  } names[] = {{"auto", 0, 0},       {"sm_80", 80, 0},      {"sm_86", 86, 0},      {"sm_89", 89, 0},
               {"sm_90a", 90, 0},    {"sm_90", 90, 0},      {"compute_80", 80, 1}, {"compute_86", 86, 1},
               {"compute_89", 89, 1}, {"compute_90a", 90, 1}};
  for (size_t i = 0; text && i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(text, names[i].name)) {
      *arch = names[i].arch;
      *ptx = names[i].ptx;
      return EVT_OK;
    }
  return EVT_ERR_INVALID;
}

/* The target whose kernels a GPU of compute capability cc runs natively: 80, 86 (8.6-8.8), 89, else 90. */
static int target_of_device(int cc) {
  if (cc >= 80 && cc < 86) return 80;
  if (cc >= 86 && cc < 89) return 86;
  return cc == 89 ? 89 : 90;
}

void evt_compile_target(const evt_options *o, int *arch, int *ptx) {
  int cc = evt_gpu_device_arch();
  *arch = o && o->arch ? o->arch : cc ? target_of_device(cc) : 90;
  *ptx = (o && o->ptx) || (cc && cc != (*arch == 90 ? 90 : *arch));
}
