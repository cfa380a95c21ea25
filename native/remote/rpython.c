/* Another process's interpreter: where its thread states, gc lists and
 * frames are, and the walks over them (through btc_rmem, never in place).
 *
 * The offsets are those of the CPython btcore is compiled against, taken
 * from its internal headers (offsetof): a target of the same version
 * family has the same layout.  Other versions are refused by the caller
 * (btcore/process.py compares the target's version with this one).
 */
#include <Python.h>
#include <string.h>

#include "capture/cpython/pyframes.h"
#include "remote/rmem.h"

#define MAX_TYPE_DEPTH 32
#define TYPE_MEMO 256

#if BTC_PY_FAMILY == 311

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_runtime.h>

int btc_remote_pylayout(btc_remote_layout *o)
{
    memset(o, 0, sizeof *o);
    o->version_hex = PY_VERSION_HEX;
    o->runtime_interp_head = offsetof(_PyRuntimeState, interpreters.head);
    o->interp_next = offsetof(PyInterpreterState, next);
    o->interp_threads_head = offsetof(PyInterpreterState, threads.head);
    o->interp_gc_generations = offsetof(PyInterpreterState, gc.generations);
    o->interp_gc_permanent = offsetof(PyInterpreterState, gc.permanent_generation);
    o->gc_generation_size = sizeof(struct gc_generation);
    o->gc_ngenerations = NUM_GENERATIONS;
    o->tstate_next = offsetof(PyThreadState, next);
    o->tstate_thread_id = offsetof(PyThreadState, thread_id);
    o->tstate_native_thread_id = offsetof(PyThreadState, native_thread_id);
    o->code_filename = offsetof(PyCodeObject, co_filename);
    o->code_qualname = offsetof(PyCodeObject, co_qualname);
    o->code_firstlineno = offsetof(PyCodeObject, co_firstlineno);
    o->code_linetable = offsetof(PyCodeObject, co_linetable);
    o->code_size = offsetof(PyVarObject, ob_size);
    o->type_name = offsetof(PyTypeObject, tp_name);
    o->unicode_state = offsetof(PyASCIIObject, state);
    o->unicode_length = offsetof(PyASCIIObject, length);
    o->ascii_data = sizeof(PyASCIIObject);
    o->compact_data = sizeof(PyCompactUnicodeObject);
    o->bytes_size = offsetof(PyVarObject, ob_size);
    o->bytes_data = offsetof(PyBytesObject, ob_sval);
    return 0;
}

/* The chain from interpreter frame f: code, instruction offset, entry flag. */
static int frame_chain(btc_rmem *m, uintptr_t f, btc_remote_pyframe *out, int max)
{
    int n = 0;
    for (int steps = 0; f && n < max && steps < BTC_PY_MAX_FRAMES; steps++) {
        _PyInterpreterFrame fr;
        if (btc_rmem_read(m, f, &fr, sizeof fr) != 0 || !fr.f_code)
            break;
        uintptr_t first = (uintptr_t)fr.f_code + offsetof(PyCodeObject, co_code_adaptive);
        out[n].code = (uintptr_t)fr.f_code;
        out[n].lasti = (int32_t)((uintptr_t)fr.prev_instr - first);
        out[n].entry = fr.is_entry;
        n++;
        f = (uintptr_t)fr.previous;
    }
    return n;
}

int btc_remote_thread_frames(btc_rmem *m, uintptr_t tstate, btc_remote_pyframe *out, int max)
{
    uintptr_t cframe, frame;
    if (!btc_rmem_word(m, tstate + offsetof(PyThreadState, cframe), &cframe) || !cframe ||
        !btc_rmem_word(m, cframe + offsetof(_PyCFrame, current_frame), &frame))
        return 0;
    return frame_chain(m, frame, out, max);
}

int btc_remote_object_frames(btc_rmem *m, uintptr_t frame_object, btc_remote_pyframe *out, int max)
{
    uintptr_t frame;
    if (!btc_rmem_word(m, frame_object + offsetof(PyFrameObject, f_frame), &frame))
        return 0;
    return frame_chain(m, frame, out, max);
}

/* ---- instances of a type, through the gc lists ---- */

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

int btc_remote_gc_instances(btc_rmem *m, const uintptr_t *heads, int nheads, uintptr_t wanted,
                            uintptr_t *out, int max, uint64_t *visited)
{
    static type_memo memo;
    memset(&memo, 0, sizeof memo);
    int n = 0;
    *visited = 0;
    for (int h = 0; h < nheads; h++) {
        uintptr_t at;
        if (!btc_rmem_word(m, heads[h], &at))
            continue;
        /* _gc_next holds a clean pointer outside a collection (bit 0 is
         * only set while one runs); a list that does not come back to its
         * head within the bound is garbage, and so is a misaligned link. */
        for (at &= ~(uintptr_t)3; at != heads[h] && *visited < BTC_REMOTE_MAX_OBJECTS; (*visited)++) {
            uintptr_t w[4];   /* _gc_next, _gc_prev, ob_refcnt, ob_type */
            if ((at & 7) || btc_rmem_read(m, at, w, sizeof w) != 0)
                break;
            if (w[3] && is_subtype(m, &memo, w[3], wanted)) {
                if (n >= max)
                    return -1;   /* more than the caller has room for */
                out[n++] = at + sizeof(PyGC_Head);
            }
            at = w[0] & ~(uintptr_t)3;
        }
    }
    return n;
}

#else

int btc_remote_pylayout(btc_remote_layout *o)
{
    memset(o, 0, sizeof *o);
    o->version_hex = PY_VERSION_HEX;
    return -1;
}

int btc_remote_thread_frames(btc_rmem *m, uintptr_t tstate, btc_remote_pyframe *out, int max) { return 0; }
int btc_remote_object_frames(btc_rmem *m, uintptr_t frame_object, btc_remote_pyframe *out, int max) { return 0; }
int btc_remote_gc_instances(btc_rmem *m, const uintptr_t *heads, int nheads, uintptr_t wanted,
                            uintptr_t *out, int max, uint64_t *visited)
{
    *visited = 0;
    return 0;
}

#endif
