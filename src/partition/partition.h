/* The fusion partitioner's internal header (module src/partition/).
 *
 * The partitioner works on an abstract *labelled DAG* (evt_pgraph): nodes carry rule flags and a tensor
 * size, edges carry a rule status. It never looks at ops itself; adapter.c turns an evt_graph into a
 * pgraph through the rule table in rules.c, and the property tests build random pgraphs directly.
 *
 * Problem. Put every kernel node (not SOURCE) into exactly one group so that
 *   - an edge with status CUT joins two groups, an edge with status FUSE stays inside one group;
 *   - a group holds at most one NUCLEUS, and no nucleus shares a group with a node the compat hook
 *     rejects for it (epilogue implementability);
 *   - contracting every group leaves a DAG (checked on the contracted graph; convexity is not enough).
 * Cost (cost.c) of a grouping, in bytes through global memory plus launch cost:
 *   write(u) = bytes(u)   once, if u has a consumer in another group or is a graph output;
 *   read(u, G) = bytes(u) once per group G that consumes u and does not contain u (a source is read once
 *                         by every group that consumes it);
 *   lambda per group (kernel launch).
 * Groups are the weakly connected pieces of their internal edges (a group given as two unconnected
 * pieces is costed as two kernels: horizontal fusion of unrelated ops is not a kernel evt can emit).
 * The MIP (ilp.c) minimizes exactly this; the brute force in the tests enumerates it.
 */
#ifndef EVT_PARTITION_H
#define EVT_PARTITION_H

#include "ir/ir.h"

/* ---- node flags (set by the adapter or by a test) ----------------------------------------------------- */
#define EVT_PN_SOURCE 1u      /* input/param/constant/rng source: not a kernel, in no group */
#define EVT_PN_NUCLEUS 2u     /* a mainloop (GEMM, conv, SpMM, reduce-apply row): at most one per group */
#define EVT_PN_CUT_IN 4u      /* every in-edge is cut (no prologue fusion), except OPERAND / CONVERT producers */
#define EVT_PN_CUT_OUT 8u     /* every out-edge is cut (a reduction ends its group; singletons) */
#define EVT_PN_FUSE_IN 16u    /* must fuse with its kernel producer (rng ops) unless a cut rule says no */
#define EVT_PN_VIEW 32u       /* alias of its producer: always fuses with it and inherits its CUT_OUT */
#define EVT_PN_OPERAND 64u    /* permute/transpose: with a single consumer that is LAYOUT_IN it fuses into it */
#define EVT_PN_LAYOUT_IN 128u /* a GEMM: accepts OPERAND producers as operand layouts */
#define EVT_PN_OUTPUT 256u    /* a graph output: always written */
#define EVT_PN_CONVERT 512u   /* a widening cast (bf16/f16 -> f32, exact): with a single consumer that is CONVERT_IN,
                               * as one of its M x N inputs, it fuses into it as the load's conversion */
#define EVT_PN_CONVERT_IN 1024u /* a row nucleus (softmax, layer norm and their backward): accepts CONVERT producers */

/* An operand prologue: a permute fused into its GEMM as a layout, or a widening cast fused into a row nucleus's
 * load. Part of the nucleus's input, not of its epilogue (rules.c, decompose.c). */
static inline bool evt_pn_prologue(unsigned f) {
  return (f & (EVT_PN_OPERAND | EVT_PN_CONVERT)) && (f & EVT_PN_CUT_IN);
}

/* ---- edge status (rules.c) ---------------------------------------------------------------------------- */
enum { EVT_PE_FREE = 0, EVT_PE_CUT, EVT_PE_FUSE, EVT_PE_SOURCE /* from a source: always a read */ };

typedef struct evt_pnode {
  unsigned flags;
  uint64_t label;   /* op, dtype, shape class: what isomorphism must preserve (cache.c) */
  double bytes;     /* size of the node's output tensor */
  int shape_class;  /* used by the default compat hook (random tests) */
  int in0, nin;     /* in-edge ids: g->in_edges[in0 .. in0+nin) */
  int out0, nout;   /* out-edge ids: g->out_edges[out0 .. out0+nout) */
} evt_pnode;

typedef struct evt_pedge {
  int u, v;         /* u < v */
  int status;       /* EVT_PE_* */
} evt_pedge;

