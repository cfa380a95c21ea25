/* Compact CFI tables: a module's .eh_frame parsed into sorted rows (cfi.c),
 * and the per-frame lookup the walker runs. */
#ifndef BTC_CFI_H
#define BTC_CFI_H

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

/* Where a module's unwind data is, as the loader mapped it. */
typedef struct btc_image {
    uintptr_t bias;                 /* load bias (dlpi_addr) */
    const uint8_t *eh_frame_hdr;    /* NULL if the module has none */
    const uint8_t *eh_frame;        /* NULL if unknown; found through eh_frame_hdr otherwise */
    size_t eh_frame_size;           /* 0 if unknown: the walk trusts the terminator */
    uintptr_t readable_lo[8], readable_hi[8];   /* PT_LOAD ranges (absolute) */
    int nreadable;
} btc_image;

/* Parse the module's .eh_frame into a table; NULL on failure (bad data is
 * skipped, never trusted: every read is bounded by the readable ranges). */
btc_table *btc_table_build(const btc_image *img);
void btc_table_free(btc_table *t);
/* The row covering pc (relative to bias), or NULL if no FDE covers it. */
const btc_cfi_row *btc_table_lookup(const btc_table *t, uint32_t rel_pc);
/* [lo, hi) of the FDE covering rel_pc (relative to bias); false if none.
 * Rows with equal rules merge across FDEs: this keeps the functions apart
 * (evalloop.c uses it to find a stripped eval loop's unnamed parts). */
bool btc_table_fde(const btc_table *t, uint32_t rel_pc, uint32_t *lo, uint32_t *hi);

#endif
