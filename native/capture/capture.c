/* btc_collect(): pick a context, walk it, merge Python frames into the eval
 * loop's native frames, and hand back raw frames.
 *
 * Runs with the GIL held (btcore's cffi wrappers keep it, see _build.py):
 * the frame chain and the code objects' reference counts belong to it.
 */
#include <Python.h>
#include <structmember.h>

#include "capture/capture.h"
#include "capture/cpython/pyframes.h"
#include "capture/evalloop.h"
#include "capture/greenlet_context.h"
#include "capture/signal_capture.h"
#include "capture/modules.h"
#include "capture/unwind.h"
#include "common/errors.h"

/* ---- the output ---- */

typedef struct {
    btc_frame *out;
    int n, max;
    bool truncated;
    int skip_python;    /* btcore's own API frames, innermost first */
    PyObject **codes;   /* the code object of each Python frame emitted (a reference each);
                         * NULL: none taken (spawn sites: the frames are live, see spawn.c) */
    int ncodes;
} sink;

static bool emit(sink *s, uintptr_t addr, int lasti, int kind, int flags)
{
    if (s->n == s->max) {
        s->truncated = true;
        return false;
    }
    s->out[s->n++] = (btc_frame){.addr = addr, .lasti = lasti, .kind = (uint8_t)kind, .flags = (uint8_t)flags};
    return true;
}

/* Where the merge takes Python frames from: this process's chain, read as
 * the merge goes (live), or frames another process's walker read already
 * (native/remote/: their code objects are the target's addresses, never
 * dereferenced here, since the sink then takes no references).  Either way
 * as raw records, read ahead in batches across eval-loop calls: one frame a
 * call went through three functions and a btc_pyframe (~120 instructions a
 * Python frame on 3.14), and one batch per eval-loop call, read straight
 * into the output, cost more than it saved on stacks of one Python frame
 * per call (Python called through C at every level; docs/design.md). */
#define PY_AHEAD 32

typedef struct {
    btc_pycursor *live;
    const btc_pyframe *frames;
    int n, at;                  /* frames: how many, the next to read */
    int ahead_n, ahead_at;      /* ahead[ahead_at..ahead_n): read, not taken yet */
    btc_frame ahead[PY_AHEAD];  /* (left uninitialised: written before it is read) */
} py_source;

static void source_of_chain(py_source *src, btc_pycursor *live)
{
    src->live = live;
    src->frames = NULL;
    src->n = src->at = src->ahead_n = src->ahead_at = 0;
}

static void source_of_frames(py_source *src, const btc_pyframe *frames, int n)
{
    source_of_chain(src, NULL);
    src->frames = frames;
    src->n = n;
}

/* Has the chain ended at the cursor's stop frame, and the merge taken it? */
static bool py_stopped(const py_source *src)
{
    return src->live && src->live->stopped && src->ahead_at == src->ahead_n;
}

static int read_ahead(py_source *src)
{
    if (src->live)
        return btc_py_next_records(src->live, src->ahead, PY_AHEAD);
    int n = 0;
    for (; n < PY_AHEAD && src->at < src->n; n++)
        btc_py_record(&src->ahead[n], &src->frames[src->at++]);
    return n;
}

/* The record of src's next frame (a frame tracebacks hide is marked
 * BTC_PY_HIDDEN), NULL at the end (a live chain ends after the cursor's
 * stop frame, if any: a spawn site of an asyncio task ends at the creating
 * task's bottom). */
static const btc_frame *py_next(py_source *src)
{
    if (BTC_UNLIKELY(src->ahead_at == src->ahead_n)) {
        src->ahead_at = 0;
        if ((src->ahead_n = read_ahead(src)) == 0)
            return NULL;
    }
    return &src->ahead[src->ahead_at++];
}

/* One Python frame's record from the chain: dropped if tracebacks hide it
 * or it is btcore's own (skip_python), else counted in *users and, if
 * emit_it, emitted with flags added (its code object noted for the
 * Backtrace to hold).  False when the output is full.  (Taking the frames
 * of an eval-loop call as one run of records cost more on stacks of one
 * Python frame per call, 107,000 against 92,000 instructions a capture of
 * 250 levels.) */
