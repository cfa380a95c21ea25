/* The saved context of a suspended greenlet (greenlet 3.x).
 *
 * greenlet keeps, in the C++ object behind PyGreenlet.pimpl, a StackState
 *   { char *_stack_start, *stack_stop, *stack_copy; intptr_t _stack_saved; ... }
 * _stack_start is the sp slp_switch had when it suspended the greenlet; the
 * bytes [_stack_start, _stack_start + _stack_saved) were copied to stack_copy
 * (the heap) because another greenlet needed that part of the stack; the rest
 * is still in place, up to stack_stop.  slp_switch stored the registers its
 * CFI does not describe in slots of its own frame; where, the architecture
 * unit reads from slp_switch's code (arch.h: btc_switch_shape_of).
 *
 * None of those offsets is taken on trust: btc_greenlet_learn() derives them
 * from greenlets in known states and checks slp_switch's code; until it has
 * succeeded, suspended greenlets are refused with a clear error.
 */
#include <Python.h>
#include <string.h>

#include "capture/greenlet_context.h"
#include "capture/greenlet_state.h"
#include "capture/modules.h"
#include "capture/signal_capture.h"
#include "common/errors.h"

typedef struct {
    uintptr_t start, stop, copy;
    intptr_t saved;
} stack_state;

#define MAX_SWITCHING 8

static struct {
    bool ok;
    size_t pimpl_off;          /* PyGreenlet.pimpl: the last field of the object */
    size_t state_off;          /* StackState within the C++ object */
    size_t object_size;        /* the C++ object's size, as greenlet allocated it */
    size_t scan_end;           /* the learning scan read [pimpl, pimpl + scan_end) */
    size_t thread_state_off;   /* MainGreenlet's ThreadState pointer; 0: not found */
    btc_switch_shape shape;    /* slp_switch: where it resumes, where it keeps fp/aux */
    uintptr_t module_lo, module_hi;
    uintptr_t stub_lo[2], stub_hi[2];   /* g_initialstub: the outermost frame of a greenlet's own */
    int nstub;
    uintptr_t switch_lo[MAX_SWITCHING], switch_hi[MAX_SWITCHING];   /* switching_functions, .cold parts */
    int nswitch;
} layout;

#define SCAN_WORDS 24           /* how far into the C++ object StackState may lie */

static void *pimpl_of(PyObject *g)
{
    return *(void **)((char *)g + layout.pimpl_off);
}

/* Where PyGreenlet.pimpl is in type's objects: PyGreenlet is {PyObject_HEAD;
 * weakreflist; dict; pimpl}, pimpl last.  False if type's objects do not
 * have that shape (greenlet before 3.x). */
static bool pimpl_offset(PyTypeObject *type, size_t *off)
{
    *off = (size_t)type->tp_basicsize - sizeof(void *);
    return type->tp_basicsize == sizeof(PyObject) + 3 * sizeof(void *);
}

static stack_state state_at(const void *pimpl, size_t off)
{
    const uintptr_t *w = (const uintptr_t *)((const char *)pimpl + off);
    return (stack_state){w[0], w[1], w[2], (intptr_t)w[3]};
}

/* Does s look like a suspended, started greenlet's StackState? */
static bool plausible(const stack_state *s, intptr_t expect_saved)
{
    return s->saved == expect_saved && btc_greenlet_state_written(s->start, s->stop, s->copy, s->saved);
}

/* A switch: g_switchstack saves and restores the interpreter's state around
 * slp_switch, which copies stacks out and in through the trampolines (and
 * memcpy: while that runs, the frames above slp_switch are half copied, so
 * the walk may never reach g_switchstack). */
static const char *const switching_functions[] = {
    "_ZN8greenlet8Greenlet13g_switchstackEv", "slp_switch", "slp_save_state_trampoline",
    "slp_restore_state_trampoline", NULL};

