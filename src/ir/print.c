/* The canonical `.evt` text of a graph (docs/text-format.md): the parser reads it back to an equal graph,
 * and print(parse(print(g))) == print(g).
 *
 *   graph NAME {
 *     %name: TYPE = op(%a, %b, attr=value, ...)      one line per node, in node (topological) order
 *     loss %l
 *     output %a, %b                                  outputs other than the loss, in order
 *   }
 *
 * Attributes are those the op takes whose value differs from evt_attrs_default (bitwise for floats, so
 * -0.0 survives), in attrs.def order; typed sources leave out shape and dtype (the type shows them).
 * Floats use the shortest of %.15g/%.16g/%.17g that reads back to the same double, and inf/-inf/nan;
 * enums print by name. */
#include "ir/ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void print_float(double v, FILE *out) {
  if (isnan(v)) {
    fputs("nan", out);
    return;
  }
  if (isinf(v)) {
    fputs(v < 0 ? "-inf" : "inf", out);
    return;
  }
  char buf[40];
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  fputs(buf, out);
}

static bool attr_is_default(const evt_attr_info *ai, const evt_attrs *a) {
  const char *x = (const char *)a + ai->offset, *d = (const char *)&evt_attrs_default + ai->offset;
  switch (ai->kind) {
  case EVT_AK_INT:
  case EVT_AK_ENUM: return memcmp(x, d, sizeof(int64_t)) == 0;
  case EVT_AK_FLOAT: return memcmp(x, d, sizeof(double)) == 0;
  case EVT_AK_LIST: {
    evt_ilist lx, ld;
    memcpy(&lx, x, sizeof lx);
    memcpy(&ld, d, sizeof ld);
    if (lx.n != ld.n) return false;
    for (int i = 0; i < lx.n && i < EVT_MAX_RANK; i++)
      if (lx.v[i] != ld.v[i]) return false;
    return true;
  }
  }
  EVT_UNREACHABLE();
}

static void print_attr_value(const evt_attr_info *ai, const evt_attrs *a, FILE *out) {
  const char *x = (const char *)a + ai->offset;
  switch (ai->kind) {
  case EVT_AK_INT: {
    int64_t v;
    memcpy(&v, x, sizeof v);
    fprintf(out, "%lld", (long long)v);
    return;
  }
  case EVT_AK_ENUM: {
    int64_t v;
    memcpy(&v, x, sizeof v);
    if (v >= 0 && v < ai->enum_count) fputs(ai->enum_names[v], out);
    else fprintf(out, "%lld", (long long)v); /* not a valid graph; the parser will say so */
    return;
  }
  case EVT_AK_FLOAT: {
    double v;
    memcpy(&v, x, sizeof v);
    print_float(v, out);
    return;
  }
  case EVT_AK_LIST: {
    evt_ilist l;
    memcpy(&l, x, sizeof l);
    fputc('[', out);
    for (int i = 0; i < l.n && i < EVT_MAX_RANK; i++) fprintf(out, "%s%lld", i ? "," : "", (long long)l.v[i]);
    fputc(']', out);
    return;
  }
  }
  EVT_UNREACHABLE();
}

void evt_print_node(const evt_graph *g, int id, FILE *out) {
  EVT_ASSERT(id >= 0 && id < g->nnodes);
  const evt_node *n = &g->nodes[id];
  const evt_op_info *info = &evt_op_table[n->op];
  char tbuf[160];
  fprintf(out, "%%%s: %s = %s(", n->name, evt_type_str(&n->type, tbuf, sizeof tbuf), info->name);
  bool first = true;
  for (int i = 0; i < n->ninputs; i++) {
    int in = n->inputs[i];
    fprintf(out, "%s%%%s", first ? "" : ", ", in >= 0 && in < g->nnodes ? g->nodes[in].name : "?");
    first = false;
  }
  for (int a = 0; a < EVT_ATTR_COUNT; a++) {
    if (!(info->attrs & (1ull << a))) continue;
    if ((info->flags & EVT_OPF_TYPED) && (a == EVT_ATTR_SHAPE || a == EVT_ATTR_DTYPE)) continue;
    const evt_attr_info *ai = &evt_attr_table[a];
    if (attr_is_default(ai, &n->attr)) continue;
    fprintf(out, "%s%s=", first ? "" : ", ", ai->name);
    print_attr_value(ai, &n->attr, out);
    first = false;
  }
  fputc(')', out);
}

/* The graph name as an identifier ([A-Za-z_][A-Za-z0-9_.]*): other characters become '_'. */
static void print_graph_name(const char *name, FILE *out) {
  if (!name || !*name) {
    fputs("main", out);
    return;
  }
  if (!((*name >= 'a' && *name <= 'z') || (*name >= 'A' && *name <= 'Z') || *name == '_')) fputc('_', out);
  for (const char *p = name; *p; p++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    fputc(ok ? c : '_', out);
  }
}

evt_status evt_graph_print(const evt_graph *g, FILE *out) {
  if (!g || !out) return EVT_ERR_INVALID;
  fputs("graph ", out);
  print_graph_name(g->name, out);
  fputs(" {\n", out);
  for (int i = 0; i < g->nnodes; i++) {
    fputs("  ", out);
    evt_print_node(g, i, out);
    fputc('\n', out);
  }
  if (g->loss >= 0 && g->loss < g->nnodes) fprintf(out, "  loss %%%s\n", g->nodes[g->loss].name);
  bool first = true;
  for (int i = 0; i < g->noutputs; i++) {
    int o = g->outputs[i];
    if (o == g->loss || o < 0 || o >= g->nnodes) continue;
    fprintf(out, "%s%%%s", first ? "  output " : ", ", g->nodes[o].name);
    first = false;
  }
  if (!first) fputc('\n', out);
  fputs("}\n", out);
  return ferror(out) ? EVT_ERR_IO : EVT_OK;
}

char *evt_graph_to_string(const evt_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  evt_status st = evt_graph_print(g, f);
  if (fclose(f) != 0 || st != EVT_OK) {
    free(buf);
    return NULL;
  }
  return buf;
}
