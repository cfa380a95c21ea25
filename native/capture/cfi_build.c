/* .eh_frame -> compact CFI rows (btc_table): FDE enumeration, the CFA
 * program interpreter, the page index.  The per-frame lookup over the result
 * is cfi_lookup.c.
 *
 * The unwind data is read where the loader mapped it, so none of it is
 * trusted: a record is read only after its whole span was found inside one
 * readable PT_LOAD range, every read is bounded by that span, a bad CIE or
 * FDE is skipped, and the number of rows is capped.  Of the full CFI state
 * only what the walk needs survives: the CFA rule, the rules of the return
 * address and of the registers the architecture tracks (arch.h: the frame
 * pointer, and rbx on x86-64), and on aarch64 whether the return address
 * is signed (pointer authentication).
 *
 * The build runs once per module (with the loader lock held by modules.c);
 * the lookup runs for every frame of every capture, possibly inside a signal
 * handler (cfi_lookup.c), so it allocates nothing and takes no lock.
 */
#include <stdlib.h>
#include <string.h>

#include "capture/arch.h"
#include "capture/cfi_build.h"
#include "common/array.h"
#include "common/reader.h"

/* Guards against garbage that would otherwise make the build run for ever or
 * eat the heap: a real module has a few thousand FDEs and < 100k rows. */
#define MAX_ROWS (4u << 20)
#define MAX_FDES (1u << 20)
#define MAX_STATE_DEPTH 16
#define MAX_AUGMENTATION 16
/* Bytes of CFA programs interpreted per module (libpython needs ~0.5 MB):
 * garbage FDEs that share one huge record must not cost quadratic time. */
#define MAX_PROGRAM_BYTES (64u << 20)

/* ---- DWARF constants (only those this file interprets) ---- */

#define DW_EH_PE_absptr  0x00
#define DW_EH_PE_uleb128 0x01
#define DW_EH_PE_udata2  0x02
#define DW_EH_PE_udata4  0x03
#define DW_EH_PE_udata8  0x04
#define DW_EH_PE_sleb128 0x09
#define DW_EH_PE_sdata2  0x0a
#define DW_EH_PE_sdata4  0x0b
#define DW_EH_PE_sdata8  0x0c
#define DW_EH_PE_pcrel   0x10
#define DW_EH_PE_datarel 0x30
#define DW_EH_PE_indirect 0x80
#define DW_EH_PE_omit    0xff

#define DW_CFA_advance_loc        0x40
#define DW_CFA_offset             0x80
#define DW_CFA_restore            0xc0
#define DW_CFA_nop                0x00
#define DW_CFA_set_loc            0x01
#define DW_CFA_advance_loc1       0x02
#define DW_CFA_advance_loc2       0x03
#define DW_CFA_advance_loc4       0x04
#define DW_CFA_offset_extended    0x05
#define DW_CFA_restore_extended   0x06
#define DW_CFA_undefined          0x07
#define DW_CFA_same_value         0x08
#define DW_CFA_register           0x09
#define DW_CFA_remember_state     0x0a
#define DW_CFA_restore_state      0x0b
#define DW_CFA_def_cfa            0x0c
#define DW_CFA_def_cfa_register   0x0d
#define DW_CFA_def_cfa_offset     0x0e
#define DW_CFA_def_cfa_expression 0x0f
#define DW_CFA_expression         0x10
#define DW_CFA_offset_extended_sf 0x11
#define DW_CFA_def_cfa_sf         0x12
#define DW_CFA_def_cfa_offset_sf  0x13
#define DW_CFA_val_offset         0x14
#define DW_CFA_val_offset_sf      0x15
#define DW_CFA_val_expression     0x16
#define DW_CFA_GNU_args_size      0x2e
#define DW_CFA_AARCH64_negate_ra_state 0x2d   /* GNU_window_save on SPARC */
#define DW_CFA_GNU_negative_offset_extended 0x2f

#define DW_OP_deref 0x06
#define DW_OP_shl   0x24
#define DW_OP_and   0x1a
#define DW_OP_plus  0x22
#define DW_OP_ge    0x2a
#define DW_OP_lit0  0x30
#define DW_OP_breg0 0x70

/* Read a DW_EH_PE_* encoded pointer.  The bytes are always consumed when the
 * format is known (so a pointer we cannot resolve, like an indirect
 * personality, can still be skipped); returns whether *out holds an address.
 * datarel is relative to .eh_frame_hdr, the only place x86-64 uses it. */
