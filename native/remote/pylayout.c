/* CPython's layout per version family: the one table of offsets that the
 * reader of another process's interpreter (rpython.c) walks with.
 *
 * 3.11 publishes no _Py_DebugOffsets: its default x86-64 build's layout is
 * listed whole, and where btcore is built for 3.11 each value is pinned to
 * offsetof on 3.11's own internal headers by a static assertion (a wrong
 * value does not compile).  3.13-3.15 publish most of it in
 * _Py_DebugOffsets (btcore/remote/debug_offsets.py reads those into the same
 * struct); what they do not publish is listed here per family, measured
 * with offsetof against each version's headers, and pinned to them the
 * same way where btcore is built for that family.  Internal structs keep
 * their layout within a minor version.
 */
#include <Python.h>
#include <string.h>

#include "capture/cpython/pyframes.h"

/* 3.11's default (not debug) x86-64 build, from 3.11.7's headers: each
 * field, its value, and what it is on 3.11's own headers (expanded only
 * where btcore is built for 3.11, into a static assertion). */
#define PY311_LAYOUT(X)                                                                              \
    X(runtime_interp_head, 40, offsetof(_PyRuntimeState, interpreters.head))                       \
    X(interp_next, 0, offsetof(PyInterpreterState, next))                                          \
    X(interp_threads_head, 16, offsetof(PyInterpreterState, threads.head))                         \
    X(interp_gc_generations, 672, offsetof(PyInterpreterState, gc.generations))                    \
    X(interp_gc_permanent, 752, offsetof(PyInterpreterState, gc.permanent_generation))             \
    X(gc_generation_size, 24, sizeof(struct gc_generation))                                        \
    X(gc_ngenerations, 3, NUM_GENERATIONS)                                                         \
    X(tstate_next, 8, offsetof(PyThreadState, next))                                               \
    X(tstate_thread_id, 152, offsetof(PyThreadState, thread_id))                                   \
    X(tstate_native_thread_id, 160, offsetof(PyThreadState, native_thread_id))                     \
    X(tstate_cframe, 56, offsetof(PyThreadState, cframe))                                          \
    X(tstate_current_frame, 8, offsetof(_PyCFrame, current_frame))                                 \
    X(frame_previous, 48, offsetof(_PyInterpreterFrame, previous))                                 \
    X(frame_executable, 32, offsetof(_PyInterpreterFrame, f_code))                                 \
    X(frame_instr_ptr, 56, offsetof(_PyInterpreterFrame, prev_instr))                              \
    X(frame_owner, 69, offsetof(_PyInterpreterFrame, owner))                                       \
    X(frame_is_entry, 68, offsetof(_PyInterpreterFrame, is_entry))                                 \
    X(frame_frame_obj, 40, offsetof(_PyInterpreterFrame, frame_obj))                               \
    X(frame_object_f_frame, 24, offsetof(PyFrameObject, f_frame))                                  \
    X(code_filename, 112, offsetof(PyCodeObject, co_filename))                                     \
    X(code_qualname, 128, offsetof(PyCodeObject, co_qualname))                                     \
    X(code_firstlineno, 72, offsetof(PyCodeObject, co_firstlineno))                                \
    X(code_linetable, 136, offsetof(PyCodeObject, co_linetable))                                   \
    X(code_size, 16, offsetof(PyVarObject, ob_size))                                               \
    X(code_adaptive, 184, offsetof(PyCodeObject, co_code_adaptive))                                \
    X(type_name, 24, offsetof(PyTypeObject, tp_name))                                              \
    X(unicode_state, 32, offsetof(PyASCIIObject, state))                                           \
    X(unicode_length, 16, offsetof(PyASCIIObject, length))                                         \
    X(ascii_data, 48, sizeof(PyASCIIObject))                                                       \
    X(compact_data, 72, sizeof(PyCompactUnicodeObject))                                            \
    X(bytes_size, 16, offsetof(PyVarObject, ob_size))                                              \
    X(bytes_data, 32, offsetof(PyBytesObject, ob_sval))