static bool take_python(sink *s, const btc_frame *r, int flags, bool emit_it, int *users)
{
    if (r->reserved == BTC_PY_HIDDEN)
        return true;
    if (s->skip_python > 0) {
        s->skip_python--;
        return true;
    }
    (*users)++;
    if (!emit_it)
        return true;
    if (s->n == s->max) {
        s->truncated = true;
        return false;
    }
    btc_frame *out = &s->out[s->n++];
    *out = *r;
    out->flags |= (uint8_t)flags;
    /* Held from now on: the allocations that build the Backtrace may run a
     * collection, and finalizers may let another thread end these frames. */
    if (s->codes)
        s->codes[s->ncodes++] = Py_NewRef((PyObject *)out->addr);
    return true;
}

/* The Python frames one eval-loop call runs: up to and including its entry
 * frame.  Returns how many frames the chain gave (0: chain exhausted). */
static int take_eval_call(sink *s, py_source *py, bool emit_it, int *users)
{
    const btc_frame *r;
    int taken = 0;
    while ((r = py_next(py))) {
        taken++;
        if (!take_python(s, r, 0, emit_it, users) || (r->flags & BTC_F_ENTRY))
            break;
    }
    return taken;
}

static void emit_rest(sink *s, py_source *py, int flags)
{
    const btc_frame *r;
    int users = 0;
    while ((r = py_next(py)) && take_python(s, r, flags, true, &users))
        ;
}

/* ---- merge ---- */

typedef struct {
    btc_native_frame *nat;
    int n;
    bool complete;     /* the walk reached its natural end, not our buffer's */
    bool own_first;    /* the innermost frames are btcore's own: drop them (see merge) */
    bool greenlet;     /* a greenlet's stack: mark (or hide) greenlet's own frames */
    uintptr_t internal_lo, internal_hi;   /* greenlet's module (this process's or another's); empty if
                                           * not a greenlet's stack (merge_walk) */
} native_walk;

/* Is the code at pc greenlet's own switching machinery?  (One unsigned
 * compare: below internal_lo wraps past the range.) */
static bool internal(const native_walk *w, uintptr_t pc)
{
    return pc - w->internal_lo < w->internal_hi - w->internal_lo;
}

/* A capture made from inside btcore's greenlet-creation hook (spawn.c): the
 * innermost native frames are btcore's own (the hook, this capture); drop
 * exactly those, keeping the interpreter's (type_call, ...) and any C
 * extension's frames that led to the creation. */
static int drop_own_module(const native_walk *w)
{
    btc_module *own = btc_module_find((uintptr_t)&btc_collect);
    int first = 0;
    while (own && first < w->n && w->nat[first].pc >= own->lo && w->nat[first].pc < own->hi)
        first++;
    return first;
}

/* Hide greenlet's switching machinery: the innermost frames (slp_switch up
 * to the switch() call site) and the outermost (its start-up stub). */
static int hide_greenlet_internals(native_walk *w)
{
    int first = 0;
    while (first < w->n && internal(w, w->nat[first].pc - !w->nat[first].exact))
        first++;
    while (w->complete && w->n > first && internal(w, w->nat[w->n - 1].pc - 1))
        w->n--;
    return first;
}

/* From nat[i] on, the native frames merge() emits with no flag (not the
 * eval loop, not exact, no signal, not greenlet's own), up to the room
 * left: the bulk of a deep native stack, copied in a loop of their own
 * (locals, not the sink's fields: its stores cannot alias them).
 * Returns how many. */
static int copy_plain_natives(sink *s, const native_walk *w, int i)
{
    int room = s->max - s->n, k = 0, end = w->n - i < room ? w->n - i : room;
    const btc_native_frame *f = &w->nat[i];
    btc_frame *out = s->out + s->n;
    for (; k < end; k++) {
        if (f[k].eval | f[k].exact | f[k].signal || internal(w, f[k].pc - 1))
            break;
        out[k] = (btc_frame){.addr = f[k].pc, .lasti = -1, .kind = BTC_KIND_NATIVE};
    }
    s->n += k;
    return k;
}

/* Replace each eval-loop frame with the Python frames it runs.  A capture
 * of the calling thread starts inside btcore: its native frames (the C core,
 * the call into it) and its skip_python Python frames are dropped, up to the
 * first eval-loop call that runs a frame of the user's. */