static bool read_encoded(reader *c, uint8_t enc, uintptr_t datarel_base, uint64_t *out)
{
    uintptr_t field = (uintptr_t)c->p;
    uint64_t v;
    if (enc == DW_EH_PE_omit)
        return false;
    switch (enc & 0x0f) {
    case DW_EH_PE_absptr:  v = read_u64(c); break;
    case DW_EH_PE_uleb128: v = read_uleb(c); break;
    case DW_EH_PE_udata2:  v = read_u16(c); break;
    case DW_EH_PE_udata4:  v = read_u32(c); break;
    case DW_EH_PE_udata8:  v = read_u64(c); break;
    case DW_EH_PE_sleb128: v = (uint64_t)read_sleb(c); break;
    case DW_EH_PE_sdata2:  v = (uint64_t)(int64_t)(int16_t)read_u16(c); break;
    case DW_EH_PE_sdata4:  v = (uint64_t)(int64_t)(int32_t)read_u32(c); break;
    case DW_EH_PE_sdata8:  v = read_u64(c); break;
    default:
        c->bad = true;   /* unknown size: nothing after it can be found */
        return false;
    }
    if (c->bad)
        return false;
    switch (enc & 0x70) {
    case 0:
        break;
    case DW_EH_PE_pcrel:
        v += field;
        break;
    case DW_EH_PE_datarel:
        if (!datarel_base)
            return false;
        v += datarel_base;
        break;
    default:
        /* textrel/funcrel have no base here; aligned needs padding first */
        if ((enc & 0x70) == 0x50)
            c->bad = true;
        return false;
    }
    if (enc & DW_EH_PE_indirect)
        return false;   /* the pointer is stored elsewhere: we never follow one */
    *out = v;
    return true;
}

/* ---- where reading is allowed ---- */

/* End of the readable range containing p (NULL if p is in none). */
static const uint8_t *readable_end(const btc_image *img, const uint8_t *p)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < img->nreadable && i < 8; i++)
        if (a >= img->readable_lo[i] && a < img->readable_hi[i])
            return (const uint8_t *)img->readable_hi[i];
    return NULL;
}

/* Where .eh_frame records may lie: the section if its size is known,
 * otherwise whatever is readable from its start. */
typedef struct {
    const btc_image *img;
    const uint8_t *eh_frame, *eh_frame_end;
} source;

/* A reader over the record (CIE or FDE) at p, bounded by its own length;
 * bad is set if the record is a terminator, malformed or not readable. */
static reader record_at(const source *src, const uint8_t *p)
{
    const uint8_t *limit = readable_end(src->img, p);
    if (src->eh_frame_end && (p < src->eh_frame || p >= src->eh_frame_end))
        limit = NULL;
    else if (limit && src->eh_frame_end && src->eh_frame_end < limit)
        limit = src->eh_frame_end;
    reader c = reader_over(p, limit ? limit : p);
    uint32_t len = read_u32(&c);
    /* 0xffffffff announces a 64-bit length: no x86-64 toolchain emits one
     * into .eh_frame, and libgcc does not read it either. */
    if (c.bad || len == 0 || len == 0xffffffff || len > (size_t)(c.end - c.p)) {
        c.bad = true;
        return c;
    }
    c.end = c.p + len;
    return c;
}

/* ---- CIE and FDE headers ---- */

typedef struct {
    const uint8_t *insns, *insns_end;   /* initial instructions */
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    bool has_aug_data;                  /* 'z': FDEs carry an augmentation length */
    bool signal;                        /* 'S' */
} cie_info;

typedef struct {
    uint64_t lo, hi;                    /* [lo, hi) relative to the load bias */
    const uint8_t *insns, *insns_end;
    const uint8_t *addr;                /* the FDE itself: sort tie-break */
    cie_info cie;
} fde_info;

/* Parse the 'z' augmentation data; false if it holds something we cannot
 * skip (an unknown letter may carry data of unknown size). */
static bool parse_augmentation(reader *c, const char *aug, uintptr_t datarel_base, cie_info *out)
{
    uint64_t len = read_uleb(c);
    if (c->bad || len > (size_t)(c->end - c->p))
        return false;
    reader data = reader_over(c->p, c->p + len);
    c->p += len;
    uint64_t ignored;
    for (const char *a = aug + 1; *a; a++) {
        switch (*a) {
        case 'L': read_u8(&data); break;                 /* LSDA encoding: FDE aug data, skipped */
        case 'R': out->fde_enc = read_u8(&data); break;
        case 'P': read_encoded(&data, read_u8(&data), datarel_base, &ignored); break;
        case 'S': out->signal = true; break;
        case 'B': break;                                  /* aarch64: signed with the B key; no data */
        default: return false;
        }
    }
    return !data.bad;
}

