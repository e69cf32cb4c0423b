/* evt_program_create: the compile driver of a GPU program (public contract: include/evt.h).
 *
 * Load the kernel library first (so a machine without a GPU fails before g is touched), run the passes
 * (unless EVT_PROGRAM_NO_OPT); with EVT_PROGRAM_FUSED build the fused plan (partition, lowering, paths) and
 * compile its distinct kernels (a group whose kernel fails to compile or load falls back to node by node,
 * reason in its `why`); list the steps and plan the arena; then the runtime (src/runtime/gpu/program.c)
 * allocates the arena and reserves the library's scratch for every node step. fp8 tensors need nothing of their
 * own: fp8 GEMMs and row groups become generated kernels, every other node runs in the kernel library. */
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "passes/passes.h"
#include "compile/compile.h"

/* Records the graph's current error as the program's, returns st. */
static evt_status fail(evt_program *p, evt_status st) {
  snprintf(p->err, sizeof p->err, "%s", evt_graph_error(p->g));
  return st;
}

/* EVT_PROGRAM_FUSED: the plan, then its kernels compiled and loaded; failures demote their groups. */
static evt_status build_fused(evt_program *p, const evt_options *o, bool device) {
  evt_graph *g = p->g;
  p->xp = calloc(1, sizeof *p->xp);
  if (!p->xp) evt_fatal(__FILE__, __LINE__, "out of memory");
  evt_status st = evt_exec_plan_build(g, o, p->xp);
  if (st != EVT_OK) {
    free(p->xp);
    p->xp = NULL;
    return fail(p, st);
  }
  evt_exec_plan *xp = p->xp;
  evt_exec_plan_counts(xp, &p->groups_fused, &p->groups_fallback);
  if (!device) return EVT_OK;
  char **so = evt_compile_kernels(xp);
  evt_gpu_program_load_kernels(p, so);
  evt_compile_kernels_free(so, xp->nkernels);
  return EVT_OK;
}


/* evt's CUDA attention (cuDNN's fused flash attention, the reference kernel) takes no mask: a device program
 * with a masked sdpa (or its backward) is refused, naming the node, so that the PyTorch backend leaves that
 * attention to PyTorch and a C caller runs the graph on the interpreter. */
static evt_status refuse_masked_attention(evt_graph *g) {
  for (int i = 0; i < g->nnodes; i++) {
    const evt_node *n = &g->nodes[i];
    int unmasked = n->op == EVT_OP_SDPA ? 3 : 4;
    if (evt_op_table[n->op].cls == EVT_CLASS_ATTENTION && n->ninputs > unmasked)
      return evt_graph_errorf(g, i, EVT_ERR_UNSUPPORTED,
                              "%s with a mask: evt's CUDA attention (cuDNN, the reference kernel) takes no mask",
                              evt_op_table[n->op].name);
  }
  return EVT_OK;
}

