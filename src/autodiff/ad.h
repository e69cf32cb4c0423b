/* Private interface between the autodiff driver (autodiff.c) and the vector-Jacobian rules (vjp.c).
 *
 * The driver owns an evt_ad context while it appends the backward of g->loss to g. For every forward
 * node that carries a gradient it calls evt_vjp_apply once (reverse id order, so every user of a node has
 * contributed before the node itself is differentiated); the rule emits new nodes with evt_ad_emit and
 * hands each operand's contribution to evt_ad_accumulate, which reduces broadcast dims, casts to the
 * operand's dtype and sums contributions from several users with `add`. The two files call each other
 * through this header on purpose: the driver applies rules, the rules hand contributions back. */
#ifndef EVT_AUTODIFF_AD_H
#define EVT_AUTODIFF_AD_H
#include "ir/ir.h"

typedef struct evt_ad {
  evt_graph *g;
  int nforward;       /* nodes [0, nforward) are the forward graph */
  int *grad;          /* [nforward] node holding d loss / d node, or -1 */
  const bool *needs;  /* [nforward] node must receive a gradient (it requires one and reaches the loss) */
  int *transposed;    /* [nforward] transpose of a forward node's last two dims, emitted once, or -1 */
  evt_origin origin;  /* origin of emitted nodes: label "grad of %<forward node>" */
  evt_status st;      /* first failure of an emit */
} evt_ad;

/* Adds a node for the rule that is running; -1 on failure (c->st and the graph's message set). */
int evt_ad_emit(evt_ad *c, evt_op op, const int *inputs, int ninputs, const evt_attrs *attrs, uint64_t given);
/* Adds `contrib` (a value of the forward user's shape) to the gradient of node `operand`. */
evt_status evt_ad_accumulate(evt_ad *c, int operand, int contrib);

/* Whether input k of node n carries a gradient at all (for F_DIFF ops; floating inputs only). */
bool evt_vjp_differentiable_input(const evt_graph *g, const evt_node *n, int k);
/* Applies the rule of forward node `id` whose gradient is node `dy`. */
evt_status evt_vjp_apply(evt_ad *c, int id, int dy);

#endif
