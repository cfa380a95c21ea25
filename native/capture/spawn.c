/* Spawn tracking: every greenlet created while it is on remembers where it
 * was created and who created it, all generations, bounded.
 *
 * The hook.  greenlet.greenlet is a C type; every way of creating one from
 * Python (the class, any subclass, gevent's Cython Greenlet, super().__new__)
 * goes through a tp_new slot.  Subclasses copied greenlet's slot when they
 * were made, so enabling swaps the slot of greenlet.greenlet and of every
 * existing subclass still holding the original; subclasses made later
 * inherit the swapped one; disabling puts the original back wherever the
 * hook is.  Nothing else of greenlet is touched.  (C code calling greenlet's
 * C API PyGreenlet_New bypasses tp_new and is not tracked.)  asyncio tasks
 * are hooked where they register (see "asyncio tasks" below) and get the
 * same records; their creator is the running task, else the greenlet.
 *
 * What is recorded.  At creation: the raw frames of the creating stack
 * (capture.c, no names), interned: identical sites are one Backtrace,
 * found through a table keyed by a hash of the raw records.
 *
 * Per greenlet: one record, a weakref subclass to the greenlet (found again
 * through the greenlet's weakref list), held by a live list and dropped by
 * the weakref's callback when the greenlet dies.  The record is also the
 * greenlet's ancestry node: (its site, its spawner's repr, its spawner's
 * record), so descendants share their ancestors' records, never copies:
 * the chain over generations is followed when it is read, each site stored
 * once (copying ancestors' frames into each child is what truncated them).
 * A live chain is bounded in generations, not frames: when a spawner's
 * chain reaches 2 * GENERATIONS, its parent link is replaced by a copy of
 * its newest GENERATIONS - 1 ancestors (tuples (site, spawner repr, parent))
 * ending in Ellipsis (older ones dropped), so older nodes can be freed
 * (amortised: one copied node per generation).  Records, nodes and sites
 * are ordinary objects: what nobody references is freed.
 *
 * Concurrency: everything runs with the GIL held, there is no lock (nothing
 * to reset after fork).  The hook may run Python code (the spawner's repr,
 * finalizers during an allocation), which may hand the GIL to another
 * thread: no pointer into the table is kept across such a call, and the
 * table and the list are changed only in C code that runs no Python.
 */
#include <Python.h>

#include "capture/capture.h"
#include "capture/greenlet_context.h"
#include "capture/cpython/pyframes.h"   /* and btc_asyncio_running_task() */
#include "capture/signal_capture.h"
#include "capture/spawn.h"
#include "capture/spawn_crash.h"
#include "common/builtins.h"
#include "common/referent.h"

/* ---- state ---- */

static PyTypeObject *greenlet_type;
static newfunc original_new;
static bool enabled;
static int capacity = BTC_SPAWN_DEFAULT_CAPACITY;   /* frames of a whole chain's Backtrace */
static int site_want = BTC_WANT_PYTHON | BTC_WANT_NATIVE;
static __thread bool in_hook;   /* greenlets created by the hook's own work are not tracked */

/* The hooks' own work, kept apart from their caller: greenlets it creates
 * are not tracked (in_hook), its failures are not the caller's (the
 * caller's exception, if one is set, is put aside and restored, and the
 * work's own is dropped). */
typedef struct {
    PyObject *type, *value, *tb;
    bool was_in_hook;
} hook_work;

static hook_work hook_work_begin(void)
{
    hook_work w = {.was_in_hook = in_hook};
    PyErr_Fetch(&w.type, &w.value, &w.tb);
    in_hook = true;
    return w;
}

static void hook_work_end(hook_work w)
{
    PyErr_Clear();
    PyErr_Restore(w.type, w.value, w.tb);
    in_hook = w.was_in_hook;
}
/* Creations watched (the profiler, btc_spawn_watch_creation): a weak
 * reference to every greenlet made since the watcher last took the list,
 * at most CREATED_MAX (beyond, `lost`: the watcher scans the heap instead);
 * NULL: not watched. */
#define CREATED_MAX 10000
static PyObject *created;
static bool created_lost;

/* ---- records: one per tracked greenlet ---- */

typedef struct record {
    PyWeakReference ref;        /* to the greenlet; the callback unlinks the record */
    PyObject *site;             /* where the greenlet was created; NULL: an untracked spawner */
    PyObject *spawner;          /* the repr of the greenlet that created it */
    PyObject *parent;           /* the spawner's node: its record (a site-less one if the spawner
                                 * was not tracked: it holds the spawner's repr and a weak
                                 * reference to it) or a tuple copy; NULL: none */
    PyObject *name;             /* this greenlet's repr, taken when it first spawns; NULL before */
    PyObject *creator;          /* the spawner's record (a weakref to it), while this greenlet lives:
                                 * dropped at its death, so records never chain through it */
    const void *bottom;         /* a task's: its coroutine's interpreter frame, where the sites of the
                                 * tasks it creates end (see task_bottom); NULL: not known yet */
    struct record *prev, *next; /* the live list, which owns one reference */
} record;

static record live = {.prev = &live, .next = &live};
static Py_ssize_t live_records;
static PyObject *record_died;   /* the weakref callback */

static int record_traverse(PyObject *self, visitproc visit, void *arg)
{
    record *r = (record *)self;
    Py_VISIT(r->site);
    Py_VISIT(r->spawner);
    Py_VISIT(r->parent);
    Py_VISIT(r->name);
    Py_VISIT(r->creator);
    return _PyWeakref_RefType.tp_traverse(self, visit, arg);
}

static int record_clear(PyObject *self)
{
    record *r = (record *)self;
    Py_CLEAR(r->site);
    Py_CLEAR(r->spawner);
    Py_CLEAR(r->parent);
    Py_CLEAR(r->name);
    Py_CLEAR(r->creator);
    return _PyWeakref_RefType.tp_clear(self);
}

static void record_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_TRASHCAN_BEGIN(self, record_dealloc)   /* a chain of records frees its parents */
    record_clear(self);
    _PyWeakref_RefType.tp_dealloc(self);
    Py_TRASHCAN_END
}

static PyTypeObject record_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "btcore._SpawnRecord",
    .tp_basicsize = sizeof(record),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = record_dealloc,
    .tp_traverse = record_traverse,
    .tp_clear = record_clear,
};

static void link_record(record *r)
{
    Py_INCREF(r);
    r->prev = live.prev;
    r->next = &live;
    live.prev->next = r;
    live.prev = r;
    live_records++;
}

/* The callback of a record: self is NULL, or the callback of the registry
 * (a weakref.WeakSet) that holds the record as its entry (see task_added),
 * which is called first: its entry goes as a plain one's would. */
