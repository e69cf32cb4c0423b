/* The GPU program API (src/runtime/gpu/program.c) without a GPU: create fails cleanly, bindings name what is
 * wrong (through evt_program_create_host, the host half of create), and the arena plan never lets two live
 * tensors share bytes while taking less than one buffer per node. The GPU half: tests/gpu/program_check.c. */
#include "passes/passes.h"
#include "compile/compile.h"
#include "runtime/gpu/cuda.h"
#include "runtime/gpu/exec_plan.h"
#include "test.h"
#include "compile/train.h"

#include <stdlib.h>
#include <string.h>

static const char *k_small = "graph g {\n  %x: f32[4, 8] = input(init=normal)\n  %w: f32[8, 3] = param(init=normal)\n"
                             "  %y: i64[4] = input(init=zeros)\n  %h: f32[4, 3] = mm(%x, %w)\n"
                             "  %loss: f32[] = cross_entropy(%h, %y)\n  loss %loss\n}\n";

static evt_graph *parse_joint(const char *text) {
  char *err = NULL;
  evt_graph *g = evt_parse(text, "t.evt", &err);
  CHECK_MSG(g, "%s", err ? err : "");
  free(err);
  if (g) CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  return g;
}

/* The joint graph of a file (a parse failure is a test failure, with the parser's message; NULL). */
static evt_graph *load_joint_file(const char *path) {
  char *err = NULL;
  evt_graph *g = evt_parse_file(path, &err);
  CHECK_MSG(g != NULL, "%s: %s", path, err ? err : "");
  free(err);
  if (g) CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
  return g;
}

/* Runs f with EVT_FALLBACK_LIB pointing nowhere (then restores it). */
static void without_library(void (*f)(void)) {
  const char *old = getenv("EVT_FALLBACK_LIB");
  char *saved = old ? strdup(old) : NULL;
  setenv("EVT_FALLBACK_LIB", "/nonexistent/libevt_fallback.so", 1);
  f();
  if (saved) setenv("EVT_FALLBACK_LIB", saved, 1);
  else unsetenv("EVT_FALLBACK_LIB");
  free(saved);
}

static void create_without_gpu(void) {
  evt_graph *g = parse_joint(k_small);
  if (!g) return;
  int before = g->nnodes;
  unsigned modes[] = {0, EVT_PROGRAM_FUSED, EVT_PROGRAM_FUSED | EVT_PROGRAM_CUDA_GRAPH, EVT_PROGRAM_NO_OPT};
  for (int m = 0; m < 4; m++) {
    evt_program *p = (evt_program *)1;
    CHECK(evt_program_create(g, modes[m], &p) == EVT_ERR_UNSUPPORTED);
    CHECK(p == NULL);
    CHECK_MSG(strstr(evt_graph_error(g), "no CUDA device") != NULL, "%s", evt_graph_error(g));
    CHECK(g->nnodes == before); /* the library is checked before the passes touch g */
  }
  evt_graph_free(g);
}

TEST(program_create_without_gpu_is_unsupported) { without_library(create_without_gpu); }

/* evt's CUDA attention takes no mask: creating a device program with a masked sdpa is refused before any GPU
 * is looked for, naming the node (the PyTorch backend then leaves that attention to PyTorch). */
TEST(program_create_refuses_masked_attention) {
  evt_graph *g = parse_joint("graph g {\n  %q: f32[1,2,3,4] = param(init=normal)\n  %m: bool[1,1,1,3] = input()\n"
                             "  %att = sdpa(%q, %q, %q, %m)\n  %loss = sum(%att)\n  loss %loss\n}\n");
  evt_program *p = NULL;
  CHECK(g && evt_program_create(g, 0, &p) == EVT_ERR_UNSUPPORTED && p == NULL);
  if (g) CHECK(strstr(evt_graph_error(g), "sdpa with a mask") != NULL && strstr(evt_graph_error(g), "%att") != NULL);
  evt_graph_free(g);
}

TEST(program_create_rejects_bad_arguments) {
  evt_program *p = NULL;
  CHECK(evt_program_create(NULL, 0, &p) == EVT_ERR_INVALID && p == NULL);
  evt_graph *g = parse_joint(k_small);
  if (!g) return;
  CHECK(evt_program_create(g, 0, NULL) == EVT_ERR_INVALID);
  CHECK(evt_program_create(g, 64, &p) == EVT_ERR_INVALID && p == NULL);
  CHECK(strstr(evt_graph_error(g), "unknown flags") != NULL);
  /* every entry tolerates a NULL program */
  CHECK(evt_program_bind(NULL, "x", (void *)16) == EVT_ERR_INVALID);
  CHECK(evt_program_bind_output(NULL, 0, (void *)16) == EVT_ERR_INVALID);
  CHECK(evt_program_run(NULL, NULL) == EVT_ERR_INVALID);
  CHECK(evt_program_launch_count(NULL) == 0);
  CHECK(strlen(evt_program_error(NULL)) > 0);
  evt_program_destroy(NULL);
  evt_graph_free(g);
}

/* The host half of a program of k_small's joint graph (NULL, with *g freed and NULL, when either fails). */
static evt_program *small_host_program(evt_graph **g) {
  *g = parse_joint(k_small);
  if (!*g) return NULL;
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(*g, 0, &p) == EVT_OK, "%s", evt_graph_error(*g));
  if (!p) {
    evt_graph_free(*g);
    *g = NULL;
  }
  return p;
}

