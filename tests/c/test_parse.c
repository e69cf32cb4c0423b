/* The .evt parser and printer: round trips, every attribute kind, and every class of error message with
 * its line:col. Only source ops are used where a test must not depend on other ops' shape rules. */
#include "test.h"

#include <stdlib.h>
#include <string.h>

/* Parses text; on failure reports the message and returns NULL. */
static evt_graph *parse_ok(const char *text) {
  char *err = NULL;
  evt_graph *g = evt_parse(text, "t.evt", &err);
  CHECK_MSG(g != NULL, "parse failed: %s", err ? err : "(no message)");
  CHECK(err == NULL);
  free(err);
  return g;
}

/* Parses text expecting failure; returns true if the message starts with `want` (message printed if not). */
static bool parse_fails_with(const char *text, const char *want) {
  char *err = NULL;
  evt_graph *g = evt_parse(text, "t.evt", &err);
  bool ok = !g && err && strncmp(err, want, strlen(want)) == 0;
  if (!ok) printf("  expected error starting with '%s', got '%s'\n", want, g ? "(parsed)" : err ? err : "(null)");
  evt_graph_free(g);
  free(err);
  return ok;
}

static const char *kSources =
    "# sources of every kind\n"
    "graph src {\n"
    "  %x: f32[32,64] = input()\n"
    "  %y: i64[32] = input(init=randint, lo=0, hi=10)\n"
    "  %w: bf16[64,10] = param(init=uniform, lo=-0.5, hi=0.5)\n"
    "  %z: f16[0,3] = full(value=1e-7)\n"
    "  %s: f32[] = scalar(value=-0.0)\n"
    "  %r: f32[4] = rand(seed=-9223372036854775808, offset=9223372036854775807)\n"
    "  %i: f32[] = scalar(value=-inf)\n"
    "  %n: f32[] = scalar(value=nan)\n"
    "  %b: bool[1] = full(value=true)\n"
    "  loss %s\n"
    "  output %x, %w\n"
    "}\n";

TEST(parse_sources_fields) {
  evt_graph *g = parse_ok(kSources);
  if (!g) return;
  CHECK(strcmp(g->name, "src") == 0);
  CHECK(g->nnodes == 9);
  const evt_node *x = &g->nodes[0], *y = &g->nodes[1], *w = &g->nodes[2], *r = &g->nodes[5];
  CHECK(strcmp(x->name, "x") == 0 && x->op == EVT_OP_INPUT);
  CHECK(x->type.dtype == EVT_F32 && x->type.rank == 2 && x->type.shape[0] == 32 && x->type.shape[1] == 64);
  CHECK(x->type.stride[0] == 64 && x->type.stride[1] == 1);
  CHECK(x->origin.line == 3 && x->origin.col == 3 && strcmp(x->origin.file, "t.evt") == 0);
  CHECK(y->attr.init == EVT_INIT_RANDINT && y->attr.hi == 10.0 && y->type.dtype == EVT_I64);
  CHECK(y->attr_given == ((1ull << EVT_ATTR_INIT) | (1ull << EVT_ATTR_LO) | (1ull << EVT_ATTR_HI)));
  CHECK(w->attr.lo == -0.5 && w->type.dtype == EVT_BF16);
  CHECK(g->nodes[3].type.shape[0] == 0 && g->nodes[3].attr.value == 1e-7);
  CHECK(g->nodes[4].type.rank == 0 && signbit(g->nodes[4].attr.value));
  CHECK(r->attr.seed == INT64_MIN && r->attr.offset == INT64_MAX);
  CHECK(isinf(g->nodes[6].attr.value) && g->nodes[6].attr.value < 0);
  CHECK(isnan(g->nodes[7].attr.value));
  CHECK(g->nodes[8].attr.value == 1.0);
  CHECK(g->loss == 4 && g->noutputs == 3 && g->outputs[0] == 4 && g->outputs[1] == 0 && g->outputs[2] == 2);
  evt_graph_free(g);
}

