/* Capture from a signal handler: what a thread stuck in C looks like now.
 *
 * A thread is registered in advance (btc_thread_register, GIL held), when
 * everything a handler cannot do may still be done: find its stack, learn
 * greenlet's start-up stub and the eval loop's ranges, build the CFI tables
 * of the modules every stack goes through.  A requester (the watchdog
 * thread, gevent's monitor, a dump thread) then sends the registered thread
 * the capture signal; the handler, running on that thread where it was
 * interrupted, walks from the interrupted registers and reads the Python
 * frame chain raw, into the slot's preallocated sample, and answers.
 *
 * The handler never allocates, never waits, never calls the loader: the
 * module lock is only tried (the interrupted code may hold it), no table is
 * built (a walk that reaches a module without one stops there, and the
 * sample says so; the requester builds that table and asks again), no TLS
 * is touched (the slot is found by pthread_self()).  Each slot has one
 * exchange at a time: IDLE -> ASKED (requester) -> WRITING (handler) ->
 * DONE (handler) -> IDLE (requester, after copying).  A handler writes only
 * what was asked for; a requester reads only what is DONE.
 */
#include <Python.h>   /* first: it sets the feature macros */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "capture/capture.h"
#include "capture/evalloop.h"
#include "capture/greenlet_context.h"
#include "capture/modules.h"
#include "capture/signal_capture.h"
#include "common/errors.h"
#include "common/gil.h"

enum { IDLE, ASKED, WRITING, DONE };

typedef struct {
    _Atomic uintptr_t thread;   /* pthread_t; 0: free */
    pid_t tid;                  /* the kernel's id: the signal goes there (tgkill fails cleanly once it exits) */
    bool by_other;              /* registered by another thread: no exit hook, dropped at the next btc_thread_register_others() */
    btc_thread_info info;
    _Atomic int state;
    btc_native_frame nat[BTC_SIGNAL_NATIVE];
    btc_sigsample sample;
} thread_slot;

static thread_slot slots[BTC_WATCHED_THREADS];
static pthread_mutex_t request_lock = PTHREAD_MUTEX_INITIALIZER;   /* one requester at a time */
static pthread_key_t exit_key;
static bool handler_installed;

int btc_capture_signal(void)
{
    return SIGRTMIN + 6;   /* glibc keeps SIGRTMIN's first ones for itself; Python uses none */
}

/* ---- reading the Python chain without trusting it ----
 *
 * The interrupted code may be between two steps of pushing or popping a
 * frame: CPython clears a frame (freeing its locals, and may unmap its
 * data-stack chunk) before it points the thread state at the previous one,
 * and a stale link may point anywhere, freed heap blocks included.  So a
 * frame is read in place only where its memory is known to be mapped: in
 * one of the thread's linked data-stack chunks (freed chunks are unlinked
 * before they are unmapped) or on its C stack (3.12+'s shim frames).
 * Anywhere else (a generator's frame, inside its object, or garbage) its
 * fixed part is copied with process_vm_readv on our own process, which
 * fails with EFAULT instead of faulting, and read from the copy (never
 * probed and then read in place: the block may be freed, or unmapped by
 * another thread, in between).  Such a frame's code object is copied so too,
 * and so is the innermost frame's: it may be the one being popped, whose
 * code object may just have been freed.  The code object of a chunk frame
 * further out is read in place: the frame is live, and holds it. */

#define GUARD_BYTES (64 * 1024)   /* below a thread's stack: its guard pages, where an overflow faults */
#define MAX_CHUNKS 4096

typedef struct {
    btc_read_check base;
    const PyThreadState *ts;
    uintptr_t stack_lo, stack_hi;
    bool refused;    /* a read was refused: the chain was cut short */
    bool copied;     /* the last frame asked for was read from a copy: so is its code object */
    int codes;       /* code objects asked for: the first one (the innermost frame's) is copied */
    union {
        char bytes[BTC_FRAME_FIXED_BYTES];
        void *align;
    } frame_copy;
    PyCodeObject code_copy;
} chain_limits;