TEST(program_bind_errors_name_what_is_wrong) {
  evt_graph *g;
  evt_program *p = small_host_program(&g);
  if (!p) return;
  CHECK(!strcmp(evt_program_error(p), ""));
  void *mem = (void *)(uintptr_t)4096;
  CHECK(evt_program_bind(p, "nosuch", mem) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "no input or param named 'nosuch'"), "%s", evt_program_error(p));
  CHECK(evt_program_bind(p, "h", mem) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "'h' is a mm node, not an input or param"), "%s", evt_program_error(p));
  CHECK(evt_program_bind(p, "x", NULL) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "%x") && strstr(evt_program_error(p), "NULL device pointer"), "%s",
            evt_program_error(p));
  CHECK(evt_program_bind(p, NULL, mem) == EVT_ERR_INVALID);
  int no = evt_graph_output_count(g);
  CHECK(no == 2); /* loss, grad.w */
  CHECK(evt_program_bind_output(p, no, mem) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "output index 2 is out of range (the graph has 2 outputs)"), "%s",
            evt_program_error(p));
  CHECK(evt_program_bind_output(p, -1, mem) == EVT_ERR_INVALID);
  /* a run names the first missing binding */
  CHECK(evt_program_bind(p, "x", mem) == EVT_OK);
  CHECK(evt_program_bind(p, "w", mem) == EVT_OK);
  CHECK(evt_program_run(p, NULL) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "%y") && strstr(evt_program_error(p), "not bound"), "%s", evt_program_error(p));
  CHECK(evt_program_bind(p, "y", mem) == EVT_OK);
  CHECK(evt_program_bind_output(p, 0, mem) == EVT_OK);
  CHECK(evt_program_run(p, NULL) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "output 1 is not bound"), "%s", evt_program_error(p));
  CHECK(evt_program_bind_output(p, 1, mem) == EVT_OK);
  CHECK(evt_program_run(p, NULL) == EVT_ERR_UNSUPPORTED); /* all bound; no device */
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* A device API that hands out host memory and counts what it allocates and frees: the arena's ownership
 * without a GPU. */
static int fake_allocs, fake_frees;
static void *fake_alloc(int64_t n, char *why, size_t len) {
  (void)why, (void)len;
  fake_allocs++;
  return aligned_alloc(EVT_ARENA_ALIGN, (size_t)((n + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN + 1) * EVT_ARENA_ALIGN);
}
static void fake_free(void *q) {
  if (q) fake_frees++;
  free(q);
}
static int fake_reserve(evt_fb_ctx *c, const evt_fb_node *n, char *why, size_t len) {
  (void)c, (void)n, (void)why, (void)len;
  return 0;
}
/* every node step needs 10 + 4 doubles of library scratch; binding records where the program put them */
static void *fake_s1, *fake_s2;
static int fake_scratch_need(evt_fb_ctx *c, const evt_fb_node *n, int64_t *n1, int64_t *n2, char *why, size_t len) {
  (void)c, (void)n, (void)why, (void)len;
  *n1 = 10, *n2 = 4;
  return 0;
}
static void fake_bind_scratch(evt_fb_ctx *c, void *s1, int64_t n1, void *s2, int64_t n2) {
  (void)c, (void)n1, (void)n2;
  fake_s1 = s1, fake_s2 = s2;
}
static void fake_nothing(void *q) { (void)q; }
static void fake_ctx_free(evt_fb_ctx *c) { (void)c; }
static const evt_fb_api fake = {.alloc = fake_alloc, .free_ = fake_free, .reserve = fake_reserve,
                                .scratch_need = fake_scratch_need, .bind_scratch = fake_bind_scratch,
                                .graph_free = fake_nothing, .stream_free = fake_nothing, .ctx_free = fake_ctx_free};

/* Every arena tensor of p points into [base, base + bytes). */
static bool tensors_in(const evt_graph *g, const evt_program *p, const char *base, int64_t bytes) {
  int n = 0;
  for (int v = 0; v < g->nnodes; v++)
    if (p->slots[v].kind == EVT_SLOT_ARENA) {
      n++;
      if (!p->t[v].ptr || (const char *)p->t[v].ptr < base || (const char *)p->t[v].ptr + p->slots[v].bytes > base + bytes)
        return false;
    }
  return n > 0;
}

/* evt_program_bind_arena and the lazy arena: placing a program allocates no arena (a caller that binds one
 * before the first run never holds two); a run without one allocates the program's own; the caller's memory
 * replaces it (freed), is never freed itself, too little or misaligned memory is refused by name, NULL
 * returns to an arena of its own (allocated by the next run), and every arena tensor points into the arena. */
TEST(program_bind_arena_owns_and_releases) {
  evt_graph *g;
  evt_program *p = small_host_program(&g);
  if (!p) return;
  CHECK(evt_program_bind_arena(p, NULL, 0) == EVT_ERR_UNSUPPORTED); /* planned without a device */
  p->api = &fake;
  fake_allocs = fake_frees = 0;
  CHECK(evt_gpu_program_place(p) == EVT_OK && !p->arena && !p->arena_caller && fake_allocs == 0);
  int64_t need = evt_program_arena_bytes(p);
  CHECK(need > 0);
  char *mine = aligned_alloc(EVT_ARENA_ALIGN, (size_t)((need + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN + 1) * EVT_ARENA_ALIGN);
  CHECK(evt_program_bind_arena(p, mine, need) == EVT_OK && p->arena == mine && tensors_in(g, p, mine, need));
  CHECK(evt_gpu_program_ensure_arena(p) == EVT_OK && p->arena == mine);
  CHECK(fake_allocs == 0 && fake_frees == 0); /* bound before the first run: no arena of its own, ever */
  CHECK(evt_program_bind_arena(p, NULL, 0) == EVT_OK && !p->arena && !p->arena_caller && fake_frees == 0);
  CHECK(evt_gpu_program_ensure_arena(p) == EVT_OK && p->arena && p->arena != mine && fake_allocs == 1);
  CHECK(tensors_in(g, p, p->arena, need));
  CHECK(evt_gpu_program_ensure_arena(p) == EVT_OK && fake_allocs == 1); /* kept */
  CHECK(evt_program_bind_arena(p, mine, need - 1) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "the arena needs"), "%s", evt_program_error(p));
  CHECK(evt_program_bind_arena(p, mine + 8, need) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "256-byte aligned"), "%s", evt_program_error(p));
  CHECK(fake_frees == 0);
  p->dirty = false;
  CHECK(evt_program_bind_arena(p, mine, need) == EVT_OK && p->arena == mine && p->dirty);
  CHECK(fake_frees == 1 && tensors_in(g, p, mine, need)); /* the program's own */
  p->dirty = false;
  CHECK(evt_program_bind_arena(p, mine, need) == EVT_OK && !p->dirty); /* the same memory: nothing to capture */
  CHECK(evt_gpu_program_place(p) == EVT_OK && p->arena == mine);   /* a re-plan that fits keeps it */
  p->arena_caller_bytes = need - 1;                                  /* one that does not drops it */
  CHECK(evt_gpu_program_place(p) == EVT_OK && !p->arena && fake_frees == 1);
  CHECK(evt_gpu_program_ensure_arena(p) == EVT_OK && p->arena && fake_allocs == 2);
  evt_program_destroy(p); /* frees its own, nothing of the caller's */
  CHECK(fake_frees == 2);
  free(mine);
  evt_graph_free(g);
}