TEST(parse_print_canonical) {
  evt_graph *g = parse_ok(kSources);
  if (!g) return;
  char *s = evt_graph_to_string(g);
  const char *want =
      "graph src {\n"
      "  %x: f32[32,64] = input()\n"
      "  %y: i64[32] = input(init=randint, hi=10)\n"
      "  %w: bf16[64,10] = param(init=uniform, lo=-0.5, hi=0.5)\n"
      "  %z: f16[0,3] = full(value=1e-07)\n"
      "  %s: f32[] = scalar(value=-0)\n"
      "  %r: f32[4] = rand(seed=-9223372036854775808, offset=9223372036854775807)\n"
      "  %i: f32[] = scalar(value=-inf)\n"
      "  %n: f32[] = scalar(value=nan)\n"
      "  %b: bool[1] = full(value=1)\n"
      "  loss %s\n"
      "  output %x, %w\n"
      "}\n";
  CHECK_MSG(s && strcmp(s, want) == 0, "got:\n%s", s ? s : "(null)");
  /* fixed point */
  evt_graph *g2 = s ? parse_ok(s) : NULL;
  char *s2 = g2 ? evt_graph_to_string(g2) : NULL;
  CHECK(s2 && strcmp(s, s2) == 0);
  free(s);
  free(s2);
  evt_graph_free(g);
  evt_graph_free(g2);
}

TEST(parse_print_floats_roundtrip) {
  /* the printed text must read back to the same double, bit for bit */
  const double vals[] = {0.1, 1.0 / 3.0, 1e-300, 4.9406564584124654e-324, 1.7976931348623157e308, -2.5, 1e22, 123456789.0};
  for (int i = 0; i < EVT_ARRAY_LEN(vals); i++) {
    evt_graph *g = evt_graph_new("f");
    evt_attrs a = evt_attrs_default;
    a.value = vals[i];
    evt_type t = {.dtype = EVT_F32, .rank = 0};
    CHECK(evt_graph_add_node(g, EVT_OP_SCALAR, NULL, 0, &a, 1ull << EVT_ATTR_VALUE, &t, "s", (evt_origin){0}) == 0);
    char *s = evt_graph_to_string(g);
    evt_graph *g2 = s ? parse_ok(s) : NULL;
    CHECK_MSG(g2 && memcmp(&g2->nodes[0].attr.value, &vals[i], sizeof(double)) == 0, "%.17g printed as %s", vals[i],
              s ? s : "(null)");
    free(s);
    evt_graph_free(g);
    evt_graph_free(g2);
  }
}

TEST(parse_every_attr_kind) {
  /* INT (with true/false), FLOAT (from an integer literal), LIST (empty and negative), ENUM: written
   * through evt_attr_table offsets on ops that take them; only source ops need a shape rule here. */
  evt_graph *g = parse_ok("graph k {\n"
                          "  %a: f32[2] = rand(seed=true, offset=-3)\n"
                          "  %b: f32[2] = full(value=2)\n"
                          "  %c: i32[2] = input(init=ones, std=0.25)\n"
                          "}\n");
  if (!g) return;
  CHECK(g->nodes[0].attr.seed == 1 && g->nodes[0].attr.offset == -3);
  CHECK(g->nodes[1].attr.value == 2.0);
  CHECK(g->nodes[2].attr.init == EVT_INIT_ONES && g->nodes[2].attr.std == 0.25);
  evt_graph_free(g);
  /* LIST and the ENUM dtype on non-source ops */
  g = parse_ok("graph k {\n  %x: f32[2,3] = input()\n  %p = permute(%x, dims=[1,0])\n  %c = cast(%p, dtype=bf16)\n}\n");
  if (!g) return;
  CHECK(g->nodes[1].attr.dims.n == 2 && g->nodes[1].attr.dims.v[0] == 1 && g->nodes[1].attr.dims.v[1] == 0);
  CHECK(g->nodes[1].attr_given == 1ull << EVT_ATTR_DIMS);
  CHECK(g->nodes[2].attr.dtype == EVT_BF16 && g->nodes[2].type.dtype == EVT_BF16);
  CHECK(g->nodes[2].type.shape[0] == 3 && g->nodes[2].type.shape[1] == 2);
  char *s = evt_graph_to_string(g);
  CHECK_MSG(s && strstr(s, "  %p: f32[3,2] = permute(%x, dims=[1,0])\n") && strstr(s, "  %c: bf16[3,2] = cast(%p, dtype=bf16)\n"),
            "%s", s ? s : "");
  free(s);
  evt_graph_free(g);
}

