/* The token encoder: a Backtrace's raw records -> "btc2." + base64url of the
 * bit stream docs/design.md ("Compact tokens", format 2) specifies.
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

/* 6-bit symbols: ALPHABET[s] for s < 62, 62 = a raw byte follows, 63 = end */
#define SYMBOL_ESCAPE 62
#define SYMBOL_END 63
static const char ALPHABET[] = "/._-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV";
static int8_t symbol_of[256];
static bool symbols_ready;

static void init_symbols(void)
{
    if (symbols_ready)
        return;
    memset(symbol_of, -1, sizeof symbol_of);
    for (int i = 0; ALPHABET[i]; i++)
        symbol_of[(uint8_t)ALPHABET[i]] = (int8_t)i;
    symbols_ready = true;
}

static void put_symbols(bit_writer *w, const uint8_t *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int s = symbol_of[data[i]];
        if (s < 0)
            put(w, SYMBOL_ESCAPE | (uint64_t)data[i] << 6, 14);
        else
            put(w, (uint64_t)s, 6);
    }
    put(w, SYMBOL_END, 6);
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
    int index;            /* in the token's module table (collect_modules()) */
} place;

typedef struct {
    const uint8_t *data;
    size_t len;
    PyObject *object;     /* the str it came from (same object: same string) */
} text;

typedef struct {
    text items[MAX_STRINGS];   /* distinct strings, in order: the table and the reference list */
    int count;
} string_table;

