/* The spawn chains another process's btcore recorded (capture/spawn.c),
 * read from outside: where each of its greenlets and tasks was created,
 * and by whom, over the generations spawn_chain() reads.
 *
 * The target describes its records itself (btc_spawn_exported: the live
 * list, its type objects, every offset), so this reader knows no layout of
 * its own; the description is copied and checked like everything else.
 * Each record, node and site is checked by type (the target's own type
 * objects) before a field of it is used; every walk is bounded and stops at
 * a loop; an unreadable word ends that chain or leaves that site empty.
 * A dump calls it while the target is stopped: the list is not changing. */
#include <stdlib.h>
#include <string.h>

#include "remote/rmem.h"

#define MAX_RECORD 512        /* bytes of a record (spawn.c's is ~100) */
#define MAX_GENERATIONS 256   /* links a chain is read to, whatever the target says */

static bool rd(btc_rmem *m, uintptr_t addr, void *out, size_t n)
{
    return addr != 0 && !(addr & 7) && addr + n > addr && btc_rmem_read(m, addr, out, n) == 0;
}

static uintptr_t field(const uint8_t *object, uint32_t at)
{
    uintptr_t w;
    memcpy(&w, object + at, sizeof w);
    return w;
}

static bool is_type(btc_rmem *m, const btc_spawn_export *x, uintptr_t obj, uintptr_t type)
{
    uintptr_t t;
    return rd(m, obj + x->object_type, &t, sizeof t) && t == type;
}

/* The description is usable: its magic, and every field it names inside the object read. */
static bool usable(const btc_spawn_export *x)
{
    uint32_t r = x->record_size;
    return x->magic == BTC_SPAWN_EXPORT_MAGIC && r >= 16 && r <= MAX_RECORD && x->record_object + 8 <= r &&
           x->record_site + 8 <= r && x->record_spawner + 8 <= r && x->record_parent + 8 <= r &&
           x->record_next + 8 <= r && x->object_type < 64 && x->var_size < 64 && x->tuple_items < 64 &&
           x->bytearray_start < 128 && x->backtrace_raw < 4096 && x->backtrace_truncated < 4096;
}

/* Node n's (site, spawner repr, parent): a record with a site, or a 3-tuple
 * copy (spawn.c's ancestry nodes); false where the chain ends. */
static bool read_node(btc_rmem *m, const btc_spawn_export *x, uintptr_t n, uintptr_t fields[3])
{
    uint8_t r[MAX_RECORD];
    intptr_t size;
    if (is_type(m, x, n, x->tuple_type))
        return rd(m, n + x->var_size, &size, sizeof size) && size == 3 &&
               rd(m, n + x->tuple_items, fields, 3 * sizeof *fields);
    if (!is_type(m, x, n, x->record_type) || !rd(m, n, r, x->record_size) || !field(r, x->record_site))
        return false;
    fields[0] = field(r, x->record_site);
    fields[1] = field(r, x->record_spawner);
    fields[2] = field(r, x->record_parent);
    return true;
}

/* ---- sites, each read once ---- */

typedef struct {
    uintptr_t *keys;
    int32_t *index;
    size_t mask;
} site_table;

static void read_site(btc_rmem *m, const btc_spawn_export *x, btc_remote_spawn_out *o, btc_remote_site *s)
{
    uintptr_t raw, flag, start;
    intptr_t size;
    *s = (btc_remote_site){.address = s->address, .first = o->nframes};
    if (!is_type(m, x, s->address, x->backtrace_type) || !rd(m, s->address + x->backtrace_raw, &raw, sizeof raw) ||
        !rd(m, s->address + x->backtrace_truncated, &flag, sizeof flag) || !is_type(m, x, raw, x->bytearray_type) ||
        !rd(m, raw + x->var_size, &size, sizeof size) || !rd(m, raw + x->bytearray_start, &start, sizeof start) ||
        size < 0 || size % sizeof(btc_frame))
        return;
    size_t n = (size_t)size / sizeof(btc_frame), room = (size_t)(o->max_frames - o->nframes);
    s->truncated = flag == x->true_object;
    if (n > room) {
        n = room;
        s->truncated = 1;
    }
    if (n && btc_rmem_read(m, start, o->frames + o->nframes, n * sizeof(btc_frame)) != 0)
        return;
    s->n = (int32_t)n;
    s->read = 1;
    o->nframes += (int32_t)n;
}