static PyObject *on_record_died(PyObject *self, PyObject *ref)
{
    PyObject *result = self ? PyObject_CallOneArg(self, ref) : Py_NewRef(Py_None);
    record *r = (record *)ref;
    if (Py_IS_TYPE(ref, &record_type) && r->next) {
        r->prev->next = r->next;
        r->next->prev = r->prev;
        r->prev = r->next = NULL;
        live_records--;
        Py_CLEAR(r->creator);
        Py_DECREF(r);
    }
    return result;
}

/* g's record, borrowed (NULL if none): a weakref of our type in its list.
 * A negative offset is 3.12+'s managed weakref list, before the object
 * (asyncio's tasks, C and Python, have one): read at the same offset. */
static record *record_of(PyObject *g)
{
    Py_ssize_t off = Py_TYPE(g)->tp_weaklistoffset;
    if (off == 0)
        return NULL;
    for (PyWeakReference *w = *(PyWeakReference **)((char *)g + off); w; w = w->wr_next)
        if (Py_IS_TYPE(w, &record_type))
            return (record *)w;
    return NULL;
}

/* A new record for g (a new reference) with no ancestry yet, in the live
 * list, died its callback (record_died, or one made by _spawn_task_hook);
 * NULL on failure. */
static record *new_record(PyObject *g, PyObject *died)
{
    PyObject *args = PyTuple_Pack(2, g, died);
    record *r = args ? (record *)_PyWeakref_RefType.tp_new(&record_type, args, NULL) : NULL;
    Py_XDECREF(args);
    if (r)
        link_record(r);
    return r;
}

/* ---- interned sites ---- */

/* A weak reference to an interned site that remembers its hash, so that
 * its callback finds the table entry to remove. */
typedef struct {
    PyWeakReference ref;
    Py_hash_t hash;
} site_ref;

static PyTypeObject site_ref_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "btcore._SiteRef",
    .tp_basicsize = sizeof(site_ref),
    .tp_flags = Py_TPFLAGS_DEFAULT,   /* weakref's GC support is inherited */
};

typedef struct {
    Py_hash_t hash;
    site_ref *ref;   /* owned; NULL: empty; TOMBSTONE: removed */
} intern_slot;

#define TOMBSTONE ((site_ref *)1)
static intern_slot *table;
static size_t table_mask, table_live, table_filled;
static PyObject *site_died;

/* The sites interned last stay alive even when no greenlet uses them any
 * more: a loop spawning short-lived greenlets reuses its site instead of
 * capturing it into a new Backtrace each time.  Bounded. */
#define RECENT_SITES 16
static PyObject *recent[RECENT_SITES];
static unsigned recent_next;

/* Each frame record is two words; two independent lanes keep the
 * multiplications from waiting on each other. */
static Py_hash_t hash_site(const btc_raw_capture *c)
{
    const uint64_t *w = (const uint64_t *)c->frames;
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t a = (uint64_t)c->n * 2 + c->truncated, b = ~a;
    for (int i = 0; i < c->n; i++) {
        a = (a ^ w[2 * i]) * k;
        b = (b ^ w[2 * i + 1]) * k;
        a ^= a >> 29;
        b ^= b >> 31;
    }
    uint64_t h = (a ^ (b * k)) * k;
    return (Py_hash_t)((h ^ (h >> 32)) & (uint64_t)PY_SSIZE_T_MAX);
}

/* Does interned site `ref` hold exactly the frames of c? */
static bool same_site(site_ref *ref, const btc_raw_capture *c, PyObject **site)
{
    *site = btc_referent(ref);
    return *site && btc_backtrace_holds(*site, c);
}

/* The interned site with c's frames (borrowed), or NULL. */
static PyObject *find_site(const btc_raw_capture *c, Py_hash_t hash)
{
    if (!table)
        return NULL;
    for (size_t i = (size_t)hash & table_mask;; i = (i + 1) & table_mask) {
        intern_slot *e = &table[i];
        PyObject *site;
        if (!e->ref)
            return NULL;
        if (e->ref != TOMBSTONE && e->hash == hash && same_site(e->ref, c, &site))
            return site;
    }
}

static void place(intern_slot *t, size_t mask, Py_hash_t hash, site_ref *ref)
{
    size_t i = (size_t)hash & mask;
    while (t[i].ref)
        i = (i + 1) & mask;
    t[i] = (intern_slot){hash, ref};
}

/* Room for one more entry (no Python code runs here); false: no memory. */
static bool table_reserve(void)
{
    if (table && (table_filled + 1) * 3 < (table_mask + 1) * 2)
        return true;
    size_t size = 64;
    while (size < (table_live + 1) * 4)
        size <<= 1;
    intern_slot *t = PyMem_Calloc(size, sizeof *t);
    if (!t)
        return false;
    for (size_t i = 0; table && i <= table_mask; i++)
        if (table[i].ref && table[i].ref != TOMBSTONE)
            place(t, size - 1, table[i].hash, table[i].ref);
    PyMem_Free(table);
    table = t;
    table_mask = size - 1;
    table_filled = table_live;
    return true;
}

static PyObject *on_site_died(PyObject *self, PyObject *ref)
{
    (void)self;
    if (!table || !Py_IS_TYPE(ref, &site_ref_type))
        Py_RETURN_NONE;
    for (size_t i = (size_t)((site_ref *)ref)->hash & table_mask; table[i].ref; i = (i + 1) & table_mask) {
        if (table[i].ref == (site_ref *)ref) {
            table[i].ref = TOMBSTONE;
            table_live--;
            Py_DECREF(ref);
            break;
        }
    }
    Py_RETURN_NONE;
}

/* The site for capture c (a new reference): the interned one, or a new one
 * interned now.  NULL on failure. */
static PyObject *intern_site(const btc_raw_capture *c, PyObject **codes)
{
    Py_hash_t hash = hash_site(c);
    PyObject *site = find_site(c, hash);
    if (site)
        return Py_NewRef(site);
    PyObject *fresh = btc_backtrace_from_site(c, codes, c->max);
    PyObject *args = fresh ? PyTuple_Pack(2, fresh, site_died) : NULL;
    site_ref *ref = args ? (site_ref *)_PyWeakref_RefType.tp_new(&site_ref_type, args, NULL) : NULL;
    Py_XDECREF(args);
    /* The allocations above may have run Python code (finalizers), and with
     * it another thread's spawns: look again before inserting. */
    site = fresh && ref ? find_site(c, hash) : NULL;
    if (site || !ref || !table_reserve()) {
        Py_XDECREF(ref);
        Py_XDECREF(fresh);
        return site ? Py_NewRef(site) : NULL;
    }
    ref->hash = hash;
    place(table, table_mask, hash, ref);   /* the table owns ref */
    table_live++;
    table_filled++;
    unsigned slot = recent_next++ % RECENT_SITES;   /* Py_XSETREF evaluates its target twice */
    Py_XSETREF(recent[slot], Py_NewRef(fresh));
    return fresh;
}

