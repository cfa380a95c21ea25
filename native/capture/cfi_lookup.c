/* The per-frame CFI lookup: pc -> row of a built table (cfi_build.c).
 *
 * Runs for every frame of every capture, and must be able to run inside a
 * signal handler: no allocation, no lock, no call out of this unit; reads
 * only the table, which stays valid while the module lock is held.
 */
#include "capture/cfi_lookup.h"
#include "common/search.h"

const btc_cfi_row *btc_table_lookup(const btc_table *t, uint32_t rel_pc)
{
    /* Below pc_lo the subtraction wraps to a page past the end. */
    uint32_t page = (rel_pc - t->pc_lo) >> t->page_shift;
    if (page >= t->npages)
        return NULL;   /* past the last row, which ends the last FDE */
    uint32_t lo = t->page_first[page], hi = t->page_first[page + 1];
    const btc_cfi_row *rows = t->rows;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (rows[mid].pc <= rel_pc)
            lo = mid;
        else
            hi = mid - 1;
    }
    return rows[lo].cfa_kind == BTC_CFA_NONE ? NULL : &rows[lo];
}

bool btc_table_fde(const btc_table *t, uint32_t rel_pc, uint32_t *lo, uint32_t *hi)
{
    /* The last FDE starting at or below rel_pc. */
    size_t a = BTC_PARTITION_POINT(t->nfdes, i, t->fde_ranges[2 * i] <= rel_pc);
    if (a == 0 || rel_pc >= t->fde_ranges[2 * (a - 1) + 1])
        return false;
    *lo = t->fde_ranges[2 * (a - 1)];
    *hi = t->fde_ranges[2 * (a - 1) + 1];
    return true;
}
