/* The spmm nucleus as a row kernel: lowering of GCN's spmm groups (what fuses, what is refused and by which node),
 * deterministic emitted source, and the host-side pieces against the interpreter on random CSR matrices (empty rows,
 * a long row, duplicate columns, rowptr not starting at 0): the spec reference of spmm and of spmm_t over A^T's CSR
 * (evt_csr_transpose), and the transpose's own order. */
#include "test.h"

#include "codegen/csr.h"
#include "codegen/examples.h"
#include "codegen/lower.h"
#include "compile/compile.h"
#include "compile/train.h"
#include "partition/partition.h"
#include "passes/passes.h"
#include "runtime/gpu/exec_plan.h"
#include "runtime/gpu/memory.h"

/* A lowered joint graph (path's model, forward + backward, optimized, greedy partition). */
typedef struct spmm_lowered {
  evt_graph *g;
  evt_part_plan part;
  evt_lower_result low;
} spmm_lowered;

static bool lower_file(const char *path, spmm_lowered *s) {
  char *err = NULL;
  memset(s, 0, sizeof *s);
  s->g = evt_parse_file(path, &err);
  CHECK_MSG(s->g, "%s: %s", path, err ? err : "");
  free(err);
  if (!s->g) return false;
  CHECK(evt_train_ensure_joint(s->g, NULL) == EVT_OK);
  CHECK(evt_passes_run_all(s->g, 0, 0) == EVT_OK);
  evt_part_options o = evt_part_options_default();
  o.use_ilp = 0;
  o.use_cache = 0;
  CHECK(evt_part_plan_build(s->g, &o, EVT_PART_LAMBDA_DEFAULT, &s->part) == EVT_OK);
  CHECK(evt_lower_plan(s->g, &s->part, &s->low) == EVT_OK);
  return true;
}

static void lowered_free(spmm_lowered *s) {
  evt_lower_free(&s->low);
  evt_part_plan_free(&s->part);
  evt_graph_free(s->g);
}

static int count_op(const evt_rspec *r, evt_vop op) {
  int c = 0;
  for (int i = 0; i < r->nnodes; i++) c += r->nodes[i].op == op;
  return c;
}

/* max |a - b| over two tensors of one shape (inf for a NaN or a size mismatch). */
static double max_abs_diff_t(const evt_tensor *a, const evt_tensor *b) {
  if (a->numel != b->numel || !a->data || !b->data) return INFINITY;
  double d = 0;
  for (int64_t i = 0; i < a->numel; i++) d = fmax(d, a->data[i] != a->data[i] ? INFINITY : fabs(a->data[i] - b->data[i]));
  return d;
}

/* Every spmm / spmm_t group of the file lowers to a row kernel with the spmm nucleus; returns how many (spmm_t ones in
 * *nt) and checks the dtypes of x and val. */
static int check_spmm_groups(const spmm_lowered *s, evt_dtype dt, int *nt) {
  int n = 0;
  *nt = 0;
  for (int gi = 0; gi < s->low.n; gi++) {
    const evt_lowered *L = &s->low.k[gi];
    int nu = L->nucleus;
    if (nu < 0 || (s->g->nodes[nu].op != EVT_OP_SPMM && s->g->nodes[nu].op != EVT_OP_SPMM_T)) continue;
    bool tr = s->g->nodes[nu].op == EVT_OP_SPMM_T;
    CHECK_MSG(L->ok && L->kind == EVT_LK_ROW, "group %d: %s", gi, L->reason);
    CHECK(L->rspec.nucleus == EVT_ROWN_SPMM && L->rspec.has_perm == tr);
    CHECK(L->rspec.in_dtype == dt && L->rspec.val_dtype == dt && L->rspec.idx_dtype == EVT_I64);
    for (int k = 0; k < 4; k++) CHECK(L->rin[k] == s->g->nodes[nu].inputs[k]);
    n++;
    *nt += tr;
  }
  return n;
}

