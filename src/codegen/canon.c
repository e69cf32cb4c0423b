/* Canonical operand order of commutative epilogue ops (contract in kspec.h, evt_vop_canonical_order), so that
 * groups whose graphs list the operands of a product or sum the other way round lower to one kernel. */
#include <stdbool.h>
#include <string.h>

#include "codegen/kspec.h"
#include "util/util.h"

/* Ops whose two operands may trade places bit for bit: IEEE a*b == b*a and a+b == b+a; eq / ne compare. Not
 * maximum / minimum: they return their second operand on equality, so max(+0, -0) is -0 and max(-0, +0) is +0. */
static bool commutes(evt_vop op) { return op == EVT_V_MUL || op == EVT_V_ADD || op == EVT_V_EQ || op == EVT_V_NE; }

/* The node whose value v passes on unchanged (stores and sums hand on their input, keep its first). */
static int through(const evt_vop *op, const int (*in)[3], int v) {
  while (evt_vop_class(op[v]) == 'S' || op[v] == EVT_V_KEEP) v = in[v][0];
  return v;
}

/* A leaf whose value is read, not computed by a multiplication (a kernel's acc and rand are computed: a softmax's
 * output, a Philox uniform's scaling). */
static bool plain_leaf(evt_vop op) {
  return op == EVT_V_SCALAR || op == EVT_V_AUX_LOAD || op == EVT_V_ROW_BCAST || op == EVT_V_COL_BCAST ||
         op == EVT_V_SCALAR_LOAD || op == EVT_V_ONE_HOT;
}

/* May node v's operands be swapped without changing a bit of the kernel's results? nvcc contracts a product
 * feeding an add into an fma; with a product on both sides which one it fuses can follow the operand order, so an
 * add swaps only when one side is a plain leaf (then at most one product can fuse, whichever the order). */
static bool may_swap(const evt_vop *op, const int (*in)[3], int v) {
  if (!commutes(op[v])) return false;
  if (op[v] != EVT_V_ADD) return true;
  return plain_leaf(op[through(op, in, in[v][0])]) || plain_leaf(op[through(op, in, in[v][1])]);
}

/* Does operand a go after operand b? By op first (the accumulator, then broadcasts, scalars, loads, computes: the
 * order most epilogues were written in keeps their text), then subtree key, then id (equal subtrees). */
static bool after(const evt_vop *op, const uint64_t *key, int a, int b) {
  if (op[a] != op[b]) return op[a] > op[b];
  return key[a] != key[b] ? key[a] > key[b] : a > b;
}

void evt_vop_canonical_order(int n, const evt_vop *op, int (*in)[3], const uint64_t *leaf, uint64_t *key) {
  for (int v = 0; v < n; v++) {
    int a = in[v][0], b = in[v][1];
    if (may_swap(op, (const int (*)[3])in, v) && after(op, key, a, b)) in[v][0] = b, in[v][1] = a;
    uint64_t h = leaf[v];
    for (int j = 0; j < evt_vop_arity(op[v]); j++) h = evt_hash_bytes(h, &key[in[v][j]], sizeof key[0]);
    key[v] = h;
  }
}

uint64_t evt_vop_leaf_key(evt_vop op, evt_dtype dtype, double value, const char *name, int extra) {
  uint64_t h = evt_hash_bytes(0, &op, sizeof op);
  h = evt_hash_bytes(h, &dtype, sizeof dtype);
  if (op == EVT_V_SCALAR) h = evt_hash_bytes(h, &value, sizeof value);
  if (evt_vop_has_memory(op)) h = evt_hash_bytes(h, name, strlen(name));
  return evt_hash_bytes(h, &extra, sizeof extra);
}
