/* The IR: ops, attributes, types, nodes and graphs - the data structures every stage shares - and the
 * prototypes of src/ir/, grouped by file. Public API: include/evt.h; the pipeline: docs/architecture.md. */
#ifndef EVT_IR_H
#define EVT_IR_H

#include "evt.h"
#include "util/util.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ops and attributes (generated from src/ir/ops.def and src/ir/attrs.def) ------------------------ */
typedef enum evt_op {
#define X(U, name, mn, mx, cls, attrs, flags) EVT_OP_##U,
#include "ir/ops.def"
#undef X
  EVT_OP_COUNT
} evt_op;

typedef enum evt_op_class {
  EVT_CLASS_SOURCE, EVT_CLASS_ELEMENTWISE, EVT_CLASS_REDUCTION, EVT_CLASS_GEMM, EVT_CLASS_SPARSE,
  EVT_CLASS_CONV, EVT_CLASS_POOL, EVT_CLASS_ROW, EVT_CLASS_RNG, EVT_CLASS_LOSS, EVT_CLASS_GATHER,
  EVT_CLASS_LAYOUT, EVT_CLASS_ATTENTION, EVT_CLASS_COUNT
} evt_op_class;

typedef enum evt_attr_id {
#define X(U, l, kind, def) EVT_ATTR_##U,
#include "ir/attrs.def"
#undef X
  EVT_ATTR_COUNT
} evt_attr_id;

typedef enum evt_attr_kind { EVT_AK_INT, EVT_AK_FLOAT, EVT_AK_LIST, EVT_AK_ENUM } evt_attr_kind;

typedef enum evt_reduction { EVT_REDUCTION_NONE, EVT_REDUCTION_MEAN, EVT_REDUCTION_SUM, EVT_REDUCTION_COUNT } evt_reduction;
typedef enum evt_approximate { EVT_APPROXIMATE_NONE, EVT_APPROXIMATE_TANH, EVT_APPROXIMATE_COUNT } evt_approximate;
/* conv/pool activation layout: nchw ([N,C,H,W], weight [O,C/g,kh,kw]) or nhwc ([N,H,W,C], weight [O,kh,kw,C/g]) */
typedef enum evt_layout { EVT_LAYOUT_NCHW, EVT_LAYOUT_NHWC, EVT_LAYOUT_COUNT } evt_layout;
typedef enum evt_init {
  EVT_INIT_NORMAL,   /* N(0, std) */
  EVT_INIT_UNIFORM,  /* U[lo, hi) */
  EVT_INIT_RANDINT,  /* integers in [lo, hi) */
  EVT_INIT_ZEROS,
  EVT_INIT_ONES,
  EVT_INIT_ROWPTR,   /* CSR row pointer of a regular graph: rowptr[i] = i * lo (lo = nonzeros per row) */
  EVT_INIT_COUNT
} evt_init;

typedef struct evt_ilist {
  int n;
  int64_t v[EVT_MAX_RANK];
} evt_ilist;

#define EVT_LIST2(a, b) {2, {a, b}}
/* All attributes of a node, as named fields; an op uses the subset ops.def lists. */
typedef struct evt_attrs {
#define EVT_FIELD_INT int64_t
#define EVT_FIELD_FLOAT double
#define EVT_FIELD_LIST evt_ilist
#define EVT_FIELD_ENUM_REDUCTION int64_t
#define EVT_FIELD_ENUM_APPROXIMATE int64_t
#define EVT_FIELD_ENUM_LAYOUT int64_t
#define EVT_FIELD_ENUM_DTYPE int64_t
#define EVT_FIELD_ENUM_INIT int64_t
#define X(U, l, kind, def) EVT_FIELD_##kind l;
#include "ir/attrs.def"
#undef X
} evt_attrs;

typedef struct evt_op_info {
  const char *name;
  int min_inputs, max_inputs;
  evt_op_class cls;
  uint64_t attrs;   /* mask of 1 << evt_attr_id */
  unsigned flags;   /* EVT_OPF_* */
} evt_op_info;
#define EVT_OPF_DIFF 1u
#define EVT_OPF_COMM 2u
#define EVT_OPF_TYPED 4u

typedef struct evt_attr_info {
  const char *name;
  evt_attr_kind kind;
  const char *const *enum_names;  /* EVT_AK_ENUM: names indexed by value */
  int enum_count;
  size_t offset;                  /* offsetof(evt_attrs, field) */
} evt_attr_info;

