/* The token encoder: a Backtrace's raw records -> "btc4." + base64url of the
 * bit stream docs/design.md ("Compact tokens", format 4) specifies.
 * btcore/codec.py holds the reference encoder this one must equal bit for
 * bit (tests/test_codec.py, tests/fuzz_codec.py compare them).
 *
 * What costs time elsewhere is learnt once here: a module's table entry
 * (build-id prefix, path or not: decided in Python, which knows where a
 * decoder searches) is taught once per module through btc_encode_module()
 * and kept, keyed by the module's id (unique in the process across
 * dlopen/dlclose: a library loaded where another was has a new id); a
 * Python frame's name and file are read from its code object as the UTF-8
 * CPython caches in each string.
 *
 * Concurrency: everything runs with the GIL held (cffi keeps it for btcore's
 * entry points, see _build.py) and calls nothing that could hand it over,
 * so the learnt modules and the scratch buffer need no lock (and nothing to
 * reset after fork).  The module lock is held only while pcs are mapped to
 * modules, never while Python objects are read.
 */
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "capture/modules.h"
#include "common/base.h"

/* ---- bits, least significant first (design.md: "B is a bit stream") ---- */

#define MAX_BODY_BYTES (3 << 18)   /* 2^20 characters of base64: longer tokens are not written here */

typedef struct {
    uint8_t *bytes;   /* cap bytes, grown as needed */
    size_t cap;
    size_t len;       /* whole bytes written (counted only once growing failed) */
    uint64_t acc;     /* pending bits */
    unsigned nacc;
    bool failed;      /* out of memory, or past MAX_BODY_BYTES */
} bit_writer;

static bool grow(bit_writer *w)
{
    size_t cap = w->cap ? 2 * w->cap : 1024;
    uint8_t *bytes = cap <= MAX_BODY_BYTES + 8 ? realloc(w->bytes, cap) : NULL;
    if (!bytes)
        return false;
    w->bytes = bytes;
    w->cap = cap;
    return true;
}

static void flush_word(bit_writer *w)
{
    if (w->len + 8 > w->cap && !w->failed && !grow(w))
        w->failed = true;
    if (!w->failed) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint64_t le = w->acc;   /* the stream is least significant byte first */
#else
        uint64_t le = __builtin_bswap64(w->acc);
#endif
        memcpy(w->bytes + w->len, &le, 8);
    }
    w->len += 8;
    w->acc = 0;
    w->nacc = 0;
}

/* value's low width bits (width <= 64) */
static inline void put(bit_writer *w, uint64_t value, unsigned width)
{
    if (width < 64)
        value &= (UINT64_C(1) << width) - 1;
    unsigned had = w->nacc, total = had + width;
    w->acc |= value << had;   /* had < 64 */
    if (total < 64) {
        w->nacc = total;
        return;
    }
    flush_word(w);
    w->acc = had ? value >> (64 - had) : 0;
    w->nacc = total - 64;
}

static size_t bit_count(const bit_writer *w)
{
    return 8 * w->len + w->nacc;
}

static unsigned bit_length(uint64_t v)
{
    return v ? 64 - (unsigned)__builtin_clzll(v) : 0;
}

/* uint: a 4-bit width class, then that many bits */
static const unsigned WIDTHS[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 28, 32, 64};

/* The smallest class whose width holds a value of b bits, for b = 0..64. */
static const uint8_t CLASS_OF_BITS[65] = {
    0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12,
    13, 13, 13, 13, 14, 14, 14, 14,
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15};

static unsigned width_class(uint64_t v)
{
    return CLASS_OF_BITS[bit_length(v)];
}

static void put_uint(bit_writer *w, uint64_t v)
{
    unsigned c = width_class(v);
    put(w, c, 4);
    put(w, v, WIDTHS[c]);
}

/* ulen (native pcs and deltas): bits(4) c, the bit length L = base + c
 * (c = 15: L in the next 7 bits), then L's bits below its top bit. */
#define ADDRESS_BASE 10
#define DELTA_BASE 6
#define LENGTH_ESCAPE 15
#define LENGTH_ESCAPE_BITS 7

static unsigned length_bits(unsigned length, unsigned base)
{
    bool direct = length >= base && length - base < LENGTH_ESCAPE;
    return 4 + (direct ? 0 : LENGTH_ESCAPE_BITS) + (length ? length - 1 : 0);
}

static void put_ulen(bit_writer *w, uint64_t v, unsigned base)
{
    unsigned length = bit_length(v);
    if (length >= base && length - base < LENGTH_ESCAPE)
        put(w, length - base, 4);
    else
        put(w, LENGTH_ESCAPE | length << 4, 4 + LENGTH_ESCAPE_BITS);
    if (length > 1)
        put(w, v, length - 1);   /* put() keeps the low length - 1 bits: the top one is implied */
}

static void put_varint(bit_writer *w, uint64_t v)
{
    for (;;) {
        bool more = v > 15;
        put(w, (v & 15) | (uint64_t)more << 4, 5);
        v >>= 4;
        if (!more)
            return;
    }
}