TEST(spmm_gcn_groups_lower_with_their_epilogues) {
  spmm_lowered s;
  if (!lower_file("examples/gcn.evt", &s)) return;
  int nt = 0;
  CHECK(check_spmm_groups(&s, EVT_F32, &nt) == 4 && nt == 2);
  /* layer 1: bias (an N-vector), ReLU and the dropout mask drawn in the kernel, masks and output stored */
  const evt_lowered *L1 = &s.low.k[s.part.group[evt_graph_find(s.g, "l1.agg")]];
  CHECK(count_op(&L1->rspec, EVT_V_ROW_BCAST) == 1 && count_op(&L1->rspec, EVT_V_RELU) == 1);
  CHECK(count_op(&L1->rspec, EVT_V_RAND) == 1 && count_op(&L1->rspec, EVT_V_AUX_STORE) >= 2);
  /* layer 2: bias, and the cross entropy's row max (a per-row reduction of the finished row) */
  const evt_lowered *L2 = &s.low.k[s.part.group[evt_graph_find(s.g, "l2.agg")]];
  char txt[2048];
  evt_rspec_text(&L2->rspec, txt, sizeof txt);
  CHECK_MSG(count_op(&L2->rspec, EVT_V_ROW_BCAST) == 1 && count_op(&L2->rspec, EVT_V_COL_MAX) >= 1, "%s", txt);
  lowered_free(&s);
  if (!lower_file("bench/graphs/gcn_bf16.evt", &s)) return;
  CHECK(check_spmm_groups(&s, EVT_BF16, &nt) == 4 && nt == 2);
  lowered_free(&s);
}

/* The group of node `name` in text's graph, lowered (partitioned with the lowering's rules when rules). */
static bool lower_group_text(const char *text, bool rules, const char *name, evt_lowered *out) {
  evt_graph *g = evt_test_parse_ok(text);
  if (!g) return false;
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  evt_part_plan part;
  evt_lower_result low;
  CHECK((rules ? evt_lower_partition(g, &o, EVT_PART_LAMBDA_DEFAULT, &part)
               : evt_part_plan_build(g, &o, EVT_PART_LAMBDA_DEFAULT, &part)) == EVT_OK);
  CHECK(evt_lower_plan(g, &part, &low) == EVT_OK);
  *out = low.k[part.group[evt_graph_find(g, name)]];
  evt_lower_free(&low);
  evt_part_plan_free(&part);
  evt_graph_free(g);
  return true;
}

TEST(spmm_refusals_name_the_node) {
  evt_lowered L;
  /* rows longer than a register-resident row: the nucleus is named */
  if (lower_group_text("graph t {\n  %rp: i64[4] = input()\n  %c: i64[5] = input()\n  %v: f32[5] = input()\n"
                       "  %x: f32[3,40000] = input()\n  %y = spmm(%rp, %c, %v, %x)\n  output %y\n}\n", false, "y", &L)) {
    CHECK(!L.ok && L.kind == EVT_LK_UNFUSED);
    CHECK_MSG(strstr(L.reason, "%y (spmm)") && strstr(L.reason, "40000"), "%s", L.reason);
  }
  /* fp8 values: no spmm kernel for them */
  if (lower_group_text("graph t {\n  %rp: i64[4] = input()\n  %c: i64[5] = input()\n  %v: f8e4m3[5] = input()\n"
                       "  %x: f8e4m3[3,8] = input()\n  %y = spmm(%rp, %c, %v, %x)\n  output %y\n}\n", false, "y", &L)) {
    CHECK(!L.ok);
    CHECK_MSG(strstr(L.reason, "%y (spmm)") && strstr(L.reason, "values f8e4m3"), "%s", L.reason);
  }
  /* an epilogue member the row spec cannot hold (an integer cast) is named, not the nucleus */
  if (lower_group_text("graph t {\n  %rp: i64[4] = input()\n  %c: i64[5] = input()\n  %v: f32[5] = input()\n"
                       "  %x: f32[3,8] = input()\n  %y = spmm(%rp, %c, %v, %x)\n  %z = cast(%y, dtype=i32)\n"
                       "  output %z\n}\n", false, "y", &L)) {
    CHECK(!L.ok);
    CHECK_MSG(strstr(L.reason, "%z (cast)"), "%s", L.reason);
  }
  /* a plain spmm with a bias and ReLU fuses */
  if (lower_group_text("graph t {\n  %rp: i32[4] = input()\n  %c: i32[5] = input()\n  %v: bf16[5] = input()\n"
                       "  %x: bf16[3,12] = input()\n  %b: bf16[12] = param()\n  %y = spmm(%rp, %c, %v, %x)\n"
                       "  %h = add(%y, %b)\n  %r = relu(%h)\n  output %r\n}\n", true, "y", &L)) {
    CHECK_MSG(L.ok && L.rspec.idx_dtype == EVT_I32 && L.rspec.in_dtype == EVT_BF16, "%s", L.reason);
    CHECK(count_op(&L.rspec, EVT_V_RELU) == 1 && count_op(&L.rspec, EVT_V_AUX_STORE) == 1);
  }
}