static bool parse_cie(const source *src, const uint8_t *p, cie_info *out)
{
    reader c = record_at(src, p);
    if (read_u32(&c) != 0 || c.bad)
        return false;   /* CIE id 0 is what tells a CIE from an FDE in .eh_frame */
    uint8_t version = read_u8(&c);
    if (version != 1 && version != 3)
        return false;
    const char *aug = (const char *)c.p;
    size_t aug_room = c.bad ? 0 : (size_t)(c.end - c.p);
    const uint8_t *nul = memchr(c.p, 0, aug_room < MAX_AUGMENTATION ? aug_room : MAX_AUGMENTATION);
    if (!nul)
        return false;
    c.p = nul + 1;
    memset(out, 0, sizeof *out);
    out->code_align = read_uleb(&c);
    out->data_align = read_sleb(&c);
    out->ra_reg = version == 1 ? read_u8(&c) : read_uleb(&c);
    out->fde_enc = DW_EH_PE_absptr;
    if (c.bad)
        return false;
    if (aug[0] == 'z') {
        out->has_aug_data = true;
        if (!parse_augmentation(&c, aug, (uintptr_t)src->img->eh_frame_hdr, out))
            return false;
    } else if (aug[0]) {
        return false;   /* without 'z' an augmentation's size is unknown */
    }
    out->insns = c.p;
    out->insns_end = c.end;
    return !c.bad;
}

/* Parse the FDE at p (and its CIE); false for anything that is not a usable
 * FDE: a CIE, garbage, or a range outside the 32-bit row space. */
static bool parse_fde(const source *src, const uint8_t *p, fde_info *out)
{
    reader c = record_at(src, p);
    const uint8_t *id_field = c.p;
    uint32_t cie_offset = read_u32(&c);
    if (c.bad || cie_offset == 0 || cie_offset > (uintptr_t)id_field)
        return false;
    /* In .eh_frame the CIE pointer counts back from the field itself. */
    if (!parse_cie(src, id_field - cie_offset, &out->cie))
        return false;
    uintptr_t datarel_base = (uintptr_t)src->img->eh_frame_hdr;
    uint64_t begin, range;
    if (!read_encoded(&c, out->cie.fde_enc, datarel_base, &begin) ||
        !read_encoded(&c, out->cie.fde_enc & 0x0f, 0, &range))
        return false;
    if (out->cie.has_aug_data) {
        uint64_t len = read_uleb(&c);
        if (c.bad || len > (size_t)(c.end - c.p))
            return false;
        c.p += len;
    }
    uint64_t lo = begin - src->img->bias;
    if (c.bad || begin < src->img->bias || lo > UINT32_MAX || range > UINT32_MAX - lo)
        return false;
    out->lo = lo;
    out->hi = lo + range;
    out->insns = c.p;
    out->insns_end = c.end;
    out->addr = p;
    return true;
}

/* ---- enumerating FDEs ---- */

typedef struct {
    fde_info *v;
    size_t n, cap;
} fde_list;

static bool fde_list_push(fde_list *l, const fde_info *f)
{
    return l->n < MAX_FDES && PUSH(l->v, l->n, l->cap, *f);
}

typedef struct {
    uint8_t table_enc;
    uint64_t count;
    reader table;          /* the (initial location, FDE address) pairs */
    const uint8_t *eh_frame;
} eh_frame_hdr;

static bool parse_eh_frame_hdr(const btc_image *img, eh_frame_hdr *out)
{
    const uint8_t *hdr = img->eh_frame_hdr;
    const uint8_t *end = hdr ? readable_end(img, hdr) : NULL;
    if (!end)
        return false;
    reader c = reader_over(hdr, end);
    uint8_t version = read_u8(&c);
    uint8_t eh_frame_enc = read_u8(&c);
    uint8_t count_enc = read_u8(&c);
    out->table_enc = read_u8(&c);
    uint64_t eh_frame = 0;
    if (c.bad || version != 1 || !read_encoded(&c, eh_frame_enc, (uintptr_t)hdr, &eh_frame))
        return false;
    out->eh_frame = (const uint8_t *)(uintptr_t)eh_frame;
    if (!read_encoded(&c, count_enc, (uintptr_t)hdr, &out->count))
        out->count = 0;   /* no search table; .eh_frame itself is still usable */
    out->table = c;
    return true;
}

/* The binary search table lists every FDE: it needs neither the section size
 * nor a terminator. */