/* ---- sites seen before ----
 *
 * A loop that spawns from one place captures the same site each time: the
 * same native frames at the same stack depth, the same Python frames at
 * the same instructions (in any greenlet: they run on the same C stack).
 * Proving that (btc_site_proven: a walk of the Python chain and a read of
 * each stack word the native walk read) costs a fraction of walking,
 * merging and interning again, so the hook keeps, per place (its sp and
 * pc, its innermost Python instruction, its stop), the
 * proof of the last capture there and the site interned for it.  A proof
 * is made at the second capture from a place only: places seen once (the
 * tasks of ever new creators) pay nothing for it.  Bounded: 8 places'
 * entries, each a weak reference to its site: a proof holds while its site
 * lives, which holds the code objects the proof names (a site still dies
 * with its last greenlet, once out of the ring of recent sites).
 * Two-way: a place's set is its hash's top bits, and two places whose
 * hashes share them keep a proof each (direct-mapped, a loop spawning at
 * two such places, as a spawner and what it spawns do, evicted each
 * other's entry for ever: no proof, every capture a walk). */
#define MEMO_SETS_LOG2 2
#define MEMO_WAYS 2   /* 4 x 2: 8 places */

typedef struct {
    uintptr_t place;        /* the last capture's place here */
    unsigned installs;      /* moves at every install: a check across one is not believed */
    PyObject *site;         /* a weak reference to what `proof` gave, interned; NULL: none */
    btc_site_proof proof;
} memo_entry;

static memo_entry memo[1 << MEMO_SETS_LOG2][MEMO_WAYS];
static unsigned char memo_newer[1 << MEMO_SETS_LOG2];   /* each set's way used last */
static uint64_t memo_hits;        /* btc_test_spawn_memo() */
static uintptr_t memo_last_place;

static uintptr_t place_of(const btc_regs *regs, const void *stop)
{
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    return (uintptr_t)((((regs->sp * k) ^ regs->ip) * k ^ (uintptr_t)stop) * k ^
                       (uintptr_t)btc_py_current_instr()) * k;
}

/* place's entry: the one of its set that holds it, else the older one
 * (which it is about to take). */
static memo_entry *memo_entry_of(uintptr_t place)
{
    uintptr_t set = place >> (8 * sizeof place - MEMO_SETS_LOG2);
    int way = memo[set][1].place == place ? 1 : memo[set][0].place == place ? 0 : !memo_newer[set];
    memo_newer[set] = (unsigned char)way;
    return &memo[set][way];
}

/* The memo's site for a capture from regs at place, ending at stop (a new
 * reference), or NULL. */
static PyObject *memo_site(memo_entry *m, uintptr_t place, int max, const btc_regs *regs, const void *stop)
{
    unsigned installs = m->installs;
    /* The check may run Python code (the thread's first greenlet made), and
     * another thread install meanwhile: then its answer is not believed. */
    if (!m->site || m->place != place || !btc_referent(m->site) ||
        !btc_site_proven(&m->proof, site_want, max, regs, stop) || m->installs != installs)
        return NULL;
    PyObject *site = btc_referent(m->site);   /* (gone meanwhile: a capture) */
    return site ? Py_NewRef(site) : NULL;
}

/* Keep site, interned from the capture that proof decided, for place.  No
 * Python code runs from the weak reference's making until the entry is
 * whole again. */
static void memo_install(memo_entry *m, uintptr_t place, const btc_site_proof *proof, PyObject *site)
{
    PyObject *ref = PyWeakref_NewRef(site, NULL);
    if (!ref) {
        PyErr_Clear();
        return;
    }
    m->installs++;
    m->place = place;
    m->proof = *proof;
    Py_XSETREF(m->site, ref);
}

/* The site of a capture from regs ending at stop (a new reference in
 * *site; NULL if it could not be interned): the memo's, or captured and
 * interned.  0, or the capture's BTC_E_* code. */
static int site_at(const btc_regs *regs, const void *stop, PyObject **site)
{
    btc_frame frames[BTC_SPAWN_SITE_FRAMES];
    PyObject *codes[BTC_SPAWN_SITE_FRAMES];
    btc_raw_capture c = {.frames = frames,
                         .max = capacity < BTC_SPAWN_SITE_FRAMES ? capacity : BTC_SPAWN_SITE_FRAMES};
    uintptr_t place = memo_last_place = place_of(regs, stop);
    memo_entry *m = memo_entry_of(place);
    if ((*site = memo_site(m, place, c.max, regs, stop))) {
        memo_hits++;
        return 0;
    }
    bool seen = m->place == place;
    m->place = place;
    btc_site_proof proof;
    int rc = btc_capture_site(&c, site_want, regs, stop, seen ? &proof : NULL);
    if (rc != 0)
        return rc;
    *site = intern_site(&c, codes);
    if (seen && proof.valid && *site)
        memo_install(m, place, &proof, *site);
    return 0;
}

/* ---- ancestry nodes ----
 *
 * A node is a record with a site, or a tuple (site, spawner repr, parent)
 * copied by bounded_chain().  A parent is a node, a site-less record (the
 * untracked spawner: the chain ends there), NULL or None (the chain ends)
 * or Ellipsis (it ends because older generations were dropped). */

#define GENERATIONS 64

static bool is_node(PyObject *n)
{
    return n && (PyTuple_CheckExact(n) || (Py_IS_TYPE(n, &record_type) && ((record *)n)->site));
}

/* Field i (0 site, 1 spawner repr, 2 parent) of node n, borrowed. */
static PyObject *node_field(PyObject *n, int i)
{
    if (PyTuple_CheckExact(n))
        return PyTuple_GET_ITEM(n, i);
    record *r = (record *)n;
    return i == 0 ? r->site : i == 1 ? r->spawner : r->parent;
}

#define NODE_SITE(n) node_field(n, 0)
#define NODE_SPAWNER(n) node_field(n, 1)
#define NODE_PARENT(n) node_field(n, 2)   /* may be NULL */

/* The newest `keep` nodes of chain, copied as tuples (a new reference):
 * None or the site-less record where the chain ends, Ellipsis where older
 * nodes are left out.  Each node is held while its elders are copied: the
 * copies' allocations may run a collection's finalizers, and with them
 * another thread that cuts a chain these nodes are part of. */
static PyObject *copy_newest(PyObject *chain, int keep)
{
    if (!is_node(chain))
        return Py_NewRef(chain ? chain : Py_None);   /* an end (a site-less record holds no chain) */
    if (keep == 0)
        return Py_NewRef(Py_Ellipsis);
    Py_INCREF(chain);
    PyObject *rest = copy_newest(NODE_PARENT(chain), keep - 1);
    PyObject *copy = rest ? PyTuple_Pack(3, NODE_SITE(chain), NODE_SPAWNER(chain), rest) : NULL;
    Py_XDECREF(rest);
    Py_DECREF(chain);
    return copy;
}