/* spmm (perm: spmm_t) of bf16 x with f32 values: acc + bias, ReLU, stored as bf16; a row sum over M too. */
static void example_spec(evt_rspec *r, int perm, int arch) {
  evt_rspec_init(r, EVT_ROWN_SPMM, EVT_BF16);
  r->val_dtype = EVT_F32;
  r->has_perm = perm;
  r->arch = arch;
  int a = evt_rspec_acc(r, EVT_RV_OUT);
  int b = evt_rspec_add(r, EVT_V_ROW_BCAST, -1, -1, EVT_BF16, "b");
  int h = evt_rspec_add(r, EVT_V_RELU, evt_rspec_add(r, EVT_V_ADD, a, b, EVT_F32, "h"), -1, EVT_F32, "r");
  evt_rspec_add(r, EVT_V_AUX_STORE, h, -1, EVT_BF16, "y");
  evt_rspec_add(r, EVT_V_ROW_SUM, h, -1, EVT_F32, "db");
}

TEST(spmm_emitted_source_is_deterministic) {
  evt_rspec r, rt, r80;
  example_spec(&r, 0, 0);
  example_spec(&rt, 1, 0);
  example_spec(&r80, 0, 80);
  char err[256];
  CHECK_MSG(evt_rspec_check(&r, err, sizeof err) == EVT_OK, "%s", err);
  char *a = evt_emit_rows(&r, err, sizeof err), *b = evt_emit_rows(&r, err, sizeof err);
  char *t = evt_emit_rows(&rt, err, sizeof err), *s80 = evt_emit_rows(&r80, err, sizeof err);
  CHECK(a && b && t && s80);
  if (a && b && t && s80) {
    CHECK(!strcmp(a, b));
    CHECK(strstr(a, "rows spmm in:bf16 val:f32 idx:i64\n") && strstr(a, "#include \"evt_spmm.cuh\""));
    CHECK(strstr(a, "evt_rows::spmm_row<T, VPT, EXF>(p.rowptr, p.col, p.val, p.perm, p.x"));
    CHECK(strstr(a, "p.err = a->csr.err;") && strstr(a, "p.err_code != 0") && strstr(a, "&& !p.perm;"));
    CHECK(strstr(t, "+perm") && strstr(t, "(p.perm || p.nnz == 0)"));
    CHECK(strstr(s80, "#define EVT_ROWS_PDL 0"));
    CHECK(evt_rspec_hash(&r) != evt_rspec_hash(&rt) && evt_rspec_hash(&r) != evt_rspec_hash(&r80));
  }
  free(a), free(b), free(t), free(s80);
  /* a spec reading back x as an M x N input is refused */
  r.nodes[0].sel = EVT_RV_IN0;
  CHECK(evt_rspec_check(&r, err, sizeof err) != EVT_OK && strstr(err, "no value 'in0'"));
}