static void merge(sink *s, const native_walk *w, py_source *py, int want)
{
    bool want_py = want & BTC_WANT_PYTHON, want_native = want & BTC_WANT_NATIVE;
    bool own = w->own_first;
    for (int i = 0; i < w->n; i++) {
        if (want_native && !own && (i += copy_plain_natives(s, w, i)) == w->n)
            break;
        const btc_native_frame *f = &w->nat[i];
        int flags = (f->exact ? BTC_F_EXACT : 0) | (f->signal ? BTC_F_SIGNAL : 0);
        if (internal(w, f->pc - !f->exact))
            flags |= BTC_F_INTERNAL;
        bool ok = true;
        if (f->eval) {   /* the walker's btc_in_eval_loop(), cached per pc */
            int users = 0;
            int taken = take_eval_call(s, py, want_py, &users);
            if (own && users == 0 && taken > 0)
                continue;   /* an eval-loop call running only btcore's own Python frames */
            own = false;
            flags |= BTC_F_EVAL;
            if (!want_py && want_native)
                ok = emit(s, f->pc, -1, BTC_KIND_NATIVE, flags);
            else if (taken == 0 && want_native)
                ok = emit(s, f->pc, -1, BTC_KIND_NATIVE, flags | BTC_F_UNMERGED);
        } else if (want_native && !own) {
            ok = emit(s, f->pc, -1, BTC_KIND_NATIVE, flags);
        }
        if (!ok || s->truncated || py_stopped(py))   /* stopped: the eval-loop call running the stop frame */
            return;
    }
    if (!w->complete)
        s->truncated = s->n == s->max;
    if (want_py)
        emit_rest(s, py, BTC_F_UNMERGED);
}

static void python_only(sink *s, py_source *py)
{
    emit_rest(s, py, 0);
}

/* ---- contexts ---- */

/* Native frames a walk may need beyond the output's size: btcore's own. */
#define OWN_NATIVE_FRAMES 32
/* A walk for an output of up to 256 frames (a spawn site's most,
 * BTC_SPAWN_SITE_FRAMES) needs no heap buffer: a malloc and free cost a
 * tracked asyncio task ~460 instructions, an eighth of its capture. */
#define STACK_NATIVE_FRAMES (256 + OWN_NATIVE_FRAMES)

/* Merge the walk w (w->nat: all the walk gave) with py's frames. */
static void merge_walk(py_source *py, sink *s, int want, native_walk w)
{
    if (!w.greenlet)
        w.internal_lo = w.internal_hi = 0;
    if (w.greenlet && !(want & BTC_WANT_INTERNALS)) {
        int hidden = hide_greenlet_internals(&w);
        w.nat += hidden;
        w.n -= hidden;
    }
    if (want & BTC_WANT_FROM_HOOK) {
        int own = drop_own_module(&w);
        w.nat += own;
        w.n -= own;
    }
    merge(s, &w, py, want);
}

/* Merge the walk nat[0..n) (of a buffer of max) with py's frames. */
static void merge_walked(btc_pycursor *py, sink *s, int want, bool own_first, bool greenlet,
                         btc_native_frame *nat, int n, int max)
{
    py_source src;
    source_of_chain(&src, py);
    native_walk w = {.nat = nat, .n = n, .complete = n < max, .own_first = own_first, .greenlet = greenlet};
    btc_greenlet_internal_range(&w.internal_lo, &w.internal_hi);
    merge_walk(&src, s, want, w);
}

/* walk: NULL, or where to prove the native walk (its n -1: not proven). */
static int capture(const btc_context *ctx, btc_pycursor *py, sink *s, int want, bool own_first,
                   bool greenlet, btc_walk_proof *walk)
{
    if (!(want & BTC_WANT_NATIVE)) {
        py_source src;
        source_of_chain(&src, py);
        python_only(s, &src);
        return 0;
    }
    if (!BTC_ARCH_SUPPORTED)
        return btc_fail(BTC_E_UNSUPPORTED, "btcore cannot walk native stacks on " BTC_ARCH_NAME
                                           " (x86-64 and aarch64 Linux only): pass native=False");
    btc_native_frame stack_buf[STACK_NATIVE_FRAMES], *nat = stack_buf;
    int max = s->max + OWN_NATIVE_FRAMES;
    btc_native_frame *heap = NULL;
    if (max > STACK_NATIVE_FRAMES && !(nat = heap = malloc(max * sizeof *nat)))
        return btc_fail(BTC_E_NOMEMORY, "out of memory");
    btc_modules_acquire();
    btc_eval_ranges_init();
    int walked = btc_unwind(ctx, nat, max);
    if (walk && !btc_unwind_proof(ctx, nat, walked, walk))
        walk->n = -1;
    merge_walked(py, s, want, own_first, greenlet, nat, walked, max);
    btc_modules_release();
    free(heap);
    return 0;
}