extern const evt_op_info evt_op_table[EVT_OP_COUNT];
extern const evt_attr_info evt_attr_table[EVT_ATTR_COUNT];
extern const evt_attrs evt_attrs_default;
extern const char *const evt_op_class_names[EVT_CLASS_COUNT];

/* ---- nodes and graphs ------------------------------------------------------------------------------ */
typedef struct evt_type {
  evt_dtype dtype;
  int rank;
  int64_t shape[EVT_MAX_RANK];
  int64_t stride[EVT_MAX_RANK];  /* in elements; contiguous row-major unless a frontend says otherwise */
} evt_type;

/* Where a node came from, for messages: text position, or a frontend's name (e.g. the PyTorch node). */
typedef struct evt_origin {
  const char *file;   /* NULL: built by API */
  int line, col;      /* 1-based; 0 if unknown */
  const char *label;  /* e.g. "aten.mm.default (mm_3)"; may be NULL */
} evt_origin;

#define EVT_NODE_OUTPUT 1u
#define EVT_NODE_LOSS 2u

typedef struct evt_node {
  evt_op op;
  evt_type type;
  int ninputs;
  int inputs[EVT_MAX_INPUTS];
  evt_attrs attr;
  uint64_t attr_given;   /* attributes set explicitly (the printer shows these and required ones) */
  const char *name;      /* unique within the graph, without the '%'; arena-owned */
  evt_origin origin;
  unsigned flags;
} evt_node;

typedef struct evt_arena_block evt_arena_block;
typedef struct evt_arena {
  evt_arena_block *head;
} evt_arena;

struct evt_graph {
  evt_arena arena;
  char *name;
  evt_node *nodes;
  int nnodes, cap;
  int *outputs;          /* node ids, in order; the loss (if any) first */
  int noutputs, outcap;
  int loss;              /* node id or -1 */
  int name_counter;      /* for fresh names */
  uint64_t rng_step;     /* the RNG step the interpreter draws rand / dropout with (kernels/philox.h) */
  /* name → id cache for evt_graph_find (src/ir/graph.c). Every name a node gets through graph.c is
   * entered; hits are re-checked against the node, so passes may swap names or renumber freely. */
  struct {
    const char **names;  /* arena-owned strings; NULL = empty slot */
    int *ids;
    int cap, count;
    int indexed;         /* nodes entered since the last rebuild; < nnodes means rebuild */
  } name_index;
  /* users of each node, for evt_graph_replace_uses (src/passes/rewrite.c): linked entries per used node,
   * built on first use and extended over nodes added since (`indexed`). Entries may be stale or repeated
   * (readers re-check the user's inputs); a missing one would be a bug, so code that points an existing
   * node's input elsewhere calls evt_graph_note_use, and code that restores or renumbers nodes, or changes
   * the outputs other than through evt_graph_replace_uses, drops it. */
  struct {
    int *head;           /* per node: first entry or -1 */
    int *outpos;         /* per node: its position in outputs, or -1 */
    int *next, *user;    /* per entry */
    int nent, capent, capnodes;
    int indexed;         /* nodes whose inputs are entered; 0 with head == NULL: not built */
  } use_index;
  char error[1024];
};

/* ---- src/ir/arena.c -------------------------------------------------------------------------------- */
void *evt_arena_alloc(evt_arena *a, size_t size);   /* zeroed, 16-byte aligned */
char *evt_arena_strdup(evt_arena *a, const char *s);
void evt_arena_free(evt_arena *a);

/* ---- src/ir/tables.c ------------------------------------------------------------------------------- */
const char *evt_dtype_name(evt_dtype dt);
int evt_dtype_from_name(const char *name, size_t len);       /* -1 if unknown */
size_t evt_dtype_size(evt_dtype dt);
bool evt_dtype_is_float(evt_dtype dt);       /* f32, f16, bf16 and the fp8 formats */
bool evt_dtype_is_fp8(evt_dtype dt);         /* f8e4m3, f8e5m2 */
int evt_op_from_name(const char *name, size_t len);          /* -1 if unknown */
int evt_attr_from_name(const char *name, size_t len);        /* -1 if unknown */
static inline const evt_op_info *evt_op_get(evt_op op) { return &evt_op_table[op]; }
/* Rounds a value to what a tensor of dtype dt stores (RNE for f32/f16/bf16; fp8: RNE of the f32 value, saturating
 * to +-max, NaN kept; ints: truncation toward zero as a C cast does, a non-finite value 0, i32 wrapped modulo 2^32 as two's complement (PyTorch's int32 arithmetic;
 * beyond int64: 0); 0/1 for bool). */