/* The GEMM scratch and the library's double scratch live at the arena's end (aligned): evt_program_arena_bytes
 * counts them, binding fewer bytes is refused, and they move with the arena (bound or the program's own). */
TEST(program_scratch_is_in_the_arena) {
  evt_graph *g = parse_joint(k_small);
  if (!g) return;
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  if (!p || !p->xp) {
    CHECK(p && p->xp);
    evt_program_destroy(p);
    evt_graph_free(g);
    return;
  }
  p->api = &fake;
  p->ctx = (evt_fb_ctx *)&fake; /* (never dereferenced by the fakes) */
  p->xp->scratch_bytes = 1000;
  int64_t at = (p->arena_bytes + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN * EVT_ARENA_ALIGN;
  int64_t s1 = at + 1024, s2 = s1 + 256, need = s2 + 4 * 8; /* 1000 -> 1024; 10 doubles -> 256 */
  bool node_steps = false;
  for (int s = 0; s < p->nsteps; s++) node_steps = node_steps || p->steps[s].node >= 0;
  CHECK(node_steps); /* (the library's scratch is sized by node steps) */
  fake_s1 = fake_s2 = (void *)&fake;
  CHECK(evt_gpu_program_place(p) == EVT_OK && !p->gemm_scratch && !fake_s1 && !fake_s2);
  CHECK(p->lib_n1 == 10 && p->lib_n2 == 4 && evt_program_arena_bytes(p) == need);
  CHECK(evt_gpu_program_ensure_arena(p) == EVT_OK && p->gemm_scratch == p->arena + at);
  CHECK(fake_s1 == p->arena + s1 && fake_s2 == p->arena + s2);
  char *mine = aligned_alloc(EVT_ARENA_ALIGN, (size_t)((need + EVT_ARENA_ALIGN - 1) / EVT_ARENA_ALIGN + 1) * EVT_ARENA_ALIGN);
  CHECK(evt_program_bind_arena(p, mine, need - 1) == EVT_ERR_INVALID);
  CHECK(evt_program_bind_arena(p, mine, need) == EVT_OK && p->gemm_scratch == mine + at);
  CHECK(fake_s1 == mine + s1 && fake_s2 == mine + s2);
  p->xp->scratch_bytes = 0;
  p->lib_n1 = p->lib_n2 = 0;
  CHECK(evt_program_arena_bytes(p) == p->arena_bytes);
  p->ctx = NULL;
  evt_program_destroy(p);
  free(mine);
  evt_graph_free(g);
}

/* evt_program_sgd without a device: the learning rate, the bindings and the gradient outputs are checked
 * (each failure says which), then it needs the device like a run. */
/* The RNG step: a program starts at its graph's, evt_program_set_rng_step sets the next run's (a host program has
 * no device word to write: it only records it). The device side (every run advancing it) is tests/gpu/run.sh's:
 * dropout graphs over several steps against the interpreter step by step. */
TEST(program_rng_step_starts_at_the_graphs) {
  CHECK(evt_program_set_rng_step(NULL, 1, NULL) == EVT_ERR_INVALID);
  CHECK(evt_program_rng_step(NULL) == 0);
  char *err = NULL;
  evt_graph *g = evt_parse_file("examples/mlp.evt", &err);
  free(err);
  if (!g) return;
  CHECK(evt_graph_rng_step(g) == 0);
  evt_graph_set_rng_step(g, 41);
  evt_program *p = NULL;
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK && evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK);
  if (p) {
    CHECK(evt_program_rng_step(p) == 41);
    CHECK(evt_program_set_rng_step(p, 7, NULL) == EVT_OK && evt_program_rng_step(p) == 7);
    evt_program_destroy(p);
  }
  evt_graph_free(g);
}