static int learn_switch_code(uintptr_t inside_module)
{
    uintptr_t lo[2], hi[2], tlo[4], thi[4];
    btc_modules_acquire();
    int n = btc_module_function_ranges(inside_module, "slp_switch", lo, hi, 2);
    int t = btc_module_function_ranges(inside_module, "slp_save_state_trampoline", tlo, thi, 4);
    layout.nstub = btc_module_function_ranges(inside_module, BTC_GREENLET_INITIAL_STUB, layout.stub_lo, layout.stub_hi, 2);
    for (const char *const *name = switching_functions; *name && layout.nswitch < MAX_SWITCHING; name++)
        layout.nswitch += btc_module_function_ranges(inside_module, *name, layout.switch_lo + layout.nswitch,
                                                     layout.switch_hi + layout.nswitch,
                                                     MAX_SWITCHING - layout.nswitch);
    btc_module *m = btc_module_find(inside_module);
    if (m) {
        layout.module_lo = m->lo;
        layout.module_hi = m->hi;
    }
    btc_modules_release();
    if (n != 1 || t < 1 || !m || lo[0] < m->lo || hi[0] > m->hi)
        return btc_fail(BTC_E_LAYOUT, "greenlet's slp_switch or slp_save_state_trampoline not found "
                                      "in its symbol table");
    if (!btc_switch_shape_of(lo[0], hi[0], tlo, t, &layout.shape))
        return btc_fail(BTC_E_LAYOUT, "greenlet's slp_switch does not have the " BTC_ARCH_NAME " shape "
                                      "btcore knows (register slots, call to slp_save_state_trampoline)");
    return 0;
}

/* greenlet's code, learned once from its module's symbols and slp_switch's
 * bytes: no greenlet is switched and no Python code runs, so this is safe
 * from a greenlet tracer or a signal handler (the GIL held). */
static int learn_code(PyTypeObject *greenlet_type)
{
    static int rc = 1;   /* 1: not tried yet */
    static const char *why;
    if (rc == 1) {
        rc = learn_switch_code((uintptr_t)greenlet_type->tp_dealloc);
        why = btc_last_error();
    }
    return rc < 0 ? btc_fail(rc, why) : 0;
}

/* ---- the size of greenlet's C++ object ----
 *
 * The scan for StackState must stay inside the object, whose size is not
 * published anywhere at run time.  greenlet allocates it with Python's
 * allocator (PyObject_Malloc; PyMem_Malloc on free-threaded builds), so a
 * hook chained in front of those for the duration of one greenlet's
 * creation sees the size asked for, as tracemalloc does. */

#define WATCHED_ALLOCS 32

static struct {
    PyMemAllocatorEx mem, obj;   /* the allocators the hooks chain to */
    struct { void *ptr; size_t size; } seen[WATCHED_ALLOCS];
    int nseen;
} watch;

static void *watched(void *p, size_t size)
{
    if (p && watch.nseen < WATCHED_ALLOCS) {
        watch.seen[watch.nseen].ptr = p;
        watch.seen[watch.nseen++].size = size;
    }
    return p;
}

static void *watch_malloc(void *ctx, size_t size)
{
    PyMemAllocatorEx *a = ctx;
    return watched(a->malloc(a->ctx, size), size);
}

static void *watch_calloc(void *ctx, size_t n, size_t size)
{
    PyMemAllocatorEx *a = ctx;
    return watched(a->calloc(a->ctx, n, size), n * size);
}

static void *watch_realloc(void *ctx, void *p, size_t size)
{
    PyMemAllocatorEx *a = ctx;
    return watched(a->realloc(a->ctx, p, size), size);
}

static void watch_free(void *ctx, void *p)
{
    PyMemAllocatorEx *a = ctx;
    a->free(a->ctx, p);
}

/* Create a greenlet of type with the hooks in place; the size of the block
 * that became its pimpl, or 0.  Called with the GIL, which the allocator
 * domains need: no other thread allocates meanwhile. */
static size_t allocated_object_size(PyObject *type)
{
    PyMemAllocatorEx hook_mem = {&watch.mem, watch_malloc, watch_calloc, watch_realloc, watch_free};
    PyMemAllocatorEx hook_obj = {&watch.obj, watch_malloc, watch_calloc, watch_realloc, watch_free};
    watch.nseen = 0;
    PyMem_GetAllocator(PYMEM_DOMAIN_MEM, &watch.mem);
    PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &watch.obj);
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &hook_mem);
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &hook_obj);
    PyObject *g = PyObject_CallNoArgs(type);
    PyMem_SetAllocator(PYMEM_DOMAIN_MEM, &watch.mem);
    PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, &watch.obj);
    size_t size = 0;
    void *pimpl = g ? pimpl_of(g) : NULL;
    for (int i = 0; pimpl && i < watch.nseen; i++)
        if (watch.seen[i].ptr == pimpl)
            size = watch.seen[i].size;
    if (!g)   /* reported, not dropped; the caller refuses the layout */
        PyErr_WriteUnraisable(type);
    Py_XDECREF(g);
    return size;
}