#define FIELD(name, value, on_311) .name = value,
static const btc_remote_layout py311 = {
    PY311_LAYOUT(FIELD)
    /* no shims, f_code untagged; 3.11's greenlet exposes no frames (frame_object_data unused) */
};
#undef FIELD

#if BTC_PY_FAMILY == 311
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_runtime.h>

#define PINNED(name, value, on_311) _Static_assert((value) == (on_311), "3.11's table: " #name);
PY311_LAYOUT(PINNED)
#undef PINNED
#endif

/* 3.13-3.15: what _Py_DebugOffsets does not say.  A row: the family, where
 * the gc lists (generations[], permanent_generation) lie in the
 * interpreter's gc state (struct _gc_runtime_state: pycore_gc.h in 3.13,
 * pycore_interp_structs.h from 3.14), PyFrameObject._f_frame_data (where
 * greenlet saves a link), f_executable's tag bits (3.14's _PyStackRef).
 * 3.14 reverted its incremental collector before release: young/old[2]
 * are the free-threaded layout only.  Where btcore is built for one of
 * these families, its row is pinned to its headers (below). */
#define PY313 0x030D, 20, 104, 64, 0
#define PY314 0x030E, 24, 96, 72, 3
#define PY315 0x030F, 8, 80, 72, 3
/* And what they share: */
#define FRAME_OBJ 48        /* _PyInterpreterFrame.frame_obj, after f_executable, previous, f_funcobj, f_globals,
                               f_builtins, f_locals */
#define SHIM_OWNER 3        /* FRAME_OWNED_BY_CSTACK (3.13), _INTERPRETER (3.14+): see capture/cpython/chain.h */
#define FRAME_OBJECT_F_FRAME 24   /* after PyObject_HEAD and f_back */
#define GC_GENERATION_SIZE 24     /* struct gc_generation: PyGC_Head, threshold, count */
#define GC_GENERATIONS 3
#define VAR_SIZE 16               /* PyVarObject.ob_size */

typedef struct {
    uint32_t family, gc_generations, gc_permanent, frame_object_data, tag_bits;
} family_constants;

#define ROW(...) ROW_(__VA_ARGS__)
#define ROW_(family_, generations_, permanent_, data_, tag_) {family_, generations_, permanent_, data_, tag_}
static const family_constants families[] = {ROW(PY313), ROW(PY314), ROW(PY315)};

#if BTC_PY_FAMILY == 313 || BTC_PY_FAMILY == 314
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#include <internal/pycore_interp.h>
#if BTC_PY_FAMILY == 314
#include <internal/pycore_interpframe_structs.h>
#define SHIM FRAME_OWNED_BY_INTERPRETER
#else
#define SHIM FRAME_OWNED_BY_CSTACK
#endif
#define PIN(...) PIN_(__VA_ARGS__)
#define PIN_(family_, generations_, permanent_, data_, tag_)                                                \
    _Static_assert(generations_ == offsetof(PyInterpreterState, gc.generations) - offsetof(PyInterpreterState, gc), \
                   "gc generations");                                                                        \
    _Static_assert(permanent_ == offsetof(PyInterpreterState, gc.permanent_generation) -                     \
                                     offsetof(PyInterpreterState, gc), "gc permanent generation");           \
    _Static_assert(data_ == offsetof(PyFrameObject, _f_frame_data), "the frame object's spare storage");
#if PY_VERSION_HEX >= 0x030F0000
PIN(PY315)
#elif BTC_PY_FAMILY == 314
PIN(PY314)
#else
PIN(PY313)
#endif
_Static_assert(FRAME_OBJ == offsetof(_PyInterpreterFrame, frame_obj), "frame_obj");
_Static_assert(SHIM_OWNER == SHIM, "the shims' owner");
_Static_assert(FRAME_OBJECT_F_FRAME == offsetof(PyFrameObject, f_frame), "f_frame");
_Static_assert(GC_GENERATION_SIZE == sizeof(struct gc_generation), "struct gc_generation");
_Static_assert(GC_GENERATIONS == NUM_GENERATIONS, "generations");
_Static_assert(VAR_SIZE == offsetof(PyVarObject, ob_size), "ob_size");

