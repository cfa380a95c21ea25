/* Source locations from DWARF: address -> compile unit -> line rows and the
 * chain of inlined calls, like `addr2line -f -i`.
 *
 * Only what a lookup needs is decoded, and it is kept: the unit table
 * (from .debug_aranges, else from each unit's top DIE) once per file, then
 * per unit touched its abbreviations, its line program (as sorted rows) and
 * its function scopes (subprograms and inlined subroutines, in DIE order).
 * Sections are read whole into the heap by elf.c.
 *
 * Every read goes through a bounded reader: malformed data ends the decode
 * of that part (the unit or table is then treated as absent), never reads
 * past a section, never allocates more than the section size justifies.
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "symbols/dwarf.h"
#include "symbols/elf.h"

/* ---- bounded reader ---- */

typedef struct {
    const uint8_t *p, *end;
    bool bad;   /* a read went past end; every later read returns 0 */
} reader;

static reader reader_at(const btc_bytes *b, uint64_t off, uint64_t size)
{
    reader r = {b->data, b->data, true};
    if (off <= b->size && size <= b->size - off)
        r = (reader){b->data + off, b->data + off + size, false};
    return r;
}

/* From off to the end of the section. */
static reader reader_from(const btc_bytes *b, uint64_t off)
{
    return reader_at(b, off, off < b->size ? b->size - off : 0);
}

static bool take(reader *r, uint64_t n)
{
    if (r->bad || n > (uint64_t)(r->end - r->p)) {
        r->bad = true;
        r->p = r->end;
        return false;
    }
    return true;
}

static uint64_t read_uint(reader *r, int n)
{
    if (!take(r, (uint64_t)n))
        return 0;
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | r->p[i];
    r->p += n;
    return v;
}

static uint8_t read_u8(reader *r) { return (uint8_t)read_uint(r, 1); }

static uint64_t read_uleb(reader *r)
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

static int64_t read_sleb(reader *r)
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

static void skip(reader *r, uint64_t n)
{
    if (take(r, n))
        r->p += n;
}

static const char *read_cstr(reader *r)
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

/* A unit or table header's length; sets *offset_size to 4 or 8 (64-bit DWARF). */
static uint64_t read_initial_length(reader *r, int *offset_size)
{
    uint64_t len = read_uint(r, 4);
    *offset_size = 4;
    if (len == 0xffffffff) {
        *offset_size = 8;
        len = read_uint(r, 8);
    } else if (len >= 0xfffffff0) {
        r->bad = true;   /* reserved values */
    }
    return len;
}

/* A nested reader over the next len bytes, which r then skips. */
static reader sub_reader(reader *r, uint64_t len)
{
    reader s = {r->p, r->p, true};
    if (take(r, len)) {
        s = (reader){r->p, r->p + len, false};
        r->p += len;
    }
    return s;
}

/* ---- growable arrays: capacity bounded by the caller's input size ---- */

static bool grow(void **items, size_t *cap, size_t need, size_t item_size)
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

/* ---- DWARF constants (the few this reader needs) ---- */

enum {
    TAG_subprogram = 0x2e, TAG_inlined_subroutine = 0x1d,

    AT_stmt_list = 0x10, AT_low_pc = 0x11, AT_high_pc = 0x12, AT_name = 0x03, AT_comp_dir = 0x1b,
    AT_abstract_origin = 0x31, AT_specification = 0x47, AT_ranges = 0x55, AT_call_file = 0x58,
    AT_call_line = 0x59, AT_linkage_name = 0x6e, AT_MIPS_linkage_name = 0x2007,
    AT_str_offsets_base = 0x72, AT_addr_base = 0x73, AT_rnglists_base = 0x74,
    AT_GNU_addr_base = 0x2133,

    UT_compile = 1, UT_partial = 3, UT_skeleton = 4, UT_split_compile = 5,
};

enum {
    FORM_addr = 0x01, FORM_block2 = 0x03, FORM_block4 = 0x04, FORM_data2 = 0x05, FORM_data4 = 0x06,
    FORM_data8 = 0x07, FORM_string = 0x08, FORM_block = 0x09, FORM_block1 = 0x0a, FORM_data1 = 0x0b,
    FORM_flag = 0x0c, FORM_sdata = 0x0d, FORM_strp = 0x0e, FORM_udata = 0x0f, FORM_ref_addr = 0x10,
    FORM_ref1 = 0x11, FORM_ref2 = 0x12, FORM_ref4 = 0x13, FORM_ref8 = 0x14, FORM_ref_udata = 0x15,
    FORM_indirect = 0x16, FORM_sec_offset = 0x17, FORM_exprloc = 0x18, FORM_flag_present = 0x19,
    FORM_strx = 0x1a, FORM_addrx = 0x1b, FORM_ref_sup4 = 0x1c, FORM_strp_sup = 0x1d,
    FORM_data16 = 0x1e, FORM_line_strp = 0x1f, FORM_ref_sig8 = 0x20, FORM_implicit_const = 0x21,
    FORM_loclistx = 0x22, FORM_rnglistx = 0x23, FORM_ref_sup8 = 0x24, FORM_strx1 = 0x25,
    FORM_strx2 = 0x26, FORM_strx3 = 0x27, FORM_strx4 = 0x28, FORM_addrx1 = 0x29, FORM_addrx2 = 0x2a,
    FORM_addrx3 = 0x2b, FORM_addrx4 = 0x2c, FORM_GNU_addr_index = 0x1f01,
    FORM_GNU_str_index = 0x1f02, FORM_GNU_ref_alt = 0x1f20, FORM_GNU_strp_alt = 0x1f21,
};

/* ---- sections ---- */

enum {
    SEC_INFO, SEC_ABBREV, SEC_LINE, SEC_STR, SEC_LINE_STR, SEC_STR_OFFSETS, SEC_ADDR,
    SEC_RANGES, SEC_RNGLISTS, SEC_ARANGES, NSECTIONS
};

static const char *const section_names[NSECTIONS] = {
    ".debug_info", ".debug_abbrev", ".debug_line", ".debug_str", ".debug_line_str",
    ".debug_str_offsets", ".debug_addr", ".debug_ranges", ".debug_rnglists", ".debug_aranges",
};

/* ---- per-unit decoded state ---- */

typedef struct {
    uint16_t name, form;
    int64_t implicit;   /* DW_FORM_implicit_const's value, kept in the abbreviation */
} attr_spec;

typedef struct {
    uint64_t code;
    uint16_t tag;
    bool children;
    uint32_t first_spec, nspecs;
} abbrev;