typedef struct {
    const learnt_module *modules[MAX_LEARNT];   /* the token's module table */
    int nmodules;
    unsigned module_bits;
    struct { int index; uint64_t vaddr; } history[HISTORY];
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

static void remember(encoder *e, int index, uint64_t vaddr)
{
    memmove(&e->history[1], &e->history[0], sizeof e->history[0] * (HISTORY - 1));
    e->history[0].index = index;
    e->history[0].vaddr = vaddr;
    if (e->nhistory < HISTORY)
        e->nhistory++;
}

static void put_native(bit_writer *w, encoder *e, int index, uint64_t vaddr)
{
    int best_k = -1;
    unsigned best_bits = 0;
    uint64_t best_delta = 0;
    bool best_negative = false;
    for (int k = 0; k < e->nhistory; k++) {
        if (e->history[k].index != index)
            continue;
        uint64_t ref = e->history[k].vaddr;
        if (ref == vaddr) {
            put(w, 0, 2);   /* REPEAT */
            put(w, (uint64_t)k, 2);
            remember(e, index, vaddr);
            return;
        }
        bool negative = vaddr < ref;
        uint64_t delta = negative ? ref - vaddr : vaddr - ref;
        unsigned bits = WIDTHS[width_class(delta)];
        if (best_k < 0 || bits < best_bits) {
            best_k = k;
            best_bits = bits;
            best_delta = delta;
            best_negative = negative;
        }
    }
    unsigned literal_bits = e->module_bits + WIDTHS[width_class(vaddr)];
    if (best_k >= 0 && best_bits + 3 < literal_bits) {
        put(w, 0b10, 2);   /* DELTA */
        put(w, (uint64_t)best_k | (uint64_t)best_negative << 2, 3);
        put_uint(w, best_delta);
    } else {
        put(w, 0b01, 2);   /* LITERAL */
        put(w, (uint64_t)index, e->module_bits);
        put_uint(w, vaddr);
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

static void put_reference(bit_writer *w, const string_table *t, int i)
{
    put(w, 0, 1);
    put(w, (uint64_t)i, bit_length((uint64_t)t->count - 1));
}

/* A table reference (bit 0 + index) or a new string (bit 1 + the string
 * against the earlier one it shares the most with, the first on a tie). */
static int put_string(bit_writer *w, string_table *t, PyObject *str)
{
    for (int i = 0; i < t->count; i++)
        if (t->items[i].object == str) {   /* the same object: the same string */
            put_reference(w, t, i);
            return 0;
        }
    text utf8, *s = &utf8;
    if (utf8_of(str, s) < 0)
        return -1;
    for (int i = 0; i < t->count; i++) {
        if (t->items[i].len == s->len && memcmp(t->items[i].data, s->data, s->len) == 0) {
            put_reference(w, t, i);
            return 0;
        }
    }
    if (t->count == MAX_STRINGS)
        return -1;
    put(w, 1, 1);
    size_t prefix = 0, suffix = 0;
    if (t->count) {
        int best = 0;
        size_t best_shared = sharing(s, &t->items[0], &prefix, &suffix);
        for (int i = 1; i < t->count; i++) {
            size_t p, q, shared = sharing(s, &t->items[i], &p, &q);
            if (shared > best_shared) {
                best = i;
                best_shared = shared;
                prefix = p;
                suffix = q;
            }
        }
        put(w, (uint64_t)best, bit_length((uint64_t)t->count - 1));
    }
    put_varint(w, prefix);
    put_varint(w, suffix);
    put_symbols(w, s->data + prefix, s->len - prefix - suffix);
    t->items[t->count++] = *s;
    return 0;
}


/* Lines per (code object, instruction offset): PyCode_Addr2Line() walks
 * the line table from its start every time.  Direct-mapped, bounded; an
 * entry holds a reference to its code object, so that the address cannot
 * name another code object while the entry lives.  References an encoding
 * evicts are dropped when it is done (a code object's deallocation can run
 * Python code: weakref callbacks). */
#define LINE_CACHE 2048
#define MAX_EVICTED 256

typedef struct {
    PyObject *code;
    int lasti;
    int line;
} line_entry;

static line_entry line_cache[LINE_CACHE];
static PyObject *evicted[MAX_EVICTED];
static int nevicted;

static int line_of(PyCodeObject *code, int lasti)
{
    if (lasti < 0)
        return -1;
    line_entry *slot = &line_cache[((uintptr_t)code >> 4 ^ (uintptr_t)lasti * 0x9E3779B1u) % LINE_CACHE];
    if (slot->code == (PyObject *)code && slot->lasti == lasti)
        return slot->line;
    int line = PyCode_Addr2Line(code, lasti);
    if (slot->code && nevicted == MAX_EVICTED)
        return line;   /* not cached: no room to drop the old entry's reference later */
    if (slot->code)
        evicted[nevicted++] = slot->code;
    Py_INCREF(code);
    *slot = (line_entry){(PyObject *)code, lasti, line};
    return line;
}

static void release_evicted(void)
{
    while (nevicted)
        Py_DECREF(evicted[--nevicted]);
}

void btc_encode_forget(int modules, int lines)
{
    if (modules)
        forget_all();
    for (int i = 0; lines && i < LINE_CACHE; i++)
        Py_CLEAR(line_cache[i].code);
}

static int put_python(bit_writer *w, encoder *e, const btc_frame *f)
{
    PyObject *obj = (PyObject *)f->addr;
    if (!PyCode_Check(obj))
        return -1;
    PyCodeObject *code = (PyCodeObject *)obj;
    put(w, 0b011, 3);
    if (put_string(w, &e->names, code->co_qualname) < 0 || put_string(w, &e->files, code->co_filename) < 0)
        return -1;
    int line = line_of(code, f->lasti);
    put_uint(w, line < 0 ? 0 : (uint64_t)line + 1);
    return 0;
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

/* Where each native record's pc is: one pass under the module lock. */
static void map_places(const btc_frame *frames, int n, place *places)
{
    btc_modules_acquire();
    for (int i = 0; i < n; i++) {
        if (frames[i].kind != BTC_KIND_NATIVE)
            continue;
        uintptr_t pc = frames[i].addr;
        btc_module *m = btc_module_find(frames[i].flags & BTC_F_EXACT ? pc : pc - 1);
        places[i] = m ? (place){m->id, pc - m->bias} : (place){0, pc};
    }
    btc_modules_release();
}

/* The token's module table, in order of first use; 0, or the number of
 * modules never taught (the first BTC_ENCODE_MAX_NEED in need). */
static int collect_modules(encoder *e, const btc_frame *frames, int n, place *places,
                           btc_encode_need *need)
{
    need->count = 0;
    uint64_t last_id = 0;
    int last_index = -1;
    for (int i = 0; i < n; i++) {
        uint64_t id = places[i].module_id;
        if (frames[i].kind != BTC_KIND_NATIVE || id == 0)
            continue;
        if (id != last_id) {   /* neighbouring frames are often in one module */
            last_id = id;
            last_index = module_index(e, id);
        }
        places[i].index = last_index;
        if (last_index >= 0)
            continue;
        bool listed = false;
        for (int k = 0; k < need->count && !listed; k++)
            listed = need->module_id[k] == id;
        if (!listed && need->count < BTC_ENCODE_MAX_NEED) {
            uintptr_t pc = frames[i].addr;
            need->module_id[need->count] = id;
            need->pc[need->count++] = frames[i].flags & BTC_F_EXACT ? pc : pc - 1;
        }
    }
    e->module_bits = bit_length((uint64_t)e->nmodules);
    for (int i = 0; i < n; i++)
        if (frames[i].kind == BTC_KIND_NATIVE && places[i].module_id == 0)
            places[i].index = e->nmodules;   /* no module */
    return need->count;
}

static int put_frames(bit_writer *w, encoder *e, const btc_frame *frames, int n, const place *places)
{
    for (int i = 0; i < n; i++) {
        const btc_frame *f = &frames[i];
        if (f->flags & BTC_F_JOIN)
            put(w, 0b1111, 4);
        if (f->kind == BTC_KIND_PYTHON) {
            if (put_python(w, e, f) < 0)
                return -1;
            continue;
        }
        if (f->flags & BTC_F_EXACT)
            put(w, 0b0111, 4);
        put_native(w, e, places[i].index, places[i].vaddr);
    }
    return 0;
}

/* Reused from call to call (GIL-held): the encoder's state, the places of
 * the records, the bit stream. */
static encoder enc;
static place *places;
static size_t places_bytes;
static bit_writer scratch;   /* its buffer, kept from call to call */

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

static int encode_into(const btc_frame *frames, int n, int truncated, PyObject *into, btc_encode_need *need)
{
    encoder *e = &enc;
    e->nmodules = e->nhistory = e->names.count = e->files.count = 0;
    map_places(frames, n, places);
    if (collect_modules(e, frames, n, places, need))
        return BTC_ENCODE_NEED_MODULE;
    bit_writer *w = &scratch;
    w->len = w->acc = w->nacc = 0;
    w->failed = false;
    put(w, truncated != 0, 1);
    put(w, BTC_TOKEN_BUILD_ID_BYTES, 4);
    put_varint(w, (uint64_t)e->nmodules);
    for (int i = 0; i < e->nmodules; i++)
        put_entry(w, e->modules[i]);
    put_varint(w, (uint64_t)n);
    if (put_frames(w, e, frames, n, places) < 0)
        return BTC_ENCODE_ELSEWHERE;
    size_t nbits = bit_count(w);
    flush_word(w);   /* the pending bits, zero-padded */
    w->len = (nbits + 7) / 8;
    PyObject *token = w->failed ? NULL : token_of(w);
    if (!token)
        return BTC_ENCODE_ELSEWHERE;
    int length = (int)PyUnicode_GET_LENGTH(token);
    if (PyList_Append(into, token) < 0) {
        PyErr_Clear();
        length = BTC_ENCODE_ELSEWHERE;
    }
    Py_DECREF(token);
    return length;
}

/* The records and truncation of the btcore.Backtrace at address backtrace
 * (its _raw bytearray of btc_frame, its truncated attribute). */
static int read_backtrace(PyObject *bt, const btc_frame **frames, int *n, int *truncated)
{
    static PyObject *raw_name, *truncated_name;
    if (!raw_name && !(raw_name = PyUnicode_InternFromString("_raw")))
        return -1;
    if (!truncated_name && !(truncated_name = PyUnicode_InternFromString("truncated")))
        return -1;
    PyObject *raw = PyObject_GetAttr(bt, raw_name);
    PyObject *flag = raw ? PyObject_GetAttr(bt, truncated_name) : NULL;
    int ok = flag && PyByteArray_Check(raw) && PyByteArray_GET_SIZE(raw) % sizeof(btc_frame) == 0 &&
             PyByteArray_GET_SIZE(raw) / (Py_ssize_t)sizeof(btc_frame) <= BTC_MAX_CAPACITY;
    *truncated = ok ? PyObject_IsTrue(flag) : -1;
    if (ok && *truncated >= 0) {
        *frames = (const btc_frame *)PyByteArray_AS_STRING(raw);
        *n = (int)(PyByteArray_GET_SIZE(raw) / (Py_ssize_t)sizeof(btc_frame));
    }
    Py_XDECREF(flag);
    Py_XDECREF(raw);   /* the Backtrace still holds it: frames stays valid until we return */
    if (!ok || *truncated < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

int btc_encode(uintptr_t backtrace, uintptr_t into, btc_encode_need *need)
{
    const btc_frame *frames;
    int n, truncated;
    if (!PyGILState_Check() || !PyList_Check((PyObject *)into) ||
        read_backtrace((PyObject *)backtrace, &frames, &n, &truncated) < 0)
        return BTC_ENCODE_ELSEWHERE;
    for (int i = 0; i < n; i++)
        if (frames[i].kind != BTC_KIND_NATIVE && frames[i].kind != BTC_KIND_PYTHON)
            return BTC_ENCODE_ELSEWHERE;   /* decoded frames: the reference encoder */
    init_symbols();
    if (!reserve((void **)&places, &places_bytes, sizeof *places * (size_t)(n ? n : 1)))
        return BTC_ENCODE_ELSEWHERE;
    int rc = encode_into(frames, n, truncated, (PyObject *)into, need);
    release_evicted();
    return rc;
}
