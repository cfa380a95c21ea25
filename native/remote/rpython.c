/* Another process's interpreter: where its thread states, gc lists and
 * frames are, and the walks over them (through btc_rmem, never in place).
 *
 * Every offset comes from one table, btc_remote_layout (pylayout.c: known
 * per version family, completed from the target's _Py_DebugOffsets on
 * 3.13+), so one walker reads any version btcore knows; the gc scan and
 * greenlets' saved states below need greenlet's layout, not CPython's.
 */
#include <Python.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "capture/cpython/pyframes.h"
#include "capture/greenlet_state.h"
#include "remote/rmem.h"

#define MAX_TYPE_DEPTH 32
#define TYPE_MEMO 256

/* ---- Python frames (any version the layout table describes) ---- */

/* What a walk reads memory through: the target's memory, except a
 * suspended greenlet's stack [lo, hi), whose first nspill bytes greenlet
 * copied to the heap and are read from that copy (spill). */
typedef struct {
    btc_rmem *m;
    uintptr_t lo, hi;
    const uint8_t *spill;
    size_t nspill;
} rview;

static bool view_read(const rview *v, uintptr_t a, void *out, size_t n)
{
    if (a >= v->lo && a - v->lo <= v->nspill && n <= v->nspill - (a - v->lo)) {
        memcpy(out, v->spill + (a - v->lo), n);
        return true;
    }
    return btc_rmem_read(v->m, a, out, n) == 0;
}

static bool view_word(const rview *v, uintptr_t a, uintptr_t *out)
{
    return view_read(v, a, out, sizeof *out);
}

/* Shims between two Python frames: one per eval-loop call. */
#define MAX_SHIMS 4

/* A frame's owner and previous link; false if unreadable or misaligned. */
static bool frame_link(const rview *v, const btc_remote_layout *L, uintptr_t f, uint8_t *owner, uintptr_t *prev)
{
    return !(f & 7) && view_read(v, f + L->frame_owner, owner, 1) && view_word(v, f + L->frame_previous, prev);
}

static bool is_shim(const btc_remote_layout *L, uint8_t owner)
{
    return L->shim_owner && owner >= L->shim_owner;
}

/* The frame's code object: 0 if none, or not a code object. */
static uintptr_t code_of(const rview *v, const btc_remote_layout *L, uintptr_t f)
{
    uintptr_t code, type;
    if (!view_word(v, f + L->frame_executable, &code))
        return 0;
    code &= ~(uintptr_t)L->executable_tag_bits;
    if (!code || (code & 7))
        return 0;
    if (L->code_type && (!btc_rmem_word(v->m, code + offsetof(PyObject, ob_type), &type) || type != L->code_type))
        return 0;
    return code;
}

/* Does the link greenlet saved for frame f (its frame object's spare
 * storage) differ from the exposed one and reach it through shims only,
 * all on the greenlet's stack?  (capture/cpython/chain.h decides it so in
 * process.) */
static bool saved_link_ends_call(const rview *v, const btc_remote_layout *L, uintptr_t f, uintptr_t exposed)
{
    uintptr_t frame_object, saved;
    if (!view_word(v, f + L->frame_frame_obj, &frame_object) || !frame_object ||
        !view_word(v, frame_object + L->frame_object_data, &saved) || saved == exposed)
        return false;
    for (int i = 0; i < MAX_SHIMS; i++) {
        uint8_t owner;
        uintptr_t prev;
        if (!saved || saved < v->lo || saved >= v->hi || !frame_link(v, L, saved, &owner, &prev) ||
            !is_shim(L, owner))
            return false;
        if (prev == exposed || !exposed)
            return true;
        saved = prev;
    }
    return false;
}

/* Is Python frame f (previous link prev) the entry frame of its eval-loop
 * call, as far as the frame itself (3.11) or greenlet's saved link tells?
 * A shim after it marks it too (frame_chain). */
