/* The GPU program's memory plan (src/runtime/gpu/memory.c), pure host code.
 *
 * Steps (the order a run enqueues): node by node, every node other than inputs and params in id order;
 * fused (EVT_PROGRAM_FUSED), the partition's sources in id order, then every group in group order: a
 * fused group is one step, a fallback group's members are one step each.
 * Memory (evt_program_layout, pure host code): inputs, params and graph outputs are the caller's memory
 * (EVT_SLOT_CALLER). Every other tensor a step writes gets bytes in ONE arena (EVT_SLOT_ARENA), 256-byte
 * aligned, live from the step that writes it to the last step that reads it; tensors whose lifetimes
 * intersect never share bytes (so a step's outputs never alias its inputs); placement is best
 * fit (evt_arena_place, below). Members of fused groups that no store writes take no memory (EVT_SLOT_NONE), except
 * a leaving reshape of a value its kernel stores (evt_exec_alias): it takes that value's slot (an arena one) or
 * points at its caller memory (follow_aliases in program.c), and reads of it count as reads of that value.
 */
#ifndef EVT_RUNTIME_GPU_MEMORY_H
#define EVT_RUNTIME_GPU_MEMORY_H

#include "ir/ir.h"
#include "runtime/gpu/exec_plan.h"

#define EVT_ARENA_ALIGN 256

/* Inputs and params: memory the caller binds. */
static inline bool evt_is_caller_source(const evt_node *n) { return n->op == EVT_OP_INPUT || n->op == EVT_OP_PARAM; }

typedef struct evt_prog_step {
  int node;   /* >= 0: this node through the library */
  int group;  /* node < 0: this fused group */
} evt_prog_step;

typedef enum evt_slot_kind { EVT_SLOT_NONE = 0, EVT_SLOT_ARENA, EVT_SLOT_CALLER } evt_slot_kind;

typedef struct evt_arena_slot {
  evt_slot_kind kind;
  int64_t offset;   /* EVT_SLOT_ARENA: bytes from the arena's start; else -1 */
  int64_t bytes;    /* aligned size (arena slots) */
  int first, last;  /* steps: written by `first`, last read by `last` (arena slots) */
} evt_arena_slot;

/* The steps of a run (above) into steps[] (room for g->nnodes entries); returns their count. xp NULL:
 * node by node. */
int evt_program_steps(const evt_graph *g, const evt_exec_plan *xp, evt_prog_step *steps);
/* The memory plan above: slots[] per node; *arena its size, *naive (optional) the bytes one buffer per
 * non-caller node would take. EVT_ERR_INTERNAL (message in err) if a step reads a tensor no earlier step
 * wrote. */
evt_status evt_program_layout(const evt_graph *g, const evt_exec_plan *xp, evt_arena_slot *slots, int64_t *arena,
                              int64_t *naive, char *err, size_t errlen);

/* Best-fit placement shared by the launch plan (src/compile/launch_plan.c) and the GPU program: item i with bytes[i] >= 0
 * (< 0: not placed, offset -1) lives over steps [first[i], last[i]]; gets an EVT_ARENA_ALIGN-aligned
 * offsets[i] (size rounded up, at least EVT_ARENA_ALIGN) so that items whose lifetimes intersect never
 * overlap. Returns the arena size. Pure host code. */
int64_t evt_arena_place(int n, const int64_t *bytes, const int *first, const int *last, int64_t *offsets);
#endif