bool btc_read_own(void *dst, uintptr_t src, size_t n)
{
    struct iovec local = {dst, n}, remote = {(void *)src, n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

static bool in_chunks(const PyThreadState *ts, uintptr_t p)
{
    int i = 0;
    for (const _PyStackChunk *ch = ts->datastack_chunk; ch && i < MAX_CHUNKS; ch = ch->previous, i++)
        if (p >= (uintptr_t)ch && ch->size >= BTC_FRAME_FIXED_BYTES &&
            p - (uintptr_t)ch <= ch->size - BTC_FRAME_FIXED_BYTES)
            return true;
    return false;
}

static const void *frame_at(btc_read_check *self, const void *frame)
{
    chain_limits *l = (chain_limits *)self;
    uintptr_t p = (uintptr_t)frame;
    const void *at = NULL;
    if (p & 7)
        at = NULL;
    else if ((p >= l->stack_lo && p + BTC_FRAME_FIXED_BYTES <= l->stack_hi) || in_chunks(l->ts, p))
        at = frame;
    else if (btc_read_own(l->frame_copy.bytes, p, sizeof l->frame_copy.bytes))
        at = l->frame_copy.bytes;
    l->copied = at && at != frame;
    l->refused |= !at;
    return at;
}

/* Does process_vm_readv on ourselves work?  (qemu-user does not emulate it:
 * there the innermost frame's code object is read in place, as before it was
 * copied.)  Asked once, from wherever first: a syscall, fine in a handler. */
static bool own_reads_work(void)
{
    static _Atomic int known;   /* 0: not asked yet; 1: yes; 2: no */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (!k) {
        uintptr_t word = 1, copy = 0;
        k = btc_read_own(&copy, (uintptr_t)&word, sizeof word) && copy == 1 ? 1 : 2;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 1;
}

bool btc_read_sampled(void *dst, uintptr_t src, size_t n)
{
    if (own_reads_work())
        return btc_read_own(dst, src, n);
    if (!src)
        return false;
    memcpy(dst, (const void *)src, n);
    return true;
}

/* A pipe's write copies from the caller's memory as process_vm_readv
 * does, checked by the kernel (or by qemu-user, against the guest's own
 * mappings): EFAULT, not a fault, where src is not readable.  One pipe per
 * call: no state shared between threads or with a handler. */
bool btc_read_piped(void *dst, uintptr_t src, size_t n)
{
    int fds[2];
    if (n > BTC_READ_PIPED_MAX || pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
        return false;
    bool ok = write(fds[1], (const void *)src, n) == (ssize_t)n && read(fds[0], dst, n) == (ssize_t)n;
    close(fds[0]);
    close(fds[1]);
    return ok;
}

bool btc_read_own_anywhere(void *dst, uintptr_t src, size_t n)
{
    return own_reads_work() ? btc_read_own(dst, src, n) : btc_read_piped(dst, src, n);
}

static const void *code_at(btc_read_check *self, const void *code)
{
    chain_limits *l = (chain_limits *)self;
    bool copy = l->copied || (l->codes++ == 0 && own_reads_work());
    const void *at = NULL;
    if ((uintptr_t)code & 7)
        at = NULL;
    else if (!copy)
        at = code;
    else if (btc_read_own(&l->code_copy, (uintptr_t)code, sizeof l->code_copy))
        at = &l->code_copy;
    /* A frame whose code is not a code object was being pushed or popped: refused too. */
    if (at && !PyCode_Check((PyObject *)at))
        at = NULL;
    l->refused |= !at;
    return at;
}

/* ---- the capture, inside the handler ---- */

/* Does the walk end at pc by nature: the thread's outermost frame (no return
 * address: _start, clone) or the greenlet's start-up stub? */
static bool natural_end(const btc_context *ctx, const btc_module *m, uintptr_t pc)
{
    for (int i = 0; i < ctx->nend; i++)
        if (pc >= ctx->end_lo[i] && pc < ctx->end_hi[i])
            return true;
    const btc_table *t = btc_module_table((btc_module *)m);
    const btc_cfi_row *row = t && pc - m->bias <= UINT32_MAX ? btc_table_lookup(t, (uint32_t)(pc - m->bias)) : NULL;
    return row && row->ra_rule == BTC_RULE_UNDEFINED;
}

/* Why the walk of nat[0..n) ended, as BTC_PARTIAL_* bits (0: at the stack's
 * natural end).  Module lock held. */
static unsigned walk_end(const btc_context *ctx, const btc_native_frame *nat, int n, btc_sigsample *out)
{
    if (n == 0)
        return BTC_PARTIAL_NO_MODULE;
    if (n == BTC_SIGNAL_NATIVE)
        return BTC_PARTIAL_TRUNCATED;
    const btc_native_frame *last = &nat[n - 1];
    uintptr_t pc = last->exact ? last->pc : last->pc - 1;
    btc_module *m = btc_module_find(pc);
    if (!m)
        return BTC_PARTIAL_NO_MODULE;
    if (btc_module_table_pending(m)) {
        out->pending_pc = pc;
        return BTC_PARTIAL_NO_TABLE;
    }
    return natural_end(ctx, m, pc) ? 0 : BTC_PARTIAL_CUT;
}

static bool python_frames(const btc_sigsample *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->frames[i].kind == BTC_KIND_PYTHON)
            return true;
    return false;
}

void btc_signal_capture(const btc_thread_info *info, const void *ucontext, btc_sigsample *out,
                        btc_native_frame *nat)
{
    btc_raw_capture c = {.frames = out->frames, .max = BTC_SIGNAL_FRAMES};
    btc_context ctx = {.ip_is_exact = true};
    btc_pycursor py = {0};
    bool switching = false;
    out->partial = 0;
    out->pending_pc = 0;
    /* The thread's state as Python's own thread-local says (pthread_getspecific):
     * NULL once the thread state is gone (an exiting thread). */
    PyThreadState *ts = PyGILState_GetThisThreadState();
    chain_limits limits = {.base = {frame_at, code_at}, .ts = ts, .stack_lo = info->stack_lo,
                           .stack_hi = info->stack_hi};
    if (ts && ts == info->tstate) {
        btc_py_cursor_thread(&py, ts);
        py.check = &limits.base;
    }
    bool py_started = py.frame != NULL;
    /* A C stack overflow faults with sp just below the stack, in its guard
     * area: the walk starts there but reads only the stack itself (the
     * faulting frame's caller is on it). */
    bool on_stack = btc_regs_from_ucontext(ucontext, &ctx.regs) && ctx.regs.sp >= info->stack_lo - GUARD_BYTES &&
                    ctx.regs.sp < info->stack_hi;
    ctx.mem.lo = ctx.regs.sp > info->stack_lo ? ctx.regs.sp : info->stack_lo;
    ctx.mem.hi = info->stack_hi;
    btc_greenlet_stub_ends(&ctx);
    if (!on_stack) {
        out->partial = BTC_PARTIAL_OFF_STACK;
        btc_capture_python_only(&c, &py);
    } else if (!btc_modules_try_acquire_prebuilt()) {
        out->partial = BTC_PARTIAL_LOCKED;
        btc_capture_python_only(&c, &py);
    } else {
        int walked = btc_capture_interrupted(&c, &ctx, &py, nat, BTC_SIGNAL_NATIVE, &switching);
        out->partial = walk_end(&ctx, nat, walked, out);
        btc_modules_release();
    }
    out->n = c.n;
    if (c.truncated)
        out->partial |= BTC_PARTIAL_TRUNCATED;
    if (limits.refused || (py_started && !switching && !python_frames(out)))
        out->partial |= BTC_PARTIAL_PYTHON;   /* a chain that had frames gave none: not complete */
    if (switching)
        out->partial = (out->partial & ~BTC_PARTIAL_CUT) | BTC_PARTIAL_SWITCHING;
}

int btc_thread_slot_self(void)
{
    uintptr_t self = (uintptr_t)pthread_self();
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        if (atomic_load_explicit(&slots[i].thread, memory_order_acquire) == self)
            return i;
    return -1;
}

int btc_thread_slot_of(uint64_t ident)
{
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        if (ident && atomic_load_explicit(&slots[i].thread, memory_order_acquire) == ident)
            return i;
    return -1;
}

const btc_thread_info *btc_thread_info_of(int slot)
{
    return slot >= 0 && slot < BTC_WATCHED_THREADS && atomic_load(&slots[slot].thread) ? &slots[slot].info
                                                                                      : NULL;
}

uint64_t btc_thread_ident_of(int slot)
{
    return slot >= 0 && slot < BTC_WATCHED_THREADS ? atomic_load(&slots[slot].thread) : 0;
}

static void on_capture_signal(int signum BTC_UNUSED, siginfo_t *si BTC_UNUSED, void *ucontext)
{
    int saved_errno = errno;
    int i = btc_thread_slot_self();
    int asked = ASKED;
    if (i >= 0 && atomic_compare_exchange_strong(&slots[i].state, &asked, WRITING)) {
        btc_signal_capture(&slots[i].info, ucontext, &slots[i].sample, slots[i].nat);
        atomic_store(&slots[i].state, DONE);
    }
    errno = saved_errno;
}

/* ---- registration (GIL held) ---- */

static void forget_exited_thread(void *slot_plus_one)
{
    atomic_store(&slots[(intptr_t)slot_plus_one - 1].thread, 0);
}

/* Build the table of the module containing pc (not in a handler). */
static void build_table_at(uintptr_t pc)
{
    btc_modules_acquire();
    btc_module *m = btc_module_find(pc);
    if (m)
        btc_module_table(m);
    btc_modules_release();
}

/* What a handler cannot do itself: the eval loop's ranges, greenlet's stub,
 * the tables every Python thread's stack goes through. */
static void prepare_for_handlers(void)
{
    btc_greenlet_learn_stub();   /* without greenlet: walks end at the thread's start */
    btc_modules_acquire();
    btc_eval_ranges_init();
    btc_modules_release();
    build_table_at((uintptr_t)&PyEval_EvalCode);
    build_table_at((uintptr_t)&write);
    build_table_at((uintptr_t)&prepare_for_handlers);
}

static int install_handler(void)
{
    if (handler_installed)
        return 0;
    struct sigaction old, sa;
    if (sigaction(btc_capture_signal(), NULL, &old) != 0)
        return btc_fail(BTC_E_UNSUPPORTED, "cannot read the capture signal's handler");
    if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)
        return btc_fail(BTC_E_UNSUPPORTED, "the capture signal (SIGRTMIN+6) already has a handler");
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_capture_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(btc_capture_signal(), &sa, NULL) != 0 || pthread_key_create(&exit_key, forget_exited_thread) != 0)
        return btc_fail(BTC_E_UNSUPPORTED, "cannot install the capture signal's handler");
    handler_installed = true;
    return 0;
}

static int free_slot(void)
{
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        if (!atomic_load(&slots[i].thread))
            return i;
    return btc_fail(BTC_E_UNSUPPORTED, "too many registered threads (64)");
}

/* Fill slot i for a thread (its stack read already); published last. */
static void take_slot(int i, uintptr_t thread, pid_t tid, PyThreadState *ts, uintptr_t lo, uintptr_t hi, bool by_other)
{
    slots[i].info = (btc_thread_info){.tstate = ts, .stack_lo = lo, .stack_hi = hi};
    slots[i].tid = tid;
    slots[i].by_other = by_other;
    atomic_store(&slots[i].state, IDLE);
    atomic_store_explicit(&slots[i].thread, thread, memory_order_release);
}

int btc_thread_register(void)
{
    int rc = install_handler();
    if (rc < 0)
        return rc;
    int i = btc_thread_slot_self();   /* a thread that exited may have left our pthread_t */
    if (i < 0 && (i = free_slot()) < 0)
        return i;
    uintptr_t lo, hi;
    if (!btc_thread_stack(&lo, &hi))
        return btc_fail(BTC_E_UNSUPPORTED, "cannot find the thread's stack");
    prepare_for_handlers();
    take_slot(i, (uintptr_t)pthread_self(), (pid_t)syscall(SYS_gettid), PyThreadState_Get(), lo, hi, false);
    pthread_setspecific(exit_key, (void *)(intptr_t)(i + 1));
    return i;
}

/* Is the thread of slot i still in the interpreter's list (same state, same thread)? */
static bool still_listed(PyInterpreterState *interp, int i)
{
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t))
        if (t == slots[i].info.tstate && t->thread_id == atomic_load(&slots[i].thread))
            return true;
    return false;
}