TEST(parse_empty_graph_and_comments) {
  evt_graph *g = parse_ok("# nothing\n\n  graph e.1 { # open\n} # close\n# end");
  if (!g) return;
  char *s = evt_graph_to_string(g);
  CHECK(s && strcmp(s, "graph e.1 {\n}\n") == 0);
  free(s);
  evt_graph_free(g);
}

TEST(parse_output_order) {
  /* outputs keep their order; the loss comes first in g->outputs and prints as `loss` */
  evt_graph *g = parse_ok("graph o { %a: f32[] = input() %b: f32[3] = input() %c: f32[] = input() output %c, %b loss %a }");
  if (!g) return;
  CHECK(g->loss == 0 && g->noutputs == 3 && g->outputs[0] == 0 && g->outputs[1] == 2 && g->outputs[2] == 1);
  char *s = evt_graph_to_string(g);
  CHECK_MSG(s && strstr(s, "  loss %a\n  output %c, %b\n}\n"), "%s", s ? s : "");
  free(s);
  evt_graph_free(g);
  /* the loss is always an output: listing it again is an error, in either order */
  CHECK(parse_fails_with("graph o { %a: f32[] = input() output %a loss %a }", "t.evt:1:46: %a is already an output"));
}

TEST(parse_errors_syntax) {
  CHECK(parse_fails_with("", "t.evt:1:1: expected 'graph', found end of file"));
  CHECK(parse_fails_with("graph {", "t.evt:1:7: expected a graph name, found '{'"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = input(\n}", "t.evt:3:1: expected an operand or attribute, found '}'"));
  CHECK(parse_fails_with("graph g {\n  %x f32[2] = input()\n}", "t.evt:2:6: expected '=', found 'f32'"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2 = input()\n}", "t.evt:2:13: expected ']', found '='"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[-2] = input()\n}", "t.evt:2:11: expected a dimension size"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = input()\n  $\n}", "t.evt:3:3: expected a statement"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = input(lo=\x01)\n}", "t.evt:2:25: expected a number, found byte 0x01"));
  CHECK(parse_fails_with("graph g { } extra", "t.evt:1:13: expected end of file, found 'extra'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(std=1", "t.evt:1:35: expected ')', found end of file"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = rand(seed=1.5) }", "t.evt:1:34: expected an integer, found '1.5'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = rand(seed=[1]) }", "t.evt:1:34: expected an integer, found '['"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(init=1) }", "t.evt:1:35: expected a name, found '1'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input() output }", "t.evt:1:39: expected %name, found '}'"));
}

TEST(parse_errors_names_and_ops) {
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = input()\n  %y = relu(%z)\n}", "t.evt:3:13: %z is not defined"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = input()\n  %x: f32[2] = input()\n}",
                         "t.evt:3:3: %x is already defined at line 2"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = frobnicate()\n}", "t.evt:2:16: unknown op 'frobnicate'"));
  CHECK(parse_fails_with("graph g {\n  %x: f32[2] = input()\n  %y = mm(%x, %x, dim=1)\n}",
                         "t.evt:3:19: op 'mm' has no attribute 'dim'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(colour=1) }", "t.evt:1:30: op 'input' has no attribute 'colour'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(std=1, std=2) }", "t.evt:1:37: attribute 'std' given twice"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(shape=[3]) }",
                         "t.evt:1:30: op 'input' takes its shape from the type annotation"));
  CHECK(parse_fails_with("graph g { %x = input() }", "t.evt:1:11: op 'input' needs a type"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input() %y = softmax(dim=1, %x) }",
                         "t.evt:1:52: operands must come before attributes"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(init=gaussian) }",
                         "t.evt:1:35: unknown value 'gaussian' for attribute 'init' (one of: normal, uniform"));
  CHECK(parse_fails_with("graph g { %x: f64[2] = input() }", "t.evt:1:15: unknown dtype 'f64'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(std) }", "t.evt:1:33: expected '=', found ')'"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(%x) }", "t.evt:1:30: %x is not defined"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input() %y: f32[2] = input(%x) }",
                         "t.evt:1:32: node %y (input): takes 0 to 0 inputs, got 1"));
}

