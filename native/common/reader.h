/* A bounded byte reader over a buffer already in memory.
 *
 * Every read checks the bytes left; a read past the end sets `bad`, moves
 * to the end and returns 0, so a parser reads a group of fields and tests
 * `bad` once.  Used by the .eh_frame parser (capture/cfi_build.c) and the
 * DWARF engine (symbols/dwarf*.c): one reader, one LEB128 rule.
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

/* [p, end), a span the caller already checked to be readable. */
static inline reader reader_over(const uint8_t *p, const uint8_t *end)
{
    return (reader){p, end, p > end};
}

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
static inline uint16_t read_u16(reader *r) { return (uint16_t)read_uint(r, 2); }
static inline uint32_t read_u32(reader *r) { return (uint32_t)read_uint(r, 4); }
static inline uint64_t read_u64(reader *r) { return read_uint(r, 8); }

/* LEB128 values wider than 64 bits are garbage, not big numbers: beyond
 * bit 63 only padding (0, or 0x7f for a negative signed value) is accepted;
 * anything else marks the reader bad. */
static inline uint64_t read_leb(reader *r, bool is_signed)
{
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t byte;
    do {
        if (!take(r, 1))
            return 0;
        byte = *r->p++;
        if (shift >= 64) {
            if ((byte & 0x7f) != (is_signed && (int64_t)v < 0 ? 0x7f : 0)) {
                r->bad = true;
                return 0;
            }
        } else {
            v |= (uint64_t)(byte & 0x7f) << shift;
        }
        shift += 7;
    } while (byte & 0x80);
    if (is_signed && shift < 64 && (byte & 0x40))
        v |= ~(uint64_t)0 << shift;
    return v;
}

static inline uint64_t read_uleb(reader *r) { return read_leb(r, false); }
static inline int64_t read_sleb(reader *r) { return (int64_t)read_leb(r, true); }

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

#endif