/* Strings (format 4): codec.py's static canonical Huffman code over the
 * 256 byte values, STRING_END and the WORDS, a string cut greedily into
 * words (the longest that starts here) and bytes.  The same numbers as
 * codec.py's CODE_LENGTHS (tests/test_codec.py writes every byte value a
 * Python string can hold, and every word, through both encoders). */
#define STRING_END 256
#define NWORDS 10
#define NSYMBOLS (STRING_END + 1 + NWORDS)
#define MAX_CODE_LENGTH 21
static const char *const WORDS[NWORDS] = {"<locals>", "<lambda>", "<module>", "<listcomp>", "<genexpr>", "__init__",
                                          ".py", "site-packages/", "/lib/python3.", "dist-packages/"};
static const uint8_t CODE_LENGTHS[NSYMBOLS] = {
    21, 21, 21, 21, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 20, 12, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 17, 20, 10, 6, 4,
    12, 7, 9, 9, 11, 14, 10, 12, 11, 16, 20, 20, 12, 20, 12, 20, 20, 9, 9, 8, 9, 9, 9, 11, 10, 9,
    14, 13, 9, 9, 10, 10, 8, 13, 9, 8, 8, 10, 11, 10, 15, 16, 13, 20, 20, 20, 20, 5, 20, 4, 7, 5,
    6, 4, 7, 6, 6, 4, 8, 7, 5, 6, 5, 4, 5, 10, 4, 4, 4, 5, 6, 8, 8, 7, 9, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20,
    20, 20, 20, 20, 20, 20, 20, 5, 7, 7, 7, 7, 7, 7, 6, 7, 7, 7};
static uint32_t reversed_code[NSYMBOLS];   /* the stream's first bit is the code's most significant */
static uint8_t word_length[NWORDS];
/* Per first byte, the words that start with it, longest first (then in
 * WORDS order), ended by -1: most bytes start none, '/' and 's' one. */
static int8_t words_at[256][NWORDS + 1];
static bool symbols_ready;

static uint32_t reverse_bits(uint32_t code, unsigned length)
{
    uint32_t out = 0;
    for (unsigned i = 0; i < length; i++)
        out |= ((code >> i) & 1) << (length - 1 - i);
    return out;
}

/* Canonical codes: by length, then by symbol value (codec.py's _canonical()). */
static void init_symbols(void)
{
    if (symbols_ready)
        return;
    uint32_t code = 0;
    for (unsigned length = 1; length <= MAX_CODE_LENGTH; length++, code <<= 1)
        for (int s = 0; s < NSYMBOLS; s++)
            if (CODE_LENGTHS[s] == length)
                reversed_code[s] = reverse_bits(code++, length);
    memset(words_at, -1, sizeof words_at);
    for (int w = 0; w < NWORDS; w++) {
        word_length[w] = (uint8_t)strlen(WORDS[w]);
        int8_t *list = words_at[(uint8_t)WORDS[w][0]];
        int at = 0;
        while (list[at] >= 0)
            at++;
        while (at > 0 && word_length[list[at - 1]] < word_length[w]) {   /* insertion: longer first */
            list[at] = list[at - 1];
            at--;
        }
        list[at] = (int8_t)w;
    }
    symbols_ready = true;
}

/* The symbol at data[*at] (a word, else the byte); *at moves past it. */
static int next_symbol(const uint8_t *data, size_t len, size_t *at)
{
    uint8_t byte = data[*at];
    for (const int8_t *w = words_at[byte]; *w >= 0; w++) {
        size_t n = word_length[*w], i = 1;
        if (len - *at < n)
            continue;
        while (i < n && data[*at + i] == (uint8_t)WORDS[*w][i])
            i++;
        if (i == n) {
            *at += n;
            return STRING_END + 1 + *w;
        }
    }
    (*at)++;
    return byte;
}

/* Codes gathered into one put() per 40 bits or so: strings are most of a
 * merged token's bits. */
static void put_symbols(bit_writer *w, const uint8_t *data, size_t len)
{
    uint64_t batch = 0;
    unsigned width = 0;
    for (size_t at = 0; at < len;) {
        int s = next_symbol(data, len, &at);
        batch |= (uint64_t)reversed_code[s] << width;
        width += CODE_LENGTHS[s];
        if (width > 64 - MAX_CODE_LENGTH) {   /* room for the next code is gone */
            put(w, batch, width);
            batch = 0;
            width = 0;
        }
    }
    put(w, batch | (uint64_t)reversed_code[STRING_END] << width, width + CODE_LENGTHS[STRING_END]);
}

/* ---- modules: table entries taught by Python, kept by module id ---- */

#define MAX_LEARNT 512
#define MAX_ENTRY_BYTES 8192

typedef struct {
    uint64_t id;
    uint8_t *entry;   /* the module table entry, nbits bits */
    size_t nbits;
} learnt_module;

static learnt_module learnt[MAX_LEARNT];
static int nlearnt;

static const learnt_module *find_learnt(uint64_t id)
{
    for (int i = nlearnt - 1; i >= 0; i--)
        if (learnt[i].id == id)
            return &learnt[i];
    return NULL;
}