TEST(parse_errors_ranges) {
  CHECK(parse_fails_with("graph g { %x: f32[99999999999999999999] = input() }", "t.evt:1:19: integer 99999999999999999999 is out of range"));
  CHECK(parse_fails_with("graph g { %x: f32[9223372036854775808] = input() }", "t.evt:1:19: integer 9223372036854775808 is out of range"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = rand(seed=-9223372036854775809) }", "t.evt:1:34: integer -9223372036854775809 is out of range"));
  CHECK(parse_fails_with("graph g { %x: f32[100000000,100000000] = input() }", "t.evt:1:29: shape too large"));
  CHECK(parse_fails_with("graph g { %x: f32[0,100000000,100000000] = input() }", "t.evt:1:31: shape too large"));
  CHECK(parse_fails_with("graph g { %x: f32[1,1,1,1,1,1,1] = input() }", "t.evt:1:31: a type has at most 6 dimensions"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(std=1e999) }", "t.evt:1:34: number 1e999 is out of range"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input(std=-1e400) }", "t.evt:1:34: number 1e400 is out of range"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = input() %y = permute(%x, dims=[0,1,2,3,4,5,6]) }",
                         "t.evt:1:67: attribute 'dims' takes at most 6 values"));
  /* a denormal is fine */
  evt_graph *g = parse_ok("graph g { %x: f32[2] = input(std=1e-320) }");
  CHECK(g && g->nodes[0].attr.std > 0);
  evt_graph_free(g);
}

TEST(parse_errors_loss_output_types) {
  CHECK(parse_fails_with("graph g { %x: f32[2] = input() loss %x }",
                         "t.evt:1:37: the loss %x must be a floating-point scalar, not f32[2]"));
  CHECK(parse_fails_with("graph g { %x: i64[] = input() loss %x }", "t.evt:1:36: the loss %x must be a floating-point scalar"));
  CHECK(parse_fails_with("graph g { %x: f32[] = input() loss %x loss %x }", "t.evt:1:39: the loss is given twice"));
  CHECK(parse_fails_with("graph g { %x: f32[] = input() output %x, %x }", "t.evt:1:42: %x is already an output"));
  CHECK(parse_fails_with("graph g { %x: f32[] = input() loss %x output %x }", "t.evt:1:46: %x is already an output"));
  CHECK(parse_fails_with("graph g { %x: f32[2] = scalar() }", "t.evt:1:11: node %x (scalar): a scalar has rank 0"));
}

TEST(parse_file_io) {
  char *err = NULL;
  CHECK(evt_parse_file("/nonexistent/dir/x.evt", &err) == NULL);
  CHECK(err && strstr(err, "/nonexistent/dir/x.evt: cannot open"));
  free(err);
  CHECK(evt_parse_file("/tmp", &err) == NULL);
  CHECK_MSG(err && strcmp(err, "/tmp: cannot read: Is a directory") == 0, "%s", err ? err : "(null)");
  free(err);
  char path[] = "/tmp/evt_test_parse_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "w");
  fputs("graph g {\n  %x: f32[2] = input()\n  %y: f32[2] = input(\n", f);
  fputc('\0', f); /* a NUL byte is a bad character, not the end of the text */
  fputs("}\n", f);
  fclose(f);
  evt_graph *g = evt_parse_file(path, &err);
  CHECK(g == NULL);
  size_t plen = strlen(path);
  CHECK_MSG(err && strncmp(err, path, plen) == 0 && strcmp(err + plen, ":4:1: expected an operand or attribute, found byte 0x00") == 0,
            "%s", err ? err : "(null)");
  free(err);
  remove(path);
}