TEST(program_sgd_checks_its_arguments) {
  CHECK(evt_program_sgd(NULL, 0.1, NULL) == EVT_ERR_INVALID);
  evt_graph *g;
  evt_program *p = small_host_program(&g);
  if (!p) return;
  void *mem = (void *)(uintptr_t)4096;
  CHECK(evt_program_sgd(p, -0.1, NULL) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_program_error(p), "learning rate"), "%s", evt_program_error(p));
  CHECK(evt_program_sgd(p, 1.0 / 0.0, NULL) == EVT_ERR_INVALID);
  CHECK(evt_program_sgd(p, 0.1, NULL) == EVT_ERR_INVALID); /* nothing bound */
  CHECK_MSG(strstr(evt_program_error(p), "not bound"), "%s", evt_program_error(p));
  CHECK(evt_program_bind(p, "x", mem) == EVT_OK && evt_program_bind(p, "w", mem) == EVT_OK &&
        evt_program_bind(p, "y", mem) == EVT_OK && evt_program_bind_output(p, 0, mem) == EVT_OK);
  CHECK(evt_program_sgd(p, 0.1, NULL) == EVT_ERR_INVALID); /* grad.w's output not bound */
  CHECK_MSG(strstr(evt_program_error(p), "output 1 is not bound"), "%s", evt_program_error(p));
  CHECK(evt_program_bind_output(p, 1, mem) == EVT_OK);
  CHECK(evt_program_sgd(p, 0.1, NULL) == EVT_ERR_UNSUPPORTED); /* all bound, a gradient for w; no device */
  CHECK_MSG(strstr(evt_program_error(p), "without a device"), "%s", evt_program_error(p));
  evt_program_destroy(p);
  evt_graph_free(g);
  /* a graph with a loss but no gradient outputs (not the joint graph): nothing to update */
  char *err = NULL;
  g = evt_parse(k_small, "t.evt", &err);
  free(err);
  if (!g) return;
  CHECK(evt_program_create_host(g, EVT_PROGRAM_NO_OPT, &p) == EVT_OK);
  if (p) {
    for (int i = 0; i < evt_graph_output_count(g); i++) CHECK(evt_program_bind_output(p, i, mem) == EVT_OK);
    CHECK(evt_program_bind(p, "x", mem) == EVT_OK && evt_program_bind(p, "w", mem) == EVT_OK &&
          evt_program_bind(p, "y", mem) == EVT_OK);
    CHECK(evt_program_sgd(p, 0.1, NULL) == EVT_ERR_INVALID);
    CHECK_MSG(strstr(evt_program_error(p), "no %grad.<param> output"), "%s", evt_program_error(p));
  }
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* Independent check of a layout: aligned, inside the arena, the lifetime of every arena tensor covers
 * every step that reads it (recomputed here from the steps), and tensors alive together never overlap. */
static int check_layout(const evt_graph *g, const evt_exec_plan *xp, const evt_arena_slot *s, int64_t arena,
                        const char *what) {
  int n = g->nnodes, bad = 0;
  evt_prog_step *steps = malloc(sizeof *steps * (size_t)(n + 1));
  int ns = evt_program_steps(g, xp, steps);
  for (int v = 0; v < n; v++) {
    const evt_node *nd = &g->nodes[v];
    bool caller = nd->op == EVT_OP_INPUT || nd->op == EVT_OP_PARAM || (nd->flags & EVT_NODE_OUTPUT);
    CHECK_MSG(caller == (s[v].kind == EVT_SLOT_CALLER), "%s: %%%s", what, nd->name);
    if (s[v].kind != EVT_SLOT_ARENA) continue;
    int64_t need = evt_type_numel(&nd->type) * (int64_t)evt_dtype_size(nd->type.dtype);
    CHECK_MSG(s[v].offset % 256 == 0 && s[v].offset + s[v].bytes <= arena && s[v].bytes >= need, "%s: %%%s", what,
              nd->name);
  }
  for (int k = 0; k < ns; k++) {
    int reads[64], nr = 0;
    if (steps[k].node >= 0) {
      CHECK(s[steps[k].node].kind != EVT_SLOT_ARENA || s[steps[k].node].first == k);
      for (int j = 0; j < g->nodes[steps[k].node].ninputs; j++) reads[nr++] = g->nodes[steps[k].node].inputs[j];
    } else {
      const evt_group_exec *x = &xp->groups[steps[k].group];
      if (x->kind == EVT_LK_GEMM_EVT) {
        reads[nr++] = x->a_node;
        reads[nr++] = x->b_node;
        if (x->d_node >= 0) reads[nr++] = x->d_node;
      } else {
        for (int j = 0; j < 4; j++)
          if (x->in_node[j] >= 0) reads[nr++] = x->in_node[j];
      }
      for (int j = 0; j < EVT_ROW_LAUNCH_MAX_PTRS && nr < 64; j++)
        if (x->ptr_node[j] >= 0) reads[nr++] = x->ptr_node[j]; /* loads and stores: both live at k */
    }
    for (int j = 0; j < nr; j++) {
      int a = evt_exec_alias(xp, reads[j]); /* a node sharing another's memory is read there */
      const evt_arena_slot *r = &s[a >= 0 ? a : reads[j]];
      if (r->kind == EVT_SLOT_NONE && steps[k].node >= 0) bad++; /* a node step reads memory that is not there */
      if (r->kind == EVT_SLOT_ARENA && (k < r->first || k > r->last)) bad++;
    }
  }
  CHECK_MSG(bad == 0, "%s: %d reads outside a lifetime", what, bad);
  int overlaps = 0;
  for (int a = 0; a < n; a++)
    for (int b = a + 1; b < n; b++) {
      if (s[a].kind != EVT_SLOT_ARENA || s[b].kind != EVT_SLOT_ARENA) continue;
      int ua = evt_exec_alias(xp, a), ub = evt_exec_alias(xp, b);
      if (ua == b || ub == a || (ua >= 0 && ua == ub)) continue; /* views sharing one stored value's memory */
      bool live = s[a].first <= s[b].last && s[b].first <= s[a].last;
      bool share = s[a].offset < s[b].offset + s[b].bytes && s[b].offset < s[a].offset + s[a].bytes;
      overlaps += live && share;
    }
  CHECK_MSG(overlaps == 0, "%s: %d live pairs share bytes", what, overlaps);
  free(steps);
  return overlaps + bad;
}