static void forget_all(void)
{
    for (int i = 0; i < nlearnt; i++)
        free(learnt[i].entry);
    nlearnt = 0;
}

int btc_encode_module(uint64_t module_id, const uint8_t *entry, size_t nbits)
{
    if (!entry || module_id == 0 || nbits == 0 || nbits > 8 * MAX_ENTRY_BYTES || find_learnt(module_id))
        return -1;
    uint8_t *copy = malloc((nbits + 7) / 8);
    if (!copy)
        return -1;
    memcpy(copy, entry, (nbits + 7) / 8);
    if (nlearnt == MAX_LEARNT)   /* bounded: start again; what is still used is taught again */
        forget_all();
    learnt[nlearnt++] = (learnt_module){module_id, copy, nbits};
    return 0;
}


static bool same_entry(const learnt_module *a, const learnt_module *b)
{
    return a->nbits == b->nbits && memcmp(a->entry, b->entry, (a->nbits + 7) / 8) == 0;
}

static void put_entry(bit_writer *w, const learnt_module *m)
{
    size_t i = 0;
    for (; i + 8 <= m->nbits; i += 8)
        put(w, m->entry[i / 8], 8);
    if (i < m->nbits)
        put(w, m->entry[i / 8], (unsigned)(m->nbits - i));
}

/* ---- one encoding ---- */

#define HISTORY 4
#define MAX_STRINGS 4096   /* distinct names (and files) per token kept for references */

typedef struct {
    uint64_t module_id;   /* 0: no module contains the pc */
    uint64_t vaddr;       /* pc - load bias (the pc itself without a module) */
    int index;            /* in the token's module table (place_frames()) */
    /* What a COPY must reproduce of the frame (codec.py's _copy_key()):
     * native: flags, module index, vaddr; Python: flags, name and file
     * (indices in their tables), line + 1 (0: none). */
    uint64_t key[2];
    int name, file;       /* Python: string table indices */
    int earlier;          /* the previous frame with the same key, -1: none */
} place;

typedef struct {
    const uint8_t *data;
    size_t len;
    PyObject *object;     /* the str it came from (same object: same string) */
} text;

typedef struct {
    text items[MAX_STRINGS];   /* distinct strings, in order: the table and the reference list */
    int count;
    int written;               /* how many of them the token holds so far */
} string_table;

typedef struct {
    const learnt_module *modules[MAX_LEARNT];   /* the token's module table */
    int nmodules;
    int seen;   /* modules named by a literal so far: the next new one is modules[seen] */
    struct { int index; uint64_t vaddr; } history[HISTORY];   /* a ring: k back is history[back(e, k)] */
    unsigned newest;
    int nhistory;
    string_table names, files;
} encoder;

/* The module's index in the token's table (added on first use); -1 if it
 * was never taught. */
static int module_index(encoder *e, uint64_t id)
{
    const learnt_module *m = find_learnt(id);
    if (!m)
        return -1;
    for (int i = 0; i < e->nmodules; i++)
        if (e->modules[i] == m)
            return i;
    for (int i = 0; i < e->nmodules; i++)   /* another mapping of the same file */
        if (same_entry(e->modules[i], m))
            return i;
    e->modules[e->nmodules] = m;
    return e->nmodules++;
}

_Static_assert((HISTORY & (HISTORY - 1)) == 0, "the history ring is indexed with a mask");

/* The slot of the native frame k + 1 back. */
static unsigned back(const encoder *e, int k)
{
    return (e->newest - (unsigned)k) & (HISTORY - 1);
}

/* A ring, not a shift of the list: a copy of 4 entries per native frame
 * showed in profiles. */
static void remember(encoder *e, int index, uint64_t vaddr)
{
    e->newest = (e->newest + 1) & (HISTORY - 1);
    e->history[e->newest].index = index;
    e->history[e->newest].vaddr = vaddr;
    if (e->nhistory < HISTORY)
        e->nhistory++;
}

/* The bits put_module() writes for a literal in module index. */
static unsigned module_bits(const encoder *e, int index)
{
    if (index == e->seen && index < e->nmodules)
        return 1;
    return (e->seen < e->nmodules) + bit_length((uint64_t)e->seen);
}

/* A literal's module: the next of the table not named yet (one bit), else
 * an index among those named so far, their count meaning no module. */
static void put_module(bit_writer *w, encoder *e, int index)
{
    bool new = index == e->seen && index < e->nmodules;
    if (e->seen < e->nmodules)
        put(w, new, 1);
    if (new)
        e->seen++;
    else
        put(w, (uint64_t)(index < e->seen ? index : e->seen), bit_length((uint64_t)e->seen));
}