int btc_thread_register_others(void)
{
    int rc = btc_thread_register();
    if (rc < 0)
        return rc;
    PyInterpreterState *interp = PyThreadState_Get()->interp;
    /* A thread registered by another one has no exit hook: drop those gone. */
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        if (slots[i].by_other && atomic_load(&slots[i].thread) && !still_listed(interp, i))
            atomic_store(&slots[i].thread, 0);
    /* The threads listed here are alive: each removes its state (with the
     * GIL, which the caller holds) before it ends. */
    int added = 0;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t)) {
        uintptr_t lo, hi;
        int i;
        if (!t->thread_id || !t->native_thread_id || btc_thread_slot_of(t->thread_id) >= 0)
            continue;
        if ((i = free_slot()) < 0)
            break;   /* 64 threads at most: the others are not shown */
        if (btc_pthread_stack((pthread_t)t->thread_id, &lo, &hi)) {
            take_slot(i, t->thread_id, (pid_t)t->native_thread_id, t, lo, hi, true);
            added++;
        }
    }
    return added;
}

void btc_thread_unregister(void)
{
    int i = btc_thread_slot_self();
    if (i >= 0) {
        atomic_store(&slots[i].thread, 0);
        pthread_setspecific(exit_key, NULL);
    }
}

/* ---- requests (never in a handler) ---- */

