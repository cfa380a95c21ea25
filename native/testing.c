/* Test- and benchmark-only entry points (declared in btcore_api.h's
 * introspection section): they expose one internal contract each, on inputs
 * a test builds, so the contract is checked directly instead of through a
 * whole capture; btc_backtrace() is the native-only walk benchmarks compare
 * with libunwind's and glibc's. */
#include <Python.h>   /* first (signal_capture.h needs it): it sets the feature macros */
#include <string.h>

#include "capture/context.h"
#include "capture/cpython/pyframes.h"
#include "capture/modules.h"
#include "capture/signal_capture.h"
#include "capture/unwind.h"

uintptr_t btc_test_eval_call_address(uintptr_t frame)
{
    const void *iframe = btc_py_interpreter_frame((PyObject *)frame);
    return iframe ? btc_py_eval_call_address(iframe) : 0;
}

int btc_test_mem_read(uintptr_t lo, uintptr_t hi, uintptr_t addr, uintptr_t *out)
{
    btc_memview view = {.lo = lo, .hi = hi};
    return btc_mem_read(&view, addr, out) ? 1 : 0;
}

int btc_test_read_piped(uintptr_t src, size_t n, uint8_t *out)
{
    return btc_read_piped(out, src, n) ? 1 : 0;
}

uintptr_t btc_test_main_stack_end(uintptr_t addr)
{
    uintptr_t hi;
    return btc_main_stack_end(addr, &hi) ? hi : 0;
}

int btc_test_unwind(uintptr_t ip, uintptr_t sp, uintptr_t lo, uintptr_t hi, uintptr_t *pcs, int max)
{
    btc_native_frame frames[16];
    btc_context ctx = {.regs = {.ip = ip, .sp = sp}, .ip_is_exact = true, .mem = {.lo = lo, .hi = hi}};
    if (max > 16)
        max = 16;
    btc_modules_acquire();
    int n = btc_unwind(&ctx, frames, max);
    btc_modules_release();
    for (int i = 0; i < n; i++)
        pcs[i] = frames[i].pc;
    return n;
}

const char *btc_arch(int *sp, int *fp, int *aux)
{
    *sp = BTC_DWARF_SP;
    *fp = BTC_DWARF_FP;
    *aux = BTC_DWARF_AUX;
    return BTC_ARCH_SUPPORTED ? BTC_ARCH_NAME : NULL;
}

int btc_cfi_rows(uintptr_t pc, btc_cfi_row *out, int max, uintptr_t *bias)
{
    int n = -1;
    btc_modules_acquire();
    btc_module *m = btc_module_find(pc);
    if (m) {
        const btc_table *t = btc_module_table(m);
        n = t ? (int)t->nrows : 0;
        if (t && out)
            memcpy(out, t->rows, (size_t)(n < max ? n : max) * sizeof *out);
        *bias = m->bias;
    }
    btc_modules_release();
    return n;
}

int btc_cfi_fde_range(uintptr_t pc, uintptr_t *lo, uintptr_t *hi)
{
    int rc = -1;
    btc_modules_acquire();
    btc_module *m = btc_module_find(pc);
    const btc_table *t = m ? btc_module_table(m) : NULL;
    uint32_t a, b;
    if (t && pc >= m->bias && pc - m->bias <= UINT32_MAX && btc_table_fde(t, (uint32_t)(pc - m->bias), &a, &b)) {
        *lo = m->bias + a;
        *hi = m->bias + b;
        rc = 0;
    }
    btc_modules_release();
    return rc;
}

/* Build a table from raw bytes as if they were a module's .eh_frame, and
 * check the invariants lookups rely on.  Rows are relative to data - 2 GiB so
 * that pc-relative FDEs of a copied section still land in the row space. */
int btc_cfi_selftest_garbage(const uint8_t *data, size_t size)
{
    uintptr_t base = (uintptr_t)data;
    btc_image img = {
        .bias = base > 0x80000000u ? base - 0x80000000u : 0,
        .eh_frame = data,
        .eh_frame_size = size,
        .readable_lo = { base },
        .readable_hi = { base + size },
        .nreadable = 1,
    };
    btc_table *t = btc_table_build(&img);
    if (!t)
        return -1;
    int result = (int)t->nrows;
    for (uint32_t i = 0; i < t->nrows; i++) {
        const btc_cfi_row *found = btc_table_lookup(t, t->rows[i].pc);
        bool sorted = i == 0 || t->rows[i - 1].pc < t->rows[i].pc;
        if (!sorted || found != (t->rows[i].cfa_kind == BTC_CFA_NONE ? NULL : &t->rows[i]))
            result = -2;
    }
    if (t->nrows && t->rows[t->nrows - 1].cfa_kind != BTC_CFA_NONE)
        result = -2;
    btc_table_free(t);
    return result;
}

#define BACKTRACE_MAX_FRAMES 256