static void learn_thread_state(void);   /* below: it needs greenlet's C API */

/* ---- learning StackState's place from greenlets in known states ---- */

int btc_greenlet_learn(uintptr_t greenlet_type, uintptr_t g1, intptr_t saved1, uintptr_t g2, intptr_t saved2)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyTypeObject *type = (PyTypeObject *)greenlet_type;
    PyObject *a = (PyObject *)g1, *b = (PyObject *)g2;
    int rc = 0, found = 0;
    layout.ok = false;
    if (!pimpl_offset(type, &layout.pimpl_off) || !PyObject_TypeCheck(a, type) || !PyObject_TypeCheck(b, type)) {
        rc = btc_fail(BTC_E_LAYOUT, "greenlet objects do not have the layout of greenlet 3.x");
        goto out;
    }
    if (!pimpl_of(a) || !pimpl_of(b)) {
        rc = btc_fail(BTC_E_LAYOUT, "greenlet objects without an implementation");
        goto out;
    }
    layout.object_size = allocated_object_size((PyObject *)type);
    if (layout.object_size < sizeof(stack_state)) {
        rc = btc_fail(BTC_E_LAYOUT, "cannot measure greenlet's C++ object (not allocated by Python's allocator)");
        goto out;
    }
    layout.scan_end = 0;
    for (size_t off = 0; off < SCAN_WORDS * sizeof(void *) && off + sizeof(stack_state) <= layout.object_size;
         off += sizeof(void *)) {
        layout.scan_end = off + sizeof(stack_state);
        stack_state sa = state_at(pimpl_of(a), off), sb = state_at(pimpl_of(b), off);
        if (saved1 > 0 && saved2 > 0 && saved1 != saved2 && plausible(&sa, saved1) &&
            plausible(&sb, saved2) && sa.stop != BTC_GREENLET_MAIN_STACK_STOP && sb.stop != BTC_GREENLET_MAIN_STACK_STOP) {
            layout.state_off = off;
            found++;
        }
    }
    if (found != 1) {
        rc = btc_fail(BTC_E_LAYOUT, "cannot locate greenlet's StackState (unknown greenlet build)");
        goto out;
    }
    rc = learn_code(type);
    layout.ok = rc == 0;
    if (layout.ok)
        learn_thread_state();
out:
    PyGILState_Release(gil);
    return rc;
}

/* ---- the context of one suspended greenlet ---- */

/* Where a main greenlet's stack ends: it has no stack_stop of its own. */
static bool main_stack_end(uintptr_t start, uintptr_t *hi)
{
    uintptr_t lo;
    if (btc_thread_stack(&lo, hi) && start >= lo && start < *hi)
        return true;
    /* Another thread's main greenlet: the main thread's (its stack's end
     * learnt once), else that thread's stack mapping, read each time
     * (/proc/self/maps: ~0.1-0.4 ms; a thread's stack may be unmapped and
     * another mapped where it was, so nothing else is kept). */
    return btc_main_stack_end(start, hi) || btc_mapping_bounds(start, &lo, hi);
}

/* A register slp_switch stored at sp + slot; slot -1: its CFI describes
 * the register, whose value here is then never read. */
static bool saved_register(const btc_memview *m, uintptr_t sp, int slot, uintptr_t *value)
{
    *value = 0;
    return slot < 0 || btc_mem_read(m, sp + (uintptr_t)slot, value);
}