typedef struct {
    uint64_t addr;
    uint32_t file, line;
    bool end_sequence;
} line_row;

/* A function body (subprogram) or an inlined call, with its pc ranges. */
typedef struct {
    uint64_t die;          /* .debug_info offset: the name is looked up only when needed */
    uint32_t subtree_end;  /* index past the last scope nested in this one */
    int32_t parent;        /* enclosing scope, -1 for a subprogram */
    uint32_t first_range, nranges;
    uint32_t call_file, call_line;
    bool inlined;
} scope;

typedef struct {
    uint64_t lo, hi;
    uint32_t scope;
} pc_range;

typedef struct {
    uint64_t offset, end, die_offset, abbrev_offset;
    uint8_t version, addr_size, offset_size, unit_type;

    bool prepared, broken;     /* abbreviations and top-DIE attributes read */
    abbrev *abbrevs;           /* sorted by code */
    size_t nabbrevs;
    attr_spec *specs;
    size_t nspecs;
    uint64_t str_offsets_base, addr_base, rnglists_base, base_address, stmt_list;
    bool has_stmt_list;
    const char *comp_dir;

    bool lines_done;
    line_row *rows;            /* sorted by address */
    size_t nrows;
    char **files;              /* full paths, indexed like DW_AT_call_file / the file register */
    size_t nfiles;

    bool scopes_done;
    scope *scopes;
    size_t nscopes;
    pc_range *ranges;          /* every scope's ranges */
    size_t nranges;
    pc_range *roots;           /* the subprograms' ranges, sorted by lo */
    size_t nroots;
} unit;

struct btc_dwarf {
    btc_elf *elf, *debug;      /* the module, and where its DWARF lives (may be elf) */
    btc_bytes sections[NSECTIONS];
    bool section_tried[NSECTIONS];
    unit *units;               /* by .debug_info offset */
    size_t nunits;
    bool units_scanned;
    pc_range *unit_ranges;     /* address -> unit index (in .scope), sorted by lo */
    size_t nunit_ranges;
    bool unit_ranges_from_dies;
};

static const btc_bytes *section(btc_dwarf *d, int id)
{
    if (!d->section_tried[id]) {
        d->section_tried[id] = true;
        btc_elf_read_section(d->debug, section_names[id], &d->sections[id]);
    }
    return &d->sections[id];
}

/* ---- attribute values ---- */

typedef enum {
    V_NONE, V_CONST, V_SIGNED, V_ADDR, V_ADDRX, V_STRING, V_STRX, V_REF, V_SEC_OFFSET, V_RNGLISTX, V_OTHER
} value_kind;

typedef struct {
    value_kind kind;
    uint64_t u;          /* constant, address, index, offset */
    const char *s;       /* V_STRING */
} attr_value;

/* What the reader needs to know to size a form. */
typedef struct {
    uint8_t version, addr_size, offset_size;
} form_ctx;

static form_ctx unit_ctx(const unit *u) { return (form_ctx){u->version, u->addr_size, u->offset_size}; }

static const char *string_at(btc_dwarf *d, int sec, uint64_t off)
{
    const btc_bytes *b = section(d, sec);
    return off < b->size ? (const char *)b->data + off : NULL;
}

/* Decode one attribute value of `form`; ref forms become absolute
 * .debug_info offsets (unit_offset: where the unit header starts). */
static void read_form(btc_dwarf *d, reader *r, form_ctx c, uint64_t unit_offset, uint64_t form,
                      int64_t implicit, attr_value *v)
{
    *v = (attr_value){V_OTHER, 0, NULL};
    for (int indirections = 0; form == FORM_indirect && indirections < 4; indirections++)
        form = read_uleb(r);
    switch (form) {
    case FORM_addr: v->kind = V_ADDR; v->u = read_uint(r, c.addr_size); return;
    case FORM_data1: case FORM_ref1: case FORM_flag: case FORM_strx1: case FORM_addrx1:
        v->u = read_uint(r, 1); break;
    case FORM_data2: case FORM_ref2: case FORM_strx2: case FORM_addrx2:
        v->u = read_uint(r, 2); break;
    case FORM_strx3: case FORM_addrx3:
        v->u = read_uint(r, 3); break;
    case FORM_data4: case FORM_ref4: case FORM_strx4: case FORM_addrx4: case FORM_ref_sup4:
        v->u = read_uint(r, 4); break;
    case FORM_data8: case FORM_ref8: case FORM_ref_sig8: case FORM_ref_sup8:
        v->u = read_uint(r, 8); break;
    case FORM_data16: skip(r, 16); return;
    case FORM_udata: case FORM_ref_udata: case FORM_strx: case FORM_addrx: case FORM_loclistx:
    case FORM_rnglistx: case FORM_GNU_addr_index: case FORM_GNU_str_index:
        v->u = read_uleb(r); break;
    case FORM_sdata: v->kind = V_SIGNED; v->u = (uint64_t)read_sleb(r); return;
    case FORM_implicit_const: v->kind = V_SIGNED; v->u = (uint64_t)implicit; return;
    case FORM_flag_present: v->kind = V_CONST; v->u = 1; return;
    case FORM_string: v->kind = V_STRING; v->s = read_cstr(r); return;
    case FORM_strp: case FORM_line_strp: case FORM_sec_offset: case FORM_strp_sup:
    case FORM_GNU_ref_alt: case FORM_GNU_strp_alt:
        v->u = read_uint(r, c.offset_size); break;
    case FORM_ref_addr: v->kind = V_REF; v->u = read_uint(r, c.version <= 2 ? c.addr_size : c.offset_size); return;
    case FORM_block1: skip(r, read_uint(r, 1)); return;
    case FORM_block2: skip(r, read_uint(r, 2)); return;
    case FORM_block4: skip(r, read_uint(r, 4)); return;
    case FORM_block: case FORM_exprloc: skip(r, read_uleb(r)); return;
    default: r->bad = true; return;   /* an unknown form has an unknown size */
    }
    switch (form) {
    case FORM_data1: case FORM_data2: case FORM_data4: case FORM_data8: case FORM_udata: case FORM_flag:
        v->kind = V_CONST; break;
    case FORM_ref1: case FORM_ref2: case FORM_ref4: case FORM_ref8: case FORM_ref_udata:
        v->kind = V_REF; v->u += unit_offset; break;
    case FORM_strx: case FORM_strx1: case FORM_strx2: case FORM_strx3: case FORM_strx4: case FORM_GNU_str_index:
        v->kind = V_STRX; break;
    case FORM_addrx: case FORM_addrx1: case FORM_addrx2: case FORM_addrx3: case FORM_addrx4: case FORM_GNU_addr_index:
        v->kind = V_ADDRX; break;
    case FORM_strp: v->kind = V_STRING; v->s = string_at(d, SEC_STR, v->u); break;
    case FORM_line_strp: v->kind = V_STRING; v->s = string_at(d, SEC_LINE_STR, v->u); break;
    case FORM_sec_offset: v->kind = V_SEC_OFFSET; break;
    case FORM_rnglistx: v->kind = V_RNGLISTX; break;
    default: break;   /* supplementary files, type signatures, location lists: unused */
    }
}

