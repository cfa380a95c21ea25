/* Source locations from DWARF: address -> compile unit -> line rows and the
 * chain of inlined calls, like `addr2line -f -i`.
 *
 * Only what a lookup needs is decoded, and it is kept: the unit table
 * (from .debug_aranges, else from each unit's top DIE) once per file, then
 * per unit touched its abbreviations, its line program (as sorted rows) and
 * its function scopes (subprograms and inlined subroutines, in DIE order).
 * Sections are read whole into the heap by symbols/elf.c.
 *
 * Every read goes through a bounded reader: malformed data ends the decode
 * of that part (the unit or table is then treated as absent), never reads
 * past a section, never allocates more than the section size justifies.
 *
 * This unit is the engine's interface (dwarf.h); the decoding is split by
 * concept into dwarf_forms.c, dwarf_units.c, dwarf_lines.c and
 * dwarf_inlines.c (see dwarf_internal.h).
 */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symbols/dwarf_internal.h"

/* ---- the engine's interface ---- */

btc_dwarf *btc_dwarf_open(int fd, const char *path, const char *debug_root)
{
    btc_dwarf *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->elf = btc_elf_open_fd(fd);
    if (!d->elf) {
        free(d);
        return NULL;
    }
    d->debug = d->elf;
    dwarf_decoded++;
    if (!btc_elf_has_section(d->elf, ".debug_info") && !btc_elf_has_section(d->elf, ".zdebug_info")) {
        btc_elf *separate = btc_elf_open_debug_file(d->elf, path, debug_root);
        if (separate)
            d->debug = separate;
    }
    return d;
}

static void free_unit(unit *u)
{
    btc_bytes_free(&u->info);
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

/* Back to the state of a unit never looked at: its header is kept, the
 * rest is decoded again on its next use. */
static void forget_unit(unit *u)
{
    free_unit(u);
    memset(&u->last_use, 0, sizeof *u - offsetof(unit, last_use));
}

void btc_dwarf_close(btc_dwarf *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->nunits; i++)
        free_unit(&d->units[i]);
    free(d->units);
    free(d->unit_ranges);
    btc_zindex_free(d->info_index);
    btc_zindex_free(d->line_index);
    for (int i = 0; i < NSECTIONS; i++)
        btc_bytes_free(&d->sections[i]);
    if (d->debug != d->elf)
        btc_elf_close(d->debug);
    btc_elf_close(d->elf);
    free(d);
}

/* Deepest inline nesting reported. */
#define MAX_INLINE_DEPTH 64

const char *btc_dwarf_symbol(btc_dwarf *d, uint64_t vaddr, uintptr_t *start)
{
    if (!d)
        return NULL;
    const char *name = btc_elf_symbolize(d->elf, (uintptr_t)vaddr, start);
    return name || d->debug == d->elf ? name : btc_elf_symbolize(d->debug, (uintptr_t)vaddr, start);
}

static const char *symbol_name(btc_dwarf *d, uint64_t vaddr)
{
    uintptr_t start;
    return btc_dwarf_symbol(d, vaddr, &start);
}

/* No DWARF for vaddr: one frame named from the symbol table, no file. */
static int symbol_only(btc_dwarf *d, uint64_t vaddr, btc_srcframe *out)
{
    out[0] = (btc_srcframe){symbol_name(d, vaddr), NULL, 0};
    return out[0].function != NULL;
}

/* Which units served lookups last (callers serialize every call on a btc_dwarf). */
static uint64_t lookup_clock;
uint64_t dwarf_decoded;

uint64_t btc_dwarf_decodes(void) { return dwarf_decoded; }

uint64_t btc_dwarf_units_read(const btc_dwarf *d) { return d ? d->units_read : 0; }

int btc_dwarf_lookup(btc_dwarf *d, uint64_t vaddr, btc_srcframe *out, int max)
{
    if (!d || max < 1)
        return 0;
    unit *u = dwarf_unit_for_address(d, vaddr);
    if (!u)
        return symbol_only(d, vaddr, out);
    u->last_use = ++lookup_clock;
    if (!u->lines_done)
        dwarf_decode_lines(d, u);
    if (!u->scopes_done)
        dwarf_decode_scopes(d, u);
    uint32_t chain[MAX_INLINE_DEPTH];
    int depth = dwarf_scope_chain(u, vaddr, chain, MAX_INLINE_DEPTH);
    const line_row *row = dwarf_row_for(u, vaddr);
    if (depth == 0 && !row)
        return symbol_only(d, vaddr, out);
    /* Innermost first: its location is the line table's; each enclosing
     * level is where the level inside it was inlined (its call site). */
    out[0].file = row ? dwarf_file_name(u, row->file) : NULL;
    out[0].line = row ? (int)row->line : 0;
    if (depth == 0) {   /* a line but no function DIE (assembly, for one) */
        out[0].function = symbol_name(d, vaddr);
        return 1;
    }
    int n = 0;
    for (int k = depth - 1; k >= 0 && n < max; k--, n++) {
        const scope *s = &u->scopes[chain[k]];
        out[n].function = dwarf_scope_name(d, s->die);
        if (n > 0) {
            const scope *inner = &u->scopes[chain[k + 1]];
            out[n].file = dwarf_file_name(u, inner->call_file);
            out[n].line = (int)inner->call_line;
        }
    }
    return n;
}

static size_t unit_memory(const unit *u)
{
    size_t n = u->info.size + u->nabbrevs * sizeof *u->abbrevs + u->nspecs * sizeof *u->specs + u->nrows * sizeof *u->rows +
               u->nscopes * sizeof *u->scopes + u->nranges * sizeof *u->ranges + u->nroots * sizeof *u->roots;
    for (size_t i = 0; i < u->nfiles; i++)
        n += sizeof(char *) + (u->files[i] ? strlen(u->files[i]) + 1 : 0);
    return n;
}

size_t btc_dwarf_memory(const btc_dwarf *d)
{
    if (!d)
        return 0;
    size_t n = sizeof *d + d->nunits * sizeof *d->units + d->nunit_ranges * sizeof *d->unit_ranges +
               btc_zindex_memory(d->info_index) + btc_zindex_memory(d->line_index);
    for (int i = 0; i < NSECTIONS; i++)
        n += d->sections[i].size;
    for (size_t i = 0; i < d->nunits; i++)
        n += unit_memory(&d->units[i]);
    return n;
}

/* The least recently used unit holding decoded state, other than the one
 * that served the latest lookup; NULL if none. */
static unit *oldest_unit(const btc_dwarf *d)
{
    unit *oldest = NULL;
    for (size_t i = 0; i < d->nunits; i++) {
        unit *u = &d->units[i];
        bool decoded = u->prepared || u->info.data;
        if (decoded && u->last_use != lookup_clock && (!oldest || u->last_use < oldest->last_use))
            oldest = u;
    }
    return oldest;
}

uint64_t btc_dwarf_oldest_use(const btc_dwarf *d)
{
    const unit *u = d ? oldest_unit(d) : NULL;
    return u ? u->last_use : UINT64_MAX;
}

size_t btc_dwarf_forget_oldest(btc_dwarf *d)
{
    unit *u = d ? oldest_unit(d) : NULL;
    if (!u)
        return 0;
    size_t freed = unit_memory(u);
    forget_unit(u);
    return freed;
}