/* Group gi of p, fused, as an spmm group reading its nucleus's rowptr, col, val and x (dy for spmm_t). */
static bool bound_as_nucleus(const evt_graph *g, const evt_exec_plan *p, int gi) {
  const evt_group_exec *x = &p->groups[gi];
  int nu = p->low.k[gi].nucleus;
  CHECK_MSG(x->fused, "group %d: %s", gi, x->why);
  for (int k = 0; k < 4; k++) CHECK(x->in_node[k] == g->nodes[nu].inputs[k]);
  return x->fused;
}

/* The memory plan of p: every fused spmm_t group's step reads dy, which stays live until that step (A^T's CSR is the
 * kernel library's scratch, not an arena tensor). Returns how many such steps. */
static int spmm_t_steps_keep_dy(const evt_graph *g, const evt_exec_plan *p) {
  int n = g->nnodes, found = 0;
  evt_prog_step *steps = calloc((size_t)n + 1, sizeof *steps);
  evt_arena_slot *slots = calloc((size_t)n + 1, sizeof *slots);
  int64_t arena = 0;
  char err[200] = "";
  CHECK_MSG(evt_program_layout(g, p, slots, &arena, NULL, err, sizeof err) == EVT_OK, "%s", err);
  int ns = evt_program_steps(g, p, steps);
  for (int s = 0; s < ns; s++) {
    int gi = steps[s].group, nu = steps[s].node < 0 ? p->low.k[gi].nucleus : -1;
    if (nu < 0 || g->nodes[nu].op != EVT_OP_SPMM_T) continue;
    const evt_arena_slot *dy = &slots[p->groups[gi].in_node[3]];
    CHECK_MSG(dy->kind == EVT_SLOT_CALLER || (dy->kind == EVT_SLOT_ARENA && dy->first < s && dy->last >= s),
              "step %d: dy's slot %d [%d, %d]", s, dy->kind, dy->first, dy->last);
    found++;
  }
  free(steps);
  free(slots);
  return found;
}

/* The fused plan binds gcn's spmm and spmm_t groups (rowptr, col, val, x; spmm_t's A^T's CSR is built from rowptr /
 * col on the device at run time), plans their memory, and its CPU model of the step gives the interpreter's outputs;
 * a column out of range fails that run naming the spmm node. */
TEST(spmm_exec_plan_binds_spmm_and_spmm_t_and_models_them) {
  char *perr = NULL;
  evt_graph *g = evt_parse_file("examples/gcn.evt", &perr);
  CHECK_MSG(g, "%s", perr ? perr : "");
  free(perr);
  if (!g) return;
  CHECK(evt_train_ensure_joint(g, NULL) == EVT_OK && evt_passes_run_all(g, 0, 0) == EVT_OK);
  evt_options o;
  evt_options_init(&o);
  evt_exec_plan p;
  CHECK(evt_exec_plan_build(g, &o, &p) == EVT_OK);
  int fwd = 0, bwd = 0;
  for (int gi = 0; gi < p.ngroups; gi++) {
    int nu = p.low.k[gi].nucleus;
    evt_op op = nu >= 0 ? g->nodes[nu].op : EVT_OP_INPUT;
    if (op == EVT_OP_SPMM) fwd += bound_as_nucleus(g, &p, gi);
    if (op == EVT_OP_SPMM_T) bwd += bound_as_nucleus(g, &p, gi) && p.low.k[gi].rspec.has_perm;
  }
  CHECK(fwd == 2 && bwd == 2);
  CHECK(spmm_t_steps_keep_dy(g, &p) == 2);
  int n = g->nnodes;
  evt_tensor *v = calloc((size_t)n, sizeof *v), *w = calloc((size_t)n, sizeof *w);
  CHECK(evt_interp_init_inputs(g, v, 3) == EVT_OK && evt_interp_init_inputs(g, w, 3) == EVT_OK);
  CHECK(evt_exec_plan_run_cpu(g, &p, w) == EVT_OK && evt_interp_run(g, v, 0, 0) == EVT_OK);
  for (int k = 0; k < g->noutputs; k++) {
    int id = g->outputs[k];
    CHECK_MSG(max_abs_diff_t(&w[id], &v[id]) < 1e-4, "%%%s differs", g->nodes[id].name);
  }
  int col = evt_graph_find(g, "adj.col");
  w[col].data[7] = 64; /* one past the 64 nodes */
  CHECK(evt_exec_plan_run_cpu(g, &p, w) == EVT_ERR_INVALID);
  CHECK_MSG(strstr(evt_graph_error(g), "l1.agg") && strstr(evt_graph_error(g), "CSR index"), "%s", evt_graph_error(g));
  for (int i = 0; i < n; i++) evt_tensor_free(&v[i]), evt_tensor_free(&w[i]);
  free(v), free(w);
  evt_exec_plan_free(&p);
  evt_graph_free(g);
}