/* An entry of a table indexed from a base (.debug_str_offsets, .debug_addr). */
static bool indexed_entry(btc_dwarf *d, int sec, uint64_t base, uint64_t index, int size, uint64_t *out)
{
    if (index > (1ull << 32))
        return false;
    reader r = reader_at(section(d, sec), base + index * (uint64_t)size, (uint64_t)size);
    *out = read_uint(&r, size);
    return !r.bad;
}

static const char *value_string(btc_dwarf *d, const unit *u, const attr_value *v)
{
    uint64_t off;
    if (v->kind == V_STRING)
        return v->s;
    if (v->kind == V_STRX && indexed_entry(d, SEC_STR_OFFSETS, u->str_offsets_base, v->u, u->offset_size, &off))
        return string_at(d, SEC_STR, off);
    return NULL;
}

static bool value_address(btc_dwarf *d, const unit *u, const attr_value *v, uint64_t *addr)
{
    if (v->kind == V_ADDR) {
        *addr = v->u;
        return true;
    }
    return v->kind == V_ADDRX && indexed_entry(d, SEC_ADDR, u->addr_base, v->u, u->addr_size, addr);
}

/* ---- DIEs ---- */

/* The attributes any lookup here needs from one DIE. */
typedef struct {
    uint64_t offset;
    const abbrev *ab;   /* NULL: the null entry that closes a sibling list */
    attr_value name, linkage_name, low_pc, high_pc, ranges, origin, specification, call_file, call_line;
    attr_value stmt_list, comp_dir, str_offsets_base, addr_base, rnglists_base;
} die;

static const abbrev *find_abbrev(const unit *u, uint64_t code)
{
    /* Codes are usually 1..n in order: try the direct slot first. */
    if (code - 1 < u->nabbrevs && u->abbrevs[code - 1].code == code)
        return &u->abbrevs[code - 1];
    size_t lo = 0, hi = u->nabbrevs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (u->abbrevs[mid].code < code)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < u->nabbrevs && u->abbrevs[lo].code == code ? &u->abbrevs[lo] : NULL;
}

static attr_value *interesting_slot(die *e, uint64_t name)
{
    switch (name) {
    case AT_name: return &e->name;
    case AT_linkage_name: case AT_MIPS_linkage_name: return &e->linkage_name;
    case AT_low_pc: return &e->low_pc;
    case AT_high_pc: return &e->high_pc;
    case AT_ranges: return &e->ranges;
    case AT_abstract_origin: return &e->origin;
    case AT_specification: return &e->specification;
    case AT_call_file: return &e->call_file;
    case AT_call_line: return &e->call_line;
    case AT_stmt_list: return &e->stmt_list;
    case AT_comp_dir: return &e->comp_dir;
    case AT_str_offsets_base: return &e->str_offsets_base;
    case AT_addr_base: case AT_GNU_addr_base: return &e->addr_base;
    case AT_rnglists_base: return &e->rnglists_base;
    default: return NULL;
    }
}

/* Read the DIE at r (inside unit u); false on malformed data. */
static bool read_die(btc_dwarf *d, const unit *u, reader *r, die *e)
{
    memset(e, 0, sizeof *e);
    e->offset = (uint64_t)(r->p - section(d, SEC_INFO)->data);
    uint64_t code = read_uleb(r);
    if (code == 0)
        return !r->bad;
    e->ab = find_abbrev(u, code);
    if (!e->ab)
        return false;
    attr_value scratch;
    for (uint32_t i = 0; i < e->ab->nspecs && !r->bad; i++) {
        const attr_spec *s = &u->specs[e->ab->first_spec + i];
        attr_value *slot = interesting_slot(e, s->name);
        read_form(d, r, unit_ctx(u), u->offset, s->form, s->implicit, slot ? slot : &scratch);
    }
    return !r->bad;
}

/* ---- units ---- */

/* Walk the unit headers of .debug_info once (cheap: a hop per unit). */
static void scan_units(btc_dwarf *d)
{
    const btc_bytes *info = section(d, SEC_INFO);
    size_t cap = 0;
    reader r = reader_at(info, 0, info->size);
    while (!r.bad && r.p < r.end) {
        uint64_t offset = (uint64_t)(r.p - info->data);
        int offset_size;
        uint64_t len = read_initial_length(&r, &offset_size);
        reader h = sub_reader(&r, len);
        unit u = {.offset = offset, .offset_size = (uint8_t)offset_size};
        u.version = (uint8_t)read_uint(&h, 2);
        if (u.version >= 5) {
            u.unit_type = read_u8(&h);
            u.addr_size = read_u8(&h);
            u.abbrev_offset = read_uint(&h, offset_size);
            if (u.unit_type == UT_skeleton || u.unit_type == UT_split_compile)
                skip(&h, 8);   /* dwo id */
            else if (u.unit_type != UT_compile && u.unit_type != UT_partial)
                continue;      /* type units hold no code */
        } else {
            u.unit_type = UT_compile;
            u.abbrev_offset = read_uint(&h, offset_size);
            u.addr_size = read_u8(&h);
        }
        if (h.bad || u.version < 2 || u.version > 5 || (u.addr_size != 4 && u.addr_size != 8))
            continue;
        u.die_offset = (uint64_t)(h.p - info->data);
        u.end = (uint64_t)(h.end - info->data);
        if (!PUSH(d->units, d->nunits, cap, u))
            return;
    }
}

static unit *unit_containing(btc_dwarf *d, uint64_t info_offset)
{
    size_t lo = 0, hi = d->nunits;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->units[mid].end <= info_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < d->nunits && d->units[lo].offset <= info_offset ? &d->units[lo] : NULL;
}

static int compare_abbrev_codes(const void *a, const void *b)
{
    uint64_t x = ((const abbrev *)a)->code, y = ((const abbrev *)b)->code;
    return x < y ? -1 : x > y;
}