/* Random DAGs of elementwise ops and reductions (node by node), some nodes marked as outputs. */
TEST(program_layout_random_graphs_never_overlap_live_tensors) {
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (int trial = 0; trial < 60; trial++) {
    evt_graph *g = evt_graph_new("rand");
    int64_t shapes[3][2] = {{8, 16}, {8, 1}, {64, 16}};
    int ids[80], nid = 0;
    for (int i = 0; i < 3; i++) {
      char nm[16];
      snprintf(nm, sizeof nm, "x%d", i);
      ids[nid++] = evt_input(g, nm, EVT_F32, 2, shapes[i == 2 ? 0 : i]);
    }
    int count = 10 + trial % 50;
    for (int i = 0; i < count; i++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      int a = ids[(rng >> 33) % (uint64_t)nid], b = ids[(rng >> 45) % (uint64_t)nid], op = (int)((rng >> 20) % 5);
      const char *names[] = {"add", "mul", "relu", "exp", "sub"};
      int in[2] = {a, b};
      int id = evt_add_op(g, names[op], in, op == 2 || op == 3 ? 1 : 2, NULL, 0);
      CHECK_MSG(id >= 0, "%s", evt_graph_error(g));
      if (id < 0) break;
      ids[nid++] = id;
      if ((rng >> 40) % 7 == 0) evt_graph_add_output(g, id);
    }
    evt_graph_add_output(g, ids[nid - 1]);
    int n = g->nnodes;
    evt_arena_slot *s = calloc((size_t)n, sizeof *s);
    int64_t arena = 0, naive = 0;
    char err[256];
    CHECK_MSG(evt_program_layout(g, NULL, s, &arena, &naive, err, sizeof err) == EVT_OK, "%s", err);
    check_layout(g, NULL, s, arena, "random");
    CHECK(arena <= naive);
    free(s);
    evt_graph_free(g);
  }
}

/* Every example, node by node and fused: a valid layout that takes less than one buffer per node. */
TEST(program_layout_examples_smaller_than_a_buffer_per_node) {
  const char *files[] = {"examples/mlp.evt",  "examples/bert_layer.evt", "examples/resnet_block.evt",
                         "examples/vit.evt",  "examples/gcn.evt",        "examples/xmlcnn.evt",
                         "bench/graphs/bert_layer_bf16.evt"};
  for (int f = 0; f < 7; f++) {
    for (int fused = 0; fused < 2; fused++) {
      char *err = NULL;
      evt_graph *g = evt_parse_file(files[f], &err);
      CHECK_MSG(g != NULL, "%s: %s (run from the repository root)", files[f], err ? err : "");
      free(err);
      if (!g) continue;
      CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK);
      evt_program *p = NULL;
      CHECK_MSG(evt_program_create_host(g, fused ? EVT_PROGRAM_FUSED : 0, &p) == EVT_OK, "%s: %s", files[f],
                evt_graph_error(g));
      if (p) {
        char what[128];
        snprintf(what, sizeof what, "%s %s", files[f], fused ? "fused" : "node by node");
        CHECK_MSG(p->arena_bytes > 0 && p->arena_bytes < p->naive_bytes, "%s: arena %lld, naive %lld", what,
                  (long long)p->arena_bytes, (long long)p->naive_bytes);
        check_layout(g, p->xp, p->slots, p->arena_bytes, what);
        if (getenv("EVT_TEST_VERBOSE"))
          printf("  %s: arena %lld bytes, one buffer per node %lld\n", what, (long long)p->arena_bytes, (long long)p->naive_bytes);
        bool has_rows = f == 0 || f == 1 || f == 6; /* examples with lowered row / pointwise groups */
        if (fused && has_rows) CHECK_MSG(p->xp && p->groups_fused > 0, "%s: no fused group", what);
        /* members of fused groups that no store writes take no memory */
        int none = 0;
        for (int v = 0; v < g->nnodes; v++) none += p->slots[v].kind == EVT_SLOT_NONE && g->nodes[v].op != EVT_OP_SCALAR;
        if (fused && has_rows) CHECK_MSG(none > 0, "%s: every node has memory", what);
      }
      evt_program_destroy(p);
      evt_graph_free(g);
    }
  }
}