int btc_capture_interrupted(btc_raw_capture *c, const btc_context *ctx, btc_pycursor *py,
                            btc_native_frame *nat, int max, bool *switching)
{
    sink s = {.out = c->frames, .max = c->max};
    int walked = btc_unwind(ctx, nat, max);
    *switching = false;
    for (int i = 0; i < walked && !*switching; i++)
        if ((*switching = btc_greenlet_switching(nat[i].exact ? nat[i].pc : nat[i].pc - 1))) {
            walked = i + 1;     /* the stack beyond is being copied in or out */
            py->frame = NULL;   /* the thread state's chain is between two greenlets */
        }
    merge_walked(py, &s, BTC_WANT_PYTHON | BTC_WANT_NATIVE, false, false, nat, walked, max);
    c->n = s.n;
    c->truncated = s.truncated;
    return walked;
}

void btc_capture_python_only(btc_raw_capture *c, btc_pycursor *py)
{
    sink s = {.out = c->frames, .max = c->max};
    py_source src;
    source_of_chain(&src, py);
    python_only(&s, &src);
    c->n = s.n;
    c->truncated = s.truncated;
}

/* The calling thread's stack as a context walked from regs (of a frame
 * still live), and its Python cursor, ending at stop if given: in a
 * greenlet, down to that greenlet's own outermost frame (below it lie
 * frames of whoever started the greenlet).  Whether it runs in a greenlet
 * (1) or not (0), or a BTC_E_* code. */
static int current_context(btc_context *ctx, btc_pycursor *py, const btc_regs *regs, const void *stop)
{
    *ctx = (btc_context){.regs = *regs};
    uintptr_t lo;
    if (!btc_thread_stack(&lo, &ctx->mem.hi))
        return btc_fail(BTC_E_UNSUPPORTED, "cannot find the thread's stack");
    ctx->mem.lo = ctx->regs.sp;
    int in_greenlet = btc_greenlet_current_end(ctx);
    if (in_greenlet < 0)
        return in_greenlet;
    btc_py_cursor_current(py);
    if (stop) {   /* the walk ends in the eval-loop call running stop: frames beyond it are not read */
        py->stop = stop;
        uintptr_t call = btc_py_eval_call_address(stop);
        if (call > ctx->regs.sp && call < ctx->mem.hi)
            ctx->mem.hi = call;
    }
    return in_greenlet;
}

static int collect_current(sink *s, int want)
{
    btc_regs regs;
    btc_get_regs(&regs);   /* this frame stays live during the walk */
    btc_context ctx;
    btc_pycursor py;
    int in_greenlet = current_context(&ctx, &py, &regs, NULL);
    return in_greenlet < 0 ? in_greenlet : capture(&ctx, &py, s, want, true, in_greenlet, NULL);
}

/* A greenlet other than the calling thread's current one.  Its state is
 * checked here, under the GIL: checks made in Python before this call may be
 * stale, since the GIL can change hands between bytecodes.  ctx: where its
 * context goes (zeroed when it has no stack). */
static int collect_greenlet(sink *s, int want, PyObject *g, btc_context *ctx)
{
    *ctx = (btc_context){0};
    int active = btc_greenlet_active(g);   /* started and not dead, as greenlet itself says */
    if (active < 0)
        return BTC_E_UNSUPPORTED;
    if (!active)
        return 0;                          /* no stack: an empty backtrace */
    PyObject *frame = btc_greenlet_frame(g);
    if (!frame)
        return BTC_E_LAYOUT;
    /* greenlet's own rule: active with no saved frame is running.  In the
     * calling thread, a greenlet that is not current cannot be running: it
     * is suspended in code without Python frames.  (The thread is asked
     * only here: a saved frame says suspended wherever it is.) */
    int rc = 0;
    if (frame == Py_None && !(want & BTC_WANT_OWN_THREAD) && btc_greenlet_in_calling_thread(g) != 1)
        rc = btc_fail(BTC_E_RUNNING, "cannot collect a greenlet that is running in another thread");
    if (rc == 0)
        rc = btc_greenlet_context(g, ctx);
    if (rc == 0) {
        btc_pycursor py;
        btc_py_cursor_greenlet(&py, frame, &ctx->mem);   /* None: no Python frames */
        rc = capture(ctx, &py, s, want, false, true, NULL);
    }
    Py_DECREF(frame);
    return rc;
}