static int chain_length(PyObject *chain, int stop_at)
{
    int n = 0;
    for (; is_node(chain) && n < stop_at; chain = NODE_PARENT(chain))
        n++;
    return n;
}

/* The spawner's chain, its parent link cut back to its newest
 * GENERATIONS - 1 ancestors once the chain reaches 2 * GENERATIONS: a live
 * greenlet keeps at most 2 * GENERATIONS nodes.  Its children already made
 * see the same cut: still the GENERATIONS generations a chain is read to. */
static bool bounded_chain(record *spawner)
{
    if (chain_length((PyObject *)spawner, 2 * GENERATIONS) < 2 * GENERATIONS)
        return true;
    PyObject *cut = copy_newest(spawner->parent, GENERATIONS - 1);
    if (!cut)
        return false;
    Py_SETREF(spawner->parent, cut);
    return true;
}

/* The record of the current greenlet, with its repr taken (borrowed,
 * kept alive by the live list while the greenlet lives; the caller holds
 * the greenlet). */
static record *spawner_record(PyObject *current)
{
    record *r = record_of(current);
    if (!r) {
        if (!(r = new_record(current, record_died)))
            return NULL;
        Py_DECREF(r);   /* the live list holds it */
    }
    if (!r->name && !(r->name = PyObject_Repr(current)))
        r->name = PyUnicode_FromFormat("<%s object at %p>", Py_TYPE(current)->tp_name, current);
    return r->name ? r : NULL;
}

/* ---- the hook ---- */

static const void *task_bottom(PyObject *task);

/* What a creation's record is made of, all of it taken before the
 * creation where it can be (see tracked_new): the spawner's record, its
 * name taken and its chain cut, and the site. */
typedef struct {
    record *spawner;   /* a new reference; NULL: the creation is not tracked */
    PyObject *site;    /* a new reference; NULL: none (the record is site-less) */
} spawn_parts;

static void drop_parts(spawn_parts *p)
{
    Py_CLEAR(p->site);
    Py_CLEAR(p->spawner);
}

/* The parts of a creation by current, a greenlet or (by_task) a running
 * asyncio task, whose bottom then ends the site, from the stack at regs.
 * This is the part that may run Python code (the spawner's __repr__, the
 * collections and finalizers its allocations set off).  False if the
 * creation is not tracked. */
static bool take_parts(PyObject *current, bool by_task, const btc_regs *regs, spawn_parts *p)
{
    p->site = NULL;
    p->spawner = NULL;
    if (!current || !(p->spawner = spawner_record(current)))
        return false;
    Py_INCREF(p->spawner);
    /* A task's coroutine, and its frame, are the same for the task's life. */
    if (by_task && !p->spawner->bottom)
        p->spawner->bottom = task_bottom(current);
    if (bounded_chain(p->spawner) && site_at(regs, by_task ? p->spawner->bottom : NULL, &p->site) == 0)
        return true;
    drop_parts(p);
    return false;
}

/* g's record from its parts, died its callback (a new reference: the live
 * list holds another), or NULL.  Runs no Python code but what a
 * collection set off by its allocation would. */
static record *record_from(PyObject *g, spawn_parts *p, PyObject *died)
{
    record *r = new_record(g, died);
    if (!r)
        return NULL;
    r->spawner = Py_NewRef(p->spawner->name);
    /* No site: an untracked greenlet, and then no parent (a site-less
     * record ends every chain, holding none). */
    if ((r->site = p->site))
        r->parent = Py_NewRef((PyObject *)p->spawner);
    p->site = NULL;   /* the record's */
    r->creator = Py_NewRef((PyObject *)p->spawner);
    return r;
}

/* Note g in `created` (its list is the watcher's to take; a failure is
 * counted as lost, never the caller's). */
static void note_created(PyObject *g)
{
    if (PyList_GET_SIZE(created) >= CREATED_MAX) {
        created_lost = true;
        return;
    }
    hook_work w = hook_work_begin();
    PyObject *ref = PyWeakref_NewRef(g, NULL);
    if (!ref || PyList_Append(created, ref) < 0)
        created_lost = true;
    Py_XDECREF(ref);
    hook_work_end(w);
}

/* What tracked_new and tracked_task_new do once the object o is made: note
 * its creation (note) and make its record from parts (none if parts has no
 * spawner), with the collector held off. */
static void finish_new(PyObject *o, bool note, spawn_parts *parts)
{
    if (!note && !parts->spawner)
        return;
    int collecting = PyGC_Disable();
    if (note)
        note_created(o);
    if (parts->spawner) {
        Py_XDECREF(record_from(o, parts, record_died));
        PyErr_Clear();   /* (none was set before: the tp_new succeeded) */
    }
    if (collecting)
        PyGC_Enable();
}

/* greenlet's tp_new while tracking is on.  What original_new makes is
 * only greenlet's part of the object when a subclass's tp_new (gevent's
 * Cython Greenlet) calls this one first: the subclass's fields are NULL
 * until it fills them, after this returns, and its getters read them
 * unchecked.  Python code run in between can find the object
 * (gc.get_objects(): a signal's dump run at the next bytecode, another
 * thread's snapshot) and read gevent's spawning_greenlet, a SIGSEGV at 0
 * (a gunicorn worker, dumped by signal while spawning under load).  So
 * everything that may run Python code is done before the object exists,
 * and after it only C with the collector held off (a collection runs
 * finalizers and gc.callbacks, Python code). */
static PyObject *tracked_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    spawn_parts parts = {0};
    if (enabled && !in_hook) {
        /* The walk starts here: the frames of the work below are not unwound. */
        btc_regs regs;
        btc_get_regs(&regs);
        hook_work w = hook_work_begin();
        PyObject *current = btc_current_greenlet();
        take_parts(current, false, &regs, &parts);
        Py_XDECREF(current);
        hook_work_end(w);
    }
    PyObject *g = original_new(type, args, kwds);
    if (g)
        finish_new(g, created != NULL, &parts);
    drop_parts(&parts);
    return g;
}

/* ---- asyncio tasks ----
 *
 * Every asyncio Task, C or Python, whatever factory made it and Task(...)
 * itself, registers at creation by calling `add` on asyncio's task
 * registry, a weakref.WeakSet (3.11: _all_tasks; 3.12-3.13:
 * _scheduled_tasks; 3.14+: pure-Python tasks only, C tasks are hooked at
 * tp_new, below).  The C Task looks `add` up on the object each time,
 * so an instance attribute replaces the method for every task: capture/spawn.py
 * sets one, the builtin made by _spawn_task_hook(), which calls the
 * original `add` and records the task as created by the running task of
 * its loop (else the current greenlet), its site ending at that task's
 * bottom (its coroutine's frame), as a greenlet's ends at the greenlet's. */

static PyObject *task_types;   /* the base types of asyncio tasks (C and Python Future) */