/* The refined partition (refine_partition 1, the torch backend's) of resnet_block lets a reshape of a
 * batch norm's stored rstd share its memory (an alias): its layout is valid (the alias's readers keep the base
 * alive; an alias and its base are one tensor, not an overlap). */
TEST(program_layout_refined_plan_with_aliases) {
  const char *files[] = {"examples/resnet_block.evt", "bench/graphs/resnet_block_bf16.evt"};
  evt_options o;
  evt_options_init(&o);
  o.refine_partition = 1;
  for (int f = 0; f < 2; f++) {
    evt_graph *g = load_joint_file(files[f]);
    if (!g) continue;
    evt_program *p = NULL;
    CHECK_MSG(evt_program_create_host_opts(g, &o, &p) == EVT_OK, "%s: %s", files[f], evt_graph_error(g));
    if (p) {
      int aliases = 0;
      for (int v = 0; v < g->nnodes; v++) aliases += evt_exec_alias(p->xp, v) >= 0;
      CHECK_MSG(aliases > 0, "%s: the refined plan has no alias (the test lost its subject)", files[f]);
      CHECK(check_layout(g, p->xp, p->slots, p->arena_bytes, files[f]) == 0);
    }
    evt_program_destroy(p);
    evt_graph_free(g);
  }
}

/* A GEMM launcher that refuses its problem demotes the group at run time (gemm_launch.h); the program then
 * re-plans. The re-planned layout (every fused group demoted, one by one) stays valid: the demoted groups'
 * members get memory, nothing is read before it is written, live tensors never overlap. */