typedef struct evt_pgraph evt_pgraph;
/* Epilogue implementability hook: may `member` share a group with `nucleus`? */
typedef bool (*evt_part_compat_fn)(const evt_pgraph *g, int nucleus, int member);

struct evt_pgraph {
  int n, m;
  evt_pnode *nodes;
  evt_pedge *edges;
  int *in_edges, *out_edges;   /* CSR, built by evt_pgraph_finish */
  int cap_m;
  double lambda;               /* launch cost of one kernel (group), in bytes */
  evt_part_compat_fn compat;   /* NULL: evt_part_compat_shape_class */
  const evt_graph *src;        /* the evt_graph this came from (adapter), or NULL */
  const char **names;          /* optional node names for messages */
  char error[512];
};

/* ---- pgraph.c: building ------------------------------------------------------------------------------- */
/* A graph of n nodes without edges; set nodes[i] fields, add edges, then call evt_pgraph_finish. */
evt_pgraph *evt_pgraph_new(int n);
void evt_pgraph_free(evt_pgraph *g);
/* Adds edge u -> v (u < v); a repeated edge is ignored (a tensor read twice by one node is read once). */
void evt_pgraph_add_edge(evt_pgraph *g, int u, int v);
/* Builds the CSR arrays and derives the edge statuses (evt_part_derive_rules). */
void evt_pgraph_finish(evt_pgraph *g);
static inline bool evt_pgraph_kernel(const evt_pgraph *g, int v) { return !(g->nodes[v].flags & EVT_PN_SOURCE); }
const char *evt_pgraph_name(const evt_pgraph *g, int v, char *buf, size_t n);

/* ---- rules.c ------------------------------------------------------------------------------------------ */
/* Flags for an evt_graph node from its op (the one rule table; see docs/partition.md). */
unsigned evt_part_op_flags(const evt_graph *g, int id);
/* Sets every edge's status from the node flags (precedence: VIEW > CUT > OPERAND > FUSE_IN > FREE). */
void evt_part_derive_rules(evt_pgraph *g);
/* Default compat hook: equal shape class, or member class 0 (a scalar/broadcast). */
bool evt_part_compat_shape_class(const evt_pgraph *g, int nucleus, int member);
/* Compat hook for adapter graphs: the member's tensor has the nucleus output's shape or broadcasts to it;
 * a reduction member reduces a tensor of that shape over its row dim, its column dims, or all dims. */
bool evt_part_compat_evt(const evt_pgraph *g, int nucleus, int member);
/* May a and b (kernel nodes) share a group as far as nucleus/compat rules go? */
bool evt_part_pair_ok(const evt_pgraph *g, int a, int b);

/* ---- cost.c ------------------------------------------------------------------------------------------- */
#define EVT_PART_LAMBDA_DEFAULT (4.0 * 1024 * 1024) /* ~1 us of launch + tail at ~4 TB/s, in bytes */
typedef struct evt_part_cost {
  double written, read;   /* bytes */
  int groups;             /* kernels */
  double total;           /* written + read + lambda * groups */
} evt_part_cost;
/* group[v] for kernel nodes: an id in [0, n) (equal = same group); ignored for sources. */
evt_part_cost evt_part_evaluate(const evt_pgraph *g, const int *group);
/* A measured model instead of the byte model: the cost of a grouping is the sum of fn over its groups
 * (members in id order). Used for reporting/comparison; the MIP optimizes the byte model. */
typedef double (*evt_part_kernel_time_fn)(const evt_pgraph *g, const int *members, int nmembers, void *ctx);
double evt_part_evaluate_model(const evt_pgraph *g, const int *group, evt_part_kernel_time_fn fn, void *ctx);

/* ---- validate.c --------------------------------------------------------------------------------------- */
/* EVT_OK, or EVT_ERR_INTERNAL with a message naming the broken rule in g->error. */
evt_status evt_part_validate(evt_pgraph *g, const int *group);
/* Renumbers groups 0..k-1 in a topological order of the contracted graph (sources get -1); returns k, or
 * -1 if the contracted graph has a cycle. */
int evt_part_normalize(const evt_pgraph *g, int *group);

/* ---- greedy.c ----------------------------------------------------------------------------------------- */
/* A legal grouping: fuse FUSE edges, then edges by decreasing bytes whenever every rule and acyclicity
 * hold. Returns the number of groups (group[] normalized). */
int evt_part_greedy(const evt_pgraph *g, int *group);

