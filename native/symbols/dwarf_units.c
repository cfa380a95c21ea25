/* Compile units: their headers, abbreviations and top DIEs, a DIE's pc
 * ranges, and the table from an address to its unit (dwarf_internal.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symbols/dwarf_internal.h"
#include "common/search.h"

/* ---- units ---- */

/* The header of the unit at .debug_info offset `at`, from r (starting
 * there); *next: where the following unit starts.  False for a unit not
 * kept (type units hold no code; unknown versions); r->bad when the walk
 * cannot go on. */
static bool read_unit_header(reader *r, uint64_t at, unit *u, uint64_t *next)
{
    const uint8_t *start = r->p;
    int offset_size;
    uint64_t len = read_initial_length(r, &offset_size);
    uint64_t body = at + (uint64_t)(r->p - start);
    if (len > UINT64_MAX - body)
        r->bad = true;
    *next = body + len;
    *u = (unit){.offset = at, .end = body + len, .offset_size = (uint8_t)offset_size};
    u->version = (uint8_t)read_uint(r, 2);
    if (u->version >= 5) {
        u->unit_type = read_u8(r);
        u->addr_size = read_u8(r);
        u->abbrev_offset = read_uint(r, offset_size);
        if (u->unit_type == UT_skeleton || u->unit_type == UT_split_compile)
            skip(r, 8);   /* dwo id */
        else if (u->unit_type != UT_compile && u->unit_type != UT_partial)
            return false;
    } else {
        u->unit_type = UT_compile;
        u->abbrev_offset = read_uint(r, offset_size);
        u->addr_size = read_u8(r);
    }
    u->die_offset = at + (uint64_t)(r->p - start);
    return !r->bad && u->version >= 2 && u->version <= 5 && (u->addr_size == 4 || u->addr_size == 8) &&
           u->die_offset <= u->end;
}

/* A header is at most this long (64-bit DWARF 5 skeleton). */
#define UNIT_HEADER_MAX 32

/* Walk the unit headers of .debug_info once, a hop per unit: a plain
 * section is read a header at a time (never whole); a compressed one is
 * inflated once for this walk, recording its access points. */
static void scan_units(btc_dwarf *d)
{
    btc_bytes whole = {0};
    bool compressed = btc_elf_section_compressed(d->debug, ".debug_info");
    if (compressed && !btc_elf_read_section_indexed(d->debug, ".debug_info", &whole, &d->info_index))
        return;
    size_t cap = 0;
    for (uint64_t at = 0, next;; at = next) {
        btc_bytes header = {0};
        if (!compressed && !btc_elf_read_section_part(d->debug, ".debug_info", NULL, at, UNIT_HEADER_MAX, &header))
            break;
        const btc_bytes *from = compressed ? &whole : &header;
        uint64_t base = compressed ? 0 : at;
        if (at - base >= from->size) {
            btc_bytes_free(&header);
            break;
        }
        reader r = reader_at(from, at - base, from->size - (at - base));
        unit u;
        bool keep = read_unit_header(&r, at, &u, &next);
        btc_bytes_free(&header);
        if ((keep && !PUSH(d->units, d->nunits, cap, u)) || (r.bad && !keep) || next <= at)
            break;
    }
    btc_bytes_free_transient(&whole);
}

bool dwarf_unit_reader(btc_dwarf *d, unit *u, uint64_t offset, reader *r)
{
    if (!u->info.data) {
        dwarf_decoded++;
        d->units_read++;
        if (!btc_elf_read_section_part(d->debug, ".debug_info", d->info_index, u->offset, u->end - u->offset,
                                       &u->info))
            return false;
    }
    if (offset < u->offset || offset > u->offset + u->info.size)
        return false;
    *r = reader_at(&u->info, offset - u->offset, u->offset + u->info.size - offset);
    return true;
}

unit *dwarf_unit_containing(btc_dwarf *d, uint64_t info_offset)
{
    size_t lo = BTC_PARTITION_POINT(d->nunits, i, d->units[i].end <= info_offset);
    return lo < d->nunits && d->units[lo].offset <= info_offset ? &d->units[lo] : NULL;
}

static int compare_abbrev_codes(const void *a, const void *b)
{
    uint64_t x = ((const abbrev *)a)->code, y = ((const abbrev *)b)->code;
    return x < y ? -1 : x > y;
}