/* spmm_t's CSR in i32: A^T's CSR is built in the same dtype, so more than 2^31 - 1 entries are refused by name (the
 * same graph with i64 indices binds). */
TEST(spmm_t_i32_overflow_is_refused) {
  const char *fmt = "graph t {\n  %%rp: %s[4] = input()\n  %%c: %s[2147483648] = input()\n"
                    "  %%v: f32[2147483648] = input()\n  %%dy: f32[3,8] = input()\n"
                    "  %%yt = spmm_t(%%rp, %%c, %%v, %%dy, shape=[5,8])\n  output %%yt\n}\n";
  for (int wide = 0; wide < 2; wide++) {
    char text[400];
    snprintf(text, sizeof text, fmt, wide ? "i64" : "i32", wide ? "i64" : "i32");
    evt_graph *g = evt_test_parse_ok(text);
    if (!g) return;
    evt_options o;
    evt_options_init(&o);
    evt_exec_plan p;
    CHECK(evt_exec_plan_build(g, &o, &p) == EVT_OK);
    int gi = p.part.group[evt_graph_find(g, "yt")];
    const evt_group_exec *x = &p.groups[gi];
    if (wide) CHECK_MSG(x->fused, "%s", x->why);
    else CHECK_MSG(!x->fused && strstr(x->why, "spmm_t with i32 indices over 2147483648 entries"), "%s", x->why);
    evt_exec_plan_free(&p);
    evt_graph_free(g);
  }
}

/* ---- host-side CSR logic against the interpreter ------------------------------------------------------------- */

/* A random CSR [m, k] with nnz slots: rowptr from `start`, row 1 empty, row 2 long, some duplicate columns. */
static void random_csr(uint64_t seed, int64_t m, int64_t k, int64_t nnz, int64_t start, double *rp, double *col,
                       double *val) {
  uint64_t x = seed * 2654435761u + 1;
#define NEXT() (x = x * 6364136223846793005ull + 1442695040888963407ull, (x >> 33))
  rp[0] = (double)start;
  int64_t left = nnz - start;
  for (int64_t i = 0; i < m; i++) {
    int64_t want = i == 1 ? 0 : i == 2 ? left / 3 : (int64_t)(NEXT() % 5);
    if (want > left) want = left;
    rp[i + 1] = rp[i] + (double)want;
    left -= want;
  }
  for (int64_t q = 0; q < nnz; q++) {
    col[q] = (double)(q % 4 == 3 && q > 0 ? (int64_t)col[q - 1] : (int64_t)(NEXT() % (uint64_t)k)); /* duplicates */
    val[q] = (double)(int64_t)(NEXT() % 2001 - 1000) / 512.0;
  }
#undef NEXT
}

/* A spec storing the gathered row as f32. */
static void store_spec(evt_rspec *r, int perm) {
  evt_rspec_init(r, EVT_ROWN_SPMM, EVT_F32);
  r->val_dtype = EVT_F32;
  r->has_perm = perm;
  evt_rspec_add(r, EVT_V_AUX_STORE, evt_rspec_acc(r, EVT_RV_OUT), -1, EVT_F32, "y");
}

