/* Capture (capture.c): context -> walk -> merge -> raw frames in a
 * btcore.Backtrace.  GIL held throughout. */
#ifndef BTC_CAPTURE_H
#define BTC_CAPTURE_H

#include <Python.h>

#include "capture/context.h"
#include "capture/cpython/pyframes.h"
#include "capture/unwind.h"

/* Remember collect()'s greenlet target in a Backtrace, weakly, for format()'s
 * header. */
void btc_backtrace_remember_target(PyObject *bt, PyObject *target);

/* This interpreter's thread state whose thread_id (threading's ident) is
 * ident, or NULL (none, or the GIL is not held: the list is the GIL's).
 * threads.c. */
PyThreadState *btc_thread_state_of(uint64_t ident);

/* ---- spawn sites (for spawn.c) ---- */

/* A raw capture into the caller's buffer (max entries). */
typedef struct {
    btc_frame *frames;
    int max, n;
    bool truncated;
} btc_raw_capture;

/* What decided a spawn site's capture (docs/design.md, "A site seen
 * before"): where it started, its view's end, the words of its walk and of
 * the Python chain it read.  A capture whose proof still holds would give
 * the same frames: the hook then takes the site it interned last time
 * (which holds the code objects the chain's words name) instead of
 * walking and merging again. */
#define BTC_CHAIN_PROOF_WORDS 288   /* 96 frames */
typedef struct {
    bool valid;          /* false: the capture could not be proven (failed, truncated, too long, ...) */
    int want, max;
    btc_regs regs;       /* fp counts only if the walk computed a CFA from it */
    const void *stop;
    uintptr_t hi;        /* the walk's view ends here */
    int in_greenlet;
    btc_walk_proof walk;
    int nchain;
    uintptr_t chain[BTC_CHAIN_PROOF_WORDS];
} btc_site_proof;

/* btc_greenlet_stamp() with the GIL held: a hash of parked greenlet g's
 * Python frames and of where its native stack stopped; 0 if unreadable. */
uint64_t btc_greenlet_stamp_held(PyObject *g);
/* Would g be captured now (want; GIL held) as the Backtrace bt holds? A
 * capture of g compared with bt's records (a parked greenlet with nothing
 * to stamp: no Python frames). */
bool btc_greenlet_stack_is(PyObject *g, int want, PyObject *bt);

/* The calling thread's stack (in a greenlet, down to its outermost frame)
 * as seen from inside btcore's creation hook, walked from regs (taken by
 * btc_get_regs() in a frame that is still live): only btcore's own native
 * frames are dropped.  No references are taken: the code objects named are
 * those of frames running below the hook, alive until it returns.  stop:
 * NULL, or the interpreter frame the site ends with (an asyncio task's
 * coroutine: native frames beyond its eval-loop call are not walked).
 * proof: NULL, or where to write what decided the capture (above).
 * 0 or a BTC_E_* code. */
int btc_capture_site(btc_raw_capture *c, int want, const btc_regs *regs, const void *stop,
                     btc_site_proof *proof);
/* Would btc_capture_site(c of room max, want, regs, stop) give the frames
 * of the capture that made proof?  Costs a walk of the Python chain and a
 * read of each proof word, no native walk, no merge. */
bool btc_site_proven(const btc_site_proof *proof, int want, int max, const btc_regs *regs, const void *stop);

/* ---- a signal handler's capture (signal_capture.c) ---- */

/* The interrupted thread's stack from ctx (its registers at the signal)
 * merged with its Python frames from py: no allocation, no reference taken,
 * no lock taken (the caller holds the module lock: btc_modules_try_acquire_prebuilt),
 * the eval loop's ranges already known.  nat: room for max native frames,
 * which hold the walk afterwards; returns how many it gave.  *switching: the
 * walk reached greenlet's stack switch, and ended there (the stack beyond it
 * is being copied), and no Python frame was read (the thread state's chain
 * is between two greenlets then). */
int btc_capture_interrupted(btc_raw_capture *c, const btc_context *ctx, btc_pycursor *py,
                            btc_native_frame *nat, int max, bool *switching);
/* Only the Python frames of py (the module lock was busy). */
void btc_capture_python_only(btc_raw_capture *c, btc_pycursor *py);

/* A new btcore.Backtrace holding the capture (taking a reference to each
 * code object it names; codes: room for c->n), or NULL (no exception set). */
PyObject *btc_backtrace_from_site(const btc_raw_capture *c, PyObject **codes, int capacity);
/* Does the btcore.Backtrace bt hold exactly c's frames (and truncation)? */
bool btc_backtrace_holds(PyObject *bt, const btc_raw_capture *c);
/* From a crash handler: where Backtrace bt's raw records are (their bytes'
 * address and size) and its truncated flag, read with btc_read_own (a
 * crashed process's heap is not trusted); false if bt is not one. */
bool btc_backtrace_raw_own(uintptr_t bt, uintptr_t *bytes, size_t *size, bool *truncated);
/* btcore.Backtrace's type and the offsets of its _raw and truncated slots
 * (for btc_spawn_exported); false before btc_bind_backtrace(). */
bool btc_backtrace_slots(uintptr_t *type, uint32_t *raw, uint32_t *truncated);

/* ---- another process's stacks (native/remote/rstacks.c) ---- */

/* A walk and Python frames read already, from another process: the merge
 * collect() makes, with the frames' eval flags set by the caller (the
 * target's eval loop) and greenlet's module given as a range. */
typedef struct {
    btc_native_frame *nat;
    int n;
    bool complete;                        /* the walk ended by itself, not at its buffer's end */
    bool greenlet;                        /* a suspended greenlet: greenlet's frames hidden */
    uintptr_t internal_lo, internal_hi;   /* the target's greenlet module */
    const btc_pyframe *py;                /* code: the target's address (never dereferenced) */
    int npy;
    int want;                             /* BTC_WANT_NATIVE | BTC_WANT_PYTHON */
} btc_merge_input;
/* The merged records (at most max) into out; how many.  No reference is
 * taken, nothing is dereferenced but in's arrays. */
int btc_merge_frames(const btc_merge_input *in, btc_frame *out, int max, bool *truncated);

#endif