#include <internal/pycore_runtime.h>

/* The fields _Py_DebugOffsets gives, as this build's headers have them:
 * the offsets the in-process readers (capture/cpython/) compile in. */
#define DEBUG_OFFSETS(X)                                                          \
    X(runtime_interp_head, offsetof(_PyRuntimeState, interpreters.head))         \
    X(interp_next, offsetof(PyInterpreterState, next))                            \
    X(interp_threads_head, offsetof(PyInterpreterState, threads.head))            \
    X(tstate_next, offsetof(PyThreadState, next))                                 \
    X(tstate_thread_id, offsetof(PyThreadState, thread_id))                       \
    X(tstate_native_thread_id, offsetof(PyThreadState, native_thread_id))         \
    X(tstate_current_frame, offsetof(PyThreadState, current_frame))               \
    X(frame_previous, offsetof(_PyInterpreterFrame, previous))                    \
    X(frame_executable, offsetof(_PyInterpreterFrame, f_executable))              \
    X(frame_instr_ptr, offsetof(_PyInterpreterFrame, instr_ptr))                  \
    X(frame_owner, offsetof(_PyInterpreterFrame, owner))                          \
    X(code_filename, offsetof(PyCodeObject, co_filename))                         \
    X(code_qualname, offsetof(PyCodeObject, co_qualname))                         \
    X(code_firstlineno, offsetof(PyCodeObject, co_firstlineno))                   \
    X(code_linetable, offsetof(PyCodeObject, co_linetable))                       \
    X(code_adaptive, offsetof(PyCodeObject, co_code_adaptive))                    \
    X(type_name, offsetof(PyTypeObject, tp_name))                                 \
    X(unicode_state, offsetof(PyASCIIObject, state))                              \
    X(unicode_length, offsetof(PyASCIIObject, length))                            \
    X(ascii_data, sizeof(PyASCIIObject))                                          \
    X(compact_data, sizeof(PyCompactUnicodeObject))                               \
    X(bytes_size, offsetof(PyVarObject, ob_size))                                 \
    X(bytes_data, offsetof(PyBytesObject, ob_sval))

int btc_remote_layout_compiled(btc_remote_layout *out)
{
#define SET(name, value) out->name = (uint32_t)(value);
    memset(out, 0, sizeof *out);
    DEBUG_OFFSETS(SET)
#undef SET
    return 0;
}
#else
int btc_remote_layout_compiled(btc_remote_layout *out)
{
    memset(out, 0, sizeof *out);
    return -1;
}
#endif

int btc_remote_layout_of(uint64_t version_hex, btc_remote_layout *out)
{
    uint32_t family = (uint32_t)(version_hex >> 16);
    if (family == 0x030B) {
        *out = py311;
        out->version_hex = version_hex;
        return 0;
    }
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
        const family_constants *f = &families[i];
        if (f->family != family)
            continue;
        memset(out, 0, sizeof *out);
        out->version_hex = version_hex;
        out->interp_gc_generations = f->gc_generations;
        out->interp_gc_permanent = f->gc_permanent;
        out->gc_generation_size = GC_GENERATION_SIZE;
        out->gc_ngenerations = GC_GENERATIONS;
        out->tstate_cframe = -1;
        out->frame_is_entry = -1;
        out->frame_frame_obj = FRAME_OBJ;
        out->shim_owner = SHIM_OWNER;
        out->executable_tag_bits = f->tag_bits;
        out->frame_object_f_frame = FRAME_OBJECT_F_FRAME;
        out->frame_object_data = f->frame_object_data;
        out->code_size = VAR_SIZE;
        return 1;
    }
    return -1;
}