static bool says_entry(const rview *v, const btc_remote_layout *L, uintptr_t f, uintptr_t prev, bool exposed)
{
    if (L->frame_is_entry >= 0) {
        /* a C bool in the target, read as a byte: a frame read while it
         * changes may hold any value there (UBSan caught a bool load) */
        uint8_t flag;
        return view_read(v, f + (uint32_t)L->frame_is_entry, &flag, 1) && flag;
    }
    return exposed && saved_link_ends_call(v, L, f, prev);
}

/* A chain cut short ends in a frame with code 0 whose lasti says why
 * (BTC_REMOTE_CUT_*), when there is room for it. */
static int cut(btc_remote_pyframe *out, int n, int max, int why)
{
    if (n > 0)
        out[n - 1].entry = 1;   /* the outermost frame read ends its eval-loop call, as far as anyone knows */
    if (n >= max)
        return n;
    out[n] = (btc_remote_pyframe){0, why, 0};
    return n + 1;
}

static int32_t lasti_of(uintptr_t instr, uintptr_t code, const btc_remote_layout *L)
{
    intptr_t at = (intptr_t)(instr - code - L->code_adaptive);
    return at > INT32_MIN && at <= INT32_MAX ? (int32_t)at : INT32_MIN;   /* checked where the code is read */
}

/* The chain from interpreter frame f: code, instruction offset, entry
 * flag.  exposed: a suspended greenlet's chain (3.12+: relinked past the
 * shims).  Shims and frames without code take steps too. */
static int frame_chain(const rview *v, const btc_remote_layout *L, uintptr_t f, bool exposed,
                       btc_remote_pyframe *out, int max)
{
    int n = 0;
    bool skipped = false;
    loop_watch watch = {0, 0, 1};
    for (int steps = 0; f && n < max && steps < BTC_PY_MAX_FRAMES; steps++) {
        uint8_t owner;
        uintptr_t prev, code, instr;
        if (!frame_link(v, L, f, &owner, &prev))
            return cut(out, n, max, BTC_REMOTE_CUT_UNREADABLE);
        if (is_shim(L, owner)) {
            if (n > 0)
                out[n - 1].entry = 1;
        } else if ((code = code_of(v, L, f)) && view_word(v, f + L->frame_instr_ptr, &instr) && instr) {
            out[n] = (btc_remote_pyframe){code, lasti_of(instr, code, L), says_entry(v, L, f, prev, exposed)};
            n++;
        } else {
            skipped = true;
        }
        f = prev;
        if (f && loops(&watch, f))
            return cut(out, n, max, BTC_REMOTE_CUT_LOOP);
    }
    if (skipped)
        return cut(out, n, max, BTC_REMOTE_CUT_SKIPPED);
    if (n > 0)
        out[n - 1].entry = 1;
    return n;
}

int btc_remote_thread_frames(btc_rmem *m, const btc_remote_layout *L, uintptr_t tstate, btc_remote_pyframe *out,
                             int max)
{
    rview v = {m, 0, 0, NULL, 0};
    uintptr_t holder = tstate, frame;
    if (L->tstate_cframe >= 0 && !btc_rmem_word(m, tstate + (uint32_t)L->tstate_cframe, &holder))
        return cut(out, 0, max, BTC_REMOTE_CUT_UNREADABLE);
    if (!holder)
        return 0;   /* a thread state being made or torn down */
    if (!btc_rmem_word(m, holder + L->tstate_current_frame, &frame))
        return cut(out, 0, max, BTC_REMOTE_CUT_UNREADABLE);
    return frame_chain(&v, L, frame, false, out, max);
}

/* A frame object's interpreter frame, 0 if unreadable. */
static uintptr_t interpreter_frame(const rview *v, const btc_remote_layout *L, uintptr_t frame_object)
{
    uintptr_t frame;
    return frame_object && view_word(v, frame_object + L->frame_object_f_frame, &frame) ? frame : 0;
}

int btc_remote_object_frames(btc_rmem *m, const btc_remote_layout *L, uintptr_t frame_object,
                             btc_remote_pyframe *out, int max)
{
    rview v = {m, 0, 0, NULL, 0};
    return frame_chain(&v, L, interpreter_frame(&v, L, frame_object), false, out, max);
}