static void collect_from_hdr(const source *src, const eh_frame_hdr *hdr, fde_list *out)
{
    /* Each entry must consume bytes, or a garbage count would spin for ever. */
    switch (hdr->table_enc & 0x0f) {
    case DW_EH_PE_udata2: case DW_EH_PE_udata4: case DW_EH_PE_udata8:
    case DW_EH_PE_sdata2: case DW_EH_PE_sdata4: case DW_EH_PE_sdata8:
    case DW_EH_PE_absptr:
        break;
    default:
        return;
    }
    reader c = hdr->table;
    uintptr_t base = (uintptr_t)src->img->eh_frame_hdr;
    for (uint64_t i = 0; i < hdr->count && !c.bad; i++) {
        uint64_t start, addr;
        fde_info f;
        read_encoded(&c, hdr->table_enc, base, &start);   /* the FDE says it again */
        if (read_encoded(&c, hdr->table_enc, base, &addr) &&
            parse_fde(src, (const uint8_t *)(uintptr_t)addr, &f) && !fde_list_push(out, &f))
            return;
    }
}

/* Without a search table: walk the records up to the section end or the
 * zero-length terminator.  An absurd length ends the walk: what follows it
 * cannot be located. */
static void collect_from_eh_frame(const source *src, fde_list *out)
{
    const uint8_t *p = src->eh_frame;
    for (;;) {
        reader c = record_at(src, p);
        if (c.bad)
            return;
        fde_info f;
        bool is_fde = read_u32(&c) != 0;   /* a CIE has id 0 */
        if (is_fde && parse_fde(src, p, &f) && !fde_list_push(out, &f))
            return;
        p = c.end;
    }
}

static int compare_fdes(const void *a, const void *b)
{
    const fde_info *x = a, *y = b;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    return 0;
}

/* ---- rows ---- */

typedef struct {
    btc_cfi_row *v;
    uint32_t n;
    size_t cap;
    uint32_t limit;   /* rows allowed; one below MAX_ROWS until the final gap row */
    bool full;        /* a row was refused: the limit, or no memory */
    uint32_t *fde_ranges;   /* [lo, hi) pairs of the FDEs whose rows were kept */
    uint32_t nfdes;
} row_list;

static bool same_rules(const btc_cfi_row *a, const btc_cfi_row *b)
{
    return a->cfa_off == b->cfa_off && a->cfa_kind == b->cfa_kind && a->cfa_reg == b->cfa_reg &&
           a->flags == b->flags && a->ra_rule == b->ra_rule && a->fp_rule == b->fp_rule &&
           a->aux_rule == b->aux_rule && a->ra_off == b->ra_off && a->fp_off == b->fp_off &&
           a->aux_off == b->aux_off;
}

/* Record that `rules` hold from `pc` on.  A row only starts where the rules
 * change: a row left with no byte to cover (same pc) is replaced, and rules
 * equal to the previous row's extend that row, even across FDEs. */
static bool add_row(row_list *l, const btc_cfi_row *rules, uint32_t pc)
{
    if (l->n && l->v[l->n - 1].pc == pc)
        l->n--;
    if (l->n && same_rules(&l->v[l->n - 1], rules))
        return true;
    if (l->n >= l->limit) {
        l->full = true;
        return false;
    }
    /* n < limit <= MAX_ROWS, a power of two: the capacity never passes it. */
    if (!grow((void **)&l->v, &l->cap, (size_t)l->n + 1, sizeof *l->v)) {
        l->full = true;
        return false;
    }
    l->v[l->n] = *rules;
    l->v[l->n].pc = pc;
    l->n++;
    return true;
}

/* ---- the CFA program ---- */

typedef struct {
    const fde_info *fde;
    uintptr_t bias;
    uintptr_t datarel_base;
    btc_cfi_row cur;        /* the rules in effect at loc (cur.pc unused) */
    btc_cfi_row initial;    /* after the CIE's instructions: what DW_CFA_restore returns to */
    btc_cfi_row saved[MAX_STATE_DEPTH];
    int depth;
    uint64_t loc;
    bool in_cie;
    bool done;              /* loc reached the end of the FDE's range */
    row_list *rows;
} cfa_machine;

static bool fits_int16(int64_t v) { return v >= INT16_MIN && v <= INT16_MAX; }
static bool fits_int32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

/* The rule and offset fields of a tracked register; false for the others,
 * whose rules the walk never needs. */
static bool rule_slot(cfa_machine *m, btc_cfi_row *r, uint64_t reg, uint8_t **rule, int16_t **off)
{
    if (reg == m->fde->cie.ra_reg) {
        *rule = &r->ra_rule;
        *off = &r->ra_off;
    } else if (reg == BTC_DWARF_FP) {
        *rule = &r->fp_rule;
        *off = &r->fp_off;
    } else if (reg == BTC_DWARF_AUX) {
        *rule = &r->aux_rule;
        *off = &r->aux_off;
    } else {
        return false;
    }
    return true;
}