/* The Python frames that another thread of this interpreter runs (ident:
 * its threading ident): it waits for the GIL this thread holds, or runs C
 * code without it, and its frame chain stands still either way.  No native
 * frames: its registers are its own. */
static int collect_thread_python(sink *s, uint64_t ident)
{
    PyThreadState *ts = btc_thread_state_of(ident);
    if (!ts)
        return btc_fail(BTC_E_UNSUPPORTED, "no thread of this interpreter has that ident");
    btc_pycursor py;
    btc_py_cursor_thread(&py, ts);
    py_source src;
    source_of_chain(&src, &py);
    python_only(s, &src);
    return 0;
}

/* ---- the Backtrace object the capture fills ---- */

/* Offsets of btcore.Backtrace's slots, checked once by btc_bind_backtrace(). */
static struct {
    PyTypeObject *type;
    Py_ssize_t raw, refs, capacity, truncated, target;
} bt_slots;

static bool slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    bool ok = d && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
              ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok)
        *offset = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_XDECREF(d);
    PyErr_Clear();
    return ok;
}

int btc_bind_backtrace(uintptr_t backtrace_type)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyTypeObject *type = (PyTypeObject *)backtrace_type;
    bool ok = PyType_Check((PyObject *)type) && slot_offset(type, "_raw", &bt_slots.raw) &&
              slot_offset(type, "_refs", &bt_slots.refs) &&
              slot_offset(type, "_capacity", &bt_slots.capacity) &&
              slot_offset(type, "truncated", &bt_slots.truncated) &&
              slot_offset(type, "_target", &bt_slots.target);
    bt_slots.type = ok ? type : NULL;
    PyGILState_Release(gil);
    return ok ? 0 : btc_fail(BTC_E_UNSUPPORTED, "btcore.Backtrace does not have the slots btcore expects");
}