int btc_remote_frame_chain(btc_rmem *m, const btc_remote_layout *L, uintptr_t frame, btc_remote_pyframe *out, int max)
{
    rview v = {m, 0, 0, NULL, 0};
    return frame_chain(&v, L, frame, false, out, max);
}

/* ---- instances of a type, through the gc lists (any CPython version) ----
 *
 * What this reads has one layout in every default (not free-threaded)
 * build from 3.8 on: PyGC_Head is two words before the object, and
 * PyTypeObject's tp_base has not moved; the caller finds the list heads
 * (btcore's own offsets, or the target's debug offsets). */

#define GC_HEAD_SIZE (2 * sizeof(uintptr_t))   /* _gc_next, _gc_prev */

typedef struct {
    uintptr_t type[TYPE_MEMO];
    int8_t is[TYPE_MEMO];   /* 0 unknown, 1 yes, -1 no */
} type_memo;

/* Is t `wanted` or a subtype of it?  Remembered per type (a dump meets few). */
static bool is_subtype(btc_rmem *m, type_memo *memo, uintptr_t t, uintptr_t wanted)
{
    size_t slot = (t >> 4) % TYPE_MEMO;
    if (memo->type[slot] == t && memo->is[slot])
        return memo->is[slot] > 0;
    bool yes = false;
    uintptr_t k = t;
    for (int depth = 0; k && !yes && depth < MAX_TYPE_DEPTH; depth++) {   /* a cycle: garbage */
        yes = k == wanted;
        if (!btc_rmem_word(m, k + offsetof(PyTypeObject, tp_base), &k))
            break;
    }
    memo->type[slot] = t;
    memo->is[slot] = yes ? 1 : -1;
    return yes;
}

static bool is_head(const uintptr_t *heads, int nheads, uintptr_t at)
{
    for (int h = 0; h < nheads; h++)
        if (heads[h] == at)
            return true;
    return false;
}

/* Append to out (at *n, at most max) the objects of the list at head
 * whose type is `wanted` or a subtype; false if out is full.  _gc_next
 * holds a clean pointer outside a collection (bit 0 is only set while one
 * runs); a list that does not come back to its head within the bound is
 * garbage, and so is a misaligned link. */
static bool walk_gc_list(btc_rmem *m, type_memo *memo, const uintptr_t *heads, int nheads, uintptr_t head,
                         uintptr_t wanted, uintptr_t *out, int *n, int max, uint64_t *visited, int *broken)
{
    uintptr_t at;
    if (!btc_rmem_word(m, head, &at)) {
        (*broken)++;
        return true;
    }
    loop_watch watch = {0, 0, 1};
    for (at &= ~(uintptr_t)3; at != head && *visited < BTC_REMOTE_MAX_OBJECTS; (*visited)++) {
        uintptr_t w[4];   /* _gc_next, _gc_prev, ob_refcnt, ob_type */
        /* a loop that misses the head, or a link into another list
         * (whose objects that list gives): garbage, the list ends */
        if ((at & 7) || loops(&watch, at) || is_head(heads, nheads, at) || btc_rmem_read(m, at, w, sizeof w) != 0) {
            (*broken)++;
            return true;
        }
        if (w[3] && is_subtype(m, memo, w[3], wanted)) {
            if (*n >= max)
                return false;   /* more than the caller has room for */
            out[(*n)++] = at + GC_HEAD_SIZE;
        }
        at = w[0] & ~(uintptr_t)3;
    }
    return true;
}