/* The index of site `address` in o->sites, read now if new; -1 when there is no room. */
static int32_t site_of(btc_rmem *m, const btc_spawn_export *x, btc_remote_spawn_out *o, site_table *t,
                       uintptr_t address)
{
    size_t at = (address >> 4) * 0x9e3779b97f4a7c15ULL & t->mask;
    for (; t->keys[at]; at = (at + 1) & t->mask)
        if (t->keys[at] == address)
            return t->index[at];
    if (o->nsites == o->max_sites)
        return -1;
    btc_remote_site *s = &o->sites[o->nsites];
    s->address = address;
    read_site(m, x, o, s);
    t->keys[at] = address;
    return t->index[at] = o->nsites++;
}

/* ---- chains ---- */

/* Record at's chain into o (its links newest first, as walk_chain() in spawn.c). */
static void read_chain(btc_rmem *m, const btc_spawn_export *x, btc_remote_spawn_out *o, site_table *t,
                       uintptr_t at, btc_remote_chain *c)
{
    uint32_t most = x->generations < MAX_GENERATIONS ? x->generations : MAX_GENERATIONS;
    uintptr_t f[3], n = at;
    c->first = o->nlinks;
    c->n = 0;
    loop_watch w = {.power = 1};
    bool node = read_node(m, x, n, f);
    for (; node && (uint32_t)c->n < most && o->nlinks < o->max_links && !loops(&w, n); node = read_node(m, x, n, f)) {
        int32_t site = site_of(m, x, o, t, f[0]);
        if (site < 0)
            break;
        uintptr_t creator = 0;   /* the parent node, when a record, is the spawner's: its greenlet or task */
        if (is_type(m, x, f[2], x->record_type))
            rd(m, f[2] + x->record_object, &creator, sizeof creator);
        o->links[o->nlinks++] = (btc_remote_link){.site = site, .spawner = f[1], .creator = creator};
        c->n++;
        n = f[2];
    }
    c->cut = node || n == x->ellipsis;
}

int btc_remote_spawn_chains(btc_rmem *m, const btc_spawn_export *x, btc_remote_spawn_out *o)
{
    o->nchains = o->nlinks = o->nsites = o->nframes = o->more = 0;
    if (!m || !usable(x) || o->max_chains < 0 || o->max_links < 0 || o->max_sites < 0 || o->max_frames < 0)
        return -1;
    size_t slots = 16;
    while (slots < 2 * (size_t)o->max_sites)
        slots *= 2;
    site_table t = {calloc(slots, sizeof *t.keys), malloc(slots * sizeof *t.index), slots - 1};
    uint8_t r[MAX_RECORD];
    uintptr_t at;
    bool ok = t.keys && t.index && rd(m, x->live + x->record_next, &at, sizeof at);
    loop_watch w = {.power = 1};
    for (; ok && at != x->live && !loops(&w, at); at = field(r, x->record_next)) {
        if (!is_type(m, x, at, x->record_type) || !rd(m, at, r, x->record_size))
            break;   /* the list ends where it cannot be read */
        if (o->nchains == o->max_chains) {
            o->more = 1;
            break;
        }
        btc_remote_chain *c = &o->chains[o->nchains];
        c->object = field(r, x->record_object);
        if (!c->object)
            continue;   /* its greenlet died: the record goes at its callback */
        read_chain(m, x, o, &t, at, c);
        o->nchains++;
    }
    free(t.keys);
    free(t.index);
    return ok ? 0 : -1;
}