int btc_greenlet_context(PyObject *g, btc_context *ctx)
{
    if (!layout.ok)
        return btc_fail(BTC_E_LAYOUT, "greenlet layout not learned");
    if (!pimpl_of(g))
        return btc_fail(BTC_E_LAYOUT, "greenlet without an implementation");
    stack_state s = state_at(pimpl_of(g), layout.state_off);
    if (!plausible(&s, s.saved))
        return btc_fail(BTC_E_LAYOUT, "greenlet's saved stack state is inconsistent");
    bool main = s.stop == BTC_GREENLET_MAIN_STACK_STOP;
    uintptr_t stack_hi = 0;
    if (main && !main_stack_end(s.start, &stack_hi))
        return btc_fail(BTC_E_LAYOUT, "cannot find the stack of a suspended main greenlet");
    memset(ctx, 0, sizeof *ctx);
    ctx->mem.lo = s.start;
    ctx->mem.hi = main ? stack_hi : s.stop;
    ctx->mem.spill_lo = s.start;
    ctx->mem.spill_hi = s.start + (uintptr_t)s.saved;
    ctx->mem.spill = (const uint8_t *)s.copy;
    ctx->last_cfa = main ? 0 : s.stop;
    ctx->regs.ip = layout.shape.resume_pc;
    ctx->regs.sp = s.start;
    if (!saved_register(&ctx->mem, s.start, layout.shape.fp_slot, &ctx->regs.fp) ||
        !saved_register(&ctx->mem, s.start, layout.shape.aux_slot, &ctx->regs.aux))
        return btc_fail(BTC_E_LAYOUT, "greenlet's saved registers are outside its stack");
    return 0;
}

/* greenlet's C API (greenlet.h): its type, getcurrent(), "is main", "is
 * active", parent.  These read greenlet's own state: a subclass overriding
 * __bool__, dead or gr_frame (gevent's Greenlet does) cannot change them. */
static void **greenlet_api;
#define GREENLET_TYPE 0
#define GREENLET_GETCURRENT 4
#define GREENLET_MAIN 8
#define GREENLET_ACTIVE 10
#define GREENLET_GET_PARENT 11

static bool have_api(void)
{
    if (!greenlet_api && !(greenlet_api = PyCapsule_Import("greenlet._C_API", 0))) {
        btc_fail_python(0, "cannot import greenlet's C API");
        return false;
    }
    return true;
}

static PyObject *current_greenlet(void)
{
    if (!have_api())
        return NULL;
    PyObject *g = ((PyObject * (*)(void)) greenlet_api[GREENLET_GETCURRENT])();
    if (!g)
        btc_fail_python(0, "greenlet.getcurrent() failed");
    return g;
}

bool btc_greenlet_made(PyTypeObject *greenlet_type, PyObject *g)
{
    size_t off;
    return !pimpl_offset(greenlet_type, &off) || *(void **)((char *)g + off) != NULL;
}

int btc_greenlet_active(PyObject *g)
{
    if (!have_api())
        return -1;
    PyTypeObject *type = (PyTypeObject *)greenlet_api[GREENLET_TYPE];
    if (!PyObject_TypeCheck(g, type))
        return btc_fail(-1, "not a greenlet");
    if (!btc_greenlet_made(type, g))
        return 0;   /* being made: not started (greenlet's own check would read its missing C++ object) */
    return ((int (*)(PyObject *))greenlet_api[GREENLET_ACTIVE])(g);
}

PyObject *btc_greenlet_frame(PyObject *g)
{
    static PyObject *getter;   /* greenlet.greenlet.gr_frame, the base type's descriptor */
    if (!getter) {
        PyTypeObject *type = (PyTypeObject *)greenlet_api[GREENLET_TYPE];
        getter = PyDict_GetItemString(type->tp_dict, "gr_frame");   /* borrowed; the type holds it */
        if (!getter || !Py_TYPE(getter)->tp_descr_get) {
            getter = NULL;
            btc_fail(0, "greenlet.greenlet has no gr_frame descriptor");
            return NULL;
        }
    }
    PyObject *frame = Py_TYPE(getter)->tp_descr_get(getter, g, NULL);
    if (!frame)
        btc_fail_python(0, "cannot read the greenlet's gr_frame");
    return frame;
}

PyObject *btc_current_greenlet(void)
{
    return current_greenlet();
}

/* The root of g's parent chain: its thread's main greenlet (new reference). */
static PyObject *root_of(PyObject *g)
{
    PyObject *(*parent_of)(PyObject *) = (PyObject * (*)(PyObject *)) greenlet_api[GREENLET_GET_PARENT];
    Py_INCREF(g);
    for (PyObject *p; (p = parent_of(g)) != NULL;) {
        Py_DECREF(g);
        g = p;
    }
    return g;   /* the root: no parent, and no exception (GET_PARENT sets none there) */
}