static bool trackable(PyObject *o)
{
    if (PyObject_TypeCheck(o, greenlet_type))
        return true;
    for (Py_ssize_t i = 0; task_types && i < PyTuple_GET_SIZE(task_types); i++)
        if (PyType_Check(PyTuple_GET_ITEM(task_types, i)) &&
            PyObject_TypeCheck(o, (PyTypeObject *)PyTuple_GET_ITEM(task_types, i)))
            return true;
    return false;
}

/* The running task of the loop of a task made now (a new reference), or
 * NULL; task_made NULL: a task about to be made (3.14+'s C task at tp_new,
 * which has no loop yet: its thread's).  3.14+ keeps a running C task in the thread state; a pure-Python
 * one (and every task before 3.14) is in current_tasks (NULL: not looked
 * up) under its loop.  The task's loop, not the calling
 * thread's running loop: asyncio's _get_running_loop() calls getpid() (a
 * system call) each time, and a task is made in its loop's thread (asyncio
 * is not thread-safe: other threads go through call_soon_threadsafe). */
static PyObject *running_task(PyObject *task_made, PyObject *current_tasks)
{
    static PyObject *loop_name;   /* interned once: a lookup by C string makes a str each time */
    PyObject *thread_loop;
    PyObject *running = btc_asyncio_running_task(&thread_loop);   /* 3.14+: a C task runs (its thread state says) */
    if (running)
        return Py_NewRef(running);
    if (!current_tasks || (!loop_name && !(loop_name = PyUnicode_InternFromString("_loop"))))
        return NULL;
    thread_loop = Py_XNewRef(thread_loop);   /* the attribute's lookup may run code that drops it */
    PyObject *loop = task_made ? PyObject_GetAttr(task_made, loop_name) : NULL;
    if (!loop || loop == Py_None) {   /* no loop (yet): its thread's then */
        PyErr_Clear();
        Py_XSETREF(loop, Py_XNewRef(thread_loop));
    }
    Py_XDECREF(thread_loop);
    PyObject *task = loop && loop != Py_None && PyDict_Check(current_tasks)
                         ? PyDict_GetItemWithError(current_tasks, loop) : NULL;
    Py_XINCREF(task);
    Py_XDECREF(loop);
    PyErr_Clear();
    return task;
}

/* The interpreter frame of a running task's coroutine: its bottom, where
 * the sites of the tasks it creates end (the frames beyond are the loop's,
 * the same for every task, and its own site has them); NULL if unknown. */
static const void *task_bottom(PyObject *task)
{
    static PyObject *coro_name, *frame_name;
    if ((!coro_name && !(coro_name = PyUnicode_InternFromString("_coro"))) ||
        (!frame_name && !(frame_name = PyUnicode_InternFromString("cr_frame"))))
        return NULL;
    PyObject *coro = PyObject_GetAttr(task, coro_name);
    PyObject *frame = coro ? PyObject_GetAttr(coro, frame_name) : NULL;
    /* Borrowed: the coroutine runs (its task is running), the task holds it. */
    const void *bottom = frame ? btc_py_interpreter_frame(frame) : NULL;
    Py_XDECREF(frame);
    Py_XDECREF(coro);
    PyErr_Clear();
    return bottom;
}

/* The parts of the record of task (NULL: a task about to be made) as
 * created by the running task (else the current greenlet), from the stack
 * at regs; current_tasks: asyncio's dict (NULL: not read).  False if the
 * task is not tracked. */
static bool task_parts(PyObject *task, PyObject *current_tasks, const btc_regs *regs, spawn_parts *p)
{
    hook_work w = hook_work_begin();
    PyObject *creator = running_task(task, current_tasks);
    bool by_task = creator != NULL;
    if (!creator)
        creator = btc_current_greenlet();
    *p = (spawn_parts){0};
    bool tracked = creator && Py_TYPE(creator)->tp_weaklistoffset != 0   /* weakly referenceable */
                   && take_parts(creator, by_task, regs, p);
    Py_XDECREF(creator);
    hook_work_end(w);
    return tracked;
}

/* Record task, made already (see task_parts), died the record's callback;
 * the record (a new reference), or NULL if the task is not tracked. */
static record *record_task(PyObject *task, PyObject *current_tasks, const btc_regs *regs, PyObject *died)
{
    spawn_parts parts;
    record *r = NULL;
    if (task_parts(task, current_tasks, regs, &parts)) {
        hook_work w = hook_work_begin();
        r = record_from(task, &parts, died);
        hook_work_end(w);
    }
    drop_parts(&parts);
    return r;
}

/* May the task's record be the registry's entry for it (see task_added)?
 * Not while the registry is iterated (3.11-3.13): WeakSet.add() first
 * commits the removals pending then (pending None: 3.14+'s WeakSet, which
 * iterates a copy, has none). */
static bool entry_of_registry(PyObject *entries, PyObject *pending)
{
    return PySet_CheckExact(entries) &&
           (pending == Py_None || (PyList_CheckExact(pending) && PyList_GET_SIZE(pending) == 0));
}

/* The registry's `add` replaced: self is (original add, _current_tasks,
 * entries, pending, died), the last three those of a weakref.WeakSet
 * registry (its set of weak references, its pending removals, and a
 * record callback that calls its own first) or None.  The record is then
 * the registry's entry for the task, added as WeakSet.add() adds the
 * weak reference it makes (equal to it: a weak reference compares and
 * hashes as its referent), and the call of add(), Python code, is saved.
 * Else, or for a task not tracked, the original add() registers it. */
static PyObject *task_added(PyObject *self, PyObject *task)
{
    PyObject *add = PyTuple_GET_ITEM(self, 0), *current_tasks = PyTuple_GET_ITEM(self, 1);
    PyObject *entries = PyTuple_GET_ITEM(self, 2), *pending = PyTuple_GET_ITEM(self, 3);
    if (!enabled || in_hook || record_of(task))   /* registered again (3.12's eager tasks) */
        return PyObject_CallOneArg(add, task);
    btc_regs regs;
    btc_get_regs(&regs);
    if (!entry_of_registry(entries, pending)) {
        PyObject *result = PyObject_CallOneArg(add, task);
        if (result)
            Py_XDECREF(record_task(task, current_tasks, &regs, record_died));
        return result;
    }
    record *r = record_task(task, current_tasks, &regs, PyTuple_GET_ITEM(self, 4));
    /* (the record's work may have run Python code: a finalizer iterating the registry) */
    if (!r || !entry_of_registry(entries, pending)) {
        Py_XDECREF(r);
        return PyObject_CallOneArg(add, task);
    }
    int added = PySet_Add(entries, (PyObject *)r);
    Py_DECREF(r);
    return added < 0 ? NULL : Py_NewRef(Py_None);
}

static PyMethodDef task_added_def = {"_spawn_task_added", task_added, METH_O,
                                     "The task registry's add(), recording the task's creation (spawn tracking)."};