static bool read_abbrevs(btc_dwarf *d, unit *u)
{
    reader r = reader_from(section(d, SEC_ABBREV), u->abbrev_offset);
    size_t cap = 0, spec_cap = 0;
    for (;;) {
        abbrev a = {.code = read_uleb(&r)};
        if (a.code == 0 || r.bad)
            break;
        a.tag = (uint16_t)read_uleb(&r);
        a.children = read_u8(&r) != 0;
        a.first_spec = (uint32_t)u->nspecs;
        for (;;) {
            attr_spec s = {.name = (uint16_t)read_uleb(&r), .form = (uint16_t)read_uleb(&r)};
            if (s.form == FORM_implicit_const)
                s.implicit = read_sleb(&r);
            if ((s.name == 0 && s.form == 0) || r.bad)
                break;
            if (!PUSH(u->specs, u->nspecs, spec_cap, s))
                return false;
        }
        a.nspecs = (uint32_t)u->nspecs - a.first_spec;
        if (!PUSH(u->abbrevs, u->nabbrevs, cap, a))
            return false;
    }
    if (r.bad)
        return false;
    if (u->nabbrevs > 1)
        qsort(u->abbrevs, u->nabbrevs, sizeof *u->abbrevs, compare_abbrev_codes);
    return true;
}

static uint64_t const_or(const attr_value *v, uint64_t fallback)
{
    return v->kind == V_CONST || v->kind == V_SEC_OFFSET || v->kind == V_SIGNED ? v->u : fallback;
}

/* Abbreviations and the top DIE's unit-wide attributes, once. */
static bool prepare_unit(btc_dwarf *d, unit *u)
{
    if (u->prepared)
        return !u->broken;
    u->prepared = true;
    u->broken = true;
    die top;
    reader r = reader_at(section(d, SEC_INFO), u->die_offset, u->end - u->die_offset);
    if (!read_abbrevs(d, u) || !read_die(d, u, &r, &top) || !top.ab)
        return false;
    /* DWARF 5 defaults: the bases point past the tables' headers. */
    u->str_offsets_base = const_or(&top.str_offsets_base, u->offset_size == 8 ? 16 : 8);
    u->addr_base = const_or(&top.addr_base, u->offset_size == 8 ? 16 : 8);
    u->rnglists_base = const_or(&top.rnglists_base, 0);
    u->has_stmt_list = top.stmt_list.kind == V_SEC_OFFSET || top.stmt_list.kind == V_CONST;
    u->stmt_list = top.stmt_list.u;
    u->comp_dir = value_string(d, u, &top.comp_dir);
    if (!value_address(d, u, &top.low_pc, &u->base_address))
        u->base_address = 0;
    u->broken = false;
    return true;
}

/* ---- address ranges of a DIE ---- */

typedef struct {
    pc_range *items;
    size_t count, cap;
    uint32_t scope;
} range_list;

/* Ranges starting at 0 (or at the tombstone) belong to code the linker
 * discarded; keeping them would claim the first bytes of the file. */
static bool add_range(range_list *l, uint64_t lo, uint64_t hi)
{
    if (lo == 0 || lo >= hi || hi == ~0ull)
        return true;
    return PUSH(l->items, l->count, l->cap, ((pc_range){lo, hi, l->scope}));
}

/* Bound on entries in one range list: real lists have a handful. */
#define MAX_RANGE_ENTRIES 65536

static void read_ranges_v4(btc_dwarf *d, const unit *u, uint64_t off, range_list *l)
{
    reader r = reader_from(section(d, SEC_RANGES), off);
    uint64_t base = u->base_address, max = u->addr_size == 4 ? 0xffffffffull : ~0ull;
    for (int n = 0; n < MAX_RANGE_ENTRIES && !r.bad; n++) {
        uint64_t a = read_uint(&r, u->addr_size), b = read_uint(&r, u->addr_size);
        if (r.bad || (a == 0 && b == 0))
            return;
        if (a == max)
            base = b;
        else if (!add_range(l, base + a, base + b))
            return;
    }
}

enum { RLE_end = 0, RLE_base_addressx, RLE_startx_endx, RLE_startx_length, RLE_offset_pair,
       RLE_base_address, RLE_start_end, RLE_start_length };

static void read_rnglist(btc_dwarf *d, const unit *u, uint64_t off, range_list *l)
{
    reader r = reader_from(section(d, SEC_RNGLISTS), off);
    uint64_t base = u->base_address;
    for (int n = 0; n < MAX_RANGE_ENTRIES && !r.bad; n++) {
        uint64_t a = 0, b = 0;
        bool ok = true;
        attr_value x = {V_ADDRX, 0, NULL}, y = {V_ADDRX, 0, NULL};
        switch (read_u8(&r)) {
        case RLE_end: return;
        case RLE_base_addressx:
            x.u = read_uleb(&r);
            if (!value_address(d, u, &x, &base))
                return;
            continue;
        case RLE_startx_endx:
            x.u = read_uleb(&r);
            y.u = read_uleb(&r);
            ok = value_address(d, u, &x, &a) && value_address(d, u, &y, &b);
            break;
        case RLE_startx_length:
            x.u = read_uleb(&r);
            ok = value_address(d, u, &x, &a);
            b = a + read_uleb(&r);
            break;
        case RLE_offset_pair:
            a = base + read_uleb(&r);
            b = base + read_uleb(&r);
            break;
        case RLE_base_address: base = read_uint(&r, u->addr_size); continue;
        case RLE_start_end:
            a = read_uint(&r, u->addr_size);
            b = read_uint(&r, u->addr_size);
            break;
        case RLE_start_length:
            a = read_uint(&r, u->addr_size);
            b = a + read_uleb(&r);
            break;
        default: return;
        }
        if (!ok || r.bad || !add_range(l, a, b))
            return;
    }
}

/* Every [lo, hi) of a DIE: low_pc/high_pc, or DW_AT_ranges. */
static void die_ranges(btc_dwarf *d, const unit *u, const die *e, range_list *l)
{
    uint64_t lo, hi;
    if (value_address(d, u, &e->low_pc, &lo)) {
        if (value_address(d, u, &e->high_pc, &hi))
            add_range(l, lo, hi);
        else if (e->high_pc.kind == V_CONST || e->high_pc.kind == V_SIGNED)
            add_range(l, lo, lo + e->high_pc.u);   /* DWARF 4+: high_pc is a length */
        return;
    }
    if (e->ranges.kind == V_RNGLISTX) {
        uint64_t off;
        if (indexed_entry(d, SEC_RNGLISTS, u->rnglists_base, e->ranges.u, u->offset_size, &off))
            read_rnglist(d, u, u->rnglists_base + off, l);
    } else if (e->ranges.kind == V_SEC_OFFSET || e->ranges.kind == V_CONST) {
        if (u->version >= 5)
            read_rnglist(d, u, e->ranges.u, l);
        else
            read_ranges_v4(d, u, e->ranges.u, l);
    }
}