static int by_value(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

/* Is the object at `at` (one a walk found before) alive and of type
 * `wanted` or a subtype?  Freeing an object leaves its reference count 0
 * (neither pymalloc nor malloc write there: they reuse its first words)
 * and untracking it clears _gc_next; memory reused by another object has
 * that object's type. */
static bool still_instance(btc_rmem *m, type_memo *memo, uintptr_t at, uintptr_t wanted)
{
    uintptr_t w[4];   /* _gc_next, _gc_prev, ob_refcnt, ob_type */
    return !(at & 7) && at >= GC_HEAD_SIZE && btc_rmem_read(m, at - GC_HEAD_SIZE, w, sizeof w) == 0 && w[0] &&
           (uint32_t)w[2] && w[3] && is_subtype(m, memo, w[3], wanted);   /* 3.12+: the count is the low half */
}

int btc_remote_gc_known(btc_rmem *m, const uintptr_t *heads, int nheads, const uintptr_t *walk, int nwalk,
                        uintptr_t wanted, const uintptr_t *known, int nknown, uintptr_t *out, int max,
                        uint64_t *visited, int *broken)
{
    static type_memo memo;
    memset(&memo, 0, sizeof memo);
    int n = 0;
    *visited = 0;
    *broken = 0;
    for (int h = 0; h < nwalk; h++)
        if (!walk_gc_list(m, &memo, heads, nheads, walk[h], wanted, out, &n, max, visited, broken))
            return -1;
    if (nknown <= 0)
        return n;   /* (in the lists' order) */
    int walked = n;
    qsort(out, (size_t)walked, sizeof *out, by_value);   /* to leave out the known ones found again */
    btc_rmem_prefetch(m, known, nknown);
    for (int i = 0; i < nknown; i++) {
        if (bsearch(&known[i], out, (size_t)walked, sizeof *out, by_value) ||
            !still_instance(m, &memo, known[i], wanted))
            continue;
        if (n >= max)
            return -1;
        out[n++] = known[i];
    }
    return n;
}

int btc_remote_gc_instances(btc_rmem *m, const uintptr_t *heads, int nheads, uintptr_t wanted,
                            uintptr_t *out, int max, uint64_t *visited, int *broken)
{
    return btc_remote_gc_known(m, heads, nheads, heads, nheads, wanted, NULL, 0, out, max, visited, broken);
}

/* ---- greenlets' saved states (any CPython version: greenlet's layout) ---- */

/* Suspended (neither running, dead nor unstarted), from greenlet's own
 * marks: start is 0 once dead, 1 while starting; a running greenlet keeps
 * the sp it last had, but has no saved frame and, having been switched in,
 * its whole stack back in place (saved 0).  A suspended greenlet may lack a
 * Python frame (parked in Cython code: gevent.spawn(queue.get)), but then
 * part of its stack was copied away, or it lies in place untouched: only
 * that last case is taken for a running one. */
static bool suspended(const btc_remote_greenlet *g)
{
    if (g->start <= 1)
        return false;
    return g->frame || g->saved > 0;
}

/* Does the heap copy of g's saved stack overlap [lo, hi)? */
static bool copy_overlaps(const btc_remote_greenlet *g, uintptr_t lo, uintptr_t hi)
{
    return g->saved > 0 && g->copy < hi && (g->copy >= lo || lo - g->copy < (uintptr_t)g->saved);
}

/* A started greenlet's state that greenlet never writes: its stack not
 * below its stop, larger than any thread's, more of it saved than it has,
 * a saved part without a heap copy (or a copy without one), a misaligned
 * frame object or heap copy, or a copy lying over the greenlet's own object
 * or the state just read of it (greenlet allocates the copy apart from both)
 * (a corrupt target: kept, marked, so the dump says so). */
static bool inconsistent(const btc_remote_greenlet *g, uintptr_t pimpl, size_t pimpl_read, size_t object_read)
{
    return g->start > 1 && (!btc_greenlet_state_written(g->start, g->stop, g->copy, g->saved) || (g->frame & 7) ||
                            (g->copy & 7) || copy_overlaps(g, pimpl, pimpl + pimpl_read) ||
                            copy_overlaps(g, g->address, g->address + object_read));
}

int btc_remote_greenlet_states(btc_rmem *m, const uintptr_t *greenlets, int n, const size_t *offsets,
                               btc_remote_greenlet *out)
{
    size_t pimpl_off = offsets[0], state_off = offsets[1], frame_off = offsets[2];
    uintptr_t *pimpls = malloc((n ? n : 1) * sizeof *pimpls);
    for (int i = 0; pimpls && i < n; i++)   /* where to read next, then all of it at once */
        pimpls[i] = btc_rmem_word(m, greenlets[i] + pimpl_off, &pimpls[i]) ? pimpls[i] + state_off : 0;
    if (pimpls)
        btc_rmem_prefetch(m, pimpls, n);
    free(pimpls);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        uintptr_t g = greenlets[i], pimpl, state[4];
        btc_remote_greenlet *o = &out[kept];
        memset(o, 0, sizeof *o);
        o->address = g;
        if (!btc_rmem_word(m, g + sizeof(Py_ssize_t), &o->type))
            continue;   /* the gc walk read it: gone since (a target that runs) */
        if (!btc_rmem_word(m, g + pimpl_off, &pimpl) || !pimpl || (pimpl & 7) ||
            btc_rmem_read(m, pimpl + state_off, state, sizeof state) != 0 ||
            !btc_rmem_word(m, pimpl + frame_off, &o->frame)) {
            o->bad = BTC_REMOTE_BAD_UNREADABLE;
            o->frame = 0;
            kept++;
            continue;
        }
        o->start = state[0];
        o->stop = state[1];
        o->copy = state[2];
        o->saved = (intptr_t)state[3];
        if (inconsistent(o, pimpl, (state_off > frame_off ? state_off : frame_off) + sizeof state,
                         pimpl_off + sizeof pimpl)) {
            o->bad = BTC_REMOTE_BAD_INCONSISTENT;
            o->saved = 0;
            o->frame = 0;
            kept++;
            continue;
        }
        kept += suspended(o);
    }
    return kept;
}

