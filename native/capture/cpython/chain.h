/* The frame chain of CPython 3.12 and later, shared by the family units.
 *
 * Since 3.12 every call of the eval loop pushes a shim frame that lives in
 * the C frame of _PyEval_EvalFrameDefault (owner FRAME_OWNED_BY_CSTACK on
 * 3.12/3.13, FRAME_OWNED_BY_INTERPRETER on 3.14+: the value is 3 on all of
 * them, and every owner >= it is "not a Python frame", as in CPython's
 * _PyFrame_IsIncomplete).  3.15 also ends each thread's chain with such a
 * sentinel (tstate->base_frame).  A Python frame is the entry frame of its
 * eval-loop call when the frame before it (outer) is a shim.
 *
 * Suspended greenlets (greenlet 3.x on 3.12+): while a greenlet is not
 * running, greenlet "exposes" its frames (Greenlet::expose_frames): each
 * complete frame's `previous` is rewritten to skip the shims in between,
 * the outermost one's to NULL, and the original link is kept in the first
 * word of the frame object's spare storage (frame_obj->_f_frame_data[0]),
 * to be put back on resume.  The shims themselves lie on the greenlet's C
 * stack, which may have been copied to the heap: they are read only through
 * the greenlet's memory view, and an original link is believed only when it
 * leads, through shims inside that view, back to the exposed link.  When it
 * does not (a greenlet that exposes differently, or none at all), the entry
 * flag falls back to what the chain itself says: the merge degrades, it
 * never reads outside the view.
 *
 * The including unit defines, before including this file:
 *   BTC_FRAME_CODE(f)     the frame's code object (PyObject *), for Python frames
 *   BTC_FRAME_INSTR(f)    the frame's instruction pointer (its LASTI base)
 *   btc_thread_frame(ts)  the thread's innermost _PyInterpreterFrame
 * with the internal headers that define _PyInterpreterFrame, struct _frame
 * and the FRAME_OWNED_BY_* constants.
 */
#ifndef BTC_CPYTHON_CHAIN_H
#define BTC_CPYTHON_CHAIN_H

#include <string.h>

#include "pyframes.h"

/* Owners from here on are shims and sentinels: 3 on every family so far
 * (FRAME_OWNED_BY_CSTACK in 3.12/3.13, FRAME_OWNED_BY_INTERPRETER in 3.14+). */
#ifndef BTC_BOUNDARY_OWNER
#define BTC_BOUNDARY_OWNER 3
#endif
/* Shims between two Python frames: one per eval-loop call. */
#define BTC_MAX_SHIMS 4

typedef _PyInterpreterFrame btc_iframe;

_Static_assert(offsetof(btc_iframe, localsplus) <= BTC_FRAME_FIXED_BYTES, "a frame's fixed part");

static bool in_view(const btc_memview *m, const void *p)
{
    return m && (uintptr_t)p >= m->lo && (uintptr_t)p < m->hi;
}

/* A frame's owner and previous link.  Frames on a suspended greenlet's
 * stack (shims) are read through its memory view, others from `at`, where
 * the cursor's reader put frame p (btc_py_frame_at). */
BTC_HOT bool read_link(const btc_pycursor *c, const btc_iframe *p, const btc_iframe *at, int *owner,
                      const btc_iframe **prev)
{
    if (!in_view(c->mem, p)) {
        *owner = at->owner;
        *prev = at->previous;
        return true;
    }
    uintptr_t a = (uintptr_t)p, ow, pw;
    uintptr_t oa = a + offsetof(btc_iframe, owner);
    if (!btc_mem_read(c->mem, oa & ~(uintptr_t)7, &ow) ||
        !btc_mem_read(c->mem, a + offsetof(btc_iframe, previous), &pw))
        return false;
    *owner = (signed char)(ow >> (8 * (oa & 7)));
    *prev = (const btc_iframe *)pw;
    return true;
}

/* Does the link greenlet saved (`saved`) reach the exposed link (`exposed`)
 * through shims only, all on the greenlet's stack? */
