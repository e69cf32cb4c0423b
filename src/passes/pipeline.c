/* The pass pipeline: the ordered list of graph passes (stage 3 of docs/architecture.md).
 *
 *   canonicalize -> [fp8] -> loss elimination -> decomposition (to a fixpoint) -> reduction elimination ->
 *   constant propagation -> CSE -> edge-list SpMM -> layout folding / permute propagation -> DCE -> split casts
 *
 * fp8 runs only when asked (EVT_PASS_FP8, evt_options.fp8): after canonicalize, whose mm it rewrites, and before
 * loss elimination, which removes the loss ops that tell it the gradients and the loss layer apart.
 * Canonicalization gives every later pass one form per construct (no addmm, no transpose, cross_entropy as
 * nll_loss(log_softmax)). Loss elimination must see the loss ops before decomposition splits them. The
 * reduction elimination works on the sums decomposition exposes; constant propagation and CSE clean up the
 * constants and duplicates the earlier passes leave (CSE also merges the forward's and the backward's copies
 * of softmax / layer norm / dropout masks); layout folding runs last among the rewrites because every pass
 * before it may create reshapes and permutes. Splitting casts comes after CSE, which would merge the copies.
 * Edge-list SpMM needs the gathers and scatters in their final form, after CSE (which may give a gather a second
 * reader, and then the pattern must not fire), and leaves layout folding the reshapes of its edge weights. */
#include "passes/passes.h"

#include <string.h>

const evt_pass_info evt_passes[] = {
    {"canonicalize", evt_pass_canonicalize, "addmm -> mm + add, transpose -> permute, no-op layout/cast dropped, scalar operands"},
    {"fp8", evt_pass_fp8, "opt-in: eligible mm in FP8 with per-tensor scaling (e4m3 forward, e5m2 gradients)", EVT_PASS_FP8},
    {"loss-elim", evt_pass_loss_elim, "softmax/BCE/MSE losses: gradient straight from the logits, loss as a side reduction"},
    {"decompose", evt_pass_decompose, "log_softmax, nll/log_softmax backward, dropout, layer/batch norm, gelu/threshold backward"},
    {"reduce-elim", evt_pass_reduce_elim, "reassociate products under sums, pull out broadcast factors, sum(one_hot) = 1"},
    {"constprop", evt_pass_constprop, "fold constants, x/c -> x*(1/c), algebraic identities"},
    {"cse", evt_pass_cse, "common-subexpression elimination (commutative ops normalized)"},
    {"edge-spmm", evt_pass_edge_spmm, "scatter-add of gathered weighted rows (edge-list message passing) -> coo_perm/coo_rowptr + spmm"},
    {"layout", evt_pass_layout, "fold permute/reshape chains, push permutes through elementwise ops"},
    {"dce", evt_pass_dce, "dead-code elimination"},
    {"split-casts", evt_pass_split_casts, "a widening cast a row nucleus shares with other readers: a copy for the nucleus (fused into its load)"},
};
const int evt_npasses = EVT_ARRAY_LEN(evt_passes);

const evt_pass_info *evt_pass_find(const char *name, size_t len) {
  for (int i = 0; i < evt_npasses; i++)
    if (strlen(evt_passes[i].name) == len && memcmp(evt_passes[i].name, name, len) == 0) return &evt_passes[i];
  return NULL;
}

evt_status evt_passes_run_all(evt_graph *g, unsigned flags, int verify) {
  for (int i = 0; i < evt_npasses; i++) {
    if ((evt_passes[i].needs & flags) != evt_passes[i].needs) continue;
    evt_pass_stats st = {.flags = flags};
    evt_status s = evt_passes[i].run(g, &st);
    if (s == EVT_OK && verify) s = evt_graph_verify(g);
    if (s != EVT_OK) return s;
  }
  return EVT_OK;
}