TEST(parse_null_err_pointer) {
  /* err may be NULL: failure still returns NULL without leaking */
  CHECK(evt_parse("graph", "t.evt", NULL) == NULL);
  CHECK(evt_parse(NULL, "t.evt", NULL) == NULL);
}

/* Prints g, parses the text back, prints again: the two texts must be equal and the re-parsed graph must
 * verify. Returns the first text (malloc'd) or NULL. */
static char *check_fixed_point(evt_graph *g) {
  char *s1 = evt_graph_to_string(g);
  CHECK(s1 != NULL);
  if (!s1) return NULL;
  evt_graph *g2 = parse_ok(s1);
  char *s2 = g2 ? evt_graph_to_string(g2) : NULL;
  CHECK_MSG(s2 && strcmp(s1, s2) == 0, "first print:\n%s\nsecond print:\n%s", s1, s2 ? s2 : "(null)");
  CHECK_MSG(g2 && evt_graph_verify(g2) == EVT_OK, "%s", g2 ? evt_graph_error(g2) : "");
  free(s2);
  evt_graph_free(g2);
  return s1;
}

TEST(parse_print_api_graph) {
  /* a graph built by the C API (fresh names like mm.0, attributes without the text form) prints as text
   * that parses back to the same print */
  evt_graph *g = evt_graph_new("api");
  int64_t xs[] = {4, 8}, ws[] = {8, 3};
  int x = evt_input(g, "x", EVT_F32, 2, xs);
  int w = evt_param(g, "w", EVT_F32, 2, ws);
  int h = evt_add_op(g, "mm", (int[]){x, w}, 2, NULL, 0);
  evt_attr sm = EVT_ATTR_INT("dim", 0);
  int p = evt_add_op(g, "log_softmax", (int[]){h}, 1, &sm, 1);
  int s = evt_add_op(g, "sum", (int[]){p}, 1, NULL, 0);
  CHECK(x >= 0 && w >= 0 && h >= 0 && p >= 0 && s >= 0);
  CHECK(evt_graph_set_loss(g, s) == EVT_OK);
  CHECK(evt_graph_add_output(g, h) == EVT_OK);
  char *text = check_fixed_point(g);
  CHECK_MSG(text && strstr(text, "= mm(%x, %w)\n") && strstr(text, "= log_softmax(%mm.") && strstr(text, ", dim=0)\n"),
            "%s", text ? text : "");
  free(text);
  evt_graph_free(g);
}

TEST(parse_print_joint_graph) {
  /* the backward ops autodiff appends (names like grad.w, attributes such as shape=) print and re-parse */
  evt_graph *g = parse_ok("graph j {\n"
                          "  %x: f32[8,16] = input()\n"
                          "  %y: i64[8] = input(init=randint, hi=4)\n"
                          "  %w: f32[16,4] = param(std=0.1)\n"
                          "  %g: f32[4] = param(init=ones)\n"
                          "  %h = mm(%x, %w)\n"
                          "  %n = layer_norm(%h, %g, eps=1e-6)\n"
                          "  %a = gelu(%n, approximate=tanh)\n"
                          "  %d = dropout(%a, p=0.2, seed=3)\n"
                          "  %l = cross_entropy(%d, %y)\n"
                          "  loss %l\n"
                          "}\n");
  if (!g) return;
  int before = g->nnodes;
  CHECK(evt_graph_build_joint(g, 0) == EVT_OK);
  CHECK(g->nnodes > before);
  char *text = check_fixed_point(g);
  CHECK_MSG(text && strstr(text, "%grad.w: f32[16,4] = ") && strstr(text, "  output %grad.w, %grad.g\n"), "%s",
            text ? text : "");
  free(text);
  evt_graph_free(g);
}