TEST(program_layout_after_demotions_stays_valid) {
  evt_graph *g = parse_joint("graph g {\n  %x: bf16[64, 32] = input(init=normal)\n"
                             "  %w: bf16[32, 64] = param(init=normal)\n  %b: bf16[64] = param(init=normal)\n"
                             "  %h: bf16[64, 64] = mm(%x, %w)\n  %hb: bf16[64, 64] = add(%h, %b)\n"
                             "  %a: bf16[64, 64] = gelu(%hb)\n  %s: bf16[64, 64] = softmax(%a, dim=1)\n"
                             "  %loss: bf16[] = sum(%s)\n  loss %loss\n}\n");
  if (!g) return;
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  if (!p) {
    evt_graph_free(g);
    return;
  }
  char err[256];
  int demoted = 0;
  for (int gi = 0; gi < p->xp->ngroups; gi++) {
    if (!p->xp->groups[gi].fused) continue;
    evt_exec_plan_demote_group(p->xp, gi, "test: refused");
    demoted++;
    p->nsteps = evt_program_steps(g, p->xp, p->steps);
    CHECK_MSG(evt_program_layout(g, p->xp, p->slots, &p->arena_bytes, NULL, err, sizeof err) == EVT_OK, "%s", err);
    check_layout(g, p->xp, p->slots, p->arena_bytes, "after a demotion");
  }
  CHECK(demoted > 0);
  for (int v = 0; v < g->nnodes; v++) CHECK(p->slots[v].kind != EVT_SLOT_NONE); /* all node by node now */
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* Sources (views of inputs, constants) run only when something reads them: a transposed weight that the
 * GEMM reads through its layout is not materialized; the same view as a graph output is. */
TEST(program_steps_skip_sources_nothing_reads) {
  for (int as_output = 0; as_output < 2; as_output++) {
    char text[512];
    snprintf(text, sizeof text,
             "graph t {\n  %%x: bf16[32,64] = input()\n  %%w: bf16[128,64] = param()\n"
             "  %%wt = permute(%%w, dims=[1,0])\n  %%m = mm(%%x, %%wt)\n  %%y = relu(%%m)\n  output %%y\n%s}\n",
             as_output ? "  output %wt\n" : "");
    char *err = NULL;
    evt_graph *g = evt_parse(text, "t", &err);
    CHECK_MSG(g, "%s", err ? err : "");
    free(err);
    if (!g) continue;
    evt_exec_plan xp;
    CHECK(evt_exec_plan_build(g, NULL, &xp) == EVT_OK);
    int wt = evt_graph_find(g, "wt"), gemm = -1;
    for (int gi = 0; gi < xp.ngroups; gi++)
      if (xp.groups[gi].fused && xp.groups[gi].kind == EVT_LK_GEMM_EVT) gemm = gi;
    CHECK_MSG(gemm >= 0 && xp.groups[gemm].b_node == evt_graph_find(g, "w"), "the GEMM reads %%w through its layout");
    bool is_source = false;
    for (int k = 0; k < xp.nsources; k++) is_source |= xp.sources[k] == wt;
    CHECK(is_source);
    evt_prog_step steps[64];
    int n = evt_program_steps(g, &xp, steps), runs = 0;
    for (int s = 0; s < n; s++) runs += steps[s].node == wt;
    CHECK_MSG(runs == as_output, "%%wt runs %d times (graph output: %d)", runs, as_output);
    evt_arena_slot slots[64];
    int64_t arena = 0;
    char why[256];
    CHECK_MSG(evt_program_layout(g, &xp, slots, &arena, NULL, why, sizeof why) == EVT_OK, "%s", why);
    evt_exec_plan_free(&xp);
    evt_graph_free(g);
  }
}

/* The host half of evt_program_create on bert_layer_bf16 (fused): the 6 attention bmm groups are steps of
 * the program as batched GEMM+EVT launches (4 heads x 2 launches), and every tensor they read or write has
 * memory (arena or caller) when its step runs. */
/* A value that is a step output and, through a reshape, a GEMM operand (bert's layer norm: the bf16 cast of its
 * result, and the [tokens, hidden] view the next GEMM reads) is stored once: the reshape shares the cast's
 * memory (evt_exec_alias) while the group runs fused, and gets memory of its own once the group is demoted. */
TEST(program_reshape_of_a_stored_value_shares_its_memory) {
  char *perr = NULL;
  evt_graph *g = evt_parse("graph seg {\n  %x: f32[4,16,128] = input()\n  %gw: f32[128] = input()\n"
                             "  %gb: f32[128] = input()\n  %ln: f32[4,16,128] = layer_norm(%x)\n"
                             "  %m1: f32[4,16,128] = mul(%gw, %ln)\n  %y: f32[4,16,128] = add(%gb, %m1)\n"
                             "  %c: bf16[4,16,128] = cast(%y, dtype=bf16)\n  %v: bf16[64,128] = reshape(%c, shape=[64,128])\n"
                             "  %w: bf16[128,256] = input()\n  %mm: f32[64,256] = mm(%v, %w, out_dtype=f32)\n"
                             "  %o: bf16[64,256] = cast(%mm, dtype=bf16)\n  output %y, %c, %o\n}\n", "t.evt", &perr);
  CHECK_MSG(g, "%s", perr ? perr : "");
  free(perr);
  if (!g) return;
  int c = evt_graph_find(g, "c"), v = evt_graph_find(g, "v");
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  if (p && c >= 0 && v >= 0) {
    int gi = p->xp->part.group[v];
    CHECK(gi >= 0 && gi == p->xp->part.group[c] && p->xp->groups[gi].fused);
    CHECK_MSG(evt_exec_alias(p->xp, v) == c, "alias of %%v: %d", evt_exec_alias(p->xp, v));
    const evt_lowered *L = &p->xp->low.k[gi];
    int stores = 0;
    for (int i = 0; i < L->rspec.nnodes; i++) stores += L->rspec.nodes[i].op == EVT_V_AUX_STORE;
    CHECK_MSG(stores == 2, "%d stores (%%y and %%c; not %%v)", stores);
    /* %c is an output (caller memory): %v takes no memory and points where %c does once the outputs are bound */
    CHECK(p->slots[c].kind == EVT_SLOT_CALLER && p->slots[v].kind == EVT_SLOT_NONE);
    char mem[64];
    for (int i = 0; i < evt_graph_output_count(g); i++) CHECK(evt_program_bind_output(p, i, mem + i) == EVT_OK);
    const char *ins[] = {"x", "gw", "gb", "w"};
    for (int i = 0; i < 4; i++) CHECK(evt_program_bind(p, ins[i], mem + 8 + i) == EVT_OK);
    CHECK(evt_program_run(p, NULL) == EVT_ERR_UNSUPPORTED); /* all bound (outputs' pointers set); no device */
    CHECK(p->t[c].ptr == mem + 1 && p->t[v].ptr == mem + 1);
    check_layout(g, p->xp, p->slots, p->arena_bytes, "alias");
    /* demoted: node by node, %v materialized by its own step */
    p->xp->groups[gi].fused = false;
    CHECK(evt_exec_alias(p->xp, v) == -1);
    char err[256];
    int64_t arena = 0;
    CHECK_MSG(evt_program_layout(g, p->xp, p->slots, &arena, NULL, err, sizeof err) == EVT_OK, "%s", err);
    CHECK(p->slots[v].kind == EVT_SLOT_ARENA);
    check_layout(g, p->xp, p->slots, arena, "alias, demoted");
  }
  evt_program_destroy(p);
  evt_graph_free(g);
}

TEST(program_host_plan_runs_batched_gemm_groups) {
  evt_graph *g = load_joint_file("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  if (p) {
    int nbat = 0, bad = 0;
    for (int k = 0; k < p->nsteps; k++) {
      if (p->steps[k].node >= 0) continue;
      int gi = p->steps[k].group;
      const evt_group_exec *x = &p->xp->groups[gi];
      const evt_lowered *L = &p->xp->low.k[gi];
      if (!x->fused || x->kind != EVT_LK_GEMM_EVT || !L->spec.batched) continue;
      nbat++;
      CHECK(L->l == 4 && L->l_outer == 2);
      int t[3 + EVT_LAUNCH_MAX_PTRS], nt = 0;
      t[nt++] = x->a_node, t[nt++] = x->b_node;
      if (x->d_node >= 0) t[nt++] = x->d_node;
      for (int i = 0; i < EVT_LAUNCH_MAX_PTRS; i++)
        if (x->ptr_node[i] >= 0) t[nt++] = x->ptr_node[i];
      for (int j = 0; j < nt; j++) {
        const evt_arena_slot *s = &p->slots[t[j]];
        bad += s->kind == EVT_SLOT_NONE || (s->kind == EVT_SLOT_ARENA && (k < s->first || k > s->last));
      }
    }
    CHECK_MSG(nbat == 6 && bad == 0, "%d batched GEMM steps, %d tensors without memory", nbat, bad);
    CHECK(p->groups_fallback <= 1); /* at most the bool %mlm.sel group runs node by node */
  }
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* EVT_PROFILE's table names each step by what runs (src/runtime/gpu/profile.c): on bert_layer_bf16's host plan
 * (default: plain GEMMs through cuBLAS), a GEMM step names its kernel, M x N x K, layout and tile config; a
 * plain GEMM cuBLAS and its shape; a row step its kernel and M x N; a step of one node the node. */
TEST(profile_labels_name_kernel_shape_and_config) {
  evt_graph *g = load_joint_file("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  int gemm = 0, row = 0, blas = 0;
  for (int s = 0; p && s < p->nsteps; s++) {
    char label[640], want[96];
    evt_prof_step_label(p, s, label, sizeof label);
    if (p->steps[s].node >= 0) {
      snprintf(want, sizeof want, "node %%%s (", g->nodes[p->steps[s].node].name);
      CHECK_MSG(strstr(label, want), "%s", label);
      continue;
    }
    const evt_group_exec *x = &p->xp->groups[p->steps[s].group];
    if (!x->fused) continue;
    if (x->kind == EVT_LK_GEMM_EVT && x->blas) {
      blas++;
      snprintf(want, sizeof want, "cuBLAS %lldx%lldx%lld ", (long long)x->m, (long long)x->n, (long long)x->k);
      CHECK_MSG(strstr(label, want) && strstr(label, "plain epilogue"), "%s", label);
    } else if (x->kind == EVT_LK_GEMM_EVT) {
      gemm++;
      snprintf(want, sizeof want, "%s %lldx%lldx%lld gemm ", p->xp->kname[x->kernel], (long long)x->m, (long long)x->n,
               (long long)x->k);
      CHECK_MSG(strstr(label, want) && strstr(label, " tile ") && strstr(label, "default config"), "%s", label);
    } else {
      row++;
      snprintf(want, sizeof want, "%s %lldx%lld from %%", p->xp->kname[x->kernel], (long long)x->m, (long long)x->n);
      CHECK_MSG(strstr(label, want), "%s", label);
    }
  }
  CHECK_MSG(gemm >= 4 && blas >= 4 && row >= 4, "%d CUTLASS, %d cuBLAS, %d row steps", gemm, blas, row);
  evt_program_destroy(p);
  evt_graph_free(g);
}

/* EVT_PROFILE=host:N's accounting (src/runtime/gpu/profile.c) on bert_layer_bf16's host plan, with step times
 * fed in directly (the enqueue that measures them needs a GPU): off without the variable; per-run means over
 * the runs, the slowest step first with its EVT_PROFILE label, shares of the steps' sum. */
TEST(host_profile_table) {
  evt_graph *g = load_joint_file("bench/graphs/bert_layer_bf16.evt");
  if (!g) return;
  evt_program *p = NULL;
  CHECK_MSG(evt_program_create_host(g, EVT_PROGRAM_FUSED, &p) == EVT_OK, "%s", evt_graph_error(g));
  const char *keys[] = {"EVT_PROFILE"};
  char *saved[1];
  evt_test_env_save(keys, 1, saved);
  setenv("EVT_PROFILE", "1000", 1); /* the GPU table's period: no host table */
  CHECK(p && !evt_hprof_begin(p, NULL) && !p->hprof);
  setenv("EVT_PROFILE", "host:1000", 1);
  if (p && p->nsteps >= 3) {
    for (int run = 0; run < 2; run++) {
      CHECK(evt_hprof_begin(p, NULL));
      for (int s = 0; s < p->nsteps; s++) evt_hprof_step(p, s, s == 2 ? 300.0 : 1.0);
      evt_hprof_end(p, 400.0 + 100.0 * run);
    }
    char buf[16384], head[160], label[640], want[800];
    CHECK(evt_hprof_format(p, buf, sizeof buf) > 0);
    snprintf(head, sizeof head, "%d steps, 450.0 us of host time per run (%.1f in the steps; mean of 2 runs",
             p->nsteps, 300.0 + (p->nsteps - 1));
    CHECK_MSG(strstr(buf, head) != NULL, "%s", buf);
    evt_prof_step_label(p, 2, label, sizeof label);
    snprintf(want, sizeof want, "[evt-host]     300.0 us %5.1f%%  step   2  %s\n", 100.0 * 300.0 / (300.0 + (p->nsteps - 1)),
             label);
    const char *first = strchr(buf, '\n');
    CHECK_MSG(first && !strncmp(first + 1, want, strlen(want)), "%s\nwant %s", buf, want);
  }
  evt_test_env_restore(keys, 1, saved);
  evt_program_destroy(p);
  evt_graph_free(g);
}