static void set_rule(cfa_machine *m, uint64_t reg, uint8_t rule, int64_t off)
{
    uint8_t *r;
    int16_t *o;
    if (!rule_slot(m, &m->cur, reg, &r, &o))
        return;
    if ((rule == BTC_RULE_AT_CFA || (rule & 15) == BTC_RULE_AT_REG) && !fits_int16(off))
        rule = BTC_RULE_UNSUPPORTED;
    *r = rule;
    *o = rule == BTC_RULE_UNSUPPORTED ? 0 : (int16_t)off;
}

static void restore_rule(cfa_machine *m, uint64_t reg)
{
    uint8_t *r, *ir;
    int16_t *o, *io;
    if (rule_slot(m, &m->cur, reg, &r, &o) && rule_slot(m, &m->initial, reg, &ir, &io)) {
        *r = *ir;
        *o = *io;
    }
}

static void set_cfa(cfa_machine *m, uint8_t kind, uint64_t reg, int64_t off)
{
    if (kind != BTC_CFA_UNSUPPORTED && (reg > UINT8_MAX || !fits_int32(off)))
        kind = BTC_CFA_UNSUPPORTED;
    m->cur.cfa_kind = kind;
    m->cur.cfa_reg = kind == BTC_CFA_UNSUPPORTED ? 0 : (uint8_t)reg;
    m->cur.cfa_off = kind == BTC_CFA_UNSUPPORTED ? 0 : (int32_t)off;
}

/* offset * data alignment factor, or false if it overflows. */
static bool factored(const cfa_machine *m, int64_t v, int64_t *out)
{
    return !__builtin_mul_overflow(v, m->fde->cie.data_align, out);
}

/* Recognise the CFA expressions compilers emit:
 *   bregN off; deref            stack realignment, glibc's __restore_rt
 *   breg7 A; breg16 0; lit15; and; litT; ge; lit3; shl; plus     PLT stubs */
/* reg saved at CFA + the factored offset s; unsupported when the offset
 * read did not fit (fits) or its product does not fit a row. */
static void set_saved_at_cfa(cfa_machine *m, uint64_t reg, bool fits, int64_t s)
{
    int64_t off;
    if (fits && factored(m, s, &off))
        set_rule(m, reg, BTC_RULE_AT_CFA, off);
    else
        set_rule(m, reg, BTC_RULE_UNSUPPORTED, 0);
}

static void set_cfa_expression(cfa_machine *m, reader e)
{
    uint8_t op = read_u8(&e);
    int64_t off = read_sleb(&e);
    if (e.bad || op < DW_OP_breg0 || op > DW_OP_breg0 + 31) {
        set_cfa(m, BTC_CFA_UNSUPPORTED, 0, 0);
        return;
    }
    if (read_u8(&e) == DW_OP_deref && !e.bad && e.p == e.end) {
        set_cfa(m, BTC_CFA_REG_DEREF, op - DW_OP_breg0, off);
        return;
    }
    e.p--;   /* not deref: reread that byte as the PLT pattern's breg16 */
    static const uint8_t plt_middle[] = { (uint8_t)(DW_OP_breg0 + BTC_DWARF_IP), 0, DW_OP_lit0 + 15, DW_OP_and };
    static const uint8_t plt_tail[] = { DW_OP_ge, DW_OP_lit0 + 3, DW_OP_shl, DW_OP_plus };
    if (BTC_PLT_CFA_EXPRESSION && op == DW_OP_breg0 + BTC_DWARF_SP && (size_t)(e.end - e.p) == sizeof plt_middle + 1 + sizeof plt_tail &&
        !memcmp(e.p, plt_middle, sizeof plt_middle) &&
        e.p[sizeof plt_middle] >= DW_OP_lit0 && e.p[sizeof plt_middle] <= DW_OP_lit0 + 15 &&
        !memcmp(e.p + sizeof plt_middle + 1, plt_tail, sizeof plt_tail)) {
        set_cfa(m, BTC_CFA_PLT, e.p[sizeof plt_middle] - DW_OP_lit0, off);
        return;
    }
    set_cfa(m, BTC_CFA_UNSUPPORTED, 0, 0);
}

/* A register saved at bregN + off, N one of the registers the walk has.
 * BTC_RULE_AT_REG keeps N in the rule's top 4 bits, so rip (16) and
 * aarch64's registers (29, 31) cannot be a base: compilers emit this form
 * for x86-64's signal trampoline only. */
