/* btc_collect(): pick a context, walk it, merge Python frames into the eval
 * loop's native frames, and hand back raw frames.
 *
 * Runs with the GIL held (btcore's cffi wrappers keep it, see _build.py):
 * the frame chain and the code objects' reference counts belong to it.
 */
#include <Python.h>

#include "context.h"
#include "cpython/pyframes.h"

/* ---- errors ---- */

static __thread const char *last_error = "";

int btc_fail(int code, const char *reason)
{
    last_error = reason;
    return code;
}

const char *btc_last_error(void) { return last_error; }

static bool in_eval_loop(const btc_native_frame *f)
{
    return btc_in_eval_loop(f->exact ? f->pc : f->pc - 1);
}

/* ---- the output ---- */

typedef struct {
    btc_frame *out;
    int n, max;
    bool truncated;
    int skip_python;    /* btcore's own API frames, innermost first */
    PyObject *refs;     /* list: the code object of each Python frame emitted */
} sink;

static bool emit(sink *s, uintptr_t addr, int lasti, int kind, int flags)
{
    if (s->n == s->max) {
        s->truncated = true;
        return false;
    }
    btc_frame *f = &s->out[s->n++];
    f->addr = addr;
    f->lasti = lasti;
    f->kind = (uint8_t)kind;
    f->flags = (uint8_t)flags;
    f->reserved = 0;
    return true;
}

/* Emit one Python frame; its code object goes to the refs list. */
static bool emit_python(sink *s, const btc_pyframe *pf, int flags)
{
    if (pf->hidden)
        return true;
    if (s->skip_python > 0) {
        s->skip_python--;
        return true;
    }
    if (pf->entry)
        flags |= BTC_F_ENTRY;
    if (s->n < s->max && PyList_Append(s->refs, pf->code) < 0) {
        PyErr_Clear();   /* out of memory: a shorter backtrace */
        s->max = s->n;
    }
    return emit(s, (uintptr_t)pf->code, pf->lasti, BTC_KIND_PYTHON, flags);
}

/* The Python frames one eval-loop call runs: up to and including its entry
 * frame.  Returns how many frames the chain gave (0: chain exhausted). */
static int emit_eval_call(sink *s, btc_pycursor *py)
{
    btc_pyframe pf;
    int taken = 0;
    while (btc_py_next(py, &pf)) {
        taken++;
        if (!emit_python(s, &pf, 0) || pf.entry)
            break;
    }
    return taken;
}

static void emit_rest_unmerged(sink *s, btc_pycursor *py)
{
    btc_pyframe pf;
    while (btc_py_next(py, &pf) && emit_python(s, &pf, BTC_F_UNMERGED))
        ;
}

/* ---- merge ---- */

typedef struct {
    btc_native_frame *nat;
    int n;
    bool complete;     /* the walk reached its natural end, not our buffer's */
    bool skip_to_eval; /* drop native frames before the first eval-loop frame (btcore's own) */
    bool greenlet;     /* a suspended greenlet: mark (or hide) greenlet's own frames */
    bool internals;    /* show greenlet's switching machinery */
} native_walk;

/* Hide greenlet's switching machinery: the innermost frames (slp_switch up
 * to the switch() call site) and the outermost (its start-up stub). */
static int hide_greenlet_internals(native_walk *w)
{
    int first = 0;
    while (first < w->n && btc_greenlet_internal(w->nat[first].pc - !w->nat[first].exact))
        first++;
    while (w->complete && w->n > first && btc_greenlet_internal(w->nat[w->n - 1].pc - 1))
        w->n--;
    return first;
}

static void merge(sink *s, const native_walk *w, btc_pycursor *py, int want)
{
    bool want_py = want & BTC_WANT_PYTHON, want_native = want & BTC_WANT_NATIVE;
    int i = 0;
    if (w->skip_to_eval)
        while (i < w->n && !in_eval_loop(&w->nat[i]))
            i++;
    for (; i < w->n; i++) {
        const btc_native_frame *f = &w->nat[i];
        int flags = f->exact ? BTC_F_EXACT : 0;
        if (w->greenlet && btc_greenlet_internal(f->pc - !f->exact))
            flags |= BTC_F_INTERNAL;
        bool ok = true;
        if (in_eval_loop(f)) {
            flags |= BTC_F_EVAL;
            if (!want_py)
                ok = emit(s, f->pc, -1, BTC_KIND_NATIVE, flags);
            else if (emit_eval_call(s, py) == 0 && want_native)
                ok = emit(s, f->pc, -1, BTC_KIND_NATIVE, flags | BTC_F_UNMERGED);
        } else if (want_native) {
            ok = emit(s, f->pc, -1, BTC_KIND_NATIVE, flags);
        }
        if (!ok || s->truncated)
            return;
    }
    if (!w->complete)
        s->truncated = s->n == s->max;
    if (want_py)
        emit_rest_unmerged(s, py);
}

static void python_only(sink *s, btc_pycursor *py)
{
    btc_pyframe pf;
    while (btc_py_next(py, &pf) && emit_python(s, &pf, 0))
        ;
}

/* ---- contexts ---- */

#define STACK_NATIVE_FRAMES 256
/* Native frames a walk may need beyond the output's size: btcore's own. */
#define OWN_NATIVE_FRAMES 32