int btc_backtrace(uintptr_t *out, int max)
{
    btc_native_frame nat[BACKTRACE_MAX_FRAMES];
    btc_context ctx = {0};
    uintptr_t lo;
    btc_get_regs(&ctx.regs);
    if (max <= 0 || !btc_thread_stack(&lo, &ctx.mem.hi))
        return 0;
    ctx.mem.lo = ctx.regs.sp;
    if (max > BACKTRACE_MAX_FRAMES - 1)
        max = BACKTRACE_MAX_FRAMES - 1;
    btc_modules_acquire();
    int n = btc_unwind(&ctx, nat, max + 1);
    btc_modules_release();
    for (int i = 1; i < n; i++)   /* nat[0] is this function */
        out[i - 1] = nat[i].pc;
    return n > 0 ? n - 1 : 0;
}

/* ---- the signal-context capture under a timer (tests/test_stress.py) ---- */

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>

#include "capture/signal_capture.h"

static struct {
    int signum, slot;
    struct sigaction previous;
    btc_native_frame nat[BTC_SIGNAL_NATIVE];
    btc_sigsample sample, last_invalid;
    _Atomic int64_t complete, partial, invalid, complete_with_python;
    _Atomic int64_t reasons[8];   /* partial samples per BTC_PARTIAL_* bit */
} stress;

/* Checked inside the handler, while the frames it names still run: every
 * record is a native pc or a live code object, and a complete sample holds
 * a native frame.  It need not hold a Python one: a greenlet in its C
 * bootstrap, before or after its run function, has none (seen under qemu's
 * signal timing: inner_bootstrap's Py_DECREF after run returned); the
 * complete samples with Python frames are counted, and the test wants
 * some.  (Its innermost record need not be
 * the interrupted pc: an eval loop's frame is replaced by its Python frames,
 * and a frame just pushed is hidden, as tracebacks hide it.) */
static bool sample_valid(const btc_sigsample *s)
{
    int native = 0, python = 0;
    if (s->n < 0 || s->n > BTC_SIGNAL_FRAMES)
        return false;
    for (int i = 0; i < s->n; i++) {
        const btc_frame *f = &s->frames[i];
        if (f->kind == BTC_KIND_NATIVE && f->addr)
            native++;
        else if (f->kind == BTC_KIND_PYTHON && f->addr && PyCode_Check((PyObject *)f->addr))
            python++;
        else
            return false;
    }
    if (!s->partial && python)
        atomic_fetch_add(&stress.complete_with_python, 1);
    return s->partial || native;
}

static void on_stress_signal(int signum BTC_UNUSED, siginfo_t *si BTC_UNUSED, void *ucontext)
{
    int saved_errno = errno;
    const btc_thread_info *info = btc_thread_info_of(stress.slot);
    if (info && btc_thread_slot_self() == stress.slot) {
        btc_signal_capture(info, ucontext, &stress.sample, stress.nat);
        if (!sample_valid(&stress.sample)) {
            atomic_fetch_add(&stress.invalid, 1);
            stress.last_invalid = stress.sample;
        } else if (stress.sample.partial) {
            atomic_fetch_add(&stress.partial, 1);
            for (int bit = 0; bit < 8; bit++)
                if (stress.sample.partial & (1u << bit))
                    atomic_fetch_add(&stress.reasons[bit], 1);
        } else
            atomic_fetch_add(&stress.complete, 1);
    }
    errno = saved_errno;
}

int btc_test_signal_stress_start(int signum)
{
    int slot = btc_thread_register();
    if (slot < 0 || stress.signum)
        return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_stress_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    stress.slot = slot;
    atomic_store(&stress.complete, 0);
    atomic_store(&stress.partial, 0);
    atomic_store(&stress.invalid, 0);
    atomic_store(&stress.complete_with_python, 0);
    for (int bit = 0; bit < 8; bit++)
        atomic_store(&stress.reasons[bit], 0);
    if (sigaction(signum, &sa, &stress.previous) != 0)
        return -1;
    stress.signum = signum;
    return 0;
}

void btc_test_signal_stress_stop(int64_t *counts, btc_sigsample *last_invalid)
{
    if (stress.signum)
        sigaction(stress.signum, &stress.previous, NULL);
    stress.signum = 0;
    counts[0] = atomic_load(&stress.complete);
    counts[1] = atomic_load(&stress.partial);
    counts[2] = atomic_load(&stress.invalid);
    for (int bit = 0; bit < 8; bit++)
        counts[3 + bit] = atomic_load(&stress.reasons[bit]);
    counts[11] = atomic_load(&stress.complete_with_python);
    *last_invalid = stress.last_invalid;
}

/* Benchmark-only: the handler's capture (btc_signal_capture) of the calling
 * registered thread, from the registers getcontext() stores here, without a
 * signal: what a handler costs apart from the kernel's delivery. */
#include <ucontext.h>

int btc_test_capture_here(btc_sigsample *out)
{
    static btc_native_frame nat[BTC_SIGNAL_NATIVE];
    const btc_thread_info *info = btc_thread_info_of(btc_thread_slot_self());
    ucontext_t uc;
    if (!info || getcontext(&uc) != 0)
        return -1;
    btc_signal_capture(info, &uc, out, nat);
    return 0;
}
