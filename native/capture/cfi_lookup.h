/* A module's compact CFI table and the per-frame lookup (cfi_lookup.c):
 * the part of the CFI code a walk runs, kept apart from the parser so it can
 * run where allocation and locks are not allowed (a signal handler). */
#ifndef BTC_CFI_LOOKUP_H
#define BTC_CFI_LOOKUP_H

#include "common/base.h"

typedef struct btc_table {
    btc_cfi_row *rows;     /* sorted by pc; gaps between FDEs are BTC_CFA_NONE rows */
    uint32_t nrows;
    uint32_t page_shift;   /* page index granularity */
    uint32_t pc_lo;        /* first row's pc */
    uint32_t npages;
    uint32_t *page_first;  /* page k: index of the row covering pc_lo + (k << page_shift) */
    uint32_t *fde_ranges;  /* [lo0, hi0, lo1, hi1, ...]: the FDEs the rows came from, sorted */
    uint32_t nfdes;
} btc_table;

/* The row covering pc (relative to bias), or NULL if no FDE covers it. */
const btc_cfi_row *btc_table_lookup(const btc_table *t, uint32_t rel_pc);
/* [lo, hi) of the FDE covering rel_pc (relative to bias); false if none.
 * Rows with equal rules merge across FDEs: this keeps the functions apart
 * (evalloop.c uses it to find a stripped eval loop's unnamed parts). */
bool btc_table_fde(const btc_table *t, uint32_t rel_pc, uint32_t *lo, uint32_t *hi);

#endif