/* The mapping of the sorted [lo, hi) that holds addr, or -1. */
static int mapping_of(const uintptr_t *lo, const uintptr_t *hi, int nmaps, uintptr_t addr)
{
    int a = 0, b = nmaps;   /* the first mapping with lo > addr, by bisection */
    while (a < b) {
        int mid = a + (b - a) / 2;
        if (lo[mid] <= addr)
            a = mid + 1;
        else
            b = mid;
    }
    return a > 0 && addr < hi[a - 1] ? a - 1 : -1;
}

size_t btc_remote_greenlet_fit(btc_remote_greenlet *gs, int n, const uintptr_t *lo, const uintptr_t *hi, int nmaps,
                               size_t budget)
{
    size_t total = 0;
    int last = -1;   /* most greenlets lie on one thread's stack */
    for (int i = 0; i < n; i++) {
        btc_remote_greenlet *g = &gs[i];
        if (g->bad || g->saved <= 0)
            continue;
        size_t size = (size_t)g->saved;
        uintptr_t end = g->stop == BTC_GREENLET_MAIN_STACK_STOP ? g->start + size : g->stop;
        if (last < 0 || g->start < lo[last] || g->start >= hi[last])
            last = mapping_of(lo, hi, nmaps, g->start);
        if (last < 0 || end < g->start || end > hi[last] || size > budget - total) {
            g->bad = BTC_REMOTE_BAD_SKIPPED;
            continue;
        }
        total += size;
    }
    return total;
}

/* The greenlet's view of memory: its stack, whose saved part is read
 * from the heap copy made of it (in spill at spill_at, if copied). */
static rview greenlet_view(btc_rmem *m, const btc_remote_greenlet *g, const uint8_t *spill, const uintptr_t *lo,
                           const uintptr_t *hi, int nmaps)
{
    rview v = {m, g->start, g->stop, NULL, 0};
    if (g->stop == BTC_GREENLET_MAIN_STACK_STOP) {   /* a main greenlet: its thread's stack, to the end of its mapping */
        int at = mapping_of(lo, hi, nmaps, g->start);
        v.hi = at >= 0 ? hi[at] : g->start;
    }
    if (g->copied && g->saved > 0) {
        v.spill = spill + g->spill_at;
        v.nspill = (size_t)g->saved;
    }
    return v;
}

/* The previous stop's greenlets, by address (bisection over an index). */
typedef struct {
    uintptr_t address;
    int at;
} by_address_entry;

static int by_entry_address(const void *a, const void *b)
{
    uintptr_t x = ((const by_address_entry *)a)->address, y = ((const by_address_entry *)b)->address;
    return (x > y) - (x < y);
}