static PyMethodDef record_died_def = {"_spawn_record_died", on_record_died, METH_O, NULL};

/* _spawn_task_hook(add, current_tasks, task_types, weakset): the builtin to
 * install as the registry's `add` (see above); weakset: None, or the
 * registry's (entries, pending removals or None, callback) if it is a
 * plain weakref.WeakSet. */
static PyObject *spawn_task_hook(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    PyObject *weakset = nargs == 4 ? args[3] : NULL;
    bool plain = weakset == Py_None;
    if (nargs != 4 || !PyCallable_Check(args[0]) || !PyDict_Check(args[1]) || !PyTuple_Check(args[2]) ||
        (!plain && !(PyTuple_Check(weakset) && PyTuple_GET_SIZE(weakset) == 3 &&
                     PySet_CheckExact(PyTuple_GET_ITEM(weakset, 0)) &&
                     (PyTuple_GET_ITEM(weakset, 1) == Py_None || PyList_CheckExact(PyTuple_GET_ITEM(weakset, 1))) &&
                     PyCallable_Check(PyTuple_GET_ITEM(weakset, 2)))))
        return PyErr_Format(PyExc_TypeError, "_spawn_task_hook(add, current_tasks, task_types, weakset)");
    Py_XSETREF(task_types, Py_NewRef(args[2]));
    PyObject *died = plain ? Py_NewRef(Py_None) : PyCFunction_New(&record_died_def, PyTuple_GET_ITEM(weakset, 2));
    PyObject *state = !died ? NULL
                      : plain ? PyTuple_Pack(5, args[0], args[1], Py_None, Py_None, Py_None)
                              : PyTuple_Pack(5, args[0], args[1], PyTuple_GET_ITEM(weakset, 0), PyTuple_GET_ITEM(weakset, 1), died);
    PyObject *hook = state ? PyCFunction_New(&task_added_def, state) : NULL;
    Py_XDECREF(died);
    Py_XDECREF(state);
    return hook;
}

static PyMethodDef spawn_task_hook_def = {
    "_spawn_task_hook", (PyCFunction)(void (*)(void))spawn_task_hook, METH_FASTCALL,
    "_spawn_task_hook(add, current_tasks, task_types, weakset): the tracking add() of a task registry."};

/* 3.14+: the C Task registers in a C list, calling nothing hookable, so
 * the C Task type's tp_new is swapped, as greenlet's is (swap_new: its
 * subclasses too; Task.__new__, which a subclass's own __new__ calls,
 * reads the swapped slot).  At tp_new the task has no loop yet: its
 * creator is the thread's running task (a task is made in its loop's
 * thread).  Pure-Python tasks still register through the registry. */
static PyTypeObject *task_type;
static newfunc task_original_new;
static PyObject *task_current_tasks;   /* asyncio.tasks._current_tasks: pure-Python tasks running */

static void swap_new(PyTypeObject *t, newfunc from, newfunc to);

/* As tracked_new, for the same reason (a subclass's fields are NULL until
 * its own tp_new fills them): the parts before the task exists. */
static PyObject *tracked_task_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    spawn_parts parts = {0};
    if (enabled && !in_hook) {
        btc_regs regs;
        btc_get_regs(&regs);
        task_parts(NULL, task_current_tasks, &regs, &parts);
    }
    PyObject *task = task_original_new(type, args, kwds);
    if (task)
        finish_new(task, false, &parts);
    drop_parts(&parts);
    return task;
}

/* _spawn_task_new(task_type, on, current_tasks): hook (on) or restore the
 * tp_new of the C Task type (the first type given is the only one ever
 * hooked); current_tasks: asyncio's dict of running pure-Python tasks. */
static PyObject *spawn_task_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 || !PyType_Check(args[0]) || !((PyTypeObject *)args[0])->tp_new ||
        (task_type && (PyTypeObject *)args[0] != task_type) || !PyDict_Check(args[2]))
        return PyErr_Format(PyExc_TypeError, "_spawn_task_new(task_type, on, current_tasks): the C Task type");
    Py_XSETREF(task_current_tasks, Py_NewRef(args[2]));
    if (!task_type) {
        task_type = (PyTypeObject *)Py_NewRef(args[0]);
        task_original_new = task_type->tp_new;
    }
    if (PyObject_IsTrue(args[1]))
        swap_new(task_type, task_original_new, tracked_task_new);
    else
        swap_new(task_type, tracked_task_new, task_original_new);
    Py_RETURN_NONE;
}

static PyMethodDef spawn_task_new_def = {
    "_spawn_task_new", (PyCFunction)(void (*)(void))spawn_task_new, METH_FASTCALL,
    "_spawn_task_new(task_type, on, current_tasks): hook or restore the C Task's tp_new (3.14+)."};

/* ---- the cffi API ---- */

static void swap_new(PyTypeObject *t, newfunc from, newfunc to)
{
    if (t->tp_new == from) {
        t->tp_new = to;
        PyType_Modified(t);
    }
    PyObject *subs = PyObject_CallMethod((PyObject *)t, "__subclasses__", NULL);
    for (Py_ssize_t i = 0; subs && PyList_Check(subs) && i < PyList_GET_SIZE(subs); i++)
        if (PyType_Check(PyList_GET_ITEM(subs, i)))
            swap_new((PyTypeObject *)PyList_GET_ITEM(subs, i), from, to);
    Py_XDECREF(subs);
    PyErr_Clear();
}

/* One generation of a chain: (site, spawner repr, the spawner's record: a
 * weak reference to it; None for a copied node).  The fields are held
 * before the allocation: it may run finalizers, and with them another
 * thread's spawns, which may cut n's parent link. */
static PyObject *link_of(PyObject *n)
{
    PyObject *up = NODE_PARENT(n);
    PyObject *site = Py_NewRef(NODE_SITE(n)), *spawner = Py_NewRef(NODE_SPAWNER(n));
    PyObject *creator = Py_NewRef(up && Py_IS_TYPE(up, &record_type) ? up : Py_None);
    PyObject *link = PyTuple_Pack(3, site, spawner, creator);
    Py_DECREF(site);
    Py_DECREF(spawner);
    Py_DECREF(creator);
    return link;
}

/* Walks the chain from node n, newest generation first, calling add(node,
 * out) on at most max nodes (and 4 * GENERATIONS: a chain is shorter, but
 * the walk does not rely on it).  Returns whether older generations exist
 * that were not walked (beyond max, or dropped by bounded_chain): 1 or 0;
 * -1 if add failed.  The node walked is held: an allocation in add may let
 * another thread cut the chain under the walk, which then ends where the
 * chain now does. */