static double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void pause_briefly(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* One signal, one answer: 0, or -1 when the thread did not answer in time
 * (it blocks the signal, or it exited). */
static int ask_once(thread_slot *s, int timeout_ms, btc_sigsample *out)
{
    int idle = IDLE;
    if (!atomic_compare_exchange_strong(&s->state, &idle, ASKED))
        return -1;
    if (syscall(SYS_tgkill, getpid(), s->tid, btc_capture_signal()) != 0) {
        atomic_store(&s->state, IDLE);
        return -1;
    }
    double deadline = monotonic_now() + timeout_ms / 1000.0;
    for (;;) {
        int state = atomic_load(&s->state);
        if (state == DONE)
            break;
        /* IDLE: a new thread took the slot (take_slot) after the asked one
         * exited with the signal pending; no answer will come. */
        if (state == IDLE)
            return -1;
        int asked = ASKED;
        if (monotonic_now() > deadline && atomic_compare_exchange_strong(&s->state, &asked, IDLE))
            return -1;   /* withdrawn before the handler started: it will not write */
        /* WRITING: the handler runs now and ends in microseconds.  Past twice
         * the time allowed, give up: the slot stays WRITING, so no later ask
         * uses it until a thread takes it again, and nothing reads the sample. */
        if (monotonic_now() > deadline + timeout_ms / 1000.0)
            return -1;
        pause_briefly();
    }
    memcpy(out, &s->sample, sizeof *out);
    atomic_store(&s->state, IDLE);
    return 0;
}

/* Asks of one sample: one more per table built between them (each ask that
 * stops at a module without one builds it: a stack through 20 modules none
 * of which has one yet takes 21 asks), and a few for an unlucky moment.
 * One bound for both (8) cut the first report of a stack through the vDSO
 * and libasan's interceptor short, before greenlet's start (ci45). */
#define MAX_TABLE_ASKS 64
#define MAX_MOMENT_ASKS 8
/* What another sample may not have: tables are built between asks; the lock,
 * a switch, a frame being pushed or popped are moments. */
#define ASK_AGAIN (BTC_PARTIAL_NO_TABLE | BTC_PARTIAL_LOCKED | BTC_PARTIAL_SWITCHING | BTC_PARTIAL_PYTHON | \
                   BTC_PARTIAL_CUT | BTC_PARTIAL_NO_MODULE)