static double max_abs_diff(const double *a, const double *b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i])) + (a[i] != a[i] || b[i] != b[i] ? INFINITY : 0);
  return d;
}

/* The transpose's structure: colptr monotone to e, each column's rows ascending and its positions in A increasing,
 * every entry's row and column those of A. */
static void check_transpose(int64_t m, int64_t k, const int64_t *rp, const int64_t *cl, const int64_t *cp, const int64_t *ri,
                            const int64_t *pm) {
  CHECK(cp[0] == 0 && cp[k] == rp[m] - rp[0]);
  for (int64_t c = 0; c < k; c++) {
    CHECK(cp[c + 1] >= cp[c]);
    for (int64_t q = cp[c]; q < cp[c + 1]; q++) {
      CHECK(cl[pm[q]] == c && pm[q] >= rp[ri[q]] && pm[q] < rp[ri[q] + 1]);
      if (q > cp[c]) CHECK(pm[q] > pm[q - 1] && ri[q] >= ri[q - 1]);
    }
  }
}

static void one_random_case(uint64_t seed, int64_t m, int64_t k, int64_t n, int64_t nnz, int64_t start) {
  char text[512];
  snprintf(text, sizeof text,
           "graph t {\n  %%rp: i64[%lld] = input()\n  %%c: i64[%lld] = input()\n  %%v: f32[%lld] = input()\n"
           "  %%x: f32[%lld,%lld] = input()\n  %%dy: f32[%lld,%lld] = input()\n  %%y = spmm(%%rp, %%c, %%v, %%x)\n"
           "  %%yt = spmm_t(%%rp, %%c, %%v, %%dy, shape=[%lld,%lld])\n  output %%y\n  output %%yt\n}\n",
           (long long)(m + 1), (long long)nnz, (long long)nnz, (long long)k, (long long)n, (long long)m, (long long)n,
           (long long)k, (long long)n);
  evt_graph *g = evt_test_parse_ok(text);
  if (!g) return;
  evt_tensor *v = calloc((size_t)g->nnodes, sizeof *v);
  CHECK(evt_interp_init_inputs(g, v, seed) == EVT_OK);
  int rp = evt_graph_find(g, "rp"), c = evt_graph_find(g, "c"), vl = evt_graph_find(g, "v");
  int x = evt_graph_find(g, "x"), dy = evt_graph_find(g, "dy"), y = evt_graph_find(g, "y"), yt = evt_graph_find(g, "yt");
  random_csr(seed, m, k, nnz, start, v[rp].data, v[c].data, v[vl].data);
  CHECK_MSG(evt_interp_run(g, v, 0, 1) == EVT_OK, "%s", evt_graph_error(g));
  /* spmm through the spec reference */
  evt_rspec r;
  store_spec(&r, 0);
  double *out = calloc((size_t)(m > k ? m : k) * (size_t)n + 1, sizeof *out);
  double *mem[2] = {NULL, out}; /* (node 1 is the store) */
  evt_rspec_csr a = {.k = k, .nnz = nnz, .rowptr = v[rp].data, .col = v[c].data, .val = v[vl].data, .x = v[x].data};
  CHECK(evt_rspec_reference_csr(&r, m, n, &a, mem, 0) == EVT_OK);
  CHECK_MSG(max_abs_diff(out, v[y].data, m * n) < 1e-12, "seed %llu: spmm differs", (unsigned long long)seed);
  /* spmm_t over A^T's CSR, values through perm */
  int64_t *ip = malloc(sizeof *ip * (size_t)(m + 1)), *ic = malloc(sizeof *ic * (size_t)nnz + 8);
  int64_t *cp = malloc(sizeof *cp * (size_t)(k + 1)), *ri = malloc(sizeof *ri * (size_t)nnz + 8);
  int64_t *pm = malloc(sizeof *pm * (size_t)nnz + 8);
  for (int64_t i = 0; i <= m; i++) ip[i] = (int64_t)v[rp].data[i];
  for (int64_t q = 0; q < nnz; q++) ic[q] = (int64_t)v[c].data[q];
  char why[160];
  CHECK(evt_csr_transpose(m, k, nnz, ip, ic, cp, ri, pm, why, sizeof why) == EVT_OK);
  check_transpose(m, k, ip, ic, cp, ri, pm);
  double *dcp = malloc(sizeof *dcp * (size_t)(k + 1)), *dri = malloc(sizeof *dri * (size_t)nnz + 8);
  double *dpm = malloc(sizeof *dpm * (size_t)nnz + 8);
  for (int64_t i = 0; i <= k; i++) dcp[i] = (double)cp[i];
  for (int64_t q = 0; q < cp[k]; q++) dri[q] = (double)ri[q], dpm[q] = (double)pm[q];
  store_spec(&r, 1);
  evt_rspec_csr at = {.k = m, .nnz = nnz, .rowptr = dcp, .col = dri, .perm = dpm, .val = v[vl].data, .x = v[dy].data};
  CHECK(evt_rspec_reference_csr(&r, k, n, &at, mem, 0) == EVT_OK);
  CHECK_MSG(max_abs_diff(out, v[yt].data, k * n) < 1e-12, "seed %llu: spmm_t differs", (unsigned long long)seed);
  free(ip), free(ic), free(cp), free(ri), free(pm), free(dcp), free(dri), free(dpm), free(out);
  for (int i = 0; i < g->nnodes; i++) evt_tensor_free(&v[i]);
  free(v);
  evt_graph_free(g);
}