static void put_native(bit_writer *w, encoder *e, int index, uint64_t vaddr)
{
    int best_k = -1;
    unsigned best_bits = 0;
    uint64_t best_delta = 0;
    bool best_negative = false;
    for (int k = 0; k < e->nhistory; k++) {
        unsigned slot = back(e, k);
        if (e->history[slot].index != index)
            continue;
        uint64_t ref = e->history[slot].vaddr;
        if (ref == vaddr) {
            put(w, 0, 2);   /* REPEAT */
            put(w, (uint64_t)k, 2);
            remember(e, index, vaddr);
            return;
        }
        bool negative = vaddr < ref;
        uint64_t delta = negative ? ref - vaddr : vaddr - ref;
        unsigned bits = length_bits(bit_length(delta), DELTA_BASE);
        if (best_k < 0 || bits < best_bits) {
            best_k = k;
            best_bits = bits;
            best_delta = delta;
            best_negative = negative;
        }
    }
    unsigned literal_bits = module_bits(e, index) + length_bits(bit_length(vaddr), ADDRESS_BASE);
    if (best_k >= 0 && 3 + best_bits < literal_bits) {
        put(w, 0b10, 2);   /* DELTA */
        put(w, (uint64_t)best_k | (uint64_t)best_negative << 2, 3);
        put_ulen(w, best_delta, DELTA_BASE);
    } else {
        put(w, 0b01, 2);   /* LITERAL */
        put_module(w, e, index);
        put_ulen(w, vaddr, ADDRESS_BASE);
    }
    remember(e, index, vaddr);
}

/* The common prefix of a and b, then the common suffix of what is left. */
static size_t sharing(const text *a, const text *b, size_t *prefix, size_t *suffix)
{
    size_t n = a->len < b->len ? a->len : b->len, p = 0, q = 0;
    while (p < n && a->data[p] == b->data[p])
        p++;
    while (q < n - p && a->data[a->len - 1 - q] == b->data[b->len - 1 - q])
        q++;
    *prefix = p;
    *suffix = q;
    return p + q;
}

static int utf8_of(PyObject *str, text *out)
{
    Py_ssize_t len;
    const char *data = PyUnicode_Check(str) ? PyUnicode_AsUTF8AndSize(str, &len) : NULL;
    if (!data) {   /* lone surrogates: the reference encoder writes them */
        PyErr_Clear();
        return -1;
    }
    *out = (text){(const uint8_t *)data, (size_t)len, str};
    return 0;
}

/* str's index in the table, added if new (the same object, else the same
 * bytes: the same string); -1 if it cannot be written here. */
static int intern_string(string_table *t, PyObject *str)
{
    for (int i = 0; i < t->count; i++)
        if (t->items[i].object == str)
            return i;
    text utf8;
    if (utf8_of(str, &utf8) < 0)
        return -1;
    for (int i = 0; i < t->count; i++)
        if (t->items[i].len == utf8.len && memcmp(t->items[i].data, utf8.data, utf8.len) == 0)
            return i;
    if (t->count == MAX_STRINGS)
        return -1;
    t->items[t->count] = utf8;
    return t->count++;
}

/* References the caches below evict during an encoding, dropped when it
 * is done (a deallocation can run Python code: weakref callbacks). */
#define MAX_EVICTED 256
static PyObject *evicted[MAX_EVICTED];
static int nevicted;

/* Whether a cache entry holding old (NULL: none) may be replaced: its
 * reference is kept, to drop after the encoding. */
static bool evict(PyObject *old)
{
    if (!old)
        return true;
    if (nevicted == MAX_EVICTED)
        return false;
    evicted[nevicted++] = old;
    return true;
}

static void release_evicted(void)
{
    while (nevicted)
        Py_DECREF(evicted[--nevicted]);
}

/* The codes of a new string's bytes between the prefix and the suffix it
 * takes from an earlier one, per str (with the prefix and suffix they were
 * coded for): the same names and files come back token after token, and
 * coding them symbol by symbol was a fifth of an encoding.  Direct-mapped
 * by the str's address, bounded; an entry holds a reference to its str
 * (immutable), so that the address cannot name another string while the
 * entry lives. */
#define CODED_CACHE_BITS 8   /* the slot: the top bits of a hash of the address */
#define CODED_CACHE (1 << CODED_CACHE_BITS)
#define MAX_CODED_WORDS 12   /* 768 bits; longer codes are written each time */

typedef struct {
    PyObject *str;
    size_t prefix, suffix;
    size_t nbits;
    uint64_t bits[MAX_CODED_WORDS];   /* the stream's first bit is bits[0]'s lowest */
} coded_string;

static coded_string coded_cache[CODED_CACHE];
static bit_writer coding;   /* a string's codes before they are cached; its buffer kept */