static int capture(const btc_context *ctx, btc_pycursor *py, sink *s, int want, bool skip_to_eval,
                   bool greenlet)
{
    if (!(want & BTC_WANT_NATIVE)) {
        python_only(s, py);
        return 0;
    }
    btc_native_frame stack_buf[STACK_NATIVE_FRAMES];
    native_walk w = {.nat = stack_buf, .skip_to_eval = skip_to_eval, .greenlet = greenlet};
    int max = s->max + OWN_NATIVE_FRAMES;
    btc_native_frame *heap = NULL;
    if (max > STACK_NATIVE_FRAMES && !(w.nat = heap = malloc(max * sizeof *w.nat)))
        return btc_fail(BTC_E_UNSUPPORTED, "out of memory");
    btc_modules_lock();
    btc_modules_refresh();
    btc_eval_ranges_init();
    w.n = btc_unwind(ctx, w.nat, max);
    w.complete = w.n < max;
    if (greenlet && !(want & BTC_WANT_INTERNALS)) {
        int hidden = hide_greenlet_internals(&w);
        w.nat += hidden;
        w.n -= hidden;
    }
    merge(s, &w, py, want);
    btc_modules_unlock();
    free(heap);
    return 0;
}

/* The calling thread's stack; in a greenlet, down to that greenlet's bottom
 * (last_cfa != 0): below it lie frames of whoever started the greenlet. */
static int collect_current(sink *s, int want, uintptr_t last_cfa)
{
    btc_context ctx = {0};
    uintptr_t lo;
    btc_get_regs(&ctx.regs);   /* this frame stays live during the walk */
    if (!btc_thread_stack(&lo, &ctx.mem.hi))
        return btc_fail(BTC_E_UNSUPPORTED, "cannot find the thread's stack");
    ctx.mem.lo = ctx.regs.sp;
    ctx.last_cfa = last_cfa;
    btc_pycursor py;
    btc_py_cursor_current(&py);
    return capture(&ctx, &py, s, want, true, last_cfa != 0);
}

static int collect_current_greenlet(sink *s, int want, PyObject *g)
{
    uintptr_t stop;
    int rc = btc_greenlet_stack_stop(g, &stop);
    return rc < 0 ? rc : collect_current(s, want, stop);
}

/* A greenlet other than the calling thread's current one.  Its state is
 * checked here, under the GIL: checks made in Python before this call may be
 * stale, since the GIL can change hands between bytecodes. */
static int collect_greenlet(sink *s, int want, PyObject *g)
{
    int active = PyObject_IsTrue(g);   /* greenlet's __bool__: started and not dead */
    if (active <= 0) {
        PyErr_Clear();
        return 0;                      /* no stack: an empty backtrace */
    }
    PyObject *frame = PyObject_GetAttrString(g, "gr_frame");
    if (!frame) {
        PyErr_Clear();
        return btc_fail(BTC_E_LAYOUT, "cannot read the greenlet's gr_frame");
    }
    /* greenlet's own rule: active with no saved frame is running.  In the
     * calling thread, a greenlet that is not current cannot be running: it
     * is suspended in code without Python frames. */
    int rc = 0;
    if (frame == Py_None && !(want & BTC_WANT_OWN_THREAD))
        rc = btc_fail(BTC_E_RUNNING, "cannot collect a greenlet that is running in another thread");
    btc_context ctx;
    if (rc == 0)
        rc = btc_greenlet_context(g, &ctx);
    if (rc == 0) {
        btc_pycursor py;
        btc_py_cursor_frame(&py, frame);   /* None: no Python frames */
        rc = capture(&ctx, &py, s, want, false, true);
    }
    Py_DECREF(frame);
    return rc;
}

/* ---- the cffi API ---- */

int btc_collect(uintptr_t target, uintptr_t frames, uintptr_t refs, int limit, int want, int skip_python)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *buf = (PyObject *)frames, *list = (PyObject *)refs;
    int rc;
    if (!PyByteArray_CheckExact(buf) || !PyList_CheckExact(list)) {
        rc = btc_fail(BTC_E_UNSUPPORTED, "btc_collect: frames must be a bytearray and refs a list");
        goto out;
    }
    int capacity = (int)(PyByteArray_GET_SIZE(buf) / sizeof(btc_frame));
    sink s = {.out = (btc_frame *)PyByteArray_AS_STRING(buf),
              .max = limit < capacity ? limit : capacity,
              .skip_python = skip_python,
              .refs = list};
    if (!btc_py_supported())
        rc = BTC_E_UNSUPPORTED;
    else if (target == 0)
        rc = collect_current(&s, want, 0);
    else if (want & BTC_WANT_CURRENT)
        rc = collect_current_greenlet(&s, want, (PyObject *)target);
    else
        rc = collect_greenlet(&s, want, (PyObject *)target);
    if (rc == 0)
        rc = s.n | (s.truncated ? BTC_TRUNCATED : 0);
out:
    PyGILState_Release(gil);
    return rc;
}
int btc_backtrace(uintptr_t *out, int max)
{
    btc_native_frame nat[STACK_NATIVE_FRAMES];
    btc_context ctx = {0};
    uintptr_t lo;
    btc_get_regs(&ctx.regs);
    if (max <= 0 || !btc_thread_stack(&lo, &ctx.mem.hi))
        return 0;
    ctx.mem.lo = ctx.regs.sp;
    if (max > STACK_NATIVE_FRAMES - 1)
        max = STACK_NATIVE_FRAMES - 1;
    btc_modules_lock();
    btc_modules_refresh();
    int n = btc_unwind(&ctx, nat, max + 1);
    btc_modules_unlock();
    for (int i = 1; i < n; i++)   /* nat[0] is this function */
        out[i - 1] = nat[i].pc;
    return n > 0 ? n - 1 : 0;
}