/* ---- solve.c + block.c + reach.c + dp.c + ilp.c + cache.c: the exact solver ---------------------------- */
typedef struct evt_part_options {
  int use_ilp;            /* 0: greedy only */
  double time_limit;      /* seconds for the whole search (decomposition, every DP and MIP); past it the
                           * blocks not solved yet keep the greedy grouping (a warning says so) */
  int decompose;          /* 0: one MIP for the whole graph (tests) */
  int use_cache;          /* in-memory + disk cache of component solutions */
  const char *cache_dir;  /* NULL: $EVT_CACHE_DIR, $XDG_CACHE_HOME/evt, ~/.cache/evt; "" = memory only */
  int use_dp;             /* 1: try the exact down-set DP (dp.c) before the MIP; 0: MIP only (tests) */
  long dp_max_sets;       /* DP cap on down-sets per block (0: EVT_DP_MAX_SETS); over it, the MIP */
  int mip_max_nodes;      /* largest block given to the MIP (0: EVT_MIP_MAX_NODES); a larger one keeps the greedy
                           * grouping unless the lower bound proves it optimal */
  long mip_bb_nodes;      /* branch-and-bound nodes one block's MIP may use (0: EVT_MIP_BB_NODES; < 0: no budget):
                           * the deterministic stop, so a plan does not depend on the machine's speed */
  int quiet;              /* 1: no warnings on stderr (they are still in evt_part_stats.warning) */
} evt_part_options;
evt_part_options evt_part_options_default(void);
#define EVT_MIP_MAX_NODES 2000
#define EVT_MIP_BB_NODES 300L
#define EVT_MIP_MAX_PAIRS 200000   /* co-consumer pairs (s columns) of one MIP; over it, as over the node cap */

typedef struct evt_part_stats {
  int dps;                /* blocks solved exactly by the down-set DP (dp.c) */
  long dp_most_sets;      /* the most down-sets of one DP block */
  int components, mips, trivial, cache_hits, disk_hits, merges, lazy_rows, timeouts;
  int bounds;             /* blocks whose greedy grouping meets the lower bound (proven without a solver) */
  int too_large;          /* blocks over the MIP's caps that kept the greedy grouping, unproven */
  int largest_too_large;  /* nodes of the largest of them */
  int late;               /* blocks reached after the time limit (greedy grouping; counted in timeouts too) */
  int mip_failures;       /* blocks where CBC failed (greedy or best legal grouping kept) */
  int node_limited;       /* blocks whose MIP used its node budget unproven (best grouping found kept) */
  long bb_nodes;          /* branch-and-bound nodes of every MIP */
  int proven;             /* 1 if every component is proven optimal */
  double max_gap;         /* largest relative gap of a component that timed out */
  double solve_seconds;
  int largest_component;
  size_t scratch_peak;    /* bytes of the largest reachability table built (no table is n x n) */
  char warning[512];      /* what went to stderr (empty: nothing) */
} evt_part_stats;

/* Solves g; fills group[] (normalized, sources -1). Never returns an invalid grouping: on any solver
 * trouble the component falls back to the greedy grouping. */
evt_status evt_part_solve(evt_pgraph *g, const evt_part_options *opt, int *group, evt_part_stats *stats);

/* A component (or a union of components) as a self-contained MIP: local ids 0..n-1. */
typedef struct evt_pblock {
  int n;
  int *gid;                 /* local -> global id */
  int nvar;                 /* variable edges (free or fuse) with both ends inside */
  int (*var)[2];
  unsigned char *var_fuse;  /* 1: x fixed to 0 */
  double *var_bytes;
  int nfix;                 /* fixed arcs pi[v] >= pi[u] + 1 (cut edges inside, paths leaving the block) */
  int (*fix)[2];
  int nrel;                 /* related incompatible pairs (path a -> b): pi[b] >= pi[a] + 1 */
  int (*rel)[2];
  int nunrel;               /* unrelated incompatible pairs: separated lazily */
  int (*unrel)[2];
  int nfam;                 /* read families: the consumers inside of one producer's tensor */
  int *fam_start, *fam_len; /* members fam_start[f] .. +fam_len[f], consumers in ascending local id */
  int *fam_cons;            /* member's local consumer */
  int *fam_var;             /* member's variable edge (the producer is inside), or -1: always a read */
  double *fam_bytes;
  unsigned char *written;   /* forced write (graph output or an out-edge cut for sure) */
  unsigned char *has_var_out;
  double *bytes;
  int *kin;                 /* kernel in-degree (part of the label) */
  int *fixed_in;            /* in-edges cut for sure (part of the label) */
  uint64_t *label;
  double lambda;
} evt_pblock;
void evt_pblock_free(evt_pblock *b);

