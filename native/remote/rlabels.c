/* What names another process's greenlets (btcore/remote/names.py), read in
 * one pass over the greenlet objects once the target runs again: their
 * parent, gevent's custom name, ident, run function and spawner.  A dump
 * of 10,000 greenlets made ~7 reads and their Python per greenlet here
 * (~0.1 s); this pass reads the same words through the chunk cache the
 * stop filled, with the same checks, and leaves to Python only what is
 * shared (types' and strings' text, whether a parent is a greenlet: a few
 * objects, remembered by address).
 *
 * Offsets: the object table of the target's version (robjects.c) and the
 * layout table (pylayout.c) for strings and types' names.  Every object's
 * type is checked against the target's type object before any of its
 * fields is read; counts and lengths are bounded; an unreadable word
 * leaves that part of the label out.
 */
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "remote/rmem.h"

#define MAX_TYPE_DEPTH 32       /* tp_base links followed (remote_names.MAX_TYPE_DEPTH) */
#define MAX_TYPE_NAME 128       /* bytes of a type's name read (bounds.MAX_TYPE_NAME) */
#define MAX_DICT_ENTRIES 256    /* entries of an instance dict looked through (remote_names.MAX_DICT_ENTRIES) */
#define MAX_LOG2_INDEX 20       /* a dict's index bytes, log2 */
#define MAX_SPAN 1024           /* words of a greenlet object read */
#define LONG_DIGITS_READ 2      /* an ident fits in 2 digits of 30 bits */
#define MEMO 64                 /* types and keys remembered per call (a dump meets few) */
#define GEVENT_GREENLET "gevent._gevent_cgreenlet.Greenlet"

/* A read of the target as bounds.readable() allows it: never at address 0 or across the end. */
static bool rd(btc_rmem *m, uintptr_t addr, void *out, size_t n)
{
    return n == 0 || (addr != 0 && addr + n >= addr && btc_rmem_read(m, addr, out, n) == 0);
}

static bool word(btc_rmem *m, uintptr_t addr, uintptr_t *out)
{
    return rd(m, addr, out, sizeof *out);
}

/* Is obj (aligned, not 0) of type `type` (known)? */
static bool is_a(btc_rmem *m, uintptr_t obj, uintptr_t type)
{
    uintptr_t t;
    return obj && !(obj & 7) && type && word(m, obj + 8, &t) && t == type;
}

/* The first n words of obj if its type is `type`. */
static bool object_words(btc_rmem *m, uintptr_t obj, uintptr_t type, uintptr_t *w, size_t n)
{
    return obj && !(obj & 7) && type && rd(m, obj, w, n * sizeof *w) && w[1] == type;
}

typedef struct {
    btc_rmem *m;
    const btc_remote_layout *lay;
    const btc_remote_objlayout *obj;
    const btc_remote_label_spec *spec;
    struct {
        uintptr_t type;
        int8_t gevent;          /* 0 unknown, 1 yes, -1 no */
        uint32_t dict_at;       /* its instances' dict, in bytes (spec->span * 8: none read) */
    } types[MEMO];
    struct {
        uintptr_t key;
        int8_t field;           /* 0 unknown, else FIELD_* */
    } keys[MEMO];
} reader;

enum { FIELD_OTHER = 1, FIELD_NAME, FIELD_RUN };

/* tp_name of tp equals name (a name read whole within MAX_TYPE_NAME bytes)? */
int btc_remote_type_named(btc_rmem *m, const btc_remote_layout *lay, uintptr_t tp, const char *name)
{
    uintptr_t at;
    char raw[MAX_TYPE_NAME];
    if (!word(m, tp + lay->type_name, &at) || !rd(m, at, raw, sizeof raw))
        return false;
    size_t n = strlen(name);
    return n < sizeof raw && memcmp(raw, name, n) == 0 && raw[n] == 0;
}

static bool inherits(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_objlayout *obj, uintptr_t tp,
                     const char *name)
{
    for (int depth = 0; depth < MAX_TYPE_DEPTH && tp; depth++) {
        if (btc_remote_type_named(m, lay, tp, name))
            return true;
        if (!word(m, tp + obj->type_base, &tp))
            return false;
    }
    return false;
}

int btc_remote_type_inherits(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_objlayout *obj, uintptr_t tp,
                             const char *name)
{
    return inherits(m, lay, obj, tp, name);
}

/* Where tp's instances keep their dict (tp_dictoffset, when it lies within the span read), and
 * whether tp is gevent's Greenlet or a subclass; remembered per type. */
static void type_info(reader *r, uintptr_t tp, bool *gevent, uint32_t *dict_at)
{
    size_t slot = (tp >> 4) % MEMO;
    if (r->types[slot].type != tp || !r->types[slot].gevent) {
        uintptr_t offset;
        uint32_t past = r->spec->span * 8;
        bool ok = word(r->m, tp + r->obj->type_dictoffset, &offset) && offset > 0 && offset < past && !(offset & 7);
        r->types[slot].type = tp;
        r->types[slot].dict_at = ok ? (uint32_t)offset : past;
        r->types[slot].gevent = inherits(r->m, r->lay, r->obj, tp, GEVENT_GREENLET) ? 1 : -1;
    }
    *gevent = r->types[slot].gevent > 0;
    *dict_at = r->types[slot].dict_at;
}

