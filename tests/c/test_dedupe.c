/* Kernels that differ only in what does not change their code are one kernel: a rand node's seed and offset are
 * launch arguments (evt_kspec_launch_rng), and commutative operands are put in one order (evt_kspec_canonicalize). */
#include <stdlib.h>
#include <string.h>

#include "codegen/lower.h"
#include "codegen/rspec.h"
#include "evt_row_launch.h"
#include "partition/partition.h"
#include "test.h"

typedef struct lowered {
  evt_graph *g;
  evt_part_plan part;
  evt_lower_result low;
} lowered;

/* text parsed, partitioned (greedy, no cache) and lowered; false (a failed check) otherwise */
static bool lower(const char *text, lowered *lg) {
  char *err = NULL;
  memset(lg, 0, sizeof *lg);
  lg->g = evt_parse(text, "dedupe", &err);
  CHECK_MSG(lg->g, "parse: %s", err ? err : "?");
  free(err);
  if (!lg->g) return false;
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  o.use_ilp = 0;
  bool ok = evt_part_plan_build(lg->g, &o, EVT_PART_LAMBDA_DEFAULT, &lg->part) == EVT_OK &&
            evt_lower_plan(lg->g, &lg->part, &lg->low) == EVT_OK;
  CHECK(ok);
  return ok;
}

static void lowered_free(lowered *lg) {
  evt_lower_free(&lg->low);
  evt_part_plan_free(&lg->part);
  evt_graph_free(lg->g);
}

/* The lowered group holding graph node `node` (NULL, a failed check, when it did not lower). */
static const evt_lowered *group_of(const lowered *lg, const char *node) {
  int id = evt_graph_find(lg->g, node);
  int gi = id >= 0 ? lg->part.group[id] : -1;
  CHECK_MSG(gi >= 0 && lg->low.k[gi].ok, "%%%s: no lowered group", node);
  return gi >= 0 && lg->low.k[gi].ok ? &lg->low.k[gi] : NULL;
}

/* The generated source of L's kernel (row or CUTLASS), malloc'd; NULL on an emission error (a failed check). */
static char *source_of(const evt_lowered *L) {
  char err[256] = "";
  char *src = evt_lowered_cutlass(L) ? evt_emit_cutlass(&L->spec, err, sizeof err) : evt_emit_rows(&L->rspec, err, sizeof err);
  CHECK_MSG(src, "%s: %s", L->kernel, err);
  return src;
}

/* Do the two graphs' groups holding `node` lower to one kernel: the same name and the same source? */
static bool same_kernel(const char *t0, const char *t1, const char *node) {
  lowered a, b;
  bool same = false;
  if (lower(t0, &a) && lower(t1, &b)) {
    const evt_lowered *la = group_of(&a, node), *lb = group_of(&b, node);
    char *sa = la ? source_of(la) : NULL, *sb = lb ? source_of(lb) : NULL;
    same = sa && sb && !strcmp(la->kernel, lb->kernel) && !strcmp(sa, sb);
    free(sa), free(sb);
    lowered_free(&b);
  }
  lowered_free(&a);
  return same;
}

#define DROPOUT_GRAPH(SEED, OFFSET)                                                               \
  "graph t {\n  %x: f32[16,24] = input()\n"                                                      \
  "  %r: f32[16,24] = rand(seed=" SEED ", offset=" OFFSET ")\n"                                  \
  "  %p: f32[] = scalar(value=0.25)\n  %k = ge(%r, %p)\n  %kf = cast(%k, dtype=f32)\n"           \
  "  %y = mul(%x, %kf)\n  output %y\n}\n"

/* Two dropouts that differ only in seed and offset: one kernel (name and source), each launch with its own key. */
TEST(dedupe_rand_seed_is_a_launch_argument) {
  const char *t0 = DROPOUT_GRAPH("7", "11"), *t1 = DROPOUT_GRAPH("8", "12");
  CHECK(same_kernel(t0, t1, "y"));
  lowered a, b;
  if (!lower(t0, &a) || !lower(t1, &b)) return;
  const evt_lowered *la = group_of(&a, "y"), *lb = group_of(&b, "y");
  evt_row_launch_args ra, rb;
  memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb);
  int r = -1;
  for (int i = 0; la && i < la->rspec.nnodes; i++)
    if (la->rspec.nodes[i].op == EVT_V_RAND) r = i;
  CHECK_MSG(r >= 0, "the group draws no rand");
  if (la && lb && r >= 0) {
    evt_rspec_launch_rng(&la->rspec, &ra);
    evt_rspec_launch_rng(&lb->rspec, &rb);
    CHECK(ra.rng[r].seed == 7 && ra.rng[r].offset == 11);
    CHECK(rb.rng[r].seed == 8 && rb.rng[r].offset == 12);
    char *src = source_of(la);
    CHECK_MSG(src && !strstr(src, "11ull") && strstr(src, "a->rng["), "the seed is in the source");
    free(src);
  }
  lowered_free(&b);
  lowered_free(&a);
}

