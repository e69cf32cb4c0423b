/* Training on the interpreter: gradients of a joint graph, plain SGD, releasing a step (src/compile/train.c). */
#ifndef EVT_COMPILE_TRAIN_H
#define EVT_COMPILE_TRAIN_H

#include <stdbool.h>

#include "ir/ir.h"

/* Builds the joint graph if g has a loss and no gradient outputs (*built tells; may be NULL). */
evt_status evt_train_ensure_joint(evt_graph *g, bool *built);
/* p -= lr * grad.p for every param (rounded to p's dtype unless flags has EVT_RUN_FP64); the gradient
 * slots must be filled. */
evt_status evt_train_sgd_update(evt_graph *g, evt_tensor *values, double lr, unsigned flags);
/* Frees every slot that is not an input or param (between steps). */
void evt_train_release(const evt_graph *g, evt_tensor *values);

#endif