TEST(spmm_csr_reference_and_transpose_match_interpreter) {
  one_random_case(1, 37, 23, 5, 90, 0);
  one_random_case(2, 16, 40, 12, 64, 3);   /* rowptr starts past 0: the first entries are not A's */
  one_random_case(3, 9, 2, 9, 30, 0);      /* two columns: long columns of A^T */
  one_random_case(4, 5, 7, 3, 0, 0);       /* no entries at all */
}

TEST(spmm_bad_indices_are_refused) {
  int64_t rp[4] = {0, 2, 1, 3}, col[3] = {0, 1, 2}, cp[4], ri[3], pm[3];
  char why[160];
  CHECK(evt_csr_transpose(3, 3, 3, rp, col, cp, ri, pm, why, sizeof why) == EVT_ERR_INVALID && strstr(why, "monotone"));
  rp[2] = 2;
  col[1] = 3;
  CHECK(evt_csr_transpose(3, 3, 3, rp, col, cp, ri, pm, why, sizeof why) == EVT_ERR_INVALID && strstr(why, "col[1] = 3"));
  rp[3] = 4;
  col[1] = 1;
  CHECK(evt_csr_transpose(3, 3, 3, rp, col, cp, ri, pm, why, sizeof why) == EVT_ERR_INVALID && strstr(why, "outside"));
  /* the spec reference refuses the same and writes nothing */
  evt_rspec r;
  store_spec(&r, 0);
  double drp[4] = {0, 2, 2, 3}, dcol[3] = {0, 5, 1}, dval[3] = {1, 1, 1}, dx[6] = {1, 2, 3, 4, 5, 6};
  double out[6] = {7, 7, 7, 7, 7, 7};
  double *mem[2] = {NULL, out}; /* (node 1 is the store) */
  evt_rspec_csr a = {.k = 3, .nnz = 3, .rowptr = drp, .col = dcol, .val = dval, .x = dx};
  CHECK(evt_rspec_reference_csr(&r, 3, 2, &a, mem, 0) == EVT_ERR_INVALID && out[0] == 7);
  dcol[1] = 2;
  CHECK(evt_rspec_reference_csr(&r, 3, 2, &a, mem, 0) == EVT_OK && out[0] == 1 + 5 && out[4] == 3);
}

/* ---- CI compile (no GPU needed) ------------------------------------------------------------------------------ */

/* Every spmm example (bf16, f32, f16) emitted for `arch` (0: sm_90a, 80: sm_80) into one translation unit, appended
 * to *all; returns the kernels emitted. */
