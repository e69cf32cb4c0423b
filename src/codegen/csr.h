/* The CSR of A^T from the CSR of A, for spmm_t as a row kernel (rspec.h, nucleus spmm with has_perm).
 *
 * spmm_t(A, dy) = A^T dy: row c of the result gathers every entry of A in column c. The structure of A^T depends
 * only on A's rowptr / col (a stable counting sort by column); the values are not copied but read through perm, so
 * the kernel stays right when val changes between steps. This is the CPU model's (evt_lower_rows_reference) and the
 * checks' definition; on the GPU the kernel library builds the same arrays from the device's rowptr / col at every
 * run (evt_fb_csr_transpose, kernels/evt_fallback.h), bit for bit.
 * Within a column the entries keep A's order (row by row, then position in the row: duplicates too), the order the
 * interpreter adds them in, and the kernel adds them in that fixed order: no atomics, bit-identical run to run.
 */
#ifndef EVT_CODEGEN_CSR_H
#define EVT_CODEGEN_CSR_H

#include <stdint.h>

#include "ir/ir.h"

/* A^T's CSR for A [m, k] given by rowptr[m+1] / col[nnz] (the interpreter's rule: rowptr in [0, nnz], never
 * decreasing; A's entries are positions rowptr[0] .. rowptr[m] - 1, e of them): colptr[k+1] (colptr[0] = 0,
 * colptr[k] = e), rowidx[e] (the row of A of each entry) and perm[e] (its position in A's arrays:
 * val_T[q] = val[perm[q]]). EVT_ERR_INVALID, with the offending position in why, for a bad rowptr or a
 * referenced column outside [0, k). */
evt_status evt_csr_transpose(int64_t m, int64_t k, int64_t nnz, const int64_t *rowptr, const int64_t *col, int64_t *colptr,
                             int64_t *rowidx, int64_t *perm, char *why, size_t whylen);

#endif