static void set_slot(PyObject *bt, Py_ssize_t offset, PyObject *value)
{
    PyObject **slot = (PyObject **)((char *)bt + offset);
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

/* The weak references handed to Backtraces are also kept in a small ring:
 * PyWeakref_NewRef() returns a greenlet's existing plain weak reference for
 * the cost of an incref, so capturing the same greenlet again allocates
 * nothing.  Bounded: the oldest is dropped (the GIL guards the ring). */
#define KEPT_TARGET_REFS 256
static PyObject *kept_target_refs[KEPT_TARGET_REFS];
static unsigned kept_target_next;

void btc_backtrace_remember_target(PyObject *bt, PyObject *target)
{
    PyObject *ref = PyWeakref_NewRef(target, NULL);
    if (!ref) {
        PyErr_Clear();   /* only format()'s header line is lost */
        return;
    }
    if (Py_REFCNT(ref) == 1) {   /* a new one: keep it for the next capture of target */
        PyObject **slot = &kept_target_refs[kept_target_next++ % KEPT_TARGET_REFS];
        PyObject *old = *slot;
        *slot = Py_NewRef(ref);
        Py_XDECREF(old);
    }
    set_slot(bt, bt_slots.target, ref);
}

static void release_codes(sink *s)
{
    for (int i = 0; i < s->ncodes; i++)
        Py_DECREF(s->codes[i]);
    s->ncodes = 0;
}

/* Hand the frames and the code objects they name to the Backtrace: raw,
 * a bytearray holding the sink's frames (cut here to exactly the frames
 * captured; append() grows it up to the capacity), and a tuple of code
 * objects, in frame order (the tuple takes the sink's references).  Takes
 * raw's reference; raw NULL: no memory for it. */
static int fill_backtrace(PyObject *bt, sink *s, int capacity, PyObject *raw)
{
    if (raw && PyByteArray_Resize(raw, (Py_ssize_t)s->n * sizeof(btc_frame)) < 0)
        Py_CLEAR(raw);
    PyObject *refs = PyTuple_New(s->ncodes);
    PyObject *cap = PyLong_FromLong(capacity);
    if (!raw || !refs || !cap) {
        Py_XDECREF(raw);
        Py_XDECREF(refs);
        Py_XDECREF(cap);
        release_codes(s);
        int code = PyErr_ExceptionMatches(PyExc_MemoryError) ? BTC_E_NOMEMORY : BTC_E_UNSUPPORTED;
        return btc_fail_python(code, "cannot build the Backtrace");
    }
    for (int i = 0; i < s->ncodes; i++)
        PyTuple_SET_ITEM(refs, i, s->codes[i]);
    s->ncodes = 0;
    set_slot(bt, bt_slots.raw, raw);
    set_slot(bt, bt_slots.refs, refs);
    set_slot(bt, bt_slots.capacity, cap);
    set_slot(bt, bt_slots.truncated, Py_NewRef(s->truncated ? Py_True : Py_False));
    return 0;
}

/* ---- the cffi API ---- */

#define STACK_FRAMES 256

static int dispatch(sink *s, uintptr_t target, int want)
{
    if (!btc_py_supported())
        return BTC_E_UNSUPPORTED;
    if (want & BTC_WANT_THREAD)
        return collect_thread_python(s, target);
    btc_context ctx;
    if (target != 0)
        return collect_greenlet(s, want, (PyObject *)target, &ctx);
    return collect_current(s, want);
}

/* An empty bytearray grown to size: PyByteArray_FromStringAndSize(NULL,
 * size) that fails to allocate frees its half-made object, whose export
 * count is not set yet, and CPython (3.11) reports a SystemError for it on
 * stderr. */
static PyObject *bytearray_of_size(Py_ssize_t size)
{
    PyObject *raw = PyByteArray_FromStringAndSize(NULL, 0);
    if (raw && PyByteArray_Resize(raw, size) < 0)
        Py_CLEAR(raw);
    return raw;
}

/* A capture that may write more than STACK_FRAMES records writes them
 * straight into the bytearray the Backtrace will hold (made for the most it
 * may write, then cut to what it wrote: realloc shrinks it in place) rather
 * than into a heap buffer copied afterwards; a smaller one writes into a
 * buffer on the stack, copied into a bytearray of exactly its frames
 * (measured: cheaper than allocating and cutting a bytearray of up to 4 KiB). */
int btc_collect(uintptr_t target, uintptr_t backtrace, int capacity, int limit, int want)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *bt = (PyObject *)backtrace;
    btc_frame frames_buf[STACK_FRAMES];
    PyObject *codes_buf[STACK_FRAMES];
    PyObject *raw = NULL;
    sink s = {.out = frames_buf, .codes = codes_buf, .max = limit < capacity ? limit : capacity,
              .skip_python = (want & BTC_WANT_HIDE_CALLER) ? 1 : 0};
    int rc = 0;
    if (!bt_slots.type || !Py_IS_TYPE(bt, bt_slots.type) || capacity < 0 || s.max < 0)
        rc = btc_fail(BTC_E_UNSUPPORTED, "btc_collect: not a btcore.Backtrace, or a bad size");
    else if (s.max > STACK_FRAMES && (!(raw = bytearray_of_size((Py_ssize_t)s.max * sizeof(btc_frame))) ||
              !(s.codes = malloc(s.max * sizeof *s.codes)))) {
        PyErr_Clear();   /* the bytearray's MemoryError: reported as btcore's own */
        rc = btc_fail(BTC_E_NOMEMORY, "out of memory");
    }
    if (rc == 0) {
        if (raw)
            s.out = (btc_frame *)PyByteArray_AS_STRING(raw);
        rc = dispatch(&s, target, want);
    }
    if (rc == 0) {
        if (!raw)   /* NULL: fill_backtrace reports the MemoryError */
            raw = PyByteArray_FromStringAndSize((const char *)s.out, (Py_ssize_t)s.n * sizeof(btc_frame));
        rc = fill_backtrace(bt, &s, capacity, raw);
        raw = NULL;   /* taken */
    }
    Py_XDECREF(raw);
    release_codes(&s);   /* only left over when the capture failed */
    if (s.codes != codes_buf)
        free(s.codes);
    PyGILState_Release(gil);
    return rc;
}

