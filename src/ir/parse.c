/* The `.evt` text parser (grammar and semantics: docs/text-format.md). A hand-written lexer with one token
 * of lookahead feeds a recursive-descent parser that builds the graph statement by statement through
 * evt_graph_add_node, so shape and type errors come from the same rules as the builder API.
 *
 *   file  := 'graph' IDENT '{' stmt* '}' EOF
 *   stmt  := NAME [':' type] '=' IDENT '(' [arg (',' arg)*] ')'      (operands before attributes)
 *          | 'loss' NAME
 *          | 'output' NAME (',' NAME)*
 *   arg   := NAME | IDENT '=' value
 *   type  := IDENT '[' [UINT (',' UINT)*] ']'                         (rank <= EVT_MAX_RANK)
 *   value := ['-'] NUMBER | ['-'] IDENT | '[' [['-'] INT (',' ['-'] INT)*] ']'
 *
 * Tokens: IDENT = [A-Za-z_][A-Za-z0-9_.]*, NAME = '%' [A-Za-z0-9_.]+, NUMBER = digits ['.' digits]
 * [e [+-] digits]; '#' starts a comment to the end of the line; newlines are whitespace.
 *
 * Contract: never reads past the text, never recurses (the grammar is flat), bounds every size (names,
 * ranks, lists, operand counts, shape products, integer literals) and reports every violation as
 * "file:line:col: message" in a malloc'd string. The first error stops the parse. */
#include "ir/ir.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME_LEN 200
#define MAX_NUMBER_LEN 64
/* A shape's element count (and every prefix product) must stay below this, so numel * bytes and strides
 * never overflow int64 and numel is exact in a double. */
#define MAX_NUMEL (INT64_C(1) << 53)

typedef enum { T_EOF, T_IDENT, T_NAME, T_NUMBER, T_PUNCT, T_BAD } tok_kind;

typedef struct {
  tok_kind kind;
  const char *s;  /* token text (for T_NAME without the '%') */
  size_t len;
  int line, col;
} token;

typedef struct {
  const char *p, *end, *line_start;
  int line;
  token tok;           /* the current token */
  const char *file;    /* arena-owned, for origins */
  evt_graph *g;
  char *err;           /* first error, malloc'd */
  int *slots;          /* open-addressing name table: node id + 1, 0 = empty */
  size_t nslots, nused;
  bool have_loss;
} parser;

/* ---- errors ---------------------------------------------------------------------------------------- */