static int spmm_unit(int arch, evt_sbuf *all) {
  const evt_dtype dts[3] = {EVT_BF16, EVT_F32, EVT_F16};
  int n = 0;
  for (int k = 0; evt_rspec_spmm_example_names[k]; k++) { /* every example once, the dtypes in turn */
    evt_rspec s;
    CHECK(evt_rspec_spmm_example(&s, evt_rspec_spmm_example_names[k], dts[k % 3]) == EVT_OK);
    s.arch = arch;
    char err[256], *src = evt_emit_rows(&s, err, sizeof err);
    CHECK_MSG(src != NULL, "%s: %s", evt_rspec_spmm_example_names[k], err);
    if (src) evt_sbuf_printf(all, "%s\n", src), n++;
    free(src);
  }
  return n;
}

/* The spmm kernels compiled by nvcc for sm_90a and sm_80 (ptxas included, warnings as errors), each target one unit
 * cached in build/spmm_ci/ by the hash of its text, its command and the kernels/ headers it includes; the two units
 * compile side by side (~70 s on 2 cores). Without nvcc it says so and checks nothing. */
TEST(ci_nvcc_compiles_spmm_kernels_per_arch) {
  if (system("nvcc --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "note: ci_nvcc_compiles_spmm_kernels_per_arch: no nvcc here, nothing checked\n");
    return;
  }
  CHECK(system("mkdir -p build/spmm_ci") == 0);
  const int archs[2] = {90, 80};
  const char *const headers[] = {"kernels/evt_rows.cuh", "kernels/evt_spmm.cuh", "kernels/evt_fp8.cuh",
                                 "kernels/evt_row_launch.h", "kernels/evt_row_config.h", "kernels/philox.h"};
  char objs[2][200], jobs[6400] = "";
  for (int a = 0; a < 2; a++) {
    evt_sbuf all = {0};
    CHECK(spmm_unit(archs[a] == 90 ? 0 : archs[a], &all) == 5);
    char gencode[96], cmd[512], base[160];
    evt_jit_gencode(archs[a], 0, gencode, sizeof gencode);
    snprintf(cmd, sizeof cmd, "nvcc -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG %s -Ikernels -Werror all-warnings",
             gencode);
    uint64_t h = evt_hash_bytes(evt_hash_bytes(0, all.p, strlen(all.p)), cmd, strlen(cmd));
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
      FILE *hf = fopen(headers[i], "rb");
      CHECK(hf != NULL);
      char buf[4096];
      size_t r;
      while (hf && (r = fread(buf, 1, sizeof buf, hf)) > 0) h = evt_hash_bytes(h, buf, r);
      if (hf) fclose(hf);
    }
    snprintf(base, sizeof base, "build/spmm_ci/spmm-sm%d-%016llx", archs[a], (unsigned long long)h);
    snprintf(objs[a], sizeof objs[a], "%s.o", base);
    struct stat st;
    if (stat(objs[a], &st) != 0) {
      char cu[200];
      snprintf(cu, sizeof cu, "%s.cu", base);
      FILE *f = fopen(cu, "w");
      CHECK(f != NULL);
      if (f) fputs(all.p, f), fclose(f);
      size_t l = strlen(jobs);
      snprintf(jobs + l, sizeof jobs - l, "(%s -c -o %s.part %s >%s.log 2>&1 && mv %s.part %s) & ", cmd, objs[a], cu, base,
               objs[a], objs[a]);
    }
    free(all.p);
  }
  if (jobs[0]) {
    strncat(jobs, "wait", sizeof jobs - strlen(jobs) - 1);
    CHECK(system(jobs) == 0);
  }
  for (int a = 0; a < 2; a++) {
    struct stat st;
    CHECK_MSG(stat(objs[a], &st) == 0, "nvcc rejected the spmm kernels for sm_%d; see %.*s.log", archs[a],
              (int)strlen(objs[a]) - 2, objs[a]);
  }
}