/* ---- stamps: has a parked greenlet moved since it was last captured? ---- */

static uint64_t fnv1a(uint64_t h, uint64_t word)
{
    for (int i = 0; i < 8; i++, word >>= 8)
        h = (h ^ (word & 0xff)) * 0x100000001b3ULL;
    return h;
}

uint64_t btc_greenlet_stamp_held(PyObject *g)
{
    btc_frame frames[STACK_FRAMES];
    sink s = {.out = frames, .max = STACK_FRAMES};   /* no codes: nothing is kept */
    btc_context ctx;
    uint64_t h = 0;
    if (btc_py_supported() && collect_greenlet(&s, BTC_WANT_PYTHON, g, &ctx) == 0) {
        h = 0xcbf29ce484222325ULL;
        for (int i = 0; i < s.n; i++)
            h = fnv1a(fnv1a(h, s.out[i].addr), (uint64_t)(uint32_t)s.out[i].lasti);
        h = fnv1a(fnv1a(fnv1a(h, (uint64_t)s.n << 1 | s.truncated), ctx.regs.sp), ctx.mem.spill_hi - ctx.mem.spill_lo);
        h |= 1;
    }
    PyErr_Clear();
    return h;
}

bool btc_greenlet_stack_is(PyObject *g, int want, PyObject *bt)
{
    if (!bt_slots.type || !Py_IS_TYPE(bt, bt_slots.type))
        return false;
    PyObject *raw = *(PyObject **)((char *)bt + bt_slots.raw);
    bool truncated = *(PyObject **)((char *)bt + bt_slots.truncated) == Py_True;
    Py_ssize_t kept = raw && PyByteArray_CheckExact(raw) ? PyByteArray_GET_SIZE(raw) / (Py_ssize_t)sizeof(btc_frame) : -1;
    if (kept < 0 || kept >= STACK_FRAMES)
        return false;
    btc_frame frames[STACK_FRAMES];
    /* Room for one more than bt holds, unless bt was cut there: a deeper stack then shows as cut. */
    sink s = {.out = frames, .max = truncated ? (int)kept : (int)kept + 1};   /* no codes: nothing is kept */
    btc_context ctx;
    int rc = btc_py_supported() ? collect_greenlet(&s, want, g, &ctx) : BTC_E_UNSUPPORTED;
    PyErr_Clear();
    return rc == 0 && btc_backtrace_holds(bt, &(btc_raw_capture){.frames = frames, .n = s.n, .truncated = s.truncated});
}

uint64_t btc_greenlet_stamp(uintptr_t target)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    uint64_t h = btc_greenlet_stamp_held((PyObject *)target);
    PyGILState_Release(gil);
    return h;
}

/* ---- spawn sites (spawn.c): raw frames of the creating stack ---- */

int btc_capture_site(btc_raw_capture *c, int want, const btc_regs *regs, const void *stop,
                     btc_site_proof *proof)
{
    sink s = {.out = c->frames, .max = c->max};
    btc_context ctx;
    btc_pycursor py;
    int in_greenlet = btc_py_supported() ? current_context(&ctx, &py, regs, stop) : BTC_E_UNSUPPORTED;
    if (proof)
        *proof = (btc_site_proof){.want = want, .max = c->max, .regs = *regs, .stop = stop,
                                  .hi = in_greenlet < 0 ? 0 : ctx.mem.hi, .in_greenlet = in_greenlet};
    int rc = in_greenlet < 0 ? in_greenlet
                             : capture(&ctx, &py, &s, want | BTC_WANT_FROM_HOOK, false, in_greenlet,
                                       proof ? &proof->walk : NULL);
    c->n = s.n;
    c->truncated = s.truncated;
    if (proof && rc == 0 && !s.truncated && proof->walk.n >= 0)
        proof->valid = (proof->nchain = btc_py_chain_proof(stop, proof->chain, BTC_CHAIN_PROOF_WORDS)) >= 0;
    return rc;
}