static bool read_abbrevs(btc_dwarf *d, unit *u)
{
    reader r = reader_from(dwarf_section(d, SEC_ABBREV), u->abbrev_offset);
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

uint64_t dwarf_const_or(const attr_value *v, uint64_t fallback)
{
    return v->kind == V_CONST || v->kind == V_SEC_OFFSET || v->kind == V_SIGNED ? v->u : fallback;
}

/* Abbreviations and the top DIE's unit-wide attributes, once. */
bool dwarf_prepare_unit(btc_dwarf *d, unit *u)
{
    if (u->prepared)
        return !u->broken;
    u->prepared = true;
    dwarf_decoded++;
    u->broken = true;
    die top;
    reader r;
    if (!dwarf_unit_reader(d, u, u->die_offset, &r) || !read_abbrevs(d, u) || !dwarf_read_die(d, u, &r, &top) ||
        !top.ab)
        return false;
    /* DWARF 5 defaults: the bases point past the tables' headers. */
    u->str_offsets_base = dwarf_const_or(&top.str_offsets_base, u->offset_size == 8 ? 16 : 8);
    u->addr_base = dwarf_const_or(&top.addr_base, u->offset_size == 8 ? 16 : 8);
    u->rnglists_base = dwarf_const_or(&top.rnglists_base, 0);
    u->has_stmt_list = top.stmt_list.kind == V_SEC_OFFSET || top.stmt_list.kind == V_CONST;
    u->stmt_list = top.stmt_list.u;
    u->comp_dir = dwarf_value_string(d, u, &top.comp_dir);
    if (!dwarf_value_address(d, u, &top.low_pc, &u->base_address))
        u->base_address = 0;
    u->broken = false;
    return true;
}

/* ---- address ranges of a DIE ---- */

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
    reader r = reader_from(dwarf_section(d, SEC_RANGES), off);
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
    reader r = reader_from(dwarf_section(d, SEC_RNGLISTS), off);
    uint64_t base = u->base_address;
    for (int n = 0; n < MAX_RANGE_ENTRIES && !r.bad; n++) {
        uint64_t a = 0, b = 0;
        bool ok = true;
        attr_value x = {V_ADDRX, 0, NULL}, y = {V_ADDRX, 0, NULL};
        switch (read_u8(&r)) {
        case RLE_end: return;
        case RLE_base_addressx:
            x.u = read_uleb(&r);
            if (!dwarf_value_address(d, u, &x, &base))
                return;
            continue;
        case RLE_startx_endx:
            x.u = read_uleb(&r);
            y.u = read_uleb(&r);
            ok = dwarf_value_address(d, u, &x, &a) && dwarf_value_address(d, u, &y, &b);
            break;
        case RLE_startx_length:
            x.u = read_uleb(&r);
            ok = dwarf_value_address(d, u, &x, &a);
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

/* Every [lo, hi) of a DIE: DW_AT_ranges, or low_pc/high_pc.  Ranges
 * first: beside them a unit's low_pc is only the base address of their
 * entries (often 0: a unit spread over sections by -ffunction-sections or
 * hot/cold partitioning), not a range of its own. */
void dwarf_die_ranges(btc_dwarf *d, const unit *u, const die *e, range_list *l)
{
    uint64_t lo, hi;
    if (e->ranges.kind == V_RNGLISTX) {
        uint64_t off;
        if (dwarf_indexed_entry(d, SEC_RNGLISTS, u->rnglists_base, e->ranges.u, u->offset_size, &off))
            read_rnglist(d, u, u->rnglists_base + off, l);
    } else if (e->ranges.kind == V_SEC_OFFSET || e->ranges.kind == V_CONST) {
        if (u->version >= 5)
            read_rnglist(d, u, e->ranges.u, l);
        else
            read_ranges_v4(d, u, e->ranges.u, l);
    } else if (dwarf_value_address(d, u, &e->low_pc, &lo)) {
        if (dwarf_value_address(d, u, &e->high_pc, &hi))
            add_range(l, lo, hi);
        else if (e->high_pc.kind == V_CONST || e->high_pc.kind == V_SIGNED)
            add_range(l, lo, lo + e->high_pc.u);   /* DWARF 4+: high_pc is a length */
    }
}

/* ---- address -> unit ---- */

int dwarf_compare_ranges(const void *a, const void *b)
{
    const pc_range *x = a, *y = b;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    return x->hi < y->hi ? -1 : x->hi > y->hi;
}

/* .debug_aranges: the producer's own address -> unit index. */
static void unit_ranges_from_aranges(btc_dwarf *d, range_list *l)
{
    const btc_bytes *sec = dwarf_section(d, SEC_ARANGES);
    reader r = reader_at(sec, 0, sec->size);
    while (!r.bad && r.p < r.end) {
        const uint8_t *set_start = r.p;
        int offset_size;
        reader h = sub_reader(&r, read_initial_length(&r, &offset_size));
        uint16_t version = (uint16_t)read_uint(&h, 2);
        uint64_t info_offset = read_uint(&h, offset_size);
        unit *u = dwarf_unit_containing(d, info_offset);
        uint8_t addr_size = read_u8(&h), seg_size = read_u8(&h);
        if (h.bad || version != 2 || !u || (addr_size != 4 && addr_size != 8) || seg_size != 0)
            continue;
        /* Tuples start at a multiple of twice the address size. */
        uint64_t used = (uint64_t)(h.p - set_start), align = 2u * addr_size;
        skip(&h, (align - used % align) % align);
        l->scope = (uint32_t)(u - d->units);
        u->in_aranges |= u->offset == info_offset;   /* a set naming a unit's start, not garbage inside it */
        while (!h.bad) {
            uint64_t lo = read_uint(&h, addr_size), len = read_uint(&h, addr_size);
            if (h.bad || (lo == 0 && len == 0))
                break;
            add_range(l, lo, lo + len);
        }
    }
}

/* Units .debug_aranges does not list (all of them without the section):
 * each one's top DIE says what it covers.  A unit it lists is not asked:
 * its set is the producer's own statement of the unit's code, and asking
 * every unit reads every unit's DIEs (libc's debug file: 2,063 units,
 * compressed, ~1-4 s) for an address no unit covers (padding between
 * functions, code without DWARF). */
static void unit_ranges_from_dies(btc_dwarf *d, range_list *l)
{
    for (size_t i = 0; i < d->nunits; i++) {
        unit *u = &d->units[i];
        die top;
        reader r;
        if (u->in_aranges || !dwarf_prepare_unit(d, u) || !dwarf_unit_reader(d, u, u->die_offset, &r) ||
            !dwarf_read_die(d, u, &r, &top) || !top.ab)
            continue;
        l->scope = (uint32_t)i;
        dwarf_die_ranges(d, u, &top, l);
    }
}

/* The address -> unit table: .debug_aranges, plus (ask_units) the ranges
 * of the units it leaves out. */
static void build_unit_ranges(btc_dwarf *d, bool ask_units)
{
    range_list l = {0};
    unit_ranges_from_aranges(d, &l);
    if (ask_units)
        unit_ranges_from_dies(d, &l);
    if (l.count > 1)
        qsort(l.items, l.count, sizeof *l.items, dwarf_compare_ranges);
    free(d->unit_ranges);
    d->unit_ranges = l.items;
    d->nunit_ranges = l.count;
    d->unit_ranges_from_dies = ask_units;
}

/* How many ranges before the last one starting at or below addr may still
 * cover it (overlapping or nested ranges): real data overlaps rarely. */
#define OVERLAP_LOOKBACK 16

const pc_range *dwarf_range_covering(const pc_range *items, size_t n, uint64_t addr)
{
    size_t lo = BTC_PARTITION_POINT(n, i, items[i].lo <= addr);
    for (size_t k = lo; k > 0 && k + OVERLAP_LOOKBACK > lo; k--)
        if (addr < items[k - 1].hi)
            return &items[k - 1];
    return NULL;
}

unit *dwarf_unit_for_address(btc_dwarf *d, uint64_t addr)
{
    if (!d->units_scanned) {
        d->units_scanned = true;
        scan_units(d);
        dwarf_decoded++;
        build_unit_ranges(d, dwarf_section(d, SEC_ARANGES)->size == 0);
    }
    const pc_range *r = dwarf_range_covering(d->unit_ranges, d->nunit_ranges, addr);
    /* Some producers leave units out of .debug_aranges (objects from
     * another compiler linked in): on a miss, ask those units (once). */
    if (!r && !d->unit_ranges_from_dies) {
        build_unit_ranges(d, true);
        dwarf_decoded++;
        r = dwarf_range_covering(d->unit_ranges, d->nunit_ranges, addr);
    }
    return r && dwarf_prepare_unit(d, &d->units[r->scope]) ? &d->units[r->scope] : NULL;
}