double evt_round_to_dtype(double v, evt_dtype dt);
/* Integer values are held in doubles (evt_tensor, attributes): exact within +-EVT_INT_EXACT_MAX = 2^53 - 1. The
 * interpreter and constant folding report, never round, an integer beyond it. */
#define EVT_INT_EXACT_MAX 9007199254740991.0
float evt_round_bf16(float v);
float evt_round_f16(float v);

/* ---- src/ir/fp8.c ---------------------------------------------------------------------------------- */
/* FP8 (dt: EVT_F8E4M3 or EVT_F8E5M2) codes from f32: round to nearest even, saturating to +-max (infinities
 * too), NaN to S.1111111 keeping its sign; and back to f32, exactly. evt_round_fp8 is the two in a row. */
uint8_t evt_fp8_from_f32(float x, evt_dtype dt);
float evt_fp8_to_f32(uint8_t code, evt_dtype dt);
float evt_round_fp8(float x, evt_dtype dt);

/* ---- src/ir/graph.c -------------------------------------------------------------------------------- */
/* Error message at a node: "file:line:col: node %name (op): <fmt>" into g->error; returns `st`. */
evt_status evt_graph_errorf(evt_graph *g, int node, evt_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
evt_status evt_graph_errorf_at(evt_graph *g, evt_origin origin, evt_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Adds a node. `attrs` may be NULL (defaults); `given` marks which attrs were set explicitly. For F_TYPED
 * ops the type comes from attrs shape/dtype. If `declared` is non-NULL the inferred type must equal it.
 * Runs evt_infer_node; on error returns -1 with the message set and the node not added. */
int evt_graph_add_node(evt_graph *g, evt_op op, const int *inputs, int ninputs, const evt_attrs *attrs,
                       uint64_t given, const evt_type *declared, const char *name, evt_origin origin);
/* A name not used yet in g, like "<base>.<n>" (arena-owned). */
const char *evt_graph_fresh_name(evt_graph *g, const char *base);
int evt_graph_find(const evt_graph *g, const char *name);   /* node id or -1 */
/* The use index (struct evt_graph): brings it up to date over every node (building it the first time);
 * records that `user` now reads `used` (a no-op while no index is built); drops it. */
void evt_graph_sync_uses(evt_graph *g);
void evt_graph_note_use(evt_graph *g, int user, int used);
void evt_graph_drop_uses(evt_graph *g);
void evt_type_set_contiguous(evt_type *t);
int64_t evt_type_numel(const evt_type *t);
bool evt_type_equal(const evt_type *a, const evt_type *b);   /* dtype, rank, shape (not strides) */
/* Writes e.g. "f32[32,64]" into buf. */
const char *evt_type_str(const evt_type *t, char *buf, size_t n);

/* The joint graph's gradients (evt_graph_build_joint names them %grad.<param>). grad_of has one slot per node: for a param, the id of its
 * output %grad.<name> (else -1). Returns the number of params that have one. */
int evt_graph_grad_outputs(const evt_graph *g, int *grad_of);
/* The params that get a gradient: the floating-point ones (an integer or bool param gets none, as in PyTorch). */
int evt_graph_float_param_count(const evt_graph *g);

/* (graph.c adds a node by inferring its type; infer.c reports errors on the graph: they call each other.) */
/* ---- src/ir/infer.c -------------------------------------------------------------------------------- */
/* Checks the node's inputs and attributes (the verifier rule of its op) and sets n->type. Messages go
 * through evt_graph_errorf and name the node. Called by evt_graph_add_node and evt_graph_verify. */
evt_status evt_infer_node(evt_graph *g, evt_node *n, int id);
/* Numpy broadcast of two shapes; false if incompatible. */
bool evt_broadcast_shapes(const evt_type *a, const evt_type *b, evt_type *out);

/* ---- src/ir/verify.c ------------------------------------------------------------------------------ */
/* (public: evt_graph_verify — re-infers every node, checks order, names, outputs and the loss) */

/* ---- src/ir/parse.c, src/ir/print.c ------------------------------------------------------------------ */
/* (public: evt_parse, evt_parse_file, evt_graph_print, evt_graph_to_string) */
/* One node in canonical form, `%name: TYPE = op(%a, attr=value)`, without indent or newline. */
void evt_print_node(const evt_graph *g, int id, FILE *out);

#endif