typedef struct evt_ilp_result {
  int optimal;              /* proven optimal */
  int failed;               /* CBC failed (abandoned, non-finite values, a solution breaking a row) */
  int timeout;              /* stopped by the time limit (what it kept depends on the machine's speed) */
  int node_limited;         /* stopped by the node budget (deterministic) */
  long bb_nodes;            /* branch-and-bound nodes used over the block's rounds */
  double gap;               /* relative */
  int lazy_rows;
  double objective;         /* block cost (variable part + block constants) */
} evt_ilp_result;
/* Solves block b exactly (CBC); start[] (local group ids, a legal grouping) is the MIP start and the
 * fallback. On return sol[] holds local group ids of the best legal grouping found. */
void evt_ilp_solve_block(const evt_pgraph *g, const evt_pblock *b, const int *start, double time_limit,
                         long node_limit, int *sol, evt_ilp_result *res);
/* The block's cost of a local grouping (the MIP objective): its writes, the reads by its groups, and
 * lambda per group. The costs of all blocks add up to the graph's cost. */
double evt_pblock_cost(const evt_pblock *b, const int *sol);
/* Checks a local grouping against the block's constraints (acyclic with fixed arcs, pairs, fuse edges). */
bool evt_pblock_legal(const evt_pblock *b, const int *sol);

/* ---- block.c, reach.c: blocks of the decomposition --------------------------------------------------- */
/* The decomposition's working state; per-node and per-edge scratch is -1 / 0 between uses. */
typedef struct evt_part_work {
  evt_pgraph *g;
  unsigned char *forced;  /* per edge: cut in every legal grouping (CUT status or a barrier on a path) */
  int *loc;               /* per node: local id in the block being built, else -1 */
  int *edge_var;          /* per edge: variable index in the block being built, else -1 */
  int *mark, *row;        /* per node: scratch of evt_part_block_reach (0 / -1) */
  size_t scratch_peak;    /* bytes of the largest table built */
  /* evt_part_exit_reach: per node, its index among its block's entries (nodes with an in-edge from a kernel
   * node outside the block), or -1; for an exit (a node with an out-edge leaving the block), the word offset in
   * exit_bits of the entries its outside successors reach (one bit per entry of its block), or -1; and whether
   * these facts describe the node's current block */
  int *entry_ix;
  long *exit_off;
  uint64_t *exit_bits;
  unsigned char *exits_known;
} evt_part_work;
/* Marks forced[] for every FREE/FUSE edge with a barrier on a path between its ends. false if the deadline
 * passed first (forced[] then holds a subset). */
bool evt_part_forced_cuts(evt_part_work *w, const unsigned char *barrier, double deadline);
/* For the block's nodes (global ids ascending, w->loc set): desc row i (k bits, k = n) = the block nodes
 * reachable from local i; ext row i = those reachable by a path that leaves the block. */
void evt_part_block_reach(evt_part_work *w, const int *nodes, int n, uint64_t *desc, uint64_t *ext);
/* For the blocks r with want[r] (nodes list[at[r] .. at[r] + len[r]), ascending): the entries each exit's
 * outside successors reach, by one sweep per chunk of entries over the whole graph (instead of one search per
 * block: blocks that span a forward layer and its backward would each search most of the graph). Sets
 * exits_known for them; false if the deadline passed first. */
/* evt_part_block_reach for a block whose exits_known is set (the block of evt_part_exit_reach, unchanged). */
void evt_part_block_reach_exits(evt_part_work *w, const int *nodes, int n, uint64_t *desc, uint64_t *ext);
bool evt_part_exit_reach(evt_part_work *w, const int *at, const int *len, const int *list, const unsigned char *want,
                         double deadline);
/* The block of the given global nodes (ascending). Without `pairs`: no arcs for paths that leave the block
 * and no incompatible pairs (enough to cost a grouping and bound the optimum, not to solve). */