/* Is the str object key's text `text` (ASCII)?  As bounds.Names.string() reads a str: compact, of kind 1, 2
 * or 4 (ASCII only as kind 1), its code units equal to text's. */
static bool str_is(reader *r, uintptr_t key, const char *text)
{
    const btc_remote_layout *L = r->lay;
    uintptr_t state, length;
    size_t n = strlen(text);
    if (!is_a(r->m, key, r->spec->str_type) || !word(r->m, key + L->unicode_state, &state) ||
        !word(r->m, key + L->unicode_length, &length) || length != n)
        return false;
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || (kind != 1 && kind != 2 && kind != 4) || (ascii && kind != 1))
        return false;
    uint8_t raw[16];
    if (n * kind > sizeof raw || !rd(r->m, key + (ascii ? L->ascii_data : L->compact_data), raw, n * kind))
        return false;
    for (size_t i = 0; i < n; i++) {
        uint32_t unit = 0;
        memcpy(&unit, raw + i * kind, kind);   /* little-endian: x86-64 only (remote/process.py) */
        if (unit != (uint8_t)text[i])
            return false;
    }
    return true;
}

/* Which of the fields a label reads the dict key `key` names; remembered per key (interned). */
static int key_field(reader *r, uintptr_t key)
{
    size_t slot = (key >> 4) % MEMO;
    if (r->keys[slot].key != key || !r->keys[slot].field) {
        r->keys[slot].key = key;
        r->keys[slot].field = str_is(r, key, "name") ? FIELD_NAME : str_is(r, key, "_run") ? FIELD_RUN : FIELD_OTHER;
    }
    return r->keys[slot].field;
}

int btc_remote_dict_entries(btc_rmem *m, const btc_remote_objlayout *O, uintptr_t keys, uintptr_t values, int most,
                            uintptr_t *out_keys, uintptr_t *out_values)
{
    uint8_t head[64], raw[BTC_REMOTE_ENTRIES_AT_ONCE * 24];
    int64_t n;
    if (O->keys_indices > sizeof head || !rd(m, keys, head, O->keys_indices))
        return -1;
    memcpy(&n, head + O->keys_nentries, sizeof n);
    uint8_t log2_index = head[O->keys_log2_index_bytes];
    if (n < 0 || n > most || log2_index > MAX_LOG2_INDEX)
        return -1;
    bool general = head[O->keys_kind] == O->kind_general;
    uint32_t size = general ? O->entry_size : O->unicode_entry_size;
    uint32_t key_at = general ? O->entry_key : O->unicode_entry_key;
    uint32_t value_at = general ? O->entry_value : O->unicode_entry_value;
    if (size > 24 || key_at + 8 > size || value_at + 8 > size)
        return -1;
    uintptr_t entries = keys + O->keys_indices + ((uintptr_t)1 << log2_index);
    if (entries < keys || (values && !rd(m, values + O->values_values, out_values, (size_t)n * 8)))
        return -1;
    for (int64_t done = 0; done < n; done += BTC_REMOTE_ENTRIES_AT_ONCE) {   /* a bounded buffer, in parts */
        int64_t part = n - done < BTC_REMOTE_ENTRIES_AT_ONCE ? n - done : BTC_REMOTE_ENTRIES_AT_ONCE;
        if (!rd(m, entries + done * size, raw, (size_t)part * size))
            return -1;
        for (int64_t i = 0; i < part; i++) {
            memcpy(&out_keys[done + i], raw + i * size + key_at, sizeof *out_keys);
            if (!values)
                memcpy(&out_values[done + i], raw + i * size + value_at, sizeof *out_values);
        }
    }
    return (int)n;
}

/* *name and *run: the values under "name" and "_run" in the dict object d (its type checked), as
 * remote_names reads a dict. */
static void dict_fields(reader *r, uintptr_t d, uintptr_t *name, uintptr_t *run)
{
    const btc_remote_objlayout *O = r->obj;
    uintptr_t w[8], keys[MAX_DICT_ENTRIES], values[MAX_DICT_ENTRIES];
    size_t nw = (O->dict_keys > O->dict_values ? O->dict_keys : O->dict_values) / 8 + 1;
    if (nw > 8 || !object_words(r->m, d, r->spec->dict_type, w, nw))
        return;
    int n = btc_remote_dict_entries(r->m, O, w[O->dict_keys / 8], w[O->dict_values / 8], MAX_DICT_ENTRIES, keys,
                                    values);
    for (int i = 0; i < n; i++) {
        int field = values[i] ? key_field(r, keys[i]) : FIELD_OTHER;
        if (field == FIELD_NAME)
            *name = values[i];
        else if (field == FIELD_RUN)
            *run = values[i];
    }
}