static uint64_t load_le64(const uint8_t *bytes)
{
    uint64_t v;
    memcpy(&v, bytes, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return v;
#else
    return __builtin_bswap64(v);
#endif
}

/* Words first.. first + n - 1 of coding's bits (zero-padded to whole words). */
static void coded_words(uint64_t *words, size_t first, size_t n)
{
    for (size_t k = 0; k < n; k++)
        words[k] = load_le64(coding.bytes + 8 * (first + k));
}

static void put_words(bit_writer *w, const uint64_t *words, size_t nbits)
{
    size_t k = 0;
    for (; 64 * (k + 1) <= nbits; k++)
        put(w, words[k], 64);
    if (nbits > 64 * k)
        put(w, words[k], (unsigned)(nbits - 64 * k));
}

/* put_symbols() of s's bytes between prefix and suffix, from the cache. */
static void put_coded(bit_writer *w, const text *s, size_t prefix, size_t suffix)
{
    uint64_t hash = ((uintptr_t)s->object >> 4) * UINT64_C(0x9E3779B97F4A7C15);
    coded_string *slot = &coded_cache[hash >> (64 - CODED_CACHE_BITS)];
    if (slot->str == s->object && slot->prefix == prefix && slot->suffix == suffix) {
        put_words(w, slot->bits, slot->nbits);
        return;
    }
    coding.len = coding.acc = coding.nacc = 0;
    coding.failed = false;
    put_symbols(&coding, s->data + prefix, s->len - prefix - suffix);
    size_t nbits = bit_count(&coding), nwords = (nbits + 63) / 64;
    flush_word(&coding);   /* the pending bits, zero-padded */
    if (coding.failed) {   /* out of memory, or longer than a token */
        w->failed = true;
        return;
    }
    uint64_t words[MAX_CODED_WORDS];
    bool keep = nwords <= MAX_CODED_WORDS && evict(slot->str);
    uint64_t *into = keep ? slot->bits : words;
    for (size_t at = 0; at < nwords; at += MAX_CODED_WORDS) {   /* a long string: a window at a time */
        size_t n = nwords - at < MAX_CODED_WORDS ? nwords - at : MAX_CODED_WORDS;
        coded_words(into, at, n);
        put_words(w, into, nbits - 64 * at < 64 * n ? nbits - 64 * at : 64 * n);
    }
    if (keep) {
        Py_INCREF(s->object);
        slot->str = s->object;
        slot->prefix = prefix;
        slot->suffix = suffix;
        slot->nbits = nbits;
    }
}

/* String i of the table: a reference (bit 0 + index) to one the token
 * holds, or the next new one (bit 1 + the string against the earlier one
 * it shares the most with, the first on a tie). */
static void put_string(bit_writer *w, string_table *t, int i)
{
    if (i < t->written) {
        put(w, 0, 1);
        put(w, (uint64_t)i, bit_length((uint64_t)t->written - 1));
        return;
    }
    const text *s = &t->items[i];   /* i == t->written: strings are interned in frame order */
    put(w, 1, 1);
    size_t prefix = 0, suffix = 0;
    if (t->written) {
        int best = 0;
        size_t best_shared = sharing(s, &t->items[0], &prefix, &suffix);
        for (int k = 1; k < t->written; k++) {
            size_t p, q, shared = sharing(s, &t->items[k], &p, &q);
            if (shared > best_shared) {
                best = k;
                best_shared = shared;
                prefix = p;
                suffix = q;
            }
        }
        put(w, (uint64_t)best, bit_length((uint64_t)t->written - 1));
    }
    put_varint(w, prefix);
    put_varint(w, suffix);
    put_coded(w, s, prefix, suffix);
    t->written++;
}

/* Lines per (code object, instruction offset): PyCode_Addr2Line() walks
 * the line table from its start every time.  Direct-mapped, bounded; an
 * entry holds a reference to its code object, so that the address cannot
 * name another code object while the entry lives. */
#define LINE_CACHE 2048

typedef struct {
    PyObject *code;
    int lasti;
    int line;
} line_entry;

static line_entry line_cache[LINE_CACHE];

static int line_of(PyCodeObject *code, int lasti)
{
    if (lasti < 0)
        return -1;
    line_entry *slot = &line_cache[((uintptr_t)code >> 4 ^ (uintptr_t)lasti * 0x9E3779B1u) % LINE_CACHE];
    if (slot->code == (PyObject *)code && slot->lasti == lasti)
        return slot->line;
    int line = PyCode_Addr2Line(code, lasti);
    if (!evict(slot->code))
        return line;   /* not cached: no room to drop the old entry's reference later */
    Py_INCREF(code);
    *slot = (line_entry){(PyObject *)code, lasti, line};
    return line;
}

void btc_encode_forget(int modules, int objects)
{
    if (modules)
        forget_all();
    for (int i = 0; objects && i < LINE_CACHE; i++)
        Py_CLEAR(line_cache[i].code);
    for (int i = 0; objects && i < CODED_CACHE; i++)
        Py_CLEAR(coded_cache[i].str);
}

#define KEY_PYTHON 0x80   /* above the flags a key keeps */

/* A Python frame's copy key: its strings interned, its line looked up. */
static int python_key(encoder *e, const btc_frame *f, place *p)
{
    PyObject *obj = (PyObject *)f->addr;
    if (!PyCode_Check(obj))
        return -1;
    PyCodeObject *code = (PyCodeObject *)obj;
    p->name = intern_string(&e->names, code->co_qualname);
    p->file = p->name < 0 ? -1 : intern_string(&e->files, code->co_filename);
    if (p->file < 0)
        return -1;
    int line = line_of(code, f->lasti);
    p->key[0] = (uint64_t)p->name << 34 | (uint64_t)p->file << 8 | (f->flags & BTC_F_JOIN) | KEY_PYTHON;
    p->key[1] = line < 0 ? 0 : (uint64_t)line + 1;
    return 0;
}

static void put_python(bit_writer *w, encoder *e, const place *p)
{
    put(w, 0b011, 3);
    put_string(w, &e->names, p->name);
    put_string(w, &e->files, p->file);
    put_uint(w, p->key[1]);
}

/* ---- the entry point ---- */

#define STRINGIFY(x) #x
#define TEXT_OF(x) STRINGIFY(x)
#define TOKEN_PREFIX "btc" TEXT_OF(BTC_TOKEN_VERSION) "."
#define TOKEN_PREFIX_LEN (sizeof TOKEN_PREFIX - 1)
static const char BASE64URL[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static size_t token_length(size_t nbytes)
{
    return TOKEN_PREFIX_LEN + (nbytes * 8 + 5) / 6;
}

static void base64url(const uint8_t *in, size_t n, char *out)
{
    size_t i = 0;
    for (; i + 3 <= n; i += 3, out += 4) {   /* 3 bytes -> 4 characters */
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[0] = BASE64URL[v >> 18];
        out[1] = BASE64URL[(v >> 12) & 63];
        out[2] = BASE64URL[(v >> 6) & 63];
        out[3] = BASE64URL[v & 63];
    }
    if (i < n) {   /* 1 or 2 bytes left: 2 or 3 characters, no padding */
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        out[0] = BASE64URL[v >> 18];
        out[1] = BASE64URL[(v >> 12) & 63];
        if (i + 1 < n)
            out[2] = BASE64URL[(v >> 6) & 63];
    }
}

/* Asks Python for the table entry of a module never taught (the first
 * BTC_ENCODE_MAX_NEED such modules, each once, with a pc inside it). */
static void note_need(btc_encode_need *need, uint64_t id, uintptr_t lookup)
{
    for (int k = 0; k < need->count; k++)
        if (need->module_id[k] == id)
            return;
    if (need->count < BTC_ENCODE_MAX_NEED) {
        need->module_id[need->count] = id;
        need->pc[need->count++] = lookup;
    }
}

/* Where each native record's pc is (module, module-relative pc) and its
 * module's index in the token's table (in order of first use): one pass
 * under the module lock, which guards the module list (nothing here reads
 * a Python object), searching the list and the taught modules only when a
 * pc leaves the previous frame's module (neighbouring frames are often in
 * one).  A pc in no module gets its index in link_keys(), once the table
 * is whole.  Returns 0, or the number of modules never taught (listed in
 * need). */
static int place_frames(encoder *e, const btc_frame *frames, int n, place *places, btc_encode_need *need)
{
    btc_module *m = NULL;
    int index = -1;
    need->count = 0;
    btc_modules_acquire();
    for (int i = 0; i < n; i++) {
        if (frames[i].kind != BTC_KIND_NATIVE)
            continue;
        uintptr_t pc = frames[i].addr, lookup = frames[i].flags & BTC_F_EXACT ? pc : pc - 1;
        if (!m || lookup < m->lo || lookup >= m->hi) {
            m = btc_module_find(lookup);
            index = m ? module_index(e, m->id) : -1;
        }
        place *p = &places[i];
        p->module_id = m ? m->id : 0;
        p->vaddr = m ? pc - m->bias : pc;
        p->index = index;
        if (m && index < 0)
            note_need(need, m->id, lookup);
    }
    btc_modules_release();
    return need->count;
}

/* COPY (design.md, format 4): the next L >= MIN_COPY frames are those D >= L
 * frames back; the run is searched among the MAX_CHAIN nearest earlier
 * frames with the same key as the next one (codec.py's _Copies). */
#define MIN_COPY 2
#define MAX_CHAIN 16
#define COPY_BASE 0

static bool same_key(const place *a, const place *b)
{
    return a->key[0] == b->key[0] && a->key[1] == b->key[1];
}

/* Every frame's key, and the previous frame with the same key: an open
 * addressing table of nslots (a power of two > n) frame numbers. */
static int link_keys(encoder *e, const btc_frame *frames, int n, place *places, int *slots, unsigned slot_bits)
{
    size_t mask = ((size_t)1 << slot_bits) - 1;
    memset(slots, -1, sizeof *slots * (mask + 1));
    for (int i = 0; i < n; i++) {
        place *p = &places[i];
        if (frames[i].kind == BTC_KIND_PYTHON) {
            if (python_key(e, &frames[i], p) < 0)
                return -1;
        } else {
            if (p->module_id == 0)
                p->index = e->nmodules;   /* no module */
            p->key[0] = (uint64_t)p->index << 8 | (frames[i].flags & (BTC_F_JOIN | BTC_F_EXACT));
            p->key[1] = p->vaddr;
        }
        uint64_t mixed = p->key[0] * UINT64_C(0x9E3779B97F4A7C15) ^ p->key[1] * UINT64_C(0xC2B2AE3D27D4EB4F);
        size_t h = (size_t)(mixed >> (64 - slot_bits));
        while (slots[h] >= 0 && !same_key(&places[slots[h]], p))
            h = (h + 1) & mask;
        p->earlier = slots[h];
        slots[h] = i;
    }
    return 0;
}

/* The length of the longest earlier run equal to the frames from i (the
 * first found, nearest first), *distance how far back it starts. */
static int longest_copy(const place *places, int n, int i, int *distance)
{
    int best = 0, chain = 0;
    for (int j = places[i].earlier; j >= 0 && chain < MAX_CHAIN; j = places[j].earlier, chain++) {
        int most = i - j < n - i ? i - j : n - i, length = 1;
        /* A run that cannot be longer than the best so far is not measured:
         * it is not taken on a tie (the nearest wins). */
        if (most <= best || !same_key(&places[j + best], &places[i + best]))
            continue;
        while (length < most && same_key(&places[j + length], &places[i + length]))
            length++;
        if (length > best) {
            best = length;
            *distance = i - j;
        }
    }
    return best;
}

/* The native frames of frames [from, to) are the latest ones: the last
 * HISTORY of them (all a long run needs) remembered in order. */
static void remember_run(encoder *e, const btc_frame *frames, const place *places, int from, int to)
{
    int start = to, natives = 0;
    while (start > from && natives < HISTORY)
        natives += frames[--start].kind == BTC_KIND_NATIVE;
    for (int k = start; k < to; k++)
        if (frames[k].kind == BTC_KIND_NATIVE)
            remember(e, places[k].index, places[k].vaddr);
}

static void put_frames(bit_writer *w, encoder *e, const btc_frame *frames, int n, const place *places)
{
    for (int i = 0; i < n;) {
        int distance = 0, length = longest_copy(places, n, i, &distance);
        if (length >= MIN_COPY) {
            put(w, 0b11111, 5);   /* COPY */
            put_ulen(w, (uint64_t)length, COPY_BASE);
            put_ulen(w, (uint64_t)distance, COPY_BASE);
            remember_run(e, frames, places, i, i + length);
            i += length;
            continue;
        }
        const btc_frame *f = &frames[i];
        if (f->flags & BTC_F_JOIN)
            put(w, 0b01111, 5);
        if (f->kind == BTC_KIND_PYTHON) {
            put_python(w, e, &places[i]);
        } else {
            if (f->flags & BTC_F_EXACT)
                put(w, 0b0111, 4);
            put_native(w, e, places[i].index, places[i].vaddr);
        }
        i++;
    }
}

/* Reused from call to call (GIL-held): the encoder's state, the places of
 * the records, the bit stream. */
static encoder enc;
static place *places;
static size_t places_bytes;
static int *slots;        /* link_keys()'s table */
static size_t slots_bytes;
static bit_writer scratch;   /* its buffer, kept from call to call */

/* link_keys()'s table: more than twice as many slots as frames. */
static unsigned slot_bits(int n)
{
    return bit_length((uint64_t)n) + 1;
}

static bool reserve(void **buf, size_t *cap, size_t want)
{
    if (want <= *cap)
        return true;
    void *grown = realloc(*buf, want);
    if (!grown)
        return false;
    *buf = grown;
    *cap = want;
    return true;
}

/* The token as a new str (a new reference), NULL and no exception when
 * it cannot be written here. */
static PyObject *token_of(const bit_writer *w)
{
    size_t nbytes = (8 * w->len + 7) / 8;
    PyObject *token = PyUnicode_New((Py_ssize_t)token_length(nbytes), 127);
    if (!token) {
        PyErr_Clear();
        return NULL;
    }
    char *out = (char *)PyUnicode_1BYTE_DATA(token);
    memcpy(out, TOKEN_PREFIX, TOKEN_PREFIX_LEN);
    base64url(w->bytes, nbytes, out + TOKEN_PREFIX_LEN);
    return token;
}

/* The token as a new str in *token, or a BTC_ENCODE_* code. */
static int encode_into(const btc_frame *frames, int n, int truncated, btc_encode_need *need, PyObject **token)
{
    encoder *e = &enc;
    e->nmodules = e->seen = e->nhistory = 0;
    e->names.count = e->names.written = e->files.count = e->files.written = 0;
    if (place_frames(e, frames, n, places, need))
        return BTC_ENCODE_NEED_MODULE;
    if (link_keys(e, frames, n, places, slots, slot_bits(n)) < 0)
        return BTC_ENCODE_ELSEWHERE;
    bit_writer *w = &scratch;
    w->len = w->acc = w->nacc = 0;
    w->failed = false;
    put(w, truncated != 0, 1);
    put(w, BTC_TOKEN_BUILD_ID_BYTES, 4);
    put_varint(w, (uint64_t)e->nmodules);
    for (int i = 0; i < e->nmodules; i++)
        put_entry(w, e->modules[i]);
    put_varint(w, (uint64_t)n);
    put_frames(w, e, frames, n, places);
    size_t nbits = bit_count(w);
    flush_word(w);   /* the pending bits, zero-padded */
    w->len = (nbits + 7) / 8;
    *token = w->failed ? NULL : token_of(w);
    return *token ? (int)PyUnicode_GET_LENGTH(*token) : BTC_ENCODE_ELSEWHERE;
}

/* The records and truncation of the btcore.Backtrace bt (its _raw
 * bytearray of btc_frame, its truncated attribute); *raw: the bytearray,
 * a new reference the caller drops once done with *frames.  Everything
 * that may run Python code (a subclass's truncated, its __bool__, the
 * flag's release) comes first, and the records are read after it: that
 * code may rebind or resize _raw, freeing the buffer a pointer read
 * earlier points into (a SIGSEGV, tests/test_codec.py). */
static int read_backtrace(PyObject *bt, const btc_frame **frames, int *n, int *truncated, PyObject **raw)
{
    static PyObject *raw_name, *truncated_name;
    if (!raw_name && !(raw_name = PyUnicode_InternFromString("_raw")))
        return -1;
    if (!truncated_name && !(truncated_name = PyUnicode_InternFromString("truncated")))
        return -1;
    *raw = PyObject_GetAttr(bt, raw_name);
    PyObject *flag = *raw ? PyObject_GetAttr(bt, truncated_name) : NULL;
    *truncated = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    Py_ssize_t size = *raw && PyByteArray_Check(*raw) ? PyByteArray_GET_SIZE(*raw) : -1;
    if (*truncated < 0 || size < 0 || size % sizeof(btc_frame) != 0 ||
        size / (Py_ssize_t)sizeof(btc_frame) > BTC_MAX_CAPACITY) {
        Py_CLEAR(*raw);
        PyErr_Clear();
        return -1;
    }
    *frames = (const btc_frame *)PyByteArray_AS_STRING(*raw);
    *n = (int)(size / (Py_ssize_t)sizeof(btc_frame));
    return 0;
}

/* Encoded by the table encoder, or BTC_ENCODE_ELSEWHERE (decoded frames, no room). */
static int encode_records(const btc_frame *frames, int n, int truncated, btc_encode_need *need, PyObject **token)
{
    for (int i = 0; i < n; i++)
        if (frames[i].kind != BTC_KIND_NATIVE && frames[i].kind != BTC_KIND_PYTHON)
            return BTC_ENCODE_ELSEWHERE;   /* decoded frames: the reference encoder */
    init_symbols();
    if (!reserve((void **)&places, &places_bytes, sizeof *places * (size_t)(n ? n : 1)) ||
        !reserve((void **)&slots, &slots_bytes, sizeof *slots << slot_bits(n)))
        return BTC_ENCODE_ELSEWHERE;
    int rc = encode_into(frames, n, truncated, need, token);
    release_evicted();
    return rc;
}

static int encode_backtrace(PyObject *bt, btc_encode_need *need, PyObject **token)
{
    const btc_frame *frames;
    int n, truncated;
    PyObject *raw;
    if (read_backtrace(bt, &frames, &n, &truncated, &raw) < 0)
        return BTC_ENCODE_ELSEWHERE;
    int rc = encode_records(frames, n, truncated, need, token);
    Py_DECREF(raw);
    return rc;
}

int btc_encode(uintptr_t backtrace, uintptr_t into, btc_encode_need *need)
{
    PyObject *token;
    if (!PyGILState_Check() || !PyList_Check((PyObject *)into))
        return BTC_ENCODE_ELSEWHERE;
    int rc = encode_backtrace((PyObject *)backtrace, need, &token);
    if (rc < 0)
        return rc;
    if (PyList_Append((PyObject *)into, token) < 0) {
        PyErr_Clear();
        rc = BTC_ENCODE_ELSEWHERE;
    }
    Py_DECREF(token);
    return rc;
}

/* Backtrace.encode() as a builtin method: a Python method calling
 * codec.encode(), which calls btc_encode() through cffi, cost about as much
 * as the encoding (the calls, the argument conversions, the list).  Every
 * call it does not finish (a module to teach, decoded records, a string
 * that is not UTF-8) is handed to codec.encode(), which does them all. */
static PyObject *python_encode;
static btc_encode_need builtin_need;   /* written, never read: python_encode asks again */

static PyObject *encode_method(PyObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *token;
    if (encode_backtrace(self, &builtin_need, &token) >= 0)
        return token;
    return PyObject_CallOneArg(python_encode, self);
}

static PyMethodDef encode_def = {"encode", encode_method, METH_NOARGS, NULL};

int btc_install_encode(uintptr_t backtrace_type, uintptr_t python_impl, const char *doc)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyTypeObject *type = (PyTypeObject *)backtrace_type;
    PyObject *method = NULL;
    int rc = -1;
    static char *owned_doc;   /* lives as long as the process, as the method */
    if (!owned_doc && !(owned_doc = strdup(doc)))
        goto out;
    encode_def.ml_doc = owned_doc;
    if (!PyType_Check((PyObject *)type) || !PyCallable_Check((PyObject *)python_impl) ||
        !(method = PyDescr_NewMethod(type, &encode_def)))
        goto out;
    Py_XSETREF(python_encode, Py_NewRef((PyObject *)python_impl));
    rc = PyObject_SetAttrString((PyObject *)type, "encode", method);
out:
    Py_XDECREF(method);
    if (rc < 0)
        PyErr_Clear();
    PyGILState_Release(gil);
    return rc;
}