int btc_signal_sample_slot(int slot, int timeout_ms, btc_sigsample *out)
{
    if (!btc_thread_info_of(slot))
        return -1;
    int rc = -1;
    pthread_mutex_lock(&request_lock);
    for (int tables = 0, moments = 0;;) {
        rc = ask_once(&slots[slot], timeout_ms, out);
        if (rc < 0 || !(out->partial & ASK_AGAIN))
            break;
        if (out->partial & BTC_PARTIAL_NO_TABLE) {
            if (++tables > MAX_TABLE_ASKS)
                break;
            build_table_at(out->pending_pc);
        } else {
            if (++moments > MAX_MOMENT_ASKS)
                break;
            pause_briefly();
        }
    }
    pthread_mutex_unlock(&request_lock);
    return rc;
}

int btc_signal_sample(uint64_t thread_ident, int timeout_ms, btc_sigsample *out)
{
    PyThreadState *gil = btc_gil_release();   /* the target may be waiting for it */
    int rc = btc_signal_sample_slot(btc_thread_slot_of(thread_ident), timeout_ms, out);
    btc_gil_restore(gil);
    return rc;
}

/* ---- fork: only the forking thread lives on in the child ---- */

static void child_after_fork(void)
{
    pthread_mutex_init(&request_lock, NULL);
    uintptr_t self = (uintptr_t)pthread_self();
    for (int i = 0; i < BTC_WATCHED_THREADS; i++) {
        if (atomic_load(&slots[i].thread) != self)
            atomic_store(&slots[i].thread, 0);
        atomic_store(&slots[i].state, IDLE);
    }
}

__attribute__((constructor)) static void signal_capture_fork_safe(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}