static void set_register_expression(cfa_machine *m, uint64_t reg, reader e)
{
    uint8_t op = read_u8(&e);
    int64_t off = read_sleb(&e);
    unsigned base = op - DW_OP_breg0;
    bool tracked = base == BTC_DWARF_AUX || base == BTC_DWARF_FP || base == BTC_DWARF_SP;
    if (!e.bad && e.p == e.end && tracked && base < 16)
        set_rule(m, reg, (uint8_t)(BTC_RULE_AT_REG | (base << 4)), off);
    else
        set_rule(m, reg, BTC_RULE_UNSUPPORTED, 0);
}

/* A DWARF expression block: uleb length, then the bytes. */
static reader read_block(reader *c)
{
    uint64_t len = read_uleb(c);
    if (c->bad || len > (size_t)(c->end - c->p)) {
        c->bad = true;
        return reader_over(c->p, c->p);
    }
    reader b = reader_over(c->p, c->p + len);
    c->p += len;
    return b;
}

/* Close the current row and move to new_loc; rows past the FDE's range are
 * not the FDE's to describe. */
static bool advance_to(cfa_machine *m, uint64_t new_loc)
{
    if (m->in_cie || new_loc < m->loc)
        return false;
    if (!add_row(m->rows, &m->cur, (uint32_t)m->loc))
        return false;
    m->loc = new_loc;
    m->done = new_loc >= m->fde->hi;
    return true;
}

static bool advance_by(cfa_machine *m, uint64_t delta)
{
    uint64_t scaled;
    if (__builtin_mul_overflow(delta, m->fde->cie.code_align, &scaled) || scaled > UINT32_MAX)
        return false;
    return advance_to(m, m->loc + scaled);
}

/* Execute one instruction; false if the program is invalid. */
static bool execute_one(cfa_machine *m, reader *c)
{
    uint8_t op = read_u8(c);
    uint64_t reg, u;
    int64_t s, off = 0;
    switch (op & 0xc0) {
    case DW_CFA_advance_loc:
        return advance_by(m, op & 0x3f);
    case DW_CFA_offset:
        u = read_uleb(c);
        set_saved_at_cfa(m, op & 0x3f, u <= INT64_MAX, (int64_t)u);
        return !c->bad;
    case DW_CFA_restore:
        if (m->in_cie)
            return false;
        restore_rule(m, op & 0x3f);
        return true;
    }
    switch (op) {
    case DW_CFA_nop:
        return true;
    case DW_CFA_set_loc: {
        uint64_t addr;
        if (!read_encoded(c, m->fde->cie.fde_enc, m->datarel_base, &addr) || addr < m->bias)
            return false;
        return advance_to(m, addr - m->bias);
    }
    case DW_CFA_advance_loc1:
        return advance_by(m, read_u8(c)) && !c->bad;
    case DW_CFA_advance_loc2:
        return advance_by(m, read_u16(c)) && !c->bad;
    case DW_CFA_advance_loc4:
        return advance_by(m, read_u32(c)) && !c->bad;
    case DW_CFA_offset_extended:
    case DW_CFA_GNU_negative_offset_extended:
        reg = read_uleb(c);
        u = read_uleb(c);
        s = (int64_t)u;
        if (op == DW_CFA_GNU_negative_offset_extended)
            s = -s;
        set_saved_at_cfa(m, reg, u <= INT64_MAX, s);
        return !c->bad;
    case DW_CFA_offset_extended_sf:
        reg = read_uleb(c);
        s = read_sleb(c);
        set_saved_at_cfa(m, reg, true, s);
        return !c->bad;
    case DW_CFA_restore_extended:
        reg = read_uleb(c);
        if (m->in_cie)
            return false;
        restore_rule(m, reg);
        return !c->bad;
    case DW_CFA_undefined:
        set_rule(m, read_uleb(c), BTC_RULE_UNDEFINED, 0);
        return !c->bad;
    case DW_CFA_same_value:
        set_rule(m, read_uleb(c), BTC_RULE_SAME, 0);
        return !c->bad;
    case DW_CFA_register:
        reg = read_uleb(c);
        u = read_uleb(c);
        /* The walk keeps no other registers: only "saved in itself" works. */
        set_rule(m, reg, reg == u ? BTC_RULE_SAME : BTC_RULE_UNSUPPORTED, 0);
        return !c->bad;
    case DW_CFA_remember_state:
        /* The whole row, CFA included, as gcc's .cfi_remember_state around
         * an epilogue expects (and as libgcc and pyelftools do). */
        if (m->depth == MAX_STATE_DEPTH)
            return false;
        m->saved[m->depth++] = m->cur;
        return true;
    case DW_CFA_restore_state:
        if (m->depth == 0)
            return false;
        m->cur = m->saved[--m->depth];
        return true;
    case DW_CFA_def_cfa:
        reg = read_uleb(c);
        u = read_uleb(c);
        set_cfa(m, u <= INT32_MAX ? BTC_CFA_REG : BTC_CFA_UNSUPPORTED, reg, (int64_t)u);
        return !c->bad;
    case DW_CFA_def_cfa_sf:
        reg = read_uleb(c);
        s = read_sleb(c);
        set_cfa(m, factored(m, s, &off) ? BTC_CFA_REG : BTC_CFA_UNSUPPORTED, reg, off);
        return !c->bad;
    case DW_CFA_def_cfa_register:
        /* Keeps the offset, so it only means something after a reg+offset rule. */
        reg = read_uleb(c);
        set_cfa(m, m->cur.cfa_kind == BTC_CFA_REG ? BTC_CFA_REG : BTC_CFA_UNSUPPORTED, reg,
                m->cur.cfa_off);
        return !c->bad;
    case DW_CFA_def_cfa_offset:
        u = read_uleb(c);
        set_cfa(m, m->cur.cfa_kind == BTC_CFA_REG && u <= INT32_MAX ? BTC_CFA_REG : BTC_CFA_UNSUPPORTED,
                m->cur.cfa_reg, (int64_t)u);
        return !c->bad;
    case DW_CFA_def_cfa_offset_sf:
        s = read_sleb(c);
        set_cfa(m, m->cur.cfa_kind == BTC_CFA_REG && factored(m, s, &off) ? BTC_CFA_REG
                                                                          : BTC_CFA_UNSUPPORTED,
                m->cur.cfa_reg, off);
        return !c->bad;
    case DW_CFA_def_cfa_expression: {
        reader e = read_block(c);
        if (!c->bad)
            set_cfa_expression(m, e);
        return !c->bad;
    }
    case DW_CFA_expression: {
        reg = read_uleb(c);
        reader e = read_block(c);
        if (!c->bad)
            set_register_expression(m, reg, e);
        return !c->bad;
    }
    case DW_CFA_val_offset:
    case DW_CFA_val_offset_sf:
        reg = read_uleb(c);
        read_uleb(c);   /* same size as an sleb: the value is not needed */
        set_rule(m, reg, BTC_RULE_UNSUPPORTED, 0);
        return !c->bad;
    case DW_CFA_val_expression:
        reg = read_uleb(c);
        read_block(c);
        set_rule(m, reg, BTC_RULE_UNSUPPORTED, 0);
        return !c->bad;
    case DW_CFA_GNU_args_size:
        read_uleb(c);
        return !c->bad;
    case DW_CFA_AARCH64_negate_ra_state:
        /* paciasp/autiasp: the return address changes between signed and
         * plain; remember/restore_state keep this state with the row. */
        if (!BTC_POINTER_AUTHENTICATION)
            return false;
        m->cur.flags ^= BTC_ROW_RA_SIGNED;
        return true;
    default:
        return false;   /* an unknown opcode: its operands cannot be skipped */
    }
}

