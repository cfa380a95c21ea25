/* What the rest of the core needs from one CPython version family.
 *
 * Exactly one unit in native/cpython/ implements this for the Python the
 * module is compiled against (each unit compiles to nothing on other
 * versions; unsupported.c covers the rest).  Adding a version family means
 * adding one unit and one BTC_PY_FAMILY line below (see docs/platforms.md).
 * Every function here is called with the GIL held.
 *
 *   py311.c   3.11        tstate->cframe->current_frame; _PyInterpreterFrame.is_entry
 *   py312.c   3.12        cframe; a shim frame (owner FRAME_OWNED_BY_CSTACK) per eval-loop call
 *   py313.c   3.13        tstate->current_frame; shim owned by FRAME_OWNED_BY_CSTACK
 *   py314.c   3.14, 3.15  _PyStackRef code; shim owned by FRAME_OWNED_BY_INTERPRETER
 * chain.h holds what 3.12+ share: shim frames, greenlet's "exposed" chains.
 * cursor.c holds the cursor constructors every family shares.
 */
#ifndef BTC_PYFRAMES_H
#define BTC_PYFRAMES_H

#include <Python.h>

#include "capture/context.h"

#if defined(Py_GIL_DISABLED)
#define BTC_PY_FAMILY 0   /* free-threaded builds: frames are read differently (not supported) */
#elif PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define BTC_PY_FAMILY 311
#elif PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define BTC_PY_FAMILY 312
#elif PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000
#define BTC_PY_FAMILY 313
#elif PY_VERSION_HEX >= 0x030E0000 && PY_VERSION_HEX < 0x03100000
#define BTC_PY_FAMILY 314   /* 3.14 and 3.15 */
#else
#define BTC_PY_FAMILY 0
#endif

/* A reader that may not trust the chain (a signal handler: the interrupted
 * code may be pushing or popping a frame, and a link may point at freed
 * memory): each frame's fixed part and each code object's header are read
 * from the address these return, never from the object itself unless they
 * return it: the object (memory sure to stay mapped), a private copy of it
 * (valid until the next call of the same function), or NULL (refused; for
 * `code`, also when the object is not a code object). */
typedef struct btc_read_check {
    const void *(*frame)(struct btc_read_check *self, const void *frame);
    const void *(*code)(struct btc_read_check *self, const void *code);
} btc_read_check;

/* The bytes of a frame a reader copies: each family unit asserts that the
 * fixed part of its _PyInterpreterFrame fits. */
#define BTC_FRAME_FIXED_BYTES 96

/* A position in a thread's chain of interpreter frames. */
typedef struct {
    const void *frame;
    /* A suspended greenlet's chain: C-stack frames are read through this view
     * (NULL: the calling thread's own chain, read in place). */
    const btc_memview *mem;
    bool exposed;       /* greenlet may have relinked the chain ("exposed" frames, 3.12+) */
    int steps;          /* frames visited: bounds a corrupt (cyclic) chain */
    btc_read_check *check;   /* NULL: the chain is consistent (GIL held) */
    const void *stop;   /* the capture's outermost frame (an asyncio task's bottom), or NULL */
    bool stopped;       /* stop was read: the chain ended there */
} btc_pycursor;

typedef struct {
    PyObject *code;     /* borrowed */
    int lasti;          /* instruction offset in bytes */
    bool entry;         /* the first frame of its eval-loop call: the merge's boundary */
    bool hidden;        /* not shown by tracebacks either (not started yet) */
} btc_pyframe;

/* Where to read frame `frame` and code object `code` of cursor c's chain
 * from (see btc_read_check; without one: in place). */
static inline const void *btc_py_frame_at(const btc_pycursor *c, const void *frame)
{
    return c->check ? c->check->frame(c->check, frame) : frame;
}

static inline const void *btc_py_code_at(const btc_pycursor *c, const void *code)
{
    return c->check ? c->check->code(c->check, code) : code;
}

/* False (with btc_fail() called) when this build cannot read frames. */
bool btc_py_supported(void);
/* The calling thread's innermost frame. */
void btc_py_cursor_current(btc_pycursor *c);
/* The innermost frame of thread state ts, read raw (no GIL, no allocation),
 * as faulthandler reads it: from a signal handler running on that thread. */