/* ---- address -> unit ---- */

static int compare_ranges(const void *a, const void *b)
{
    const pc_range *x = a, *y = b;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    return x->hi < y->hi ? -1 : x->hi > y->hi;
}

/* .debug_aranges: the producer's own address -> unit index. */
static void unit_ranges_from_aranges(btc_dwarf *d, range_list *l)
{
    const btc_bytes *sec = section(d, SEC_ARANGES);
    reader r = reader_at(sec, 0, sec->size);
    while (!r.bad && r.p < r.end) {
        const uint8_t *set_start = r.p;
        int offset_size;
        reader h = sub_reader(&r, read_initial_length(&r, &offset_size));
        uint16_t version = (uint16_t)read_uint(&h, 2);
        unit *u = unit_containing(d, read_uint(&h, offset_size));
        uint8_t addr_size = read_u8(&h), seg_size = read_u8(&h);
        if (h.bad || version != 2 || !u || (addr_size != 4 && addr_size != 8) || seg_size != 0)
            continue;
        /* Tuples start at a multiple of twice the address size. */
        uint64_t used = (uint64_t)(h.p - set_start), align = 2u * addr_size;
        skip(&h, (align - used % align) % align);
        l->scope = (uint32_t)(u - d->units);
        while (!h.bad) {
            uint64_t lo = read_uint(&h, addr_size), len = read_uint(&h, addr_size);
            if (h.bad || (lo == 0 && len == 0))
                break;
            add_range(l, lo, lo + len);
        }
    }
}

/* Without .debug_aranges: each unit's top DIE says what it covers. */
static void unit_ranges_from_dies(btc_dwarf *d, range_list *l)
{
    for (size_t i = 0; i < d->nunits; i++) {
        unit *u = &d->units[i];
        die top;
        reader r = reader_at(section(d, SEC_INFO), u->die_offset, u->end - u->die_offset);
        if (!prepare_unit(d, u) || !read_die(d, u, &r, &top) || !top.ab)
            continue;
        l->scope = (uint32_t)i;
        die_ranges(d, u, &top, l);
    }
}

static void build_unit_ranges(btc_dwarf *d, bool from_dies)
{
    range_list l = {0};
    if (from_dies)
        unit_ranges_from_dies(d, &l);
    else
        unit_ranges_from_aranges(d, &l);
    if (l.count > 1)
        qsort(l.items, l.count, sizeof *l.items, compare_ranges);
    free(d->unit_ranges);
    d->unit_ranges = l.items;
    d->nunit_ranges = l.count;
    d->unit_ranges_from_dies = from_dies;
}

/* How many ranges before the last one starting at or below addr may still
 * cover it (overlapping or nested ranges): real data overlaps rarely. */
#define OVERLAP_LOOKBACK 16

static const pc_range *range_covering(const pc_range *items, size_t n, uint64_t addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (items[mid].lo <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = lo; k > 0 && k + OVERLAP_LOOKBACK > lo; k--)
        if (addr < items[k - 1].hi)
            return &items[k - 1];
    return NULL;
}

static unit *unit_for_address(btc_dwarf *d, uint64_t addr)
{
    if (!d->units_scanned) {
        d->units_scanned = true;
        scan_units(d);
        build_unit_ranges(d, section(d, SEC_ARANGES)->size == 0);
    }
    const pc_range *r = range_covering(d->unit_ranges, d->nunit_ranges, addr);
    /* Some producers leave units out of .debug_aranges: on a miss, ask the
     * units themselves (once). */
    if (!r && !d->unit_ranges_from_dies) {
        build_unit_ranges(d, true);
        r = range_covering(d->unit_ranges, d->nunit_ranges, addr);
    }
    return r && prepare_unit(d, &d->units[r->scope]) ? &d->units[r->scope] : NULL;
}

/* ---- line programs ---- */

typedef struct {
    uint8_t version, offset_size, addr_size, min_inst, max_ops, default_is_stmt, line_range, opcode_base;
    int8_t line_base;
    const uint8_t *standard_lengths;
} line_header;

static bool is_absolute(const char *p) { return p && p[0] == '/'; }

/* dir/name resolved the way binutils prints it: no normalisation, relative
 * directories under the unit's compilation directory. */
static char *join_path(const char *comp_dir, const char *dir, const char *name)
{
    if (!name)
        return NULL;
    const char *parts[3] = {NULL, NULL, name};
    if (!is_absolute(name) && dir) {
        parts[1] = dir;
        if (!is_absolute(dir) && comp_dir)
            parts[0] = comp_dir;
    }
    size_t len = 1;
    for (int i = 0; i < 3; i++)
        len += parts[i] ? strlen(parts[i]) + 1 : 0;
    char *path = malloc(len), *p = path;
    if (!path)
        return NULL;
    for (int i = 0; i < 3; i++) {
        if (!parts[i])
            continue;
        size_t n = strlen(parts[i]);
        memcpy(p, parts[i], n);
        p += n;
        *p++ = i < 2 ? '/' : 0;
    }
    return path;
}

enum { LNCT_path = 1, LNCT_directory_index = 2 };

/* Bound on directory/file entries and entry formats in one header. */
#define MAX_LINE_ENTRIES (1 << 20)
#define MAX_ENTRY_FORMATS 32

/* A DWARF 5 entry list (directories or files): formats, then entries;
 * each entry's path and directory index go to the callback's arrays. */
static bool read_v5_entries(btc_dwarf *d, reader *r, const unit *u, form_ctx c, const char ***paths,
                            uint64_t **dirs, size_t *count)
{
    uint8_t nformats = read_u8(r);
    uint64_t types[MAX_ENTRY_FORMATS], forms[MAX_ENTRY_FORMATS];
    if (nformats > MAX_ENTRY_FORMATS)
        return false;
    for (int i = 0; i < nformats; i++) {
        types[i] = read_uleb(r);
        forms[i] = read_uleb(r);
    }
    uint64_t n = read_uleb(r);
    if (r->bad || n > MAX_LINE_ENTRIES || n > (uint64_t)(r->end - r->p))
        return false;
    *paths = calloc(n + 1, sizeof **paths);
    *dirs = calloc(n + 1, sizeof **dirs);
    if (!*paths || !*dirs)
        return false;
    for (uint64_t k = 0; k < n && !r->bad; k++) {
        for (int i = 0; i < nformats; i++) {
            attr_value v;
            read_form(d, r, c, 0, forms[i], 0, &v);
            if (types[i] == LNCT_path)
                (*paths)[k] = value_string(d, u, &v);
            else if (types[i] == LNCT_directory_index)
                (*dirs)[k] = v.u;
        }
    }
    *count = (size_t)n;
    return !r->bad;
}