/* ---- where a thread's current greenlet is kept ----
 *
 * greenlet's per-thread state, ThreadState, begins {main_greenlet,
 * current_greenlet} (two PyGreenlet pointers), and a thread's MainGreenlet
 * points to it.  That is the only record of which greenlet a thread runs:
 * greenlet's own rule ("running" = active without a saved frame) also fits
 * one parked where there is no Python frame (gevent.spawn(event.wait)).
 * The pointer's place in MainGreenlet is learned from the calling thread,
 * while a greenlet other than its main one runs (btc_greenlet_learn's
 * caller): the one word of its main greenlet's object that points to
 * {main, current}.  Every read of the scan is btc_read_own_anywhere: it
 * may pass the object's end, and a word that is no pointer is only read
 * through (under qemu-user, which has no process_vm_readv, through a pipe:
 * read in place, such a word could fault).  The place found is then read
 * in place (btc_greenlet_thread_current says why that is safe). */

#define THREAD_STATE_SCAN_WORDS 64   /* MainGreenlet: Greenlet's members, then its own two */

static void learn_thread_state(void)
{
    PyObject *current = current_greenlet(), *root = current ? root_of(current) : NULL;
    int found = 0;
    for (size_t off = 0; root && root != current && off < THREAD_STATE_SCAN_WORDS * sizeof(void *);
         off += sizeof(void *)) {
        uintptr_t ts, pair[2];
        if (btc_read_own_anywhere(&ts, (uintptr_t)pimpl_of(root) + off, sizeof ts) && ts && !(ts & 7) &&
            btc_read_own_anywhere(pair, ts, sizeof pair) && pair[0] == (uintptr_t)root && pair[1] == (uintptr_t)current) {
            layout.thread_state_off = off;
            found++;
        }
    }
    if (found != 1 || layout.thread_state_off + sizeof(void *) > layout.object_size)
        layout.thread_state_off = 0;   /* unknown: greenlet_objects.c's fallback rule stays */
    Py_XDECREF(root);
    Py_XDECREF(current);
    PyErr_Clear();
}

/* Once learned, the two words are read in place, with the GIL: the
 * profiler asks this of every other thread at every tick, and two system
 * calls a thread were most of its state read (a gunicorn worker: 11 threads,
 * 22 process_vm_readv a tick).  In place is safe there because of how
 * greenlet ends a ThreadState (TThreadStateDestroy.cpp, 3.0 to 3.5): the
 * dying thread first clears its main greenlet's pointer, then the state is
 * deleted by a pending call, which runs with the GIL; so while the caller
 * holds the GIL, a pointer still set names a live ThreadState.  The main
 * greenlet's object lives while root does, and the learned place lies in it
 * (learn_thread_state: within the measured size of a greenlet's object, of
 * which MainGreenlet's is no larger).  Without a GIL (a free-threaded
 * build) the state may be deleted meanwhile: read through a check. */
int btc_greenlet_thread_current(PyObject *root, uintptr_t *current)
{
    if (!layout.ok || !layout.thread_state_off || !pimpl_of(root))
        return -1;
    uintptr_t ts = *(const uintptr_t *)((const char *)pimpl_of(root) + layout.thread_state_off);
    *current = 0;   /* its thread has ended */
    if (!ts)
        return 1;
    if (ts & 7)
        return -1;
#ifdef Py_GIL_DISABLED
    return btc_read_own_anywhere(current, ts + sizeof(void *), sizeof *current) ? 1 : -1;
#else
    *current = ((const uintptr_t *)ts)[1];
    return 1;
#endif
}

int btc_greenlet_target(PyObject *target)
{
    PyObject *current = current_greenlet();
    if (!current)
        return BTC_TARGET_UNKNOWN;
    int kind = BTC_TARGET_UNKNOWN;
    if (target == current)
        kind = BTC_TARGET_CURRENT;
    else if (layout.ok && PyObject_TypeCheck(target, (PyTypeObject *)greenlet_api[GREENLET_TYPE]))
        kind = BTC_TARGET_GREENLET;
    Py_DECREF(current);
    return kind;
}