static bool fail_at(parser *ps, int line, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool fail_at(parser *ps, int line, int col, const char *fmt, ...) {
  if (ps->err) return false;
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (asprintf(&ps->err, "%s:%d:%d: %s", ps->file, line, col, msg) < 0) ps->err = NULL;
  if (!ps->err) evt_fatal(__FILE__, __LINE__, "out of memory");
  return false;
}

/* A short printable description of a token for "found ..." messages. */
static const char *describe(const token *t, char *buf, size_t n) {
  switch (t->kind) {
  case T_EOF: return "end of file";
  case T_BAD: {
    unsigned char c = (unsigned char)t->s[0];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
  }
  default: {
    int show = t->len > 40 ? 40 : (int)t->len;
    snprintf(buf, n, "'%s%.*s%s'", t->kind == T_NAME ? "%" : "", show, t->s, t->len > 40 ? "..." : "");
    return buf;
  }
  }
}

static bool expected(parser *ps, const char *what) {
  char buf[64];
  return fail_at(ps, ps->tok.line, ps->tok.col, "expected %s, found %s", what, describe(&ps->tok, buf, sizeof buf));
}

/* ---- lexer ----------------------------------------------------------------------------------------- */

static bool is_ident_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_name_char(int c) { return is_ident_start(c) || is_digit(c) || c == '.'; }

static void next(parser *ps) {
  const char *p = ps->p, *end = ps->end;
  for (;;) {
    if (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\f' || *p == '\v')) {
      p++;
    } else if (p < end && *p == '\n') {
      p++;
      ps->line++;
      ps->line_start = p;
    } else if (p < end && *p == '#') {
      while (p < end && *p != '\n') p++;
    } else {
      break;
    }
  }
  token t = {.s = p, .line = ps->line, .col = (int)(p - ps->line_start) + 1};
  if (p >= end) {
    t.kind = T_EOF;
  } else if (is_ident_start((unsigned char)*p)) {
    t.kind = T_IDENT;
    while (p < end && is_name_char((unsigned char)*p)) p++;
  } else if (*p == '%' && p + 1 < end && is_name_char((unsigned char)p[1])) {
    t.kind = T_NAME;
    t.s = ++p;
    while (p < end && is_name_char((unsigned char)*p)) p++;
  } else if (is_digit((unsigned char)*p)) {
    t.kind = T_NUMBER;
    while (p < end && is_digit((unsigned char)*p)) p++;
    if (p < end && *p == '.') {
      p++;
      while (p < end && is_digit((unsigned char)*p)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      const char *q = p + 1;
      if (q < end && (*q == '+' || *q == '-')) q++;
      if (q < end && is_digit((unsigned char)*q)) {
        p = q;
        while (p < end && is_digit((unsigned char)*p)) p++;
      }
    }
  } else if (strchr("{}()[],=:-", *p) && *p != '\0') {
    t.kind = T_PUNCT;
    p++;
  } else {
    t.kind = T_BAD;
    p++;
  }
  if (t.kind != T_EOF && t.kind != T_BAD) t.len = (size_t)(p - t.s);
  else t.len = t.kind == T_BAD ? 1 : 0;
  ps->p = p;
  ps->tok = t;
}

static bool is_punct(const parser *ps, char c) { return ps->tok.kind == T_PUNCT && ps->tok.s[0] == c; }
static bool is_word(const parser *ps, const char *w) {
  return ps->tok.kind == T_IDENT && ps->tok.len == strlen(w) && memcmp(ps->tok.s, w, ps->tok.len) == 0;
}

static bool expect_punct(parser *ps, char c) {
  if (!is_punct(ps, c)) {
    char what[8] = {'\'', c, '\'', 0};
    return expected(ps, what);
  }
  next(ps);
  return true;
}

/* ---- the name table ------------------------------------------------------------------------------- */

static uint64_t hash_name(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* Node id of the name, or -1. */
static int lookup(const parser *ps, const char *s, size_t n) {
  if (!ps->nslots) return -1;
  for (size_t i = hash_name(s, n) & (ps->nslots - 1);; i = (i + 1) & (ps->nslots - 1)) {
    int v = ps->slots[i];
    if (!v) return -1;
    const char *nm = ps->g->nodes[v - 1].name;
    if (strlen(nm) == n && memcmp(nm, s, n) == 0) return v - 1;
  }
}

static void insert(parser *ps, int id) {
  if ((ps->nused + 1) * 2 > ps->nslots) {
    size_t ns = ps->nslots ? ps->nslots * 2 : 64;
    int *slots = calloc(ns, sizeof *slots);
    if (!slots) evt_fatal(__FILE__, __LINE__, "out of memory");
    int *old = ps->slots;
    size_t on = ps->nslots;
    ps->slots = slots;
    ps->nslots = ns;
    ps->nused = 0;
    for (size_t i = 0; i < on; i++)
      if (old[i]) insert(ps, old[i] - 1);
    free(old);
  }
  const char *nm = ps->g->nodes[id].name;
  size_t i = hash_name(nm, strlen(nm)) & (ps->nslots - 1);
  while (ps->slots[i]) i = (i + 1) & (ps->nslots - 1);
  ps->slots[i] = id + 1;
  ps->nused++;
}

/* Resolves the current NAME token to a node id (and consumes it); -1 with an error if undefined. */
static int operand(parser *ps) {
  if (ps->tok.kind != T_NAME) {
    expected(ps, "%name");
    return -1;
  }
  int id = lookup(ps, ps->tok.s, ps->tok.len);
  if (id < 0) {
    int show = ps->tok.len > 40 ? 40 : (int)ps->tok.len;
    fail_at(ps, ps->tok.line, ps->tok.col, "%%%.*s%s is not defined", show, ps->tok.s, ps->tok.len > 40 ? "..." : "");
    return -1;
  }
  next(ps);
  return id;
}

/* ---- literals -------------------------------------------------------------------------------------- */

static bool number_is_float(const token *t) {
  for (size_t i = 0; i < t->len; i++)
    if (t->s[i] == '.' || t->s[i] == 'e' || t->s[i] == 'E') return true;
  return false;
}

/* An integer: ['-'] NUMBER without fraction or exponent, in int64 range. */
static bool parse_int(parser *ps, int64_t *out, const char *what) {
  token start = ps->tok;
  bool neg = false;
  if (is_punct(ps, '-')) {
    neg = true;
    next(ps);
  }
  if (ps->tok.kind != T_NUMBER || number_is_float(&ps->tok)) return expected(ps, what);
  uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
  for (size_t i = 0; i < ps->tok.len; i++) {
    unsigned d = (unsigned)(ps->tok.s[i] - '0');
    if (v > (limit - d) / 10)
      return fail_at(ps, start.line, start.col, "integer %s%.*s is out of range", neg ? "-" : "",
                     ps->tok.len > 40 ? 40 : (int)ps->tok.len, ps->tok.s);
    v = v * 10 + d;
  }
  *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
  next(ps);
  return true;
}

/* A float: ['-'] (NUMBER | inf | nan); integers are accepted; overflow to infinity is an error. */
static bool parse_float(parser *ps, double *out) {
  token start = ps->tok;
  bool neg = false;
  if (is_punct(ps, '-')) {
    neg = true;
    next(ps);
  }
  double v;
  if (is_word(ps, "inf")) {
    v = INFINITY;
  } else if (is_word(ps, "nan")) {
    v = NAN;
  } else if (ps->tok.kind == T_NUMBER) {
    if (ps->tok.len > MAX_NUMBER_LEN)
      return fail_at(ps, ps->tok.line, ps->tok.col, "number literal longer than %d characters", MAX_NUMBER_LEN);
    char buf[MAX_NUMBER_LEN + 1];
    memcpy(buf, ps->tok.s, ps->tok.len);
    buf[ps->tok.len] = '\0';
    v = strtod(buf, NULL);
    if (isinf(v)) return fail_at(ps, start.line, start.col, "number %s is out of range for a double", buf);
  } else {
    return expected(ps, "a number");
  }
  *out = neg ? -v : v;
  next(ps);
  return true;
}

/* ---- types ----------------------------------------------------------------------------------------- */

/* type := IDENT '[' [UINT (',' UINT)*] ']' */
static bool parse_type(parser *ps, evt_type *t) {
  memset(t, 0, sizeof *t);
  if (ps->tok.kind != T_IDENT) return expected(ps, "a dtype (f32, f16, bf16, i64, i32, bool, f8e4m3, f8e5m2)");
  int dt = evt_dtype_from_name(ps->tok.s, ps->tok.len);
  if (dt < 0) {
    char buf[64];
    return fail_at(ps, ps->tok.line, ps->tok.col, "unknown dtype %s (expected f32, f16, bf16, i64, i32, bool, f8e4m3 or f8e5m2)",
                   describe(&ps->tok, buf, sizeof buf));
  }
  t->dtype = (evt_dtype)dt;
  next(ps);
  if (!expect_punct(ps, '[')) return false;
  int64_t numel = 1;
  if (!is_punct(ps, ']')) {
    for (;;) {
      token dim_tok = ps->tok;
      if (t->rank == EVT_MAX_RANK)
        return fail_at(ps, dim_tok.line, dim_tok.col, "a type has at most %d dimensions", EVT_MAX_RANK);
      int64_t d;
      if (is_punct(ps, '-')) return expected(ps, "a dimension size (a non-negative integer)");
      if (!parse_int(ps, &d, "a dimension size (a non-negative integer)")) return false;
      int64_t f = d > 0 ? d : 1;
      if (d > MAX_NUMEL || numel > MAX_NUMEL / f)
        return fail_at(ps, dim_tok.line, dim_tok.col, "shape too large: more than 2^53 elements");
      numel *= f;
      t->shape[t->rank++] = d;
      if (!is_punct(ps, ',')) break;
      next(ps);
    }
  }
  if (!expect_punct(ps, ']')) return false;
  evt_type_set_contiguous(t);
  return true;
}

/* ---- attributes ------------------------------------------------------------------------------------ */

static bool parse_attr_value(parser *ps, const evt_attr_info *ai, evt_attrs *attrs) {
  char *field = (char *)attrs + ai->offset;
  switch (ai->kind) {
  case EVT_AK_INT: {
    int64_t v = 0;
    if (is_word(ps, "true") || is_word(ps, "false")) {
      v = is_word(ps, "true");
      next(ps);
    } else if (!parse_int(ps, &v, "an integer")) {
      return false;
    }
    memcpy(field, &v, sizeof v);
    return true;
  }
  case EVT_AK_FLOAT: {
    double v = 0;
    if (is_word(ps, "true") || is_word(ps, "false")) {
      v = is_word(ps, "true");
      next(ps);
    } else if (!parse_float(ps, &v)) {
      return false;
    }
    memcpy(field, &v, sizeof v);
    return true;
  }
  case EVT_AK_LIST: {
    evt_ilist l = {0};
    if (!expect_punct(ps, '[')) return false;
    if (!is_punct(ps, ']')) {
      for (;;) {
        if (l.n == EVT_MAX_RANK)
          return fail_at(ps, ps->tok.line, ps->tok.col, "attribute '%s' takes at most %d values", ai->name,
                         EVT_MAX_RANK);
        if (!parse_int(ps, &l.v[l.n], "an integer")) return false;
        l.n++;
        if (!is_punct(ps, ',')) break;
        next(ps);
      }
    }
    if (!expect_punct(ps, ']')) return false;
    memcpy(field, &l, sizeof l);
    return true;
  }
  case EVT_AK_ENUM: {
    if (ps->tok.kind != T_IDENT) return expected(ps, "a name");
    for (int i = 0; i < ai->enum_count; i++)
      if (strlen(ai->enum_names[i]) == ps->tok.len && memcmp(ai->enum_names[i], ps->tok.s, ps->tok.len) == 0) {
        int64_t v = i;
        memcpy(field, &v, sizeof v);
        next(ps);
        return true;
      }
    char choices[256] = "", buf[64];
    size_t len = 0;
    for (int i = 0; i < ai->enum_count && len < sizeof choices; i++)
      len += (size_t)snprintf(choices + len, sizeof choices - len, "%s%s", i ? ", " : "", ai->enum_names[i]);
    return fail_at(ps, ps->tok.line, ps->tok.col, "unknown value %s for attribute '%s' (one of: %s)",
                   describe(&ps->tok, buf, sizeof buf), ai->name, choices);
  }
  }
  EVT_UNREACHABLE();
}

/* ---- statements ------------------------------------------------------------------------------------ */

/* NAME [':' type] '=' IDENT '(' [arg (',' arg)*] ')' */
static bool parse_node(parser *ps) {
  token name_tok = ps->tok;
  if (name_tok.len > MAX_NAME_LEN)
    return fail_at(ps, name_tok.line, name_tok.col, "name longer than %d characters", MAX_NAME_LEN);
  int prev = lookup(ps, name_tok.s, name_tok.len);
  if (prev >= 0) {
    const evt_origin *o = &ps->g->nodes[prev].origin;
    return fail_at(ps, name_tok.line, name_tok.col, "%%%.*s is already defined at line %d", (int)name_tok.len,
                   name_tok.s, o->line);
  }
  char name[MAX_NAME_LEN + 1];
  memcpy(name, name_tok.s, name_tok.len);
  name[name_tok.len] = '\0';
  next(ps);

  evt_type declared;
  bool has_type = false;
  if (is_punct(ps, ':')) {
    next(ps);
    if (!parse_type(ps, &declared)) return false;
    has_type = true;
  }
  if (!expect_punct(ps, '=')) return false;
  if (ps->tok.kind != T_IDENT) return expected(ps, "an op name");
  token op_tok = ps->tok;
  int op = evt_op_from_name(op_tok.s, op_tok.len);
  if (op < 0) {
    char buf[64];
    return fail_at(ps, op_tok.line, op_tok.col, "unknown op %s", describe(&op_tok, buf, sizeof buf));
  }
  const evt_op_info *info = &evt_op_table[op];
  next(ps);
  if (!expect_punct(ps, '(')) return false;

  int inputs[EVT_MAX_INPUTS];
  int ninputs = 0;
  evt_attrs attrs = evt_attrs_default;
  uint64_t given = 0;
  if (!is_punct(ps, ')')) {
    for (;;) {
      if (ps->tok.kind == T_NAME) {
        if (given)
          return fail_at(ps, ps->tok.line, ps->tok.col, "operands must come before attributes");
        if (ninputs == EVT_MAX_INPUTS)
          return fail_at(ps, ps->tok.line, ps->tok.col, "op '%s' takes at most %d inputs", info->name,
                         info->max_inputs);
        int id = operand(ps);
        if (id < 0) return false;
        inputs[ninputs++] = id;
      } else if (ps->tok.kind == T_IDENT) {
        token at = ps->tok;
        int a = evt_attr_from_name(at.s, at.len);
        int show = at.len > 40 ? 40 : (int)at.len;
        if (a < 0 || !(info->attrs & (1ull << a)))
          return fail_at(ps, at.line, at.col, "op '%s' has no attribute '%.*s'", info->name, show, at.s);
        if ((info->flags & EVT_OPF_TYPED) && (a == EVT_ATTR_SHAPE || a == EVT_ATTR_DTYPE))
          return fail_at(ps, at.line, at.col, "op '%s' takes its %s from the type annotation", info->name,
                         evt_attr_table[a].name);
        if (given & (1ull << a)) return fail_at(ps, at.line, at.col, "attribute '%.*s' given twice", show, at.s);
        next(ps);
        if (!expect_punct(ps, '=')) return false;
        if (!parse_attr_value(ps, &evt_attr_table[a], &attrs)) return false;
        given |= 1ull << a;
      } else {
        return expected(ps, "an operand or attribute");
      }
      if (!is_punct(ps, ',')) break;
      next(ps);
    }
  }
  if (!expect_punct(ps, ')')) return false;

  if ((info->flags & EVT_OPF_TYPED) && !has_type)
    return fail_at(ps, name_tok.line, name_tok.col, "op '%s' needs a type: %%%s: f32[...] = %s(...)", info->name, name,
                   info->name);
  evt_origin origin = {.file = ps->file, .line = name_tok.line, .col = name_tok.col};
  int id = evt_graph_add_node(ps->g, (evt_op)op, inputs, ninputs, &attrs, given, has_type ? &declared : NULL, name,
                              origin);
  if (id < 0) {
    if (!ps->err && asprintf(&ps->err, "%s", evt_graph_error(ps->g)) < 0) evt_fatal(__FILE__, __LINE__, "out of memory");
    return false;
  }
  insert(ps, id);
  return true;
}

/* 'loss' NAME */
static bool parse_loss(parser *ps) {
  token kw = ps->tok;
  next(ps);
  token nt = ps->tok;
  int id = operand(ps);
  if (id < 0) return false;
  if (ps->have_loss) return fail_at(ps, kw.line, kw.col, "the loss is given twice");
  const evt_type *t = &ps->g->nodes[id].type;
  if (evt_type_numel(t) != 1 || !evt_dtype_is_float(t->dtype)) {
    char buf[128];
    return fail_at(ps, nt.line, nt.col, "the loss %%%s must be a floating-point scalar, not %s",
                   ps->g->nodes[id].name, evt_type_str(t, buf, sizeof buf));
  }
  for (int i = 0; i < ps->g->noutputs; i++)
    if (ps->g->outputs[i] == id)
      return fail_at(ps, nt.line, nt.col, "%%%s is already an output", ps->g->nodes[id].name);
  if (evt_graph_set_loss(ps->g, id) != EVT_OK) return fail_at(ps, nt.line, nt.col, "%s", evt_graph_error(ps->g));
  ps->have_loss = true;
  return true;
}

/* 'output' NAME (',' NAME)* */
static bool parse_output(parser *ps) {
  next(ps);
  for (;;) {
    token nt = ps->tok;
    int id = operand(ps);
    if (id < 0) return false;
    for (int i = 0; i < ps->g->noutputs; i++)
      if (ps->g->outputs[i] == id)
        return fail_at(ps, nt.line, nt.col, "%%%s is already an output", ps->g->nodes[id].name);
    if (evt_graph_add_output(ps->g, id) != EVT_OK) return fail_at(ps, nt.line, nt.col, "%s", evt_graph_error(ps->g));
    if (!is_punct(ps, ',')) return true;
    next(ps);
  }
}

/* 'graph' IDENT '{' stmt* '}' EOF */
static bool parse_file(parser *ps) {
  if (!is_word(ps, "graph")) return expected(ps, "'graph'");
  next(ps);
  if (ps->tok.kind != T_IDENT) return expected(ps, "a graph name");
  if (ps->tok.len > MAX_NAME_LEN)
    return fail_at(ps, ps->tok.line, ps->tok.col, "name longer than %d characters", MAX_NAME_LEN);
  char name[MAX_NAME_LEN + 1];
  memcpy(name, ps->tok.s, ps->tok.len);
  name[ps->tok.len] = '\0';
  ps->g->name = evt_arena_strdup(&ps->g->arena, name);
  next(ps);
  if (!expect_punct(ps, '{')) return false;
  for (;;) {
    bool ok;
    if (ps->tok.kind == T_NAME) ok = parse_node(ps);
    else if (is_word(ps, "loss")) ok = parse_loss(ps);
    else if (is_word(ps, "output")) ok = parse_output(ps);
    else if (is_punct(ps, '}')) break;
    else return expected(ps, "a statement (%name = ..., loss, output) or '}'");
    if (!ok) return false;
  }
  next(ps);
  if (ps->tok.kind != T_EOF) return expected(ps, "end of file");
  return true;
}

static evt_graph *parse_text(const char *text, size_t len, const char *filename, char **err) {
  if (err) *err = NULL;
  if (!filename) filename = "<input>";
  if (len > (size_t)INT_MAX / 2) {
    if (err && asprintf(err, "%s: input too large", filename) < 0) *err = NULL;
    return NULL;
  }
  evt_graph *g = evt_graph_new("main");
  if (!g) evt_fatal(__FILE__, __LINE__, "out of memory");
  parser ps = {.p = text, .end = text + len, .line_start = text, .line = 1, .g = g};
  ps.file = evt_arena_strdup(&g->arena, filename);
  next(&ps);
  bool ok = parse_file(&ps);
  free(ps.slots);
  if (!ok) {
    EVT_ASSERT(ps.err);
    if (err) *err = ps.err;
    else free(ps.err);
    evt_graph_free(g);
    return NULL;
  }
  g->error[0] = '\0';
  return g;
}

evt_graph *evt_parse(const char *text, const char *filename, char **err) {
  if (!text) {
    if (err && asprintf(err, "%s: no text", filename ? filename : "<input>") < 0) *err = NULL;
    return NULL;
  }
  return parse_text(text, strlen(text), filename, err);
}

evt_graph *evt_parse_file(const char *path, char **err) {
  if (err) *err = NULL;
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) {
    if (err && asprintf(err, "%s: cannot open: %s", path ? path : "(null)", strerror(errno)) < 0) *err = NULL;
    return NULL;
  }
  size_t cap = 65536, len = 0;
  char *buf = malloc(cap);
  errno = 0;
  if (!buf) evt_fatal(__FILE__, __LINE__, "out of memory");
  for (;;) {
    if (len == cap) {
      if (cap > (size_t)INT_MAX / 2) break;
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) evt_fatal(__FILE__, __LINE__, "out of memory");
      buf = nb;
    }
    size_t r = fread(buf + len, 1, cap - len, f);
    len += r;
    if (r == 0) break;
  }
  int bad = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (bad) {
    free(buf);
    if (err && asprintf(err, "%s: cannot read: %s", path, strerror(bad)) < 0) *err = NULL;
    return NULL;
  }
  evt_graph *g = parse_text(buf, len, path, err);
  free(buf);
  return g;
}