static int walk_chain(PyObject *n, Py_ssize_t max, int (*add)(PyObject *node, PyObject *out), PyObject *out)
{
    if (max > GENERATIONS * 4)
        max = GENERATIONS * 4;
    Py_XINCREF(n);
    for (Py_ssize_t walked = 0; is_node(n) && walked < max; walked++) {
        if (add(n, out) < 0) {
            Py_DECREF(n);
            return -1;
        }
        Py_SETREF(n, Py_XNewRef(NODE_PARENT(n)));   /* may be NULL: the end */
    }
    int cut = is_node(n) || n == Py_Ellipsis;
    Py_XDECREF(n);
    return cut;
}

static int add_link(PyObject *node, PyObject *links)
{
    PyObject *link = link_of(node);
    int rc = link ? PyList_Append(links, link) : -1;
    Py_XDECREF(link);
    return rc;
}

/* _spawn_chain(g, limit): (links, cut) for g, newest generation first, at
 * most limit links; cut: older generations exist but are not in links.
 * None if g is untracked. */
static PyObject *spawn_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    long limit = nargs == 2 ? PyLong_AsLong(args[1]) : -1;
    if (nargs != 2 || limit < 0 || !trackable(args[0])) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "spawn_chain() needs a greenlet or an asyncio task, not %s",
                         nargs ? Py_TYPE(args[0])->tp_name : "nothing");
        return NULL;
    }
    PyObject *n = (PyObject *)record_of(args[0]);
    if (!is_node(n))
        Py_RETURN_NONE;
    PyObject *links = PyList_New(0);
    int cut = links ? walk_chain(n, limit, add_link, links) : -1;
    PyObject *tuple = cut >= 0 ? PyList_AsTuple(links) : NULL;
    Py_XDECREF(links);
    PyObject *result = tuple ? PyTuple_Pack(2, tuple, cut ? Py_True : Py_False) : NULL;
    Py_XDECREF(tuple);
    return result;
}

static int add_key_items(PyObject *node, PyObject *key)
{
    return PyList_Append(key, NODE_SITE(node)) < 0 || PyList_Append(key, NODE_SPAWNER(node)) < 0 ? -1 : 0;
}

PyObject *btc_spawn_chain_key(PyObject *g)
{
    PyObject *n = trackable(g) ? (PyObject *)record_of(g) : NULL;
    if (!is_node(n))
        Py_RETURN_NONE;
    PyObject *key = PyList_New(1);   /* [cut, site, spawner, ...] */
    if (!key)
        return NULL;
    PyList_SET_ITEM(key, 0, Py_NewRef(Py_None));
    int cut = walk_chain(n, GENERATIONS, add_key_items, key);
    PyObject *tuple = NULL;
    if (cut >= 0) {
        PyList_SetItem(key, 0, Py_NewRef(cut ? Py_True : Py_False));
        tuple = PyList_AsTuple(key);
    }
    Py_DECREF(key);
    return tuple;
}

/* _spawn_creator(g): the greenlet that created g while tracking was on, or
 * None (untracked, or its creator is gone). */
static PyObject *spawn_creator(PyObject *self, PyObject *g)
{
    (void)self;
    if (!trackable(g))
        return PyErr_Format(PyExc_TypeError, "_spawn_creator() needs a greenlet or an asyncio task, not %s",
                            Py_TYPE(g)->tp_name);
    record *r = record_of(g);
    PyObject *creator = r && r->creator ? btc_referent(r->creator) : NULL;
    return Py_NewRef(creator ? creator : Py_None);
}

/* _spawn_take_created(): (weak references to the greenlets made since the
 * last call, lost), and a new empty list for the next ones; lost: some were
 * not kept (more than CREATED_MAX, or no memory), or creations are not
 * watched: the caller must scan the heap for them. */
static PyObject *spawn_take_created(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *fresh = created ? PyList_New(0) : NULL;
    if (!fresh) {
        PyErr_Clear();
        return Py_BuildValue("(()O)", Py_True);
    }
    PyObject *taken = created;
    created = fresh;
    PyObject *result = Py_BuildValue("(NO)", taken, created_lost ? Py_True : Py_False);
    created_lost = false;
    return result;
}

static PyMethodDef spawn_take_created_def = {
    "_spawn_take_created", spawn_take_created, METH_NOARGS,
    "_spawn_take_created(): (weak references to the greenlets made since the last call, lost)."};
static PyMethodDef spawn_creator_def = {
    "_spawn_creator", spawn_creator, METH_O,
    "_spawn_creator(g): the greenlet that created g while tracking was on, or None."};
static PyMethodDef spawn_chain_def = {
    "_spawn_chain", (PyCFunction)(void (*)(void))spawn_chain, METH_FASTCALL,
    "_spawn_chain(g, limit): ((site, spawner repr, spawner record), ...) newest first and whether "
    "older generations were left out; None if g is untracked."};
static PyMethodDef site_died_def = {"_spawn_site_died", on_site_died, METH_O, NULL};

/* Remember greenlet's type and its original tp_new, once (a module
 * reloaded while tracking is on finds them already set). */
static bool remember_greenlet_type(PyTypeObject *type)
{
    if (greenlet_type)
        return type == greenlet_type;
    if (!PyType_Check((PyObject *)type) || !type->tp_new || type->tp_weaklistoffset <= 0)
        return false;
    record_type.tp_base = site_ref_type.tp_base = &_PyWeakref_RefType;
    if (PyType_Ready(&record_type) < 0 || PyType_Ready(&site_ref_type) < 0 ||
        !(record_died = PyCFunction_New(&record_died_def, NULL)) ||
        !(site_died = PyCFunction_New(&site_died_def, NULL)))
        return false;
    greenlet_type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    original_new = type->tp_new;
    return true;
}

int btc_spawn_install(uintptr_t namespace, uintptr_t greenlet)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *ns = (PyObject *)namespace;
    static PyMethodDef *const builtins[] = {&spawn_chain_def, &spawn_creator_def, &spawn_task_hook_def,
                                            &spawn_task_new_def, &spawn_take_created_def};
    int rc = PyDict_Check(ns) && remember_greenlet_type((PyTypeObject *)greenlet) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < sizeof builtins / sizeof *builtins; i++)
        rc = btc_put_builtin(ns, builtins[i]);
    if (rc < 0)
        PyErr_Clear();
    PyGILState_Release(gil);
    return rc;
}

/* greenlet's tp_new is hooked while spawn tracking or a creation watch needs it. */
static void update_hook(void)
{
    if (enabled || created)
        swap_new(greenlet_type, original_new, tracked_new);
    else
        swap_new(greenlet_type, tracked_new, original_new);
}

/* Read from outside only (remote/rspawn.c): hidden, kept in the symbol table. */
BTC_FOUND_BY_NAME btc_spawn_export btc_spawn_exported;

