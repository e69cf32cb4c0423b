/* Shape and dtype inference, and the verifier rule of every op. evt_infer_node checks a node's inputs
 * and attributes and sets its type; any violation is a user error naming the node (EVT_ERR_TYPE). */
#include "evt_impl.h"

#include <string.h>

#define FAIL(...) return evt_graph_errorf(g, id, EVT_ERR_TYPE, __VA_ARGS__)


bool evt_broadcast_shapes(const evt_type *a, const evt_type *b, evt_type *out) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  out->rank = r;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out->shape[i] = da == 1 ? db : da;
  }
  return true;
}

static evt_status set_from_attrs(evt_graph *g, evt_node *n, int id) {
  const evt_ilist *s = &n->attr.shape;
  if (s->n < 0 || s->n > EVT_MAX_RANK) FAIL("rank %d out of range", s->n);
  if ((unsigned)n->attr.dtype >= EVT_DTYPE_COUNT) FAIL("bad dtype");
  n->type.dtype = (evt_dtype)n->attr.dtype;
  n->type.rank = s->n;
  for (int i = 0; i < s->n; i++) {
    if (s->v[i] < 0) FAIL("negative size %lld in dim %d", (long long)s->v[i], i);
    n->type.shape[i] = s->v[i];
  }
  return EVT_OK;
}

evt_status evt_infer_node(evt_graph *g, evt_node *n, int id) {
  memset(&n->type, 0, sizeof n->type);
  evt_status st = EVT_OK;
  switch (n->op) {
  case EVT_OP_INPUT:
  case EVT_OP_PARAM:
  case EVT_OP_FULL:
  case EVT_OP_RAND:
    st = set_from_attrs(g, n, id);
    break;
  case EVT_OP_SCALAR:
    st = set_from_attrs(g, n, id);
    if (st == EVT_OK && n->type.rank != 0) FAIL("a scalar has rank 0");
    break;
  default:
    FAIL("no shape rule for this op yet");
  }
  if (st != EVT_OK) return st;
  evt_type_set_contiguous(&n->type);
  return EVT_OK;
}
