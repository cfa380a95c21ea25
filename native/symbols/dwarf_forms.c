/* DWARF sections, attribute forms and values, and DIEs (dwarf_internal.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symbols/dwarf_internal.h"
#include "common/search.h"

static const char *const section_names[NSECTIONS] = {
    ".debug_abbrev", ".debug_str", ".debug_line_str", ".debug_str_offsets", ".debug_addr",
    ".debug_ranges", ".debug_rnglists", ".debug_aranges",
};

const btc_bytes *dwarf_section(btc_dwarf *d, int id)
{
    if (!d->section_tried[id]) {
        d->section_tried[id] = true;
        dwarf_decoded++;
        btc_elf_read_section(d->debug, section_names[id], &d->sections[id]);
    }
    return &d->sections[id];
}


static const char *string_at(btc_dwarf *d, int sec, uint64_t off)
{
    const btc_bytes *b = dwarf_section(d, sec);
    return off < b->size ? (const char *)b->data + off : NULL;
}

/* Decode one attribute value of `form`; ref forms become absolute
 * .debug_info offsets (unit_offset: where the unit header starts). */
void dwarf_read_form(btc_dwarf *d, reader *r, form_ctx c, uint64_t unit_offset, uint64_t form,
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
bool dwarf_indexed_entry(btc_dwarf *d, int sec, uint64_t base, uint64_t index, int size, uint64_t *out)
{
    if (index > (1ull << 32))
        return false;
    reader r = reader_at(dwarf_section(d, sec), base + index * (uint64_t)size, (uint64_t)size);
    *out = read_uint(&r, size);
    return !r.bad;
}

const char *dwarf_value_string(btc_dwarf *d, const unit *u, const attr_value *v)
{
    uint64_t off;
    if (v->kind == V_STRING)
        return v->s;
    if (v->kind == V_STRX && dwarf_indexed_entry(d, SEC_STR_OFFSETS, u->str_offsets_base, v->u, u->offset_size, &off))
        return string_at(d, SEC_STR, off);
    return NULL;
}

bool dwarf_value_address(btc_dwarf *d, const unit *u, const attr_value *v, uint64_t *addr)
{
    if (v->kind == V_ADDR) {
        *addr = v->u;
        return true;
    }
    return v->kind == V_ADDRX && dwarf_indexed_entry(d, SEC_ADDR, u->addr_base, v->u, u->addr_size, addr);
}

/* ---- DIEs ---- */

/* The attributes any lookup here needs from one DIE. */
static const abbrev *find_abbrev(const unit *u, uint64_t code)
{
    /* Codes are usually 1..n in order: try the direct slot first. */
    if (code - 1 < u->nabbrevs && u->abbrevs[code - 1].code == code)
        return &u->abbrevs[code - 1];
    size_t lo = BTC_PARTITION_POINT(u->nabbrevs, i, u->abbrevs[i].code < code);
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
bool dwarf_read_die(btc_dwarf *d, const unit *u, reader *r, die *e)
{
    memset(e, 0, sizeof *e);
    e->offset = u->offset + (uint64_t)(r->p - u->info.data);
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
        dwarf_read_form(d, r, unit_ctx(u), u->offset, s->form, s->implicit, slot ? slot : &scratch);
    }
    return !r->bad;
}
