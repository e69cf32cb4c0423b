/* A^T's CSR by a stable counting sort over A's entries (contract in csr.h): count per column, prefix sums, then
 * place the entries in A's order, so each column lists its rows ascending (duplicates in A's order). O(nnz + k). */
#include <stdio.h>
#include <string.h>

#include "codegen/csr.h"

/* rowptr monotone within [0, nnz] and every referenced column in [0, k); else the first bad position in why. */
static bool csr_valid(int64_t m, int64_t k, int64_t nnz, const int64_t *rowptr, const int64_t *col, char *why,
                      size_t whylen) {
  if (rowptr[0] < 0 || rowptr[m] > nnz) {
    snprintf(why, whylen, "CSR rowptr spans [%lld, %lld), outside [0, %lld]", (long long)rowptr[0], (long long)rowptr[m],
             (long long)nnz);
    return false;
  }
  for (int64_t i = 0; i < m; i++)
    if (rowptr[i + 1] < rowptr[i]) {
      snprintf(why, whylen, "CSR rowptr is not monotone: rowptr[%lld] = %lld < %lld", (long long)(i + 1),
               (long long)rowptr[i + 1], (long long)rowptr[i]);
      return false;
    }
  for (int64_t q = rowptr[0]; q < rowptr[m]; q++)
    if (col[q] < 0 || col[q] >= k) {
      snprintf(why, whylen, "CSR column index col[%lld] = %lld outside [0, %lld)", (long long)q, (long long)col[q],
               (long long)k);
      return false;
    }
  return true;
}

evt_status evt_csr_transpose(int64_t m, int64_t k, int64_t nnz, const int64_t *rowptr, const int64_t *col, int64_t *colptr,
                             int64_t *rowidx, int64_t *perm, char *why, size_t whylen) {
  if (m < 0 || k < 0 || !csr_valid(m, k, nnz, rowptr, col, why, whylen)) return EVT_ERR_INVALID;
  memset(colptr, 0, sizeof *colptr * (size_t)(k + 1));
  for (int64_t q = rowptr[0]; q < rowptr[m]; q++) colptr[col[q] + 1]++;
  for (int64_t c = 0; c < k; c++) colptr[c + 1] += colptr[c];
  /* colptr[c] walks forward while column c fills, then is restored from its neighbour */
  for (int64_t i = 0; i < m; i++)
    for (int64_t q = rowptr[i]; q < rowptr[i + 1]; q++) {
      int64_t at = colptr[col[q]]++;
      rowidx[at] = i;
      perm[at] = q;
    }
  for (int64_t c = k; c > 0; c--) colptr[c] = colptr[c - 1];
  colptr[0] = 0;
  return EVT_OK;
}