void evt_part_block_build(evt_part_work *w, const int *nodes, int n, bool pairs, evt_pblock *b);
/* A lower bound on the block's cost over every legal grouping; `nuclei`: nuclei in the block. */
double evt_pblock_lower_bound(const evt_pblock *b, int nuclei);

/* ---- dp.c: exact DP over down-sets ---------------------------------------------------------------------- */
/* Solves block b exactly (n <= 64) when it has at most max_sets down-sets and the group enumeration takes
 * at most max_work steps: returns 1 with sol[] (local group ids: each group's smallest member) and the
 * optimal block cost in *objective; 0 when over a cap (the caller uses the MIP). *nsets: down-sets seen. */
int evt_dp_solve_block(const evt_pblock *b, long max_sets, long max_work, int *sol, double *objective, long *nsets);
#define EVT_DP_MAX_SETS 200000
#define EVT_DP_MAX_WORK 4000000L

/* ---- cache.c ------------------------------------------------------------------------------------------ */
typedef struct evt_part_cache evt_part_cache;
/* dir NULL or "" (or a folder util/cachedir.h refuses, checked `levels` folders up): memory only */
evt_part_cache *evt_part_cache_new(const char *dir, int levels);
void evt_part_cache_free(evt_part_cache *c);
/* Canonical form of a block: order[] (canonical position -> local id) and a malloc'd key string. */
char *evt_pblock_canonical(const evt_pblock *b, int *order);
/* Looks the block up; on a hit writes the stored solution mapped to local ids into sol[] and returns
 * 1 (memory) or 2 (disk). A disk entry is used only when its checksum holds and the cost model gives its
 * grouping the cost it was stored with. */
int evt_part_cache_get(evt_part_cache *c, const evt_pblock *b, int *sol, int *optimal);
void evt_part_cache_put(evt_part_cache *c, const evt_pblock *b, const int *sol, int optimal);
const char *evt_part_cache_default_dir(char *buf, size_t n);

/* ---- adapter.c ---------------------------------------------------------------------------------------- */
/* The pgraph of an evt_graph: one pnode per evt node (same ids). Views and permutes of sources and
 * constants become sources; rand is a free source (generated in-kernel, 0 bytes). */
evt_pgraph *evt_part_from_graph(const evt_graph *eg, double lambda);

/* ---- plan.c ------------------------------------------------------------------------------------------- */
typedef struct evt_part_plan {
  int ngroups;
  int *group;        /* per evt node; -1 for sources */
  int *nucleus;      /* per group: node id or -1 */
  evt_part_cost cost;
  evt_part_stats stats;
} evt_part_plan;
evt_status evt_part_plan_build(evt_graph *eg, const evt_part_options *opt, double lambda, evt_part_plan *plan);
/* The same with a pair-compatibility hook other than the default shape-class rule (e.g. the code
 * generator's evt_lower_compat). */
evt_status evt_part_plan_build_compat(evt_graph *eg, const evt_part_options *opt, double lambda,
                                      evt_part_compat_fn compat, evt_part_plan *plan);
/* The same with the kernel nodes v with isolate[v] == EVT_PART_ISOLATE_ALONE in groups of their own (every in-
 * and out-edge cut; views and operand permutes are not isolated), and those with EVT_PART_ISOLATE_CLASS in groups
 * shared only with each other (and views of them). isolate NULL: as _compat. */
#define EVT_PART_ISOLATE_ALONE 1
#define EVT_PART_ISOLATE_CLASS 2
evt_status evt_part_plan_build_isolated(evt_graph *eg, const evt_part_options *opt, double lambda,
                                        evt_part_compat_fn compat, const unsigned char *isolate, evt_part_plan *plan);
void evt_part_plan_free(evt_part_plan *plan);
/* Text listing of the groups (nucleus, members, boundary tensors). */
void evt_part_plan_print(const evt_graph *eg, const evt_part_plan *plan, FILE *out);
void evt_part_plan_dot(const evt_graph *eg, const evt_part_plan *plan, FILE *out);

/* ---- exec.c ------------------------------------------------------------------------------------------- */
/* Runs eg group by group on the interpreter (sources first); values[] as for evt_interp_run. Only tensors
 * crossing group boundaries (and outputs) stay alive between groups. peak_live (optional): the largest
 * number of tensors alive at a group boundary. */
evt_status evt_part_exec(evt_graph *eg, const evt_part_plan *plan, evt_tensor *values, unsigned flags, int *peak_live);

#endif