/* DWARF 2-4: NUL-terminated lists; directory 0 is the compilation directory
 * and file numbers start at 1, so slot 0 of each array stays empty. */
static bool read_v4_entries(reader *r, const char ***paths, uint64_t **dirs, size_t *count, bool files)
{
    size_t cap = 0, dir_cap = 0, ndirs = 0;
    *paths = NULL;
    *dirs = NULL;
    *count = 0;
    const char *name = NULL;
    uint64_t dir = 0;
    while (*count <= MAX_LINE_ENTRIES) {
        if (!PUSH(*paths, *count, cap, name) || !PUSH(*dirs, ndirs, dir_cap, dir))
            return false;
        name = read_cstr(r);
        if (!name || !*name)
            break;
        if (files) {
            dir = read_uleb(r);
            read_uleb(r);   /* mtime */
            read_uleb(r);   /* length */
        }
    }
    return !r->bad;
}

static bool read_file_table(btc_dwarf *d, unit *u, reader *r, const line_header *h)
{
    const char **dir_paths = NULL, **file_paths = NULL;
    uint64_t *dir_unused = NULL, *file_dirs = NULL;
    size_t ndirs = 0, nfiles = 0;
    form_ctx c = {h->version, h->addr_size, h->offset_size};
    bool ok = h->version >= 5
                  ? read_v5_entries(d, r, u, c, &dir_paths, &dir_unused, &ndirs) &&
                        read_v5_entries(d, r, u, c, &file_paths, &file_dirs, &nfiles)
                  : read_v4_entries(r, &dir_paths, &dir_unused, &ndirs, false) &&
                        read_v4_entries(r, &file_paths, &file_dirs, &nfiles, true);
    if (ok && h->version < 5 && ndirs > 0)
        dir_paths[0] = u->comp_dir;
    if (ok)
        u->files = calloc(nfiles ? nfiles : 1, sizeof *u->files);
    for (size_t i = 0; ok && u->files && i < nfiles; i++) {
        const char *dir = file_dirs[i] < ndirs ? dir_paths[file_dirs[i]] : NULL;
        u->files[i] = join_path(u->comp_dir, dir, file_paths[i]);
    }
    if (u->files)
        u->nfiles = nfiles;
    free(dir_paths);
    free(dir_unused);
    free(file_paths);
    free(file_dirs);
    return ok && u->files;
}

static bool read_line_header(reader *r, const unit *u, line_header *h, reader *program)
{
    int offset_size;
    uint64_t len = read_initial_length(r, &offset_size);
    *r = sub_reader(r, len);
    h->offset_size = (uint8_t)offset_size;
    h->version = (uint8_t)read_uint(r, 2);
    h->addr_size = u->addr_size;
    if (h->version >= 5) {
        h->addr_size = read_u8(r);
        read_u8(r);   /* segment selector size */
    }
    uint64_t header_len = read_uint(r, offset_size);
    *program = *r;
    skip(program, header_len);   /* the program starts after the header */
    h->min_inst = read_u8(r);
    h->max_ops = h->version >= 4 ? read_u8(r) : 1;
    h->default_is_stmt = read_u8(r);
    h->line_base = (int8_t)read_u8(r);
    h->line_range = read_u8(r);
    h->opcode_base = read_u8(r);
    h->standard_lengths = r->p;
    skip(r, h->opcode_base ? h->opcode_base - 1u : 0);
    return !r->bad && !program->bad && h->version >= 2 && h->version <= 5 && h->line_range != 0 &&
           h->max_ops != 0 && h->opcode_base != 0 && (h->addr_size == 4 || h->addr_size == 8);
}

typedef struct {
    uint64_t addr, file, line;
    uint64_t op_index;
} line_state;

typedef struct {
    line_row *rows;
    size_t count, cap;
    size_t sequence_start;
} row_list;

/* binutils keeps only the last row of several at one address in a sequence
 * (PR ld/4986); doing the same makes addr2line our exact oracle. */
static bool emit_row(row_list *l, const line_state *s, bool end_sequence)
{
    line_row row = {s->addr, (uint32_t)s->file, (uint32_t)s->line, end_sequence};
    if (l->count > l->sequence_start && l->rows[l->count - 1].addr == s->addr && !end_sequence) {
        l->rows[l->count - 1] = row;
        return true;
    }
    if (!PUSH(l->rows, l->count, l->cap, row))
        return false;
    if (end_sequence) {
        /* A sequence at address 0 is code the linker discarded. */
        if (l->rows[l->sequence_start].addr == 0)
            l->count = l->sequence_start;
        l->sequence_start = l->count;
    }
    return true;
}

static void advance(line_state *s, const line_header *h, uint64_t operation_advance)
{
    if (h->max_ops == 1) {
        s->addr += h->min_inst * operation_advance;
        return;
    }
    s->addr += h->min_inst * ((s->op_index + operation_advance) / h->max_ops);
    s->op_index = (s->op_index + operation_advance) % h->max_ops;
}

enum { LNS_copy = 1, LNS_advance_pc, LNS_advance_line, LNS_set_file, LNS_set_column, LNS_negate_stmt,
       LNS_set_basic_block, LNS_const_add_pc, LNS_fixed_advance_pc };
enum { LNE_end_sequence = 1, LNE_set_address = 2 };

static bool run_extended_op(reader *r, line_state *s, row_list *rows)
{
    reader op = sub_reader(r, read_uleb(r));
    switch (read_u8(&op)) {
    case LNE_end_sequence:
        if (!emit_row(rows, s, true))
            return false;
        *s = (line_state){0, 1, 1, 0};
        return true;
    case LNE_set_address: {
        uint64_t size = (uint64_t)(op.end - op.p);
        if (size == 4 || size == 8)
            s->addr = read_uint(&op, (int)size);
        s->op_index = 0;
        return true;
    }
    default:
        return true;   /* define_file, set_discriminator, vendor ops: nothing we keep */
    }
}