void btc_py_cursor_thread(btc_pycursor *c, PyThreadState *ts);
/* The chain from a frame object; false if frame is not a frame object. */
bool btc_py_cursor_frame(btc_pycursor *c, PyObject *frame);
/* The chain of a suspended greenlet from its gr_frame; mem is the view of
 * its stack (btc_context.mem), which must outlive the cursor.  On 3.12+
 * greenlet relinks a suspended greenlet's frames past the eval loop's shim
 * frames (Greenlet::expose_frames); the family unit recovers the entry
 * boundaries from the links greenlet saved.  False if frame is not a frame
 * object. */
bool btc_py_cursor_greenlet(btc_pycursor *c, PyObject *frame, const btc_memview *mem);
/* A record's `reserved` while the merge holds it: a frame read but hidden
 * from tracebacks (not started yet), left out of every Backtrace. */
#define BTC_PY_HIDDEN 1

/* The raw record a Backtrace holds for Python frame f (code object,
 * instruction offset, BTC_F_ENTRY on the first frame of an eval-loop
 * call; BTC_PY_HIDDEN for the merge), stored field by field: a compound
 * literal was built with a mask per field over the previous record's word
 * (gcc 12, ~20 instructions a frame). */
BTC_HOT void btc_py_record(btc_frame *out, const btc_pyframe *f)
{
    out->addr = (uintptr_t)f->code;
    out->lasti = f->lasti;
    out->kind = BTC_KIND_PYTHON;
    out->flags = f->entry ? BTC_F_ENTRY : 0;
    out->reserved = f->hidden ? BTC_PY_HIDDEN : 0;
}

/* The next frames of c's chain, outward, as records (btc_py_record) into
 * out[0..max): how many (0: the chain has ended).  The chain ends after the
 * cursor's stop frame (c->stopped).  In batches, not a frame a call: one
 * loop reads them, with the family's step inlined. */
int btc_py_next_records(btc_pycursor *c, btc_frame *out, int max);

/* btc_py_next_records over a family unit's one-frame step `next` (false at
 * the end of the chain), inlined into the unit's loop.  The stop is the
 * frame the cursor stood at before a step (on 3.12+ a shim may stand
 * before it: then it is not seen, and the chain goes on). */
BTC_HOT int btc_py_records_by(btc_pycursor *c, btc_frame *out, int max, bool (*next)(btc_pycursor *, btc_pyframe *))
{
    const void *stop = c->stop;
    int n = 0;
    while (n < max) {
        const void *was = c->frame;
        btc_pyframe f;
        if (!next(c, &f))
            break;
        btc_py_record(&out[n++], &f);
        if (stop && was == stop) {
            c->frame = NULL;
            c->stopped = true;
            break;
        }
    }
    return n;
}

/* The words that decide the records btc_py_next_records gives for the
 * calling thread's chain, read by a cursor from its innermost frame that
 * stops at `stop` (or NULL), into out[0..max): how many, or -1 (more than
 * max, or a frame no proof covers: one tracebacks hide, or whose code is
 * not a code object).  Each frame's owner (where the cursor meets the
 * stop), and its code object and instruction pointer: equal words later
 * mean equal records, as long as the code objects named stay alive (the
 * comparer holds them: an address then names one object).  Spawn sites
 * seen before (capture.c). */
int btc_py_chain_proof(const void *stop, uintptr_t *out, int max);
/* Does the chain read so now give proof[0..n), made by btc_py_chain_proof
 * (the caller holding the code objects it names)? */
bool btc_py_chain_proven(const void *stop, const uintptr_t *proof, int n);
/* The instruction pointer of the calling thread's innermost frame (what
 * it runs, wherever its frame lies), or NULL. */
const void *btc_py_current_instr(void);

/* The interpreter frame of frame object `frame` (borrowed: live while
 * `frame` runs or is suspended), or NULL. */
const void *btc_py_interpreter_frame(PyObject *frame);
/* An address inside the C stack frame of the calling thread's eval-loop
 * call that runs interpreter frame `frame` (3.11: that call's _PyCFrame
 * local), or 0 when this version cannot tell. */
uintptr_t btc_py_eval_call_address(const void *frame);
/* Names of the C functions that run the eval loop (NULL-terminated). */
extern const char *const btc_py_eval_functions[];

/* A chain longer than this is corrupt (CPython's default recursion limit is
 * 1000; the frame stack is bounded by memory, but a backtrace is not). */
#define BTC_PY_MAX_FRAMES 100000

/* The calling thread's running asyncio task, borrowed (3.14+, where the C
 * Task keeps it in the thread state; NULL: none, or an earlier version),
 * and in *loop its running loop (borrowed, or NULL).  asyncio_lists.c. */
PyObject *btc_asyncio_running_task(PyObject **loop);

#endif