static bool saved_link_is_shims(const btc_pycursor *c, const btc_iframe *saved, const btc_iframe *exposed)
{
    for (int i = 0; i < BTC_MAX_SHIMS && saved; i++) {
        int owner;
        const btc_iframe *prev;
        if (!in_view(c->mem, saved) || !read_link(c, saved, saved, &owner, &prev) || owner < BTC_BOUNDARY_OWNER)
            return false;
        /* exposed == NULL: the greenlet's outermost Python frame; whatever
         * lies below its shim (NULL, 3.15's base frame) is not its own. */
        if (prev == exposed || !exposed)
            return true;
        saved = prev;
    }
    return false;
}

/* Is the Python frame read at `at` (previous link `next`) the entry frame
 * of its eval-loop call?  (`at` is not read once next is asked for.) */
BTC_HOT bool entry_frame(const btc_pycursor *c, const btc_iframe *at, const btc_iframe *next)
{
    if (c->exposed && at->frame_obj) {
        const btc_iframe *saved;
        memcpy(&saved, &at->frame_obj->_f_frame_data[0], sizeof saved);
        if (saved != next && saved_link_is_shims(c, saved, next))
            return true;
    }
    const btc_iframe *next_at;
    if (!next || !(next_at = btc_py_frame_at(c, next)))
        return true;
    int owner;
    const btc_iframe *ignored;
    return read_link(c, next, next_at, &owner, &ignored) && owner >= BTC_BOUNDARY_OWNER;
}

static bool chain_end(btc_pycursor *c)
{
    c->frame = NULL;
    return false;
}

/* The instruction offset of Python frame f (read at `at`), in bytes. */
BTC_HOT int frame_lasti(const btc_iframe *at, const PyObject *code)
{
    const char *first = (const char *)code + offsetof(PyCodeObject, co_code_adaptive);
    return (int)((const char *)BTC_FRAME_INSTR(at) - first);
}

/* CPython's _PyFrame_IsIncomplete for a frame that is not a shim, with the
 * code object's field read from code_at. */
BTC_HOT bool hidden_frame(int owner, int lasti, const PyCodeObject *code_at)
{
    return owner != FRAME_OWNED_BY_GENERATOR &&
           lasti < code_at->_co_firsttraceable * (int)sizeof(_Py_CODEUNIT);   /* no signed division */
}

/* One step of cursor c, whose frames are read as reader r says: r is c,
 * or (plain) a cursor without reader, memory view or exposed links, in
 * which the checks of those fold away when this is inlined with plain
 * constant.  A spawn site, collect() and the profiler read the calling
 * thread's own chain that way (~40 instructions a frame fewer); suspended
 * greenlets and signal handlers need the rest. */
BTC_HOT bool step(btc_pycursor *c, btc_pyframe *f, bool plain)
{
    const btc_pycursor in_place = {0}, *r = plain ? &in_place : c;
    const btc_iframe *fr = c->frame, *at, *prev;
    int owner;
    for (;;) {   /* shims and sentinels are not Python frames */
        if (!fr || ++c->steps > BTC_PY_MAX_FRAMES || !(at = btc_py_frame_at(r, fr)) ||
            !read_link(r, fr, at, &owner, &prev))
            return chain_end(c);
        if (owner < BTC_BOUNDARY_OWNER)
            break;
        fr = prev;
    }
    /* A Python frame never lives on a C stack: if this one seems to, the
     * chain is not what we think it is. */
    if (in_view(r->mem, fr))
        return chain_end(c);
    PyObject *code = BTC_FRAME_CODE(at);
    const PyCodeObject *code_at;
    if (!code || !(code_at = btc_py_code_at(r, code)) || !PyCode_Check((PyObject *)code_at))
        return chain_end(c);
    int lasti = frame_lasti(at, code);
    f->code = code;
    f->lasti = lasti;
    f->hidden = hidden_frame(owner, lasti, code_at);
    f->entry = entry_frame(r, at, prev);
    c->frame = prev;
    return true;
}

BTC_HOT bool step_in_place(btc_pycursor *c, btc_pyframe *f) { return step(c, f, true); }
BTC_HOT bool step_through_reader(btc_pycursor *c, btc_pyframe *f) { return step(c, f, false); }

/* The loop through a reader in a function of its own: inlined beside the
 * plain one, both shared one register allocation and the plain loop kept
 * its counters in memory. */
static __attribute__((noinline)) int records_through_reader(btc_pycursor *c, btc_frame *out, int max)
{
    return btc_py_records_by(c, out, max, step_through_reader);
}