static bool run_line_program(reader *r, const line_header *h, row_list *rows)
{
    line_state s = {0, 1, 1, 0};
    while (!r->bad && r->p < r->end) {
        uint8_t op = read_u8(r);
        if (op >= h->opcode_base) {
            unsigned adjusted = op - h->opcode_base;
            advance(&s, h, adjusted / h->line_range);
            s.line += (uint64_t)(int64_t)(h->line_base + (int)(adjusted % h->line_range));
            if (!emit_row(rows, &s, false))
                return false;
            continue;
        }
        switch (op) {
        case 0: if (!run_extended_op(r, &s, rows)) return false; break;
        case LNS_copy: if (!emit_row(rows, &s, false)) return false; break;
        case LNS_advance_pc: advance(&s, h, read_uleb(r)); break;
        case LNS_advance_line: s.line += (uint64_t)read_sleb(r); break;
        case LNS_set_file: s.file = read_uleb(r); break;
        case LNS_const_add_pc: advance(&s, h, (255u - h->opcode_base) / h->line_range); break;
        case LNS_fixed_advance_pc: s.addr += read_uint(r, 2); s.op_index = 0; break;
        default:
            /* Skip the operands the header declares for this opcode. */
            for (unsigned k = 0; k < h->standard_lengths[op - 1]; k++)
                read_uleb(r);
        }
    }
    return true;
}

static int compare_rows(const void *a, const void *b)
{
    const line_row *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    /* A sequence ending where the next begins: the end comes first, so a
     * lookup at that address lands on the new sequence's row. */
    return (int)y->end_sequence - (int)x->end_sequence;
}

static void decode_lines(btc_dwarf *d, unit *u)
{
    u->lines_done = true;
    if (!u->has_stmt_list)
        return;
    reader r = reader_from(section(d, SEC_LINE), u->stmt_list);
    reader program;
    line_header h;
    if (!read_line_header(&r, u, &h, &program) || !read_file_table(d, u, &r, &h))
        return;
    row_list rows = {0};
    if (!run_line_program(&program, &h, &rows)) {
        free(rows.rows);
        return;
    }
    /* Sequences come in any order; rows within one are already ascending,
     * so a stable order only matters for the tie rule above. */
    if (rows.count > 1)
        qsort(rows.rows, rows.count, sizeof *rows.rows, compare_rows);
    u->rows = rows.rows;
    u->nrows = rows.count;
}