/* A GEMM epilogue's rand (the Philox visitor) reads its key from the launch too. */
TEST(dedupe_gemm_rand_key_is_a_launch_argument) {
  evt_kspec s[2];
  char *src[2];
  for (int k = 0; k < 2; k++) {
    evt_kspec_init(&s[k], EVT_LAYOUT_NN, EVT_BF16, EVT_BF16, EVT_TILE_CONFIG_DEFAULT);
    int acc = evt_kspec_add(&s[k], EVT_V_ACC, -1, -1, EVT_F32, NULL);
    int r = evt_kspec_add(&s[k], EVT_V_RAND, -1, -1, EVT_F32, NULL);
    s[k].nodes[r].seed = 7 + (uint64_t)k, s[k].nodes[r].offset = 3 + (uint64_t)k;
    s[k].d_node = evt_kspec_add(&s[k], EVT_V_MUL, acc, r, EVT_F32, NULL);
    char err[256] = "";
    src[k] = evt_emit_cutlass(&s[k], err, sizeof err);
    CHECK_MSG(src[k], "%s", err);
  }
  CHECK(evt_kspec_hash(&s[0]) == evt_kspec_hash(&s[1]));
  CHECK(src[0] && src[1] && !strcmp(src[0], src[1]) && strstr(src[0], "a->rng[1].seed"));
  evt_launch_args a;
  memset(&a, 0, sizeof a);
  evt_kspec_launch_rng(&s[1], &a);
  CHECK(a.rng[1].seed == 8 && a.rng[1].offset == 4 && a.rng[0].seed == 0);
  free(src[0]), free(src[1]);
}

#define PRODUCT_GRAPH(L, R, BL, BR)                                                               \
  "graph t {\n  %x: f32[16,24] = input()\n  %b: f32[24] = param()\n"                             \
  "  %e = exp(%x)\n  %s = relu(%x)\n  %y = mul(" L ", " R ")\n  %z = add(" BL ", " BR ")\n"     \
  "  output %z\n}\n"

/* mul(a, b) and mul(b, a), add(y, bias) and add(bias, y): one kernel. */
TEST(dedupe_commutative_operand_order) {
  CHECK(same_kernel(PRODUCT_GRAPH("%e", "%s", "%y", "%b"), PRODUCT_GRAPH("%s", "%e", "%b", "%y"), "z"));
}

/* The same in a GEMM epilogue: acc + bias either way round. */
TEST(dedupe_commutative_gemm_epilogue) {
  const char *fmt = "graph t {\n  %%x: bf16[32,64] = input()\n  %%w: bf16[64,64] = param()\n  %%b: bf16[64] = param()\n"
                    "  %%m = mm(%%x, %%w)\n  %%h = add(%s)\n  %%y = relu(%%h)\n  output %%y\n}\n";
  char t0[512], t1[512];
  snprintf(t0, sizeof t0, fmt, "%m, %b");
  snprintf(t1, sizeof t1, fmt, "%b, %m");
  CHECK(same_kernel(t0, t1, "y"));
}

/* An add of two products keeps its order: nvcc may contract either product into an fma, by operand order. */
TEST(dedupe_add_of_two_products_keeps_its_order) {
  const char *fmt = "graph t {\n  %%x: f32[16,24] = input()\n  %%u: f32[16,24] = input()\n"
                    "  %%p = mul(%%x, %%x)\n  %%q = mul(%%u, %%u)\n  %%z = add(%s)\n  output %%z\n}\n";
  char t0[512], t1[512];
  snprintf(t0, sizeof t0, fmt, "%p, %q");
  snprintf(t1, sizeof t1, fmt, "%q, %p");
  CHECK(!same_kernel(t0, t1, "z"));
}