int btc_greenlet_in_calling_thread(PyObject *g)
{
    PyObject *current = current_greenlet();
    if (!current)
        return -1;
    /* greenlets cannot change threads, and a parent is always in the same thread */
    PyObject *a = root_of(g), *b = root_of(current);
    int same = a == b;
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(current);
    return same;
}

int btc_greenlet_current_end(btc_context *ctx)
{
    PyObject *g = current_greenlet();
    if (!g)
        return BTC_E_UNSUPPORTED;   /* the reason is in btc_last_error() */
    int main = ((int (*)(PyObject *))greenlet_api[GREENLET_MAIN])(g);
    Py_DECREF(g);
    if (main)
        return 0;   /* a main greenlet: the whole stack */
    /* Below g_initialstub lie frames of whoever first switched into this
     * greenlet.  It is found even where slp_switch is not recognised (that
     * only matters to suspended greenlets); not found: the whole stack (not
     * refused: the current stack is always capturable). */
    learn_code((PyTypeObject *)greenlet_api[GREENLET_TYPE]);
    btc_greenlet_stub_ends(ctx);
    return 1;
}

int btc_greenlet_learn_stub(void)
{
    return have_api() ? learn_code((PyTypeObject *)greenlet_api[GREENLET_TYPE]) : BTC_E_UNSUPPORTED;
}

void btc_greenlet_stub_ends(btc_context *ctx)
{
    for (ctx->nend = 0; ctx->nend < layout.nstub; ctx->nend++) {
        ctx->end_lo[ctx->nend] = layout.stub_lo[ctx->nend];
        ctx->end_hi[ctx->nend] = layout.stub_hi[ctx->nend];
    }
}

int btc_greenlet_layout(size_t *state_off, size_t *object_size, size_t *scan_end)
{
    *state_off = layout.state_off;
    *object_size = layout.object_size;
    *scan_end = layout.scan_end;
    return layout.ok ? 0 : -1;
}

void btc_greenlet_internal_range(uintptr_t *lo, uintptr_t *hi)
{
    *lo = layout.module_lo;
    *hi = layout.module_hi;
}

bool btc_greenlet_switching(uintptr_t pc)
{
    for (int i = 0; i < layout.nswitch; i++)
        if (pc >= layout.switch_lo[i] && pc < layout.switch_hi[i])
            return true;
    return false;
}

/* ---- which thread a greenlet belongs to (threads.c) ---- */

uintptr_t btc_greenlet_stack_mark(uintptr_t address)
{
    PyObject *g = (PyObject *)address;
    if (!layout.ok || !have_api() || !PyObject_TypeCheck(g, (PyTypeObject *)greenlet_api[GREENLET_TYPE]) ||
        !pimpl_of(g))
        return 0;
    stack_state s = state_at(pimpl_of(g), layout.state_off);
    /* A main greenlet's _stack_start is the sp it was last suspended at (it
     * keeps it while it runs again; 1 before it first switched away, NULL
     * once dead): on its thread's stack.  A thread with any other greenlet
     * started has suspended its main greenlet at least once. */
    if (s.stop != BTC_GREENLET_MAIN_STACK_STOP)
        return 0;
    return s.start > 1 ? s.start : 0;
}

/* ---- a greenlet's state, read by a crash handler (spawn.c) ---- */

/* Is type greenlet's type or a subclass?  Its base chain read with
 * btc_read_own: a crashed process's heap is not trusted. */
static bool is_greenlet_type_own(uintptr_t type)
{
    uintptr_t want = greenlet_api ? (uintptr_t)greenlet_api[GREENLET_TYPE] : 0;
    for (int depth = 0; type && want && depth < 16; depth++) {
        if (type == want)
            return true;
        if (!btc_read_own(&type, type + offsetof(PyTypeObject, tp_base), sizeof type))
            return false;
    }
    return false;
}

bool btc_greenlet_stack_state_own(uintptr_t g, uintptr_t state[4])
{
    uintptr_t type, pimpl;
    return layout.ok && g && !(g & 7) && btc_read_own(&type, g + offsetof(PyObject, ob_type), sizeof type) &&
           is_greenlet_type_own(type) && btc_read_own(&pimpl, g + layout.pimpl_off, sizeof pimpl) && pimpl &&
           !(pimpl & 7) && btc_read_own(state, pimpl + layout.state_off, 4 * sizeof *state);
}