static bool run_program(cfa_machine *m, const uint8_t *p, const uint8_t *end)
{
    reader c = reader_over(p, end);
    while (c.p < c.end && !m->done) {
        if (!execute_one(m, &c))
            return false;
    }
    return !c.bad;
}

/* Append the rows of one FDE; false if its program is invalid (the caller
 * then drops whatever it added). */
static bool add_fde_rows(const fde_info *f, const btc_image *img, row_list *rows)
{
    cfa_machine m = {
        .fde = f,
        .bias = img->bias,
        .datarel_base = (uintptr_t)img->eh_frame_hdr,
        .cur = { .cfa_kind = BTC_CFA_UNSUPPORTED, .flags = f->cie.signal ? BTC_ROW_SIGNAL : 0 },
        .loc = f->lo,
        .in_cie = true,
        .rows = rows,
    };
    if (!run_program(&m, f->cie.insns, f->cie.insns_end))
        return false;
    m.initial = m.cur;
    m.in_cie = false;
    m.depth = 0;
    if (!run_program(&m, f->insns, f->insns_end))
        return false;
    return m.done || add_row(rows, &m.cur, (uint32_t)m.loc);
}

/* A row that ends the covered range: lookups from pc on find no FDE. */
static bool add_gap_row(row_list *rows, uint64_t pc)
{
    btc_cfi_row none = { .cfa_kind = BTC_CFA_NONE };
    return add_row(rows, &none, (uint32_t)pc);
}

/* Rows of the FDEs sorted by start; an FDE overlapping the previous one is
 * skipped so that every pc has at most one row. */