bool btc_site_proven(const btc_site_proof *p, int want, int max, const btc_regs *regs, const void *stop)
{
    if (!p->valid || p->want != want || p->max != max || p->stop != stop)
        return false;
    if (want & BTC_WANT_NATIVE) {   /* the walk's start and its view's end, then its words */
        btc_context ctx;
        btc_pycursor py;
        if (p->regs.ip != regs->ip || p->regs.sp != regs->sp || (p->walk.uses_fp && p->regs.fp != regs->fp) ||
            current_context(&ctx, &py, regs, stop) != p->in_greenlet || ctx.mem.hi != p->hi ||
            !btc_unwind_proven(&p->walk, regs->sp, ctx.mem.hi))
            return false;
    }
    return btc_py_chain_proven(stop, p->chain, p->nchain);
}

PyObject *btc_backtrace_from_site(const btc_raw_capture *c, PyObject **codes, int capacity)
{
    sink s = {.out = c->frames, .codes = codes, .n = c->n, .truncated = c->truncated};
    for (int i = 0; i < c->n; i++)
        if (c->frames[i].kind == BTC_KIND_PYTHON)
            codes[s.ncodes++] = Py_NewRef((PyObject *)c->frames[i].addr);
    PyObject *bt = bt_slots.type ? bt_slots.type->tp_alloc(bt_slots.type, 0) : NULL;
    PyObject *raw = bt ? PyByteArray_FromStringAndSize((const char *)c->frames, (Py_ssize_t)c->n * sizeof(btc_frame))
                       : NULL;
    if (!bt || fill_backtrace(bt, &s, capacity, raw) < 0) {   /* fill_backtrace takes the references */
        release_codes(&s);
        Py_XDECREF(bt);
        PyErr_Clear();
        return NULL;
    }
    return bt;
}

bool btc_backtrace_holds(PyObject *bt, const btc_raw_capture *c)
{
    if (!bt_slots.type || !Py_IS_TYPE(bt, bt_slots.type))
        return false;
    PyObject *raw = *(PyObject **)((char *)bt + bt_slots.raw);
    PyObject *truncated = *(PyObject **)((char *)bt + bt_slots.truncated);
    size_t size = (size_t)c->n * sizeof(btc_frame);
    return raw && PyByteArray_CheckExact(raw) && (size_t)PyByteArray_GET_SIZE(raw) == size &&
           (truncated == Py_True) == c->truncated && memcmp(PyByteArray_AS_STRING(raw), c->frames, size) == 0;
}

bool btc_backtrace_slots(uintptr_t *type, uint32_t *raw, uint32_t *truncated)
{
    *type = (uintptr_t)bt_slots.type;
    *raw = (uint32_t)bt_slots.raw;
    *truncated = (uint32_t)bt_slots.truncated;
    return bt_slots.type != NULL;
}

bool btc_backtrace_raw_own(uintptr_t bt, uintptr_t *bytes, size_t *size, bool *truncated)
{
    uintptr_t type, raw, flag;
    PyByteArrayObject a;
    if (!bt_slots.type || !bt || (bt & 7) || !btc_read_own(&type, bt + offsetof(PyObject, ob_type), sizeof type) ||
        type != (uintptr_t)bt_slots.type || !btc_read_own(&raw, bt + bt_slots.raw, sizeof raw) ||
        !btc_read_own(&flag, bt + bt_slots.truncated, sizeof flag) || !raw || !btc_read_own(&a, raw, sizeof a) ||
        a.ob_base.ob_base.ob_type != &PyByteArray_Type || a.ob_base.ob_size < 0)
        return false;
    *bytes = (uintptr_t)a.ob_start;
    *size = (size_t)a.ob_base.ob_size;
    *truncated = flag == (uintptr_t)Py_True;
    return true;
}

/* ---- another process's stacks (native/remote/rstacks.c) ---- */

int btc_merge_frames(const btc_merge_input *in, btc_frame *out, int max, bool *truncated)
{
    sink s = {.out = out, .max = max};
    py_source src;
    source_of_frames(&src, in->py, in->npy);
    if (!(in->want & BTC_WANT_NATIVE))
        python_only(&s, &src);
    else
        merge_walk(&src, &s, in->want,
                   (native_walk){.nat = in->nat, .n = in->n, .complete = in->complete, .greenlet = in->greenlet,
                                 .internal_lo = in->internal_lo, .internal_hi = in->internal_hi});
    *truncated = s.truncated;
    return s.n;
}