static void export_layout(void)
{
    btc_spawn_export x = {
        .live = (uintptr_t)&live,
        .record_type = (uintptr_t)&record_type, .tuple_type = (uintptr_t)&PyTuple_Type,
        .bytearray_type = (uintptr_t)&PyByteArray_Type, .true_object = (uintptr_t)Py_True,
        .ellipsis = (uintptr_t)Py_Ellipsis,
        .record_size = sizeof(record), .record_object = offsetof(record, ref.wr_object),
        .record_site = offsetof(record, site), .record_spawner = offsetof(record, spawner),
        .record_parent = offsetof(record, parent), .record_next = offsetof(record, next),
        .object_type = offsetof(PyObject, ob_type), .var_size = offsetof(PyVarObject, ob_size),
        .tuple_items = offsetof(PyTupleObject, ob_item), .bytearray_start = offsetof(PyByteArrayObject, ob_start),
        .generations = GENERATIONS, .capacity = (uint32_t)capacity,
    };
    if (btc_backtrace_slots(&x.backtrace_type, &x.backtrace_raw, &x.backtrace_truncated))
        x.magic = BTC_SPAWN_EXPORT_MAGIC;   /* else none: a reader finds nothing to read */
    btc_spawn_exported = x;
}

int btc_spawn_enable(int frames, int native)
{
    if (!greenlet_type || frames < 1 || frames > BTC_MAX_CAPACITY)
        return -1;
    PyGILState_STATE gil = PyGILState_Ensure();
    capacity = frames;
    export_layout();
    site_want = BTC_WANT_PYTHON | (native ? BTC_WANT_NATIVE : 0);
    enabled = true;
    update_hook();
    PyGILState_Release(gil);
    return 0;
}

void btc_spawn_disable(void)
{
    if (!greenlet_type)
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    enabled = false;
    update_hook();
    PyGILState_Release(gil);
}

int btc_spawn_watch_creation(int on)
{
    if (!greenlet_type)
        return -1;
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = 0;
    if (on && !created && !(created = PyList_New(0))) {
        PyErr_Clear();
        rc = -1;
    } else if (!on) {
        Py_CLEAR(created);
    }
    created_lost = false;
    update_hook();
    PyGILState_Release(gil);
    return rc;
}

int btc_spawn_enabled(void) { return enabled; }

uint64_t btc_test_spawn_memo(uintptr_t *last_place)
{
    uint64_t hits = memo_hits;
    memo_hits = 0;
    *last_place = memo_last_place;
    return hits;
}

int btc_spawn_capacity(void) { return capacity; }

int btc_spawn_generations(void) { return GENERATIONS; }

void btc_spawn_counts(int64_t *records, int64_t *sites)
{
    *records = live_records;
    *sites = (int64_t)table_live;
}

uintptr_t btc_type_new_slot(uintptr_t type)
{
    return (uintptr_t)((PyTypeObject *)type)->tp_new;
}

/* ---- the crashing greenlet's chain, read by a crash handler (crash.c) ----
 *
 * The handler runs in a process that may have corrupted its heap: nothing
 * here allocates, waits or dereferences a pointer it read; records, nodes
 * and sites are copied with btc_read_own (process_vm_readv: EFAULT, not a
 * fault) and checked by type before their fields are used.  The live list
 * may be half changed by a thread stopped inside link_record: the search is
 * bounded and ends at any record it cannot read. */

#define CRASH_RECORDS_SEARCHED 100000

/* The record of the greenlet running on the crashed thread, or 0.  Every
 * greenlet of a thread runs on that thread's stack; the one running has its
 * whole stack in place (saved 0; start 1 until its first switch out, 0 once
 * dead), its stop inside the thread's stack above sp.  A suspended greenlet
 * always has part of its stack saved (greenlet saves [its sp, the next
 * one's stop) when it switches away, and that stop lies above its sp); the
 * one running in another thread has its stop in that thread's stack.  So
 * one record fits; more than one (a state greenlet does not leave) names
 * none rather than a guess. */
static uintptr_t running_record(uintptr_t sp, uintptr_t lo, uintptr_t hi, uintptr_t *greenlet)
{
    uintptr_t found = 0, at = (uintptr_t)live.next;
    int fits = 0;
    record r;
    for (int i = 0; at != (uintptr_t)&live && i < CRASH_RECORDS_SEARCHED && btc_read_own(&r, at, sizeof r);
         i++, at = (uintptr_t)r.next) {
        uintptr_t g = (uintptr_t)r.ref.wr_object, state[4];   /* start, stop, copy, saved */
        if (!btc_greenlet_stack_state_own(g, state) || state[0] == 0 || state[3] != 0 ||
            state[1] == UINTPTR_MAX || state[1] <= sp || state[1] < lo || state[1] > hi)
            continue;
        fits++;
        found = at;
        *greenlet = g;
    }
    if (fits != 1)
        *greenlet = 0;
    return fits == 1 ? found : 0;
}

/* Node n's (site, spawner repr, parent): a record with a site, or a tuple
 * copy (bounded_chain); false where the chain ends. */
static bool read_node(uintptr_t n, uintptr_t fields[3])
{
    uintptr_t type;
    Py_ssize_t size;
    record r;
    if (!n || (n & 7) || !btc_read_own(&type, n + offsetof(PyObject, ob_type), sizeof type))
        return false;
    if (type == (uintptr_t)&PyTuple_Type)
        return btc_read_own(&size, n + offsetof(PyVarObject, ob_size), sizeof size) && size == 3 &&
               btc_read_own(fields, n + offsetof(PyTupleObject, ob_item), 3 * sizeof *fields);
    if (type != (uintptr_t)&record_type || !btc_read_own(&r, n, sizeof r) || !r.site)
        return false;
    fields[0] = (uintptr_t)r.site;
    fields[1] = (uintptr_t)r.spawner;
    fields[2] = (uintptr_t)r.parent;
    return true;
}

/* Site s's frames copied into frames[used:], at most room of them. */
static void copy_site(uintptr_t site, btc_crash_site *s, btc_frame *frames, int used, int room)
{
    uintptr_t bytes;
    size_t size;
    bool truncated;
    s->first = used;
    s->n = 0;
    s->truncated = false;
    if (!btc_backtrace_raw_own(site, &bytes, &size, &truncated))
        return;
    size_t n = size / sizeof *frames;
    if (n > (size_t)room) {
        n = (size_t)room;
        truncated = true;
    }
    if (btc_read_own(frames + used, bytes, n * sizeof *frames))
        s->n = (int)n;
    s->truncated = truncated;
}

int btc_spawn_crash_chain(uintptr_t sp, uintptr_t stack_lo, uintptr_t stack_hi, uintptr_t *greenlet,
                          btc_crash_site *sites, int max_sites, btc_frame *frames, int max_frames)
{
    *greenlet = 0;
    uintptr_t node = running_record(sp, stack_lo, stack_hi, greenlet), f[3];
    if (!node)
        return -1;
    int n = 0, used = 0;
    for (; n < max_sites && read_node(node, f); node = f[2], n++) {
        sites[n].spawner = f[1];
        copy_site(f[0], &sites[n], frames, used, max_frames - used);
        used += sites[n].n;
    }
    return n;
}