static evt_status create(evt_graph *g, const evt_options *o, bool device, evt_program **out) {
  if (!out) return EVT_ERR_INVALID;
  *out = NULL;
  if (!g) return EVT_ERR_INVALID;
  evt_options dflt;
  if (!o) {
    evt_options_init(&dflt);
    dflt.flags = 0;
    o = &dflt;
  }
  const unsigned flags = o->flags;
  if (o->refine_partition < 0 || o->refine_partition > 2 || o->fusion_ab < 0 || o->fusion_ab > 2)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID,
                               "evt_options: refine_partition %d and fusion_ab %d must be 0, 1 or 2", o->refine_partition,
                               o->fusion_ab);
  if (!(o->arch == 0 || o->arch == 80 || o->arch == 86 || o->arch == 89 || o->arch == 90) || o->ptx < 0 || o->ptx > 1)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID,
                               "evt_options: arch %d (0, 80, 86, 89 or 90) and ptx %d (0 or 1)", o->arch, o->ptx);
  if (o->fp8 != EVT_FP8_OFF && o->fp8 != EVT_FP8_TENSORWISE)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "evt_options: fp8 %d (0 off, 1 tensorwise)", o->fp8);
  if (o->tf32 != 0 && o->tf32 != 1)
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "evt_options: tf32 %d (0 exact f32, 1 TF32)", o->tf32);
  if (flags & ~(unsigned)(EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH | EVT_PROGRAM_NO_OPT))
    return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "evt_program_create: unknown flags 0x%x", flags);
  evt_program *p = calloc(1, sizeof *p);
  if (!p) return evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INTERNAL, "out of memory");
  p->g = g;
  p->flags = flags;
  p->rng_step = g->rng_step; /* the first run's RNG step */
  char why[1024];
  if (device && refuse_masked_attention(g) != EVT_OK) {
    evt_program_destroy(p);
    return EVT_ERR_UNSUPPORTED;
  }
  p->api = device ? evt_gpu_library(why, sizeof why) : NULL;
  evt_status st = EVT_OK;
  if (device && !p->api) {
    evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "%s", why);
    evt_program_destroy(p);
    return EVT_ERR_UNSUPPORTED;
  }
  if (!(flags & EVT_PROGRAM_NO_OPT)) st = evt_passes_run_all(g, evt_compile_pass_flags(o), 0);
  if (st == EVT_OK && g->noutputs == 0) st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_INVALID, "the graph has no outputs");
  if (st == EVT_OK && device && !(p->ctx = p->api->ctx_new(why, sizeof why)))
    st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "no CUDA device: %s", why);
  if (st == EVT_OK && (flags & EVT_PROGRAM_FUSED)) st = build_fused(p, o, device);
  int n = g->nnodes;
  if (st == EVT_OK) {
    p->steps = malloc(sizeof *p->steps * (size_t)(n + 1));
    p->t = calloc((size_t)n + 1, sizeof *p->t);
    p->slots = calloc((size_t)n + 1, sizeof *p->slots);
    p->bound = calloc((size_t)n + 1, 1);
    p->noutputs = g->noutputs;
    p->out_node = malloc(sizeof(int) * (size_t)(g->noutputs + 1));
    p->out_ptr = calloc((size_t)g->noutputs + 1, sizeof(void *));
    if (!p->steps || !p->t || !p->slots || !p->bound || !p->out_node || !p->out_ptr)
      evt_fatal(__FILE__, __LINE__, "out of memory");
    for (int k = 0; k < g->noutputs; k++) p->out_node[k] = g->outputs[k];
    p->nsteps = evt_program_steps(g, p->xp, p->steps);
    st = evt_program_layout(g, p->xp, p->slots, &p->arena_bytes, &p->naive_bytes, why, sizeof why);
    if (st != EVT_OK) evt_graph_errorf_at(g, (evt_origin){0}, st, "memory plan: %s", why);
  }
  if (!device) {
    if (st != EVT_OK) {
      evt_program_destroy(p);
      return st;
    }
    evt_gpu_program_set_tensors(p);
    *out = p;
    return EVT_OK;
  }
  if (st == EVT_OK) st = evt_gpu_program_place(p);
  if (st == EVT_OK) st = evt_gpu_program_rng_init(p);
  if (st == EVT_OK && (flags & EVT_PROGRAM_CUDA_GRAPH) && p->api->stream_new(&p->capture_stream, why, sizeof why))
    st = evt_graph_errorf_at(g, (evt_origin){0}, EVT_ERR_UNSUPPORTED, "capture stream: %s", why);
  if (st != EVT_OK) {
    evt_program_destroy(p);
    return st;
  }
  p->dirty = true;
  *out = p;
  return EVT_OK;
}



unsigned evt_compile_pass_flags(const evt_options *o) { return o && o->fp8 ? EVT_PASS_FP8 : 0; }

void evt_options_init(evt_options *o) {
  *o = (evt_options){.flags = EVT_PROGRAM_FUSED, .refine_partition = 0, .fusion_ab = 1};
}

static evt_options with_flags(unsigned flags) {
  evt_options o;
  evt_options_init(&o);
  o.flags = flags;
  return o;
}

evt_status evt_program_create(evt_graph *g, unsigned flags, evt_program **out) {
  evt_options o = with_flags(flags);
  return create(g, &o, true, out);
}

evt_status evt_program_create_opts(evt_graph *g, const evt_options *o, evt_program **out) { return create(g, o, true, out); }

evt_status evt_program_create_host(evt_graph *g, unsigned flags, evt_program **out) {
  evt_options o = with_flags(flags);
  return create(g, &o, false, out);
}

evt_status evt_program_create_host_opts(evt_graph *g, const evt_options *o, evt_program **out) {
  return create(g, o, false, out);
}
