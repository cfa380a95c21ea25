/* Binary search over a sorted array, written once.
 *
 * BTC_PARTITION_POINT(n, i, before): the first index in [0, n) for which
 * the condition `before` (an expression of the index i) is false, n if none;
 * `before` must hold for a prefix of the indices and fail for the rest.
 * With `before` = "items[i].key <= x" that is one past the last item whose
 * key is <= x (upper bound); with "items[i].key < x" the first item whose
 * key is >= x (lower bound).  A macro, so hot callers (the per-frame module
 * lookup) keep an inlined loop with a direct comparison.
 */
#ifndef BTC_SEARCH_H
#define BTC_SEARCH_H

#include <stddef.h>

#define BTC_PARTITION_POINT(n, i, before)         \
    __extension__({                              \
        size_t lo_ = 0, hi_ = (size_t)(n);       \
        while (lo_ < hi_) {                      \
            size_t i = lo_ + (hi_ - lo_) / 2;    \
            if (before)                          \
                lo_ = i + 1;                     \
            else                                 \
                hi_ = i;                         \
        }                                        \
        lo_;                                     \
    })

#endif