int btc_py_next_records(btc_pycursor *c, btc_frame *out, int max)
{
    if (BTC_UNLIKELY(c->check || c->mem || c->exposed))
        return records_through_reader(c, out, max);
    return btc_py_records_by(c, out, max, step_in_place);
}

/* step()'s reads, in place, three words a frame: its owner (and whether
 * the cursor meets the stop there), code and instruction (a shim's too,
 * though the cursor reads only its owner and link).  From each cursor
 * position (the first frame, and each frame after a Python frame) the
 * shims, then a Python frame, whose entry flag is the next frame's owner
 * (the next frame is read when the cursor stops there too).  No address:
 * another greenlet's frames at the same code and instructions give the
 * same records.  check: compare with a proof made here, out[0..max) (-1 at
 * the first difference); equal words name the same live code objects (the
 * proof's holder keeps them), so its frames are neither hidden nor
 * foreign, as when the proof was made.  Bounded by max, a proof's room. */
BTC_HOT int chain_words(const void *stop, uintptr_t *out, int max, bool check)
{
    bool at_position = true, stop_read = false, stopped = false;
    int n = 0;
    for (const btc_iframe *f = btc_thread_frame(PyThreadState_Get()); f; f = f->previous, n += 3) {
        if (n + 3 > max)
            return -1;
        bool stop_here = at_position && f == stop;
        PyObject *code = BTC_FRAME_CODE(f);
        uintptr_t w0 = (uintptr_t)(unsigned char)f->owner | (uintptr_t)stop_here << 8, w1 = (uintptr_t)code,
                  w2 = (uintptr_t)BTC_FRAME_INSTR(f);
        if (check && ((out[n] ^ w0) | (out[n + 1] ^ w1) | (out[n + 2] ^ w2)))
            return -1;
        if (!check)
            out[n] = w0, out[n + 1] = w1, out[n + 2] = w2;
        if (stopped)
            return n + 3;
        bool python = f->owner < BTC_BOUNDARY_OWNER;
        if (!check && python && (!code || !PyCode_Check(code) ||
                                 hidden_frame(f->owner, frame_lasti(f, code), (const PyCodeObject *)code)))
            return -1;   /* not a code object's, or hidden: its code is held by nobody */
        stop_read |= stop_here;
        stopped = python && stop_read;
        at_position = python;
    }
    return n;
}

const void *btc_py_current_instr(void)
{
    const btc_iframe *f = btc_thread_frame(PyThreadState_Get());
    return f ? (const void *)BTC_FRAME_INSTR(f) : NULL;
}

int btc_py_chain_proof(const void *stop, uintptr_t *out, int max)
{
    return chain_words(stop, out, max, false);
}

bool btc_py_chain_proven(const void *stop, const uintptr_t *proof, int n)
{
    return chain_words(stop, (uintptr_t *)proof, n, true) == n;
}

/* The C-stack address of the eval-loop call that runs `frame`, a frame of
 * the calling thread's chain (a running task's coroutine), or 0: the shim
 * frame that call pushed before it (its `previous`, past any other shim), a
 * local of that _PyEval_EvalFrameDefault call.  A spawn site's native walk
 * ends there, as 3.11's ends at its _PyCFrame.  GIL held: the chain is
 * consistent; bounded by BTC_PY_MAX_FRAMES. */
uintptr_t btc_py_eval_call_address(const void *frame)
{
    const btc_iframe *f = btc_thread_frame(PyThreadState_Get());
    int steps = 0;
    while (f && f != frame && steps++ < BTC_PY_MAX_FRAMES)
        f = f->previous;
    for (f = f == frame ? f->previous : NULL; f && steps++ < BTC_PY_MAX_FRAMES; f = f->previous)
        if (f->owner >= BTC_BOUNDARY_OWNER)
            return (uintptr_t)f;
    return 0;
}

bool btc_py_supported(void) { return true; }

void btc_py_cursor_thread(btc_pycursor *c, PyThreadState *ts)
{
    *c = (btc_pycursor){.frame = btc_thread_frame(ts)};
}

bool btc_py_cursor_greenlet(btc_pycursor *c, PyObject *frame, const btc_memview *mem)
{
    bool ok = btc_py_cursor_frame(c, frame);
    c->mem = mem;
    c->exposed = true;
    return ok;
}

const char *const btc_py_eval_functions[] = {"_PyEval_EvalFrameDefault", NULL};

#endif
