/* Pass: dead-code elimination.
 *
 * Contract: requires nothing beyond a graph whose rewrites made no cycle; preserves every output exactly.
 * Removes every node that no output (and not the loss) depends on, except inputs and params, which are
 * the graph's interface; re-sorts and renumbers (evt_graph_compact in rewrite.c). Every other pass already
 * ends with the same compaction, so this pass matters when run alone (`evtc opt --passes=dce`). */
#include "passes/passes.h"

evt_status evt_pass_dce(evt_graph *g, evt_pass_stats *st) { return evt_graph_compact(g, &st->removed); }
