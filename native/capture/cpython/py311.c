/* CPython 3.11: _PyInterpreterFrame chain from tstate->cframe->current_frame;
 * is_entry marks the first frame of each _PyEval_EvalFrameDefault call. */
#include "pyframes.h"

#if BTC_PY_FAMILY == 311

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>

_Static_assert(offsetof(_PyInterpreterFrame, localsplus) <= BTC_FRAME_FIXED_BYTES, "a frame's fixed part");

const char *const btc_py_eval_functions[] = {"_PyEval_EvalFrameDefault", NULL};

bool btc_py_supported(void) { return true; }

/* The innermost frame of thread state ts. */
static const _PyInterpreterFrame *thread_frame(const PyThreadState *ts)
{
    return ts->cframe ? ts->cframe->current_frame : NULL;
}

void btc_py_cursor_thread(btc_pycursor *c, PyThreadState *ts)
{
    *c = (btc_pycursor){.frame = thread_frame(ts)};
}

/* greenlet does not relink frames on 3.11: a suspended chain is a chain. */
bool btc_py_cursor_greenlet(btc_pycursor *c, PyObject *frame, const btc_memview *mem)
{
    bool ok = btc_py_cursor_frame(c, frame);
    c->mem = mem;
    return ok;
}

/* Each _PyEval_EvalFrameDefault call links a _PyCFrame local into
 * tstate->cframe; its current_frame is the innermost frame that call runs,
 * whose chain reaches the call's entry frame.  Bounded: a chain of calls
 * longer than BTC_PY_MAX_FRAMES frames is not searched. */
uintptr_t btc_py_eval_call_address(const void *frame)
{
    int steps = 0;
    for (_PyCFrame *cf = PyThreadState_Get()->cframe; cf; cf = cf->previous)
        for (_PyInterpreterFrame *f = cf->current_frame; f && steps++ < BTC_PY_MAX_FRAMES; f = f->previous) {
            if (f == frame)
                return (uintptr_t)cf;
            if (f->is_entry)
                break;
        }
    return 0;
}

/* _PyFrame_IsIncomplete for frame fr, with the code object's field read
 * from code_at. */
BTC_HOT bool hidden_frame(const _PyInterpreterFrame *fr, const PyCodeObject *code_at)
{
    return fr->owner != FRAME_OWNED_BY_GENERATOR && fr->prev_instr < _PyCode_CODE(fr->f_code) + code_at->_co_firsttraceable;
}

/* One frame of cursor c, read as reader r says: r is c, or (plain) a
 * cursor without reader, whose checks fold away when this is inlined with
 * plain constant (the calling thread's own chain). */
BTC_HOT bool step(btc_pycursor *c, btc_pyframe *f, bool plain)
{
    const btc_pycursor in_place = {0}, *r = plain ? &in_place : c;
    const _PyInterpreterFrame *frame = c->frame, *fr;
    const PyCodeObject *code;
    if (!frame || ++c->steps > BTC_PY_MAX_FRAMES || !(fr = btc_py_frame_at(r, frame)))
        return false;
    f->code = (PyObject *)fr->f_code;
    if (!f->code || !(code = btc_py_code_at(r, f->code)) || !PyCode_Check((PyObject *)code))
        return false;
    f->lasti = _PyInterpreterFrame_LASTI(fr) * (int)sizeof(_Py_CODEUNIT);   /* pointer arithmetic only */
    f->entry = fr->is_entry;
    f->hidden = hidden_frame(fr, code);
    c->frame = fr->previous;
    return true;
}

/* step()'s reads, in place (pyframes.h), three words a frame: its owner
 * with its entry flag (and whether it is the stop), code and instruction;
 * no address (another greenlet's frames at the same code and instructions
 * give the same records).  check: compared with a proof made here,
 * out[0..max) (equal words name the same live code objects: neither
 * hidden nor foreign, as when the proof was made). */
BTC_HOT int chain_words(const void *stop, uintptr_t *out, int max, bool check)
{
    const _PyInterpreterFrame *f = thread_frame(PyThreadState_Get());
    int n = 0;
    for (; f; f = f->previous, n += 3) {
        if (n + 3 > max)
            return -1;
        if (!check && (!f->f_code || !PyCode_Check((PyObject *)f->f_code) || hidden_frame(f, f->f_code)))
            return -1;   /* not a code object's, or hidden: its code is held by nobody */
        uintptr_t w0 = (uintptr_t)(unsigned char)f->owner | (uintptr_t)f->is_entry << 8 | (uintptr_t)(f == stop) << 9,
                  w1 = (uintptr_t)f->f_code, w2 = (uintptr_t)f->prev_instr;
        if (check && ((out[n] ^ w0) | (out[n + 1] ^ w1) | (out[n + 2] ^ w2)))
            return -1;
        if (!check)
            out[n] = w0, out[n + 1] = w1, out[n + 2] = w2;
        if (f == stop)
            return n + 3;
    }
    return n;
}

const void *btc_py_current_instr(void)
{
    const _PyInterpreterFrame *f = thread_frame(PyThreadState_Get());
    return f ? (const void *)f->prev_instr : NULL;
}

int btc_py_chain_proof(const void *stop, uintptr_t *out, int max)
{
    return chain_words(stop, out, max, false);
}

bool btc_py_chain_proven(const void *stop, const uintptr_t *proof, int n)
{
    return chain_words(stop, (uintptr_t *)proof, n, true) == n;
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
    if (BTC_UNLIKELY(c->check))
        return records_through_reader(c, out, max);
    return btc_py_records_by(c, out, max, step_in_place);
}

#endif
