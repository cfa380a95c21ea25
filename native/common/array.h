/* Growable arrays: doubling capacity, bounded by the caller (by its input
 * size or an explicit limit).  grow() leaves the array as it was when memory
 * runs out. */
#ifndef BTC_ARRAY_H
#define BTC_ARRAY_H

#include <stdlib.h>

#include "common/base.h"

static inline bool grow(void **items, size_t *cap, size_t need, size_t item_size)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*items, n * item_size);
    if (!p)
        return false;
    *items = p;
    *cap = n;
    return true;
}

#define PUSH(arr, count, cap, value) \
    (grow((void **)&(arr), &(cap), (count) + 1, sizeof *(arr)) ? ((arr)[(count)++] = (value), true) : false)

#endif
