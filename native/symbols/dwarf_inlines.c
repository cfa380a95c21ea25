/* Function scopes: subprograms and inlined calls, in DIE order, and the
 * chain of scopes covering an address (dwarf_internal.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "symbols/dwarf_internal.h"

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
    dwarf_die_ranges(d, u, e, &l->ranges);
    if (l->ranges.count == first)
        return false;   /* no code: an abstract instance or a declaration */
    scope s = {
        .die = e->offset,
        .subtree_end = (uint32_t)l->count + 1,
        .parent = parent,
        .first_range = (uint32_t)first,
        .nranges = (uint32_t)(l->ranges.count - first),
        .call_file = (uint32_t)dwarf_const_or(&e->call_file, 0),
        .call_line = (uint32_t)dwarf_const_or(&e->call_line, 0),
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
    reader r;
    if (!dwarf_unit_reader(d, u, u->die_offset, &r))
        return;
    die e;
    while (!r.bad && r.p < r.end && dwarf_read_die(d, u, &r, &e)) {
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

void dwarf_decode_scopes(btc_dwarf *d, unit *u)
{
    u->scopes_done = true;
    dwarf_decoded++;
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
        qsort(roots, nroots, sizeof *roots, dwarf_compare_ranges);
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
int dwarf_scope_chain(const unit *u, uint64_t addr, uint32_t *chain, int max)
{
    const pc_range *root = dwarf_range_covering(u->roots, u->nroots, addr);
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
const char *dwarf_scope_name(btc_dwarf *d, uint64_t die_offset)
{
    const char *plain = NULL;
    for (int hop = 0; hop < MAX_NAME_HOPS; hop++) {
        unit *u = dwarf_unit_containing(d, die_offset);
        if (!u || !dwarf_prepare_unit(d, u))
            break;
        die e;
        reader r;
        if (!dwarf_unit_reader(d, u, die_offset, &r) || !dwarf_read_die(d, u, &r, &e) || !e.ab)
            break;
        const char *linkage = dwarf_value_string(d, u, &e.linkage_name);
        if (linkage)
            return linkage;
        if (!plain)
            plain = dwarf_value_string(d, u, &e.name);
        const attr_value *next = e.origin.kind == V_REF ? &e.origin : &e.specification;
        if (next->kind != V_REF)
            break;
        die_offset = next->u;
    }
    return plain;
}