typedef struct {
    const btc_remote_greenlet *gs;
    const uint8_t *spill;
    size_t spill_size;
    by_address_entry *index;   /* NULL: nothing to reuse */
    int n;
} previous_stop;

static previous_stop previous_of(const btc_remote_greenlet *prev, int nprev, const uint8_t *prev_spill,
                                 size_t prev_spill_size)
{
    previous_stop p = {prev, prev_spill, prev_spill_size, NULL, 0};
    if (!prev || !prev_spill || nprev <= 0 || !(p.index = malloc((size_t)nprev * sizeof *p.index)))
        return p;
    for (int i = 0; i < nprev; i++)
        p.index[i] = (by_address_entry){prev[i].address, i};
    qsort(p.index, (size_t)nprev, sizeof *p.index, by_entry_address);
    p.n = nprev;
    return p;
}

/* The previous stop's copy of g's saved stack, if g's state is the one it had then (same stack, same heap
 * copy at the same address and size, same top frame): NULL otherwise. */
static const uint8_t *unchanged_copy(const previous_stop *p, const btc_remote_greenlet *g)
{
    by_address_entry key = {g->address, 0}, *e = p->index ? bsearch(&key, p->index, (size_t)p->n, sizeof key,
                                                                     by_entry_address) : NULL;
    const btc_remote_greenlet *q = e ? &p->gs[e->at] : NULL;
    if (!q || !q->copied || q->bad || q->type != g->type || q->start != g->start || q->stop != g->stop ||
        q->copy != g->copy || q->saved != g->saved || q->frame != g->frame || q->spill_at > p->spill_size ||
        (size_t)g->saved > p->spill_size - q->spill_at)
        return NULL;
    return p->spill + q->spill_at;
}

void btc_remote_greenlet_spills(btc_rmem *m, btc_remote_greenlet *gs, int n, uint8_t *spill, size_t spill_size,
                                const btc_remote_greenlet *prev, int nprev, const uint8_t *prev_spill,
                                size_t prev_spill_size)
{
    uintptr_t *addr = malloc((n ? n : 1) * sizeof *addr);
    size_t *size = malloc((n ? n : 1) * sizeof *size);
    uint8_t **dest = malloc((n ? n : 1) * sizeof *dest), *ok = malloc(n ? n : 1);
    int *reader = malloc((n ? n : 1) * sizeof *reader);   /* the greenlet each read is for */
    previous_stop before = previous_of(prev, nprev, prev_spill, prev_spill_size);
    int nread = 0;
    size_t spilled = 0;
    for (int i = 0; i < n; i++) {   /* the heap copies: in batches */
        btc_remote_greenlet *g = &gs[i];
        g->spill_at = spilled;
        g->copied = g->saved == 0 && !g->bad;
        if (!addr || !size || !dest || !ok || !reader || g->bad || g->saved <= 0 || (size_t)g->saved > spill_size - spilled)
            continue;
        if (unchanged_copy(&before, g)) {
            g->copied = BTC_REMOTE_COPIED_BEFORE;   /* copied by btc_remote_greenlet_reuse(), after the stop */
        } else {
            addr[nread] = g->copy;
            size[nread] = (size_t)g->saved;
            dest[nread] = spill + spilled;
            reader[nread++] = i;
        }
        spilled += (size_t)g->saved;
    }
    if (nread)
        btc_rmem_read_many(m, addr, size, dest, nread, ok);
    /* (by index, not by where the copy went: a skipped or bad greenlet's spill_at is its successor's) */
    for (int r = 0; r < nread; r++)
        gs[reader[r]].copied = ok[r];
    free(before.index);
    free(addr);
    free(size);
    free(dest);
    free(ok);
    free(reader);
}

void btc_remote_greenlet_reuse(btc_remote_greenlet *gs, int n, uint8_t *spill, const btc_remote_greenlet *prev,
                               int nprev, const uint8_t *prev_spill, size_t prev_spill_size)
{
    previous_stop before = previous_of(prev, nprev, prev_spill, prev_spill_size);
    for (int i = 0; i < n; i++) {
        btc_remote_greenlet *g = &gs[i];
        if (g->copied != BTC_REMOTE_COPIED_BEFORE)
            continue;
        const uint8_t *same = unchanged_copy(&before, g);
        if (same)
            memcpy(spill + g->spill_at, same, (size_t)g->saved);
        else
            g->copied = 0;   /* (no previous state to take it from: not one spills() chose) */
    }
    free(before.index);
}