static bool build_rows(fde_info *fdes, size_t n, const btc_image *img, row_list *rows)
{
    if (n)
        qsort(fdes, n, sizeof *fdes, compare_fdes);
    rows->fde_ranges = n ? malloc(2 * n * sizeof *rows->fde_ranges) : NULL;   /* optional */
    rows->limit = MAX_ROWS - 1;
    uint64_t covered_end = 0, program_bytes = 0;
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        const fde_info *f = &fdes[i];
        if (f->hi <= f->lo || (any && f->lo < covered_end))
            continue;
        program_bytes += (size_t)(f->cie.insns_end - f->cie.insns) + (size_t)(f->insns_end - f->insns);
        if (program_bytes > MAX_PROGRAM_BYTES)
            break;
        if (any && f->lo > covered_end && !add_gap_row(rows, covered_end))
            return false;
        uint32_t mark = rows->n;
        if (!add_fde_rows(f, img, rows)) {
            /* An invalid FDE covers nothing: the next gap row ends its
             * predecessor.  A full table keeps the FDEs that fitted. */
            rows->n = mark;
            if (rows->full)
                break;
            continue;
        }
        covered_end = f->hi;
        any = true;
        if (rows->fde_ranges) {   /* n slots were allocated: one per FDE at most */
            rows->fde_ranges[2 * rows->nfdes] = (uint32_t)f->lo;
            rows->fde_ranges[2 * rows->nfdes + 1] = (uint32_t)f->hi;
            rows->nfdes++;
        }
    }
    rows->limit = MAX_ROWS;
    return !any || add_gap_row(rows, covered_end);
}

/* ---- the table ---- */

/* The smallest pages (from 16 bytes) that are no more than the rows: the
 * index then costs at most 4 bytes per 20-byte row, and since rows crowd
 * around prologues and epilogues, most pages (2 in 3 in libpython) hold no
 * row boundary at all, so the lookup reads a single row. */
static uint32_t choose_page_shift(uint32_t span, uint32_t nrows)
{
    uint32_t shift = 4;
    while (shift < 16 && (span >> shift) >= nrows)
        shift++;
    return shift;
}

static bool build_page_index(btc_table *t)
{
    uint32_t span = t->rows[t->nrows - 1].pc - t->pc_lo;
    t->page_shift = choose_page_shift(span, t->nrows);
    t->npages = (span >> t->page_shift) + 1;
    /* One extra entry so the last page also has an upper bound. */
    t->page_first = malloc(((size_t)t->npages + 1) * sizeof *t->page_first);
    if (!t->page_first)
        return false;
    uint32_t row = 0;
    for (uint32_t k = 0; k < t->npages; k++) {
        uint32_t page_pc = t->pc_lo + (k << t->page_shift);
        while (row + 1 < t->nrows && t->rows[row + 1].pc <= page_pc)
            row++;
        t->page_first[k] = row;
    }
    t->page_first[t->npages] = t->nrows - 1;
    return true;
}

static btc_table *table_from_rows(row_list *rows)
{
    btc_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (rows->n == 0)
        return t;   /* a module without FDEs: every lookup misses */
    btc_cfi_row *fit = realloc(rows->v, (size_t)rows->n * sizeof *fit);
    t->rows = fit ? fit : rows->v;
    t->nrows = rows->n;
    rows->v = NULL;
    t->fde_ranges = rows->fde_ranges;
    t->nfdes = t->fde_ranges ? rows->nfdes : 0;
    rows->fde_ranges = NULL;
    t->pc_lo = t->rows[0].pc;
    if (!build_page_index(t)) {
        btc_table_free(t);
        return NULL;
    }
    return t;
}

btc_table *btc_table_build(const btc_image *img)
{
    source src = { .img = img, .eh_frame = img->eh_frame };
    if (img->eh_frame && img->eh_frame_size)
        src.eh_frame_end = img->eh_frame + img->eh_frame_size;
    eh_frame_hdr hdr;
    bool have_hdr = parse_eh_frame_hdr(img, &hdr);
    if (!src.eh_frame && have_hdr)
        src.eh_frame = hdr.eh_frame;
    if (!src.eh_frame || !readable_end(img, src.eh_frame))
        return NULL;

    fde_list fdes = { 0 };
    if (have_hdr)
        collect_from_hdr(&src, &hdr, &fdes);
    if (fdes.n == 0)
        collect_from_eh_frame(&src, &fdes);
    row_list rows = { 0 };
    btc_table *t = NULL;
    if (build_rows(fdes.v, fdes.n, img, &rows))
        t = table_from_rows(&rows);
    free(fdes.v);
    free(rows.v);
    free(rows.fde_ranges);
    return t;
}

void btc_table_free(btc_table *t)
{
    if (!t)
        return;
    free(t->rows);
    free(t->page_first);
    free(t->fde_ranges);
    free(t);
}