static const line_row *row_for(const unit *u, uint64_t addr)
{
    size_t lo = 0, hi = u->nrows;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (u->rows[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && !u->rows[lo - 1].end_sequence ? &u->rows[lo - 1] : NULL;
}

static const char *file_name(const unit *u, uint64_t index)
{
    return index < u->nfiles ? u->files[index] : NULL;
}

/* ---- function scopes ---- */

/* Deeper DIE nesting than this is treated as corrupt. */
#define MAX_DIE_DEPTH 256

typedef struct {
    scope *items;
    size_t count, cap;
    range_list ranges;
} scope_list;

static bool add_scope(btc_dwarf *d, const unit *u, const die *e, int32_t parent, scope_list *l)
{
    size_t first = l->ranges.count;
    l->ranges.scope = (uint32_t)l->count;
    die_ranges(d, u, e, &l->ranges);
    if (l->ranges.count == first)
        return false;   /* no code: an abstract instance or a declaration */
    scope s = {
        .die = e->offset,
        .subtree_end = (uint32_t)l->count + 1,
        .parent = parent,
        .first_range = (uint32_t)first,
        .nranges = (uint32_t)(l->ranges.count - first),
        .call_file = (uint32_t)const_or(&e->call_file, 0),
        .call_line = (uint32_t)const_or(&e->call_line, 0),
        .inlined = e->ab->tag == TAG_inlined_subroutine,
    };
    return PUSH(l->items, l->count, l->cap, s);
}

/* One pass over the unit's DIEs, keeping subprograms and inlined calls
 * that have code, each with the index of its enclosing scope.  Scopes are
 * stored in DIE order, so a scope's descendants directly follow it, up to
 * its subtree_end (set when its children's list closes). */
static void collect_scopes(btc_dwarf *d, unit *u, scope_list *l)
{
    int32_t enclosing[MAX_DIE_DEPTH];  /* per nesting level: the nearest scope around it */
    int32_t opened[MAX_DIE_DEPTH];     /* per nesting level: the scope whose children it lists */
    int depth = 0;
    enclosing[0] = opened[0] = -1;
    reader r = reader_at(section(d, SEC_INFO), u->die_offset, u->end - u->die_offset);
    die e;
    while (!r.bad && r.p < r.end && read_die(d, u, &r, &e)) {
        if (!e.ab) {   /* end of a sibling list */
            if (opened[depth] >= 0)
                l->items[opened[depth]].subtree_end = (uint32_t)l->count;
            if (--depth < 0)
                return;
            continue;
        }
        int32_t recorded = -1;
        uint16_t tag = e.ab->tag;
        /* A subprogram is a physical function even when nested in another. */
        if ((tag == TAG_subprogram || tag == TAG_inlined_subroutine) &&
            add_scope(d, u, &e, tag == TAG_subprogram ? -1 : enclosing[depth], l))
            recorded = (int32_t)l->count - 1;
        if (e.ab->children) {
            if (++depth >= MAX_DIE_DEPTH)
                break;
            enclosing[depth] = recorded >= 0 ? recorded : enclosing[depth - 1];
            opened[depth] = recorded;
        }
    }
    /* Truncated or corrupt: close what is still open. */
    for (; depth > 0; depth--)
        if (depth < MAX_DIE_DEPTH && opened[depth] >= 0)
            l->items[opened[depth]].subtree_end = (uint32_t)l->count;
}

static void decode_scopes(btc_dwarf *d, unit *u)
{
    u->scopes_done = true;
    scope_list l = {0};
    collect_scopes(d, u, &l);
    size_t nroots = 0;
    for (size_t i = 0; i < l.ranges.count; i++)
        nroots += l.items[l.ranges.items[i].scope].parent < 0;
    pc_range *roots = malloc((nroots ? nroots : 1) * sizeof *roots);
    if (!roots) {
        free(l.items);
        free(l.ranges.items);
        return;
    }
    nroots = 0;
    for (size_t i = 0; i < l.ranges.count; i++)
        if (l.items[l.ranges.items[i].scope].parent < 0)
            roots[nroots++] = l.ranges.items[i];
    if (nroots > 1)
        qsort(roots, nroots, sizeof *roots, compare_ranges);
    u->scopes = l.items;
    u->nscopes = l.count;
    u->ranges = l.ranges.items;
    u->nranges = l.ranges.count;
    u->roots = roots;
    u->nroots = nroots;
}

static bool scope_covers(const unit *u, const scope *s, uint64_t addr)
{
    for (uint32_t k = 0; k < s->nranges; k++) {
        const pc_range *r = &u->ranges[s->first_range + k];
        if (addr >= r->lo && addr < r->hi)
            return true;
    }
    return false;
}

/* The scopes containing addr, outermost (the subprogram) first; returns
 * how many.  Descends only into inlined calls that cover addr, skipping
 * every other subtree whole. */
static int scope_chain(const unit *u, uint64_t addr, uint32_t *chain, int max)
{
    const pc_range *root = range_covering(u->roots, u->nroots, addr);
    if (!root || max < 1)
        return 0;
    int n = 0;
    uint32_t current = root->scope;
    chain[n++] = current;
    for (uint32_t i = current + 1; i < u->scopes[current].subtree_end && n < max;) {
        const scope *s = &u->scopes[i];
        if (s->inlined && s->parent == (int32_t)current && scope_covers(u, s, addr)) {
            current = i;
            chain[n++] = i;
            i++;
        } else {
            i = s->subtree_end > i ? s->subtree_end : i + 1;
        }
    }
    return n;
}

/* Bound on abstract_origin / specification hops: real chains have 2-3. */
#define MAX_NAME_HOPS 8

/* A scope's name: the linkage (mangled) name when some DIE in its
 * origin/specification chain has one, else the first plain name. */
static const char *scope_name(btc_dwarf *d, uint64_t die_offset)
{
    const char *plain = NULL;
    for (int hop = 0; hop < MAX_NAME_HOPS; hop++) {
        unit *u = unit_containing(d, die_offset);
        if (!u || !prepare_unit(d, u))
            break;
        die e;
        reader r = reader_at(section(d, SEC_INFO), die_offset, u->end - die_offset);
        if (!read_die(d, u, &r, &e) || !e.ab)
            break;
        const char *linkage = value_string(d, u, &e.linkage_name);
        if (linkage)
            return linkage;
        if (!plain)
            plain = value_string(d, u, &e.name);
        const attr_value *next = e.origin.kind == V_REF ? &e.origin : &e.specification;
        if (next->kind != V_REF)
            break;
        die_offset = next->u;
    }
    return plain;
}

/* ---- the engine's interface ---- */

btc_dwarf *btc_dwarf_open(const char *path, const char *debug_root)
{
    btc_dwarf *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->elf = btc_elf_open(path);
    if (!d->elf) {
        free(d);
        return NULL;
    }
    d->debug = d->elf;
    if (!btc_elf_has_section(d->elf, ".debug_info") && !btc_elf_has_section(d->elf, ".zdebug_info")) {
        btc_elf *separate = btc_elf_open_debug_file(d->elf, path, debug_root);
        if (separate)
            d->debug = separate;
    }
    return d;
}

static void free_unit(unit *u)
{
    free(u->abbrevs);
    free(u->specs);
    free(u->rows);
    for (size_t i = 0; i < u->nfiles; i++)
        free(u->files[i]);
    free(u->files);
    free(u->scopes);
    free(u->ranges);
    free(u->roots);
}

void btc_dwarf_close(btc_dwarf *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->nunits; i++)
        free_unit(&d->units[i]);
    free(d->units);
    free(d->unit_ranges);
    for (int i = 0; i < NSECTIONS; i++)
        btc_bytes_free(&d->sections[i]);
    if (d->debug != d->elf)
        btc_elf_close(d->debug);
    btc_elf_close(d->elf);
    free(d);
}

/* Deepest inline nesting reported. */
#define MAX_INLINE_DEPTH 64

/* The symbol table's name for vaddr (the debug file's table is the fuller
 * one when the module itself was stripped). */
static const char *symbol_name(btc_dwarf *d, uint64_t vaddr)
{
    uintptr_t start;
    const char *name = d->debug != d->elf ? btc_elf_symbolize(d->debug, (uintptr_t)vaddr, &start) : NULL;
    return name ? name : btc_elf_symbolize(d->elf, (uintptr_t)vaddr, &start);
}

/* No DWARF for vaddr: one frame named from the symbol table, no file. */
static int symbol_only(btc_dwarf *d, uint64_t vaddr, btc_srcframe *out)
{
    out[0] = (btc_srcframe){symbol_name(d, vaddr), NULL, 0};
    return out[0].function != NULL;
}

int btc_dwarf_lookup(btc_dwarf *d, uint64_t vaddr, btc_srcframe *out, int max)
{
    if (!d || max < 1)
        return 0;
    unit *u = unit_for_address(d, vaddr);
    if (!u)
        return symbol_only(d, vaddr, out);
    if (!u->lines_done)
        decode_lines(d, u);
    if (!u->scopes_done)
        decode_scopes(d, u);
    uint32_t chain[MAX_INLINE_DEPTH];
    int depth = scope_chain(u, vaddr, chain, MAX_INLINE_DEPTH);
    const line_row *row = row_for(u, vaddr);
    if (depth == 0 && !row)
        return symbol_only(d, vaddr, out);
    /* Innermost first: its location is the line table's; each enclosing
     * level is where the level inside it was inlined (its call site). */
    out[0].file = row ? file_name(u, row->file) : NULL;
    out[0].line = row ? (int)row->line : 0;
    if (depth == 0) {   /* a line but no function DIE (assembly, for one) */
        out[0].function = symbol_name(d, vaddr);
        return 1;
    }
    int n = 0;
    for (int k = depth - 1; k >= 0 && n < max; k--, n++) {
        const scope *s = &u->scopes[chain[k]];
        out[n].function = scope_name(d, s->die);
        if (n > 0) {
            const scope *inner = &u->scopes[chain[k + 1]];
            out[n].file = file_name(u, inner->call_file);
            out[n].line = (int)inner->call_line;
        }
    }
    return n;
}

static size_t unit_memory(const unit *u)
{
    size_t n = u->nabbrevs * sizeof *u->abbrevs + u->nspecs * sizeof *u->specs + u->nrows * sizeof *u->rows +
               u->nscopes * sizeof *u->scopes + u->nranges * sizeof *u->ranges + u->nroots * sizeof *u->roots;
    for (size_t i = 0; i < u->nfiles; i++)
        n += sizeof(char *) + (u->files[i] ? strlen(u->files[i]) + 1 : 0);
    return n;
}

size_t btc_dwarf_memory(const btc_dwarf *d)
{
    if (!d)
        return 0;
    size_t n = sizeof *d + d->nunits * sizeof *d->units + d->nunit_ranges * sizeof *d->unit_ranges;
    for (int i = 0; i < NSECTIONS; i++)
        n += d->sections[i].size;
    for (size_t i = 0; i < d->nunits; i++)
        n += unit_memory(&d->units[i]);
    return n;
}
