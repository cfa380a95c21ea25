/* A bounded byte reader over a buffer already in memory, and growable
 * arrays whose capacity the caller bounds by its input size.
 *
 * Every read checks the bytes left; a read past the end sets `bad`, moves
 * to the end and returns 0, so a parser reads a group of fields and tests
 * `bad` once.  Used by the DWARF engine (symbols/dwarf*.c).
 */
#ifndef BTC_READER_H
#define BTC_READER_H

#include <stdlib.h>
#include <string.h>

#include "common/base.h"

/* A heap buffer (a section's contents, say), followed by one NUL byte (not
 * counted in size) so strings at its end are terminated. */
typedef struct {
    uint8_t *data;
    size_t size;
} btc_bytes;

/* ---- bounded reader ---- */

typedef struct {
    const uint8_t *p, *end;
    bool bad;   /* a read went past end; every later read returns 0 */
} reader;

static inline reader reader_at(const btc_bytes *b, uint64_t off, uint64_t size)
{
    reader r = {b->data, b->data, true};
    if (off <= b->size && size <= b->size - off)
        r = (reader){b->data + off, b->data + off + size, false};
    return r;
}

/* From off to the end of the section. */
static inline reader reader_from(const btc_bytes *b, uint64_t off)
{
    return reader_at(b, off, off < b->size ? b->size - off : 0);
}

static inline bool take(reader *r, uint64_t n)
{
    if (r->bad || n > (uint64_t)(r->end - r->p)) {
        r->bad = true;
        r->p = r->end;
        return false;
    }
    return true;
}

static inline uint64_t read_uint(reader *r, int n)
{
    if (!take(r, (uint64_t)n))
        return 0;
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | r->p[i];
    r->p += n;
    return v;
}

static inline uint8_t read_u8(reader *r) { return (uint8_t)read_uint(r, 1); }

static inline uint64_t read_uleb(reader *r)
{
    uint64_t v = 0;
    for (int shift = 0; take(r, 1); shift += 7) {
        uint8_t b = *r->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    return 0;
}

static inline int64_t read_sleb(reader *r)
{
    uint64_t v = 0;
    int shift = 0;
    while (take(r, 1)) {
        uint8_t b = *r->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            if (shift < 64 && (b & 0x40))
                v |= ~0ull << shift;
            return (int64_t)v;
        }
    }
    return 0;
}

static inline void skip(reader *r, uint64_t n)
{
    if (take(r, n))
        r->p += n;
}

static inline const char *read_cstr(reader *r)
{
    const uint8_t *nul = r->bad ? NULL : memchr(r->p, 0, (size_t)(r->end - r->p));
    if (!nul) {
        take(r, (uint64_t)(r->end - r->p) + 1);
        return NULL;
    }
    const char *s = (const char *)r->p;
    r->p = nul + 1;
    return s;
}

/* A nested reader over the next len bytes, which r then skips. */
static inline reader sub_reader(reader *r, uint64_t len)
{
    reader s = {r->p, r->p, true};
    if (take(r, len)) {
        s = (reader){r->p, r->p + len, false};
        r->p += len;
    }
    return s;
}

/* ---- growable arrays: capacity bounded by the caller's input size ---- */

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
