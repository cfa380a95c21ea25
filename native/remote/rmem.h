/* Another process's memory (rmem.c): read through process_vm_readv (or
 * /proc/PID/mem), or from a core file's segments, with a bounded cache of
 * 16 KiB chunks.  What was read while the target was stopped stays as it
 * was: the cache is the dump's snapshot of the target. */
#ifndef BTC_RMEM_H
#define BTC_RMEM_H

#include "common/base.h"

/* btc_rmem and its API: btcore_api.h ("another process"). */

/* n ranges [addr[i], addr[i] + size[i]) into dest[i], in batches of one
 * syscall where the process allows it (not cached: each is read once);
 * ok[i] says whether range i was read whole. */
void btc_rmem_read_many(btc_rmem *m, const uintptr_t *addr, const size_t *size, uint8_t *const *dest, int n,
                        uint8_t *ok);
/* Fill the cache's chunks under the n addresses (0s are skipped) in
 * batches of one syscall; later reads there are cache hits. */
void btc_rmem_prefetch(btc_rmem *m, const uintptr_t *addr, int n);
/* One aligned word, through the cache; false if unreadable. */
bool btc_rmem_word(btc_rmem *m, uintptr_t addr, uintptr_t *out);

#endif
