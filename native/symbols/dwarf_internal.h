/* What the units of the DWARF engine share (symbols/dwarf*.c): the DWARF
 * constants read, the decoded per-file and per-unit state, and the entry
 * points each unit offers the others.
 *
 *   dwarf_forms.c    sections, attribute forms and values, DIEs
 *   dwarf_units.c    compile units, abbreviations, a DIE's pc ranges, address -> unit
 *   dwarf_lines.c    the line program: address -> file and line
 *   dwarf_inlines.c  function scopes: address -> chain of inlined calls
 *   dwarf.c          the engine (dwarf.h): open, lookup, memory
 */
#ifndef BTC_DWARF_INTERNAL_H
#define BTC_DWARF_INTERNAL_H

#include "common/array.h"
#include "common/reader.h"
#include "symbols/dwarf.h"
#include "symbols/elf.h"

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

/* The sections kept whole once read (small, shared by every unit).
 * .debug_info and .debug_line, the big ones, are read per unit: a unit's
 * DIEs (unit.info) and its line program (while decoding it). */
enum {
    SEC_ABBREV, SEC_STR, SEC_LINE_STR, SEC_STR_OFFSETS, SEC_ADDR,
    SEC_RANGES, SEC_RNGLISTS, SEC_ARANGES, NSECTIONS
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
    bool in_aranges;           /* .debug_aranges has a set for it: its ranges, complete */

    /* Everything below is decoded on demand and dropped together
     * (dwarf_forget_unit) when the file cache is over its byte budget. */
    uint64_t last_use;         /* the lookup clock when the unit last served a lookup */
    btc_bytes info;            /* the unit's bytes of .debug_info, [offset, end) */
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
    btc_zindex *info_index, *line_index;   /* random access when those sections are compressed */
    bool line_indexed;
    unit *units;               /* by .debug_info offset */
    size_t nunits;
    bool units_scanned;
    pc_range *unit_ranges;     /* address -> unit index (in .scope), sorted by lo */
    size_t nunit_ranges;
    bool unit_ranges_from_dies;
    uint64_t units_read;       /* DIE byte reads of units (btc_dwarf_units_read) */
};

/* A unit or table header's length; sets *offset_size to 4 or 8 (64-bit DWARF). */
static inline uint64_t read_initial_length(reader *r, int *offset_size)
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

static inline form_ctx unit_ctx(const unit *u) { return (form_ctx){u->version, u->addr_size, u->offset_size}; }

typedef struct {
    uint64_t offset;
    const abbrev *ab;   /* NULL: the null entry that closes a sibling list */
    attr_value name, linkage_name, low_pc, high_pc, ranges, origin, specification, call_file, call_line;
    attr_value stmt_list, comp_dir, str_offsets_base, addr_base, rnglists_base;
} die;

typedef struct {
    pc_range *items;
    size_t count, cap;
    uint32_t scope;
} range_list;


/* Bumped by every decoding step that allocates (btc_dwarf_decodes()). */
extern uint64_t dwarf_decoded;

/* ---- dwarf_forms.c ---- */
/* The section, read on first use (empty if absent). */
const btc_bytes *dwarf_section(btc_dwarf *d, int id);
bool dwarf_indexed_entry(btc_dwarf *d, int sec, uint64_t base, uint64_t index, int size, uint64_t *out);
/* r: a reader from dwarf_unit_reader(d, u, ...). */
bool dwarf_read_die(btc_dwarf *d, const unit *u, reader *r, die *e);
void dwarf_read_form(btc_dwarf *d, reader *r, form_ctx c, uint64_t unit_offset, uint64_t form,
                      int64_t implicit, attr_value *v);
bool dwarf_value_address(btc_dwarf *d, const unit *u, const attr_value *v, uint64_t *addr);
const char *dwarf_value_string(btc_dwarf *d, const unit *u, const attr_value *v);

/* ---- dwarf_units.c ---- */
/* A reader over the unit's DIEs from .debug_info offset `offset` to the
 * unit's end (its bytes are read on first use); false if unreadable. */
bool dwarf_unit_reader(btc_dwarf *d, unit *u, uint64_t offset, reader *r);
int dwarf_compare_ranges(const void *a, const void *b);
uint64_t dwarf_const_or(const attr_value *v, uint64_t fallback);
void dwarf_die_ranges(btc_dwarf *d, const unit *u, const die *e, range_list *l);
bool dwarf_prepare_unit(btc_dwarf *d, unit *u);
const pc_range *dwarf_range_covering(const pc_range *items, size_t n, uint64_t addr);
unit *dwarf_unit_containing(btc_dwarf *d, uint64_t info_offset);
unit *dwarf_unit_for_address(btc_dwarf *d, uint64_t addr);

/* ---- dwarf_lines.c ---- */
void dwarf_decode_lines(btc_dwarf *d, unit *u);
const char *dwarf_file_name(const unit *u, uint64_t index);
const line_row *dwarf_row_for(const unit *u, uint64_t addr);

/* ---- dwarf_inlines.c ---- */
void dwarf_decode_scopes(btc_dwarf *d, unit *u);
int dwarf_scope_chain(const unit *u, uint64_t addr, uint32_t *chain, int max);
const char *dwarf_scope_name(btc_dwarf *d, uint64_t die_offset);

#endif