/* The name of the callable obj: a function's (a bound method's function's) name, a str object; or a
 * builtin's, a C string. */
static void function_name(reader *r, uintptr_t obj, btc_remote_label *out)
{
    const btc_remote_label_spec *S = r->spec;
    if (is_a(r->m, obj, S->method_type) && !word(r->m, obj + r->obj->method_func, &obj))
        return;
    uintptr_t ml, name;
    if (is_a(r->m, obj, S->function_type) && word(r->m, obj + r->obj->func_name, &name))
        out->function = name;
    else if (is_a(r->m, obj, S->builtin_type) && word(r->m, obj + r->obj->cfunc_def, &ml) && ml &&
             word(r->m, ml + r->obj->methoddef_name, &name)) {
        out->function = name;
        out->function_is_cstring = 1;
    }
}

int64_t btc_remote_small_int(btc_rmem *m, const btc_remote_objlayout *O, uintptr_t int_type, uintptr_t obj)
{
    uintptr_t w[8];
    size_t nw = (O->long_digits + 4 * LONG_DIGITS_READ + 7) / 8;
    if (nw > 8 || O->long_size / 8 >= nw || !object_words(m, obj, int_type, w, nw))
        return -1;
    uint64_t size = w[O->long_size / 8], digits;
    if (!O->long_tag_bits)   /* 3.11: ob_size, a signed count */
        digits = size < (uint64_t)1 << 63 ? size : UINT64_MAX;
    else   /* 3.12+: lv_tag, sign below the count: 0 positive, 1 zero, 2 negative */
        digits = (size & 3) == 2 ? UINT64_MAX : (size & 3) == 1 ? 0 : size >> O->long_tag_bits;
    if (digits > LONG_DIGITS_READ)
        return -1;
    int64_t value = 0;
    for (uint64_t i = 0; i < digits; i++) {
        uint32_t d;
        memcpy(&d, (const uint8_t *)w + O->long_digits + 4 * i, sizeof d);
        value += (int64_t)d << (O->long_shift * i);
    }
    return value;
}

/* gevent's weak reference to the spawner: what it points at (its type checked), or 0. */
static uintptr_t weak_target(reader *r, uintptr_t ref)
{
    uintptr_t w[8];
    size_t nw = r->obj->weakref_object / 8 + 1;
    return nw <= 8 && object_words(r->m, ref, r->spec->weakref_type, w, nw) ? w[nw - 1] : 0;
}

static void label(reader *r, uintptr_t g, btc_remote_label *out)
{
    const btc_remote_label_spec *S = r->spec;
    uintptr_t w[MAX_SPAN];
    size_t nw = S->span;
    memset(out, 0, sizeof *out);
    out->ident = -1;
    /* the object's words up to the last field read, in one read; a plain greenlet is smaller: if its
     * object ends where memory does, its own words */
    if (g & 7 || !rd(r->m, g, w, nw * 8)) {
        nw = S->short_span;
        if (g & 7 || !rd(r->m, g, w, nw * 8))
            return;
    }
    out->read = 1;
    out->type = w[1];
    if (S->pimpl_at >= 0 && (size_t)S->pimpl_at / 8 < nw) {
        uintptr_t pimpl = w[S->pimpl_at / 8];
        uintptr_t parent;
        if (pimpl && !(pimpl & 7) && word(r->m, pimpl + S->parent_at, &parent))
            out->parent = parent;
    }
    bool gevent;
    uint32_t dict_at;
    type_info(r, out->type, &gevent, &dict_at);
    if (!gevent || nw != S->span)
        return;
    out->gevent = 1;
    uintptr_t name = 0, run = 0;
    if (dict_at < S->span * 8)
        dict_fields(r, w[dict_at / 8], &name, &run);
    out->name = name;
    if (run)
        function_name(r, run, out);
    if (S->ident_at >= 0)
        out->ident = btc_remote_small_int(r->m, r->obj, S->int_type, w[S->ident_at / 8]);
    if (S->spawner_at >= 0)
        out->spawner = weak_target(r, w[S->spawner_at / 8]);
}

int btc_remote_greenlet_labels(btc_rmem *m, const btc_remote_layout *lay, const btc_remote_objlayout *obj,
                               const btc_remote_label_spec *spec, const uintptr_t *greenlets, int n,
                               btc_remote_label *out)
{
    if (spec->span < 2 || spec->span > MAX_SPAN || spec->short_span < 2 || spec->short_span > spec->span ||
        (spec->ident_at >= 0 && (size_t)spec->ident_at / 8 >= spec->span) ||
        (spec->spawner_at >= 0 && (size_t)spec->spawner_at / 8 >= spec->span))
        return -1;
    reader *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    *r = (reader){.m = m, .lay = lay, .obj = obj, .spec = spec};
    for (int i = 0; i < n; i++)
        label(r, greenlets[i], &out[i]);
    free(r);
    return n;
}
