/* The CPU interpreter (the oracle): the public evt_interp_run / evt_interp_init_inputs (include/evt.h), and
 * what other modules use of it. */
#ifndef EVT_INTERP_H
#define EVT_INTERP_H

#include "ir/ir.h"

/* (public: evt_interp_run, evt_interp_init_inputs) */
/* Runs one node given its input tensors; `out` is allocated by the callee. */
evt_status evt_interp_node(evt_graph *g, int id, const evt_tensor *const *inputs, evt_tensor *out, unsigned flags);
/* Small accessors for language bindings (tests/python/evt_ctypes.py) that must not mirror evt_node:
 * a node's name and op name (NULL for a bad id), and the id of output i (-1 past the end). */
const char *evt_interp_node_name(const evt_graph *g, int id);
const char *evt_interp_node_op(const evt_graph *g, int id);
int evt_interp_output(const evt_graph *g, int i);

#endif