int btc_remote_greenlet_frames(btc_rmem *m, const btc_remote_layout *L, btc_remote_greenlet *gs, int n,
                               const uint8_t *spill, btc_remote_pyframe *frames, int max_frames,
                               const uintptr_t *lo, const uintptr_t *hi, int nmaps)
{
    uintptr_t *addr = malloc((n ? n : 1) * sizeof *addr);
    rview plain = {m, 0, 0, NULL, 0};
    for (int i = 0; addr && i < n; i++)   /* each greenlet's innermost interpreter frame, read together */
        addr[i] = interpreter_frame(&plain, L, gs[i].frame);
    if (addr)
        btc_rmem_prefetch(m, addr, n);
    free(addr);
    int nframes = 0;
    for (int i = 0; i < n; i++) {
        btc_remote_greenlet *g = &gs[i];
        g->frames_at = nframes;
        g->nframes = 0;
        if (g->frame && nframes < max_frames) {
            rview v = greenlet_view(m, g, spill, lo, hi, nmaps);
            g->nframes = frame_chain(&v, L, interpreter_frame(&v, L, g->frame), true, frames + nframes,
                                     max_frames - nframes);
            if (!g->nframes && !g->bad)   /* a suspended greenlet's top frame always gives one */
                g->bad = BTC_REMOTE_BAD_FRAME;
        }
        nframes += g->nframes;
    }
    return nframes;
}

/* A suspended greenlet's stack is its heap copy alone when that copy holds
 * all of it (a greenlet other than a thread's main one, whose stack was
 * saved whole): the common case, filled here in one pass.  The others keep
 * a part in place on their thread's stack: the caller joins the two. */
static bool copy_is_whole(const btc_remote_greenlet *g)
{
    return g->copied && g->stop != BTC_GREENLET_MAIN_STACK_STOP && g->start + (uintptr_t)g->saved >= g->stop;
}

int btc_remote_greenlet_stacks(const btc_remote_greenlet *states, const int32_t *rows, int n, const uint8_t *spill,
                               size_t spill_size, const btc_remote_pyframe *frames, int nframes, int32_t walk,
                               btc_remote_stack *out, int32_t *left)
{
    int nleft = 0;
    for (int i = 0; i < n; i++) {
        const btc_remote_greenlet *g = &states[rows[i]];
        btc_remote_stack *st = &out[i];
        st->greenlet = 1;
        st->lo = g->start;
        st->last_cfa = g->stop == BTC_GREENLET_MAIN_STACK_STOP ? 0 : g->stop;
        bool framed = g->nframes > 0 && g->frames_at >= 0 && g->frames_at <= nframes - g->nframes;
        st->py = framed ? frames + g->frames_at : NULL;
        st->npy = framed ? g->nframes : 0;
        if (!walk || (g->bad != 0 && g->bad != BTC_REMOTE_BAD_FRAME))   /* a bad top frame leaves the stack whole */
            continue;
        if (copy_is_whole(g) && g->spill_at <= spill_size && (uint64_t)g->saved <= spill_size - g->spill_at) {
            st->copy = spill + g->spill_at;
            st->size = (uint64_t)g->saved;
        } else {
            left[nleft++] = i;
        }
    }
    return nleft;
}

int btc_remote_greenlet_copies(btc_rmem *m, const btc_remote_layout *L, btc_remote_greenlet *gs, int n,
                               uint8_t *spill, size_t spill_size, btc_remote_pyframe *frames, int max_frames,
                               const uintptr_t *lo, const uintptr_t *hi, int nmaps)
{
    btc_remote_greenlet_spills(m, gs, n, spill, spill_size, NULL, 0, NULL, 0);
    return btc_remote_greenlet_frames(m, L, gs, n, spill, frames, max_frames, lo, hi, nmaps);
}
