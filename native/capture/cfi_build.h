/* Building compact CFI tables: a module's .eh_frame parsed into sorted rows
 * (cfi_build.c).  Runs once per module, under the module lock. */
#ifndef BTC_CFI_BUILD_H
#define BTC_CFI_BUILD_H

#include "capture/cfi_lookup.h"

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

#endif
