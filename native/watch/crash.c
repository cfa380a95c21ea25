/* The crash report, in-process part (issue 27): on SIGSEGV, SIGBUS, SIGILL,
 * SIGFPE or SIGABRT, write the signal, the fault address and the crashing
 * thread's merged native + Python backtrace taken from the signal's
 * context, then let the signal do what it would have done without btcore.
 *
 * A crashed process cannot be trusted: its heap may be corrupt, any lock may
 * be held by the code that crashed, its stack may be exhausted.  So the
 * handler runs on an alternate signal stack (a C stack overflow is reported
 * too), allocates nothing, waits for no lock, calls no Python API that
 * allocates and no printf.  It reuses the watchdog's signal-context capture
 * (signal_capture.c: registered threads only, module list tried, tables
 * built in advance) and the watchdog's text renderer (report.c), whose
 * Python frames are read raw from code objects; native frames are printed as
 * module + offset: naming them reads ELF files and allocates.  Everything it
 * writes goes into a static buffer, then to the file descriptor with write().
 *
 * Chaining: before returning, the handler puts back the dispositions found
 * when it was installed (faulthandler's, Python's, SIG_DFL) and raises the
 * signal again; the signal is blocked while the handler runs, so it is
 * delivered to that previous disposition as the handler returns (a fault
 * would also recur at the faulting instruction).  The process then ends the
 * way it would have, with the same signal (core dump, exit status).
 *
 * The crashing greenlet: with spawn tracking on, the greenlet running on the
 * crashed thread is found among spawn.c's live records and its spawn sites
 * written after the thread's frames (btc_spawn_crash_chain: every read with
 * process_vm_readv on ourselves, so a corrupt heap shortens the report
 * instead of faulting again).  The frames written are kept in a static
 * record whose address the helper gets: it reads them back from the
 * stopped process, names them and writes their tokens (encoding allocates:
 * not here).
 *
 * A handler installed after ours (faulthandler.enable() after
 * enable_crash_report()) runs first and passes the signal on by raising it
 * again from inside itself: our context is then that handler's, on the
 * alternate stack, where the fault's registers are not.  The kernel's frame
 * of the first delivery lies above ours on that stack; first_delivery()
 * finds it, and the report is of the fault's own context and siginfo, as
 * if ours had run first.
 *
 * A second crash during the report: all five signals are blocked while the
 * handler runs, so a fault inside it is fatal at once (the kernel forces the
 * default action of a blocked synchronous signal): no loop.  Another thread
 * crashing meanwhile waits (bounded) for the first report to end.
 *
 * The rest of the report comes from a healthy process (Crashpad's way):
 * after the crashing thread's frames, the handler starts the helper command
 * set at enable time (`python -m btcore dump PID`, PID written here) with the
 * report's descriptor as its output, lets it trace this process
 * (PR_SET_PTRACER: Yama allows tracing descendants only, not a parent) and
 * waits for it, bounded.  The helper stops every thread and reads them, and
 * every parked greenlet with its name, through the one remote engine, which
 * trusts nothing it reads; nothing of that runs in the crashed process.  The
 * child is made with a raw clone (glibc's fork() runs atfork handlers, which
 * may take the locks the crash holds) and calls only async-signal-safe
 * functions before execve.  Where it cannot start (no fork, seccomp, no
 * ptrace rights) the report is the crashing thread's alone.
 */
#include <Python.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "capture/arch.h"
#include "capture/modules.h"
#include "capture/signal_capture.h"
#include "capture/spawn_crash.h"
#include "watch/report.h"

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define NFATAL (int)(sizeof fatal_signals / sizeof *fatal_signals)
#define ALT_STACK_BYTES (256 * 1024)   /* the walk, the renderer and the handler's frames, with room */

static struct sigaction previous[NFATAL];
static bool installed;
static _Atomic int report_fd = -1;
static _Atomic uintptr_t reporter;   /* pthread_t of the thread reporting; 0: none yet */
static _Atomic int fault_in_report;  /* tests: fault inside the report (a second crash) */
static volatile uintptr_t unmapped = 8;
extern char **environ;

/* The helper's command: argv copied here at enable time; its last argument
 * is this process's pid, written at crash time (a fork child crashes as
 * itself). */
#define HELPER_ARGS 8
static char helper_text[8192];
static char *helper_argv[HELPER_ARGS + 2];
static char helper_pid[24];
static int helper_timeout_ms;   /* in the never-mapped first page; volatile: a real store, not a trap */

/* The handler's working memory: one report per process.  The record is
 * what the helper reads back from this process (its address is one of the
 * helper's arguments): the frames it names and encodes. */
static btc_sigsample sample;
static btc_native_frame nat[BTC_SIGNAL_NATIVE];
static char text_buf[64 * 1024];
static btc_crash_record record;

#define PASSED_ON "\n(passed on by a handler that ran first, faulthandler's if enabled after btcore: the frames " \
                  "are the fault's, from the kernel's first signal frame)"

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
    }
}

/* Did the signal interrupt code running on the alternate stack alt? */
static bool on_alt_stack(const ucontext_t *uc, const stack_t *alt)
{
    btc_regs regs;
    return btc_regs_from_ucontext(uc, &regs) && regs.sp - (uintptr_t)alt->ss_sp < alt->ss_size;
}

/* The context of the signal's first delivery, when a handler that ran
 * before ours raised it again from inside itself, on the alternate stack
 * (faulthandler does, having written its report): ours, otherwise.  Each
 * frame the kernel pushes records the alternate stack's settings
 * (uc_stack; its flags are the stack's, not whether the interrupted code
 * was on it) and the interrupted registers: our frame's sp lies on that
 * stack, the first delivery's is the frame above ours whose sp does not.
 * Its siginfo is there only if that handler asked for one (SA_SIGINFO;
 * faulthandler does not): *si is set to it when it names this signal,
 * else to NULL.  The scan reads only [our frame, the stack's top): the
 * stack we run on, written by the kernel and the handlers since the first
 * delivery. */
static const ucontext_t *first_delivery(int sig, const ucontext_t *uc, const siginfo_t **si)
{
    const stack_t *alt = &uc->uc_stack;
    if ((*si)->si_code > 0 || !on_alt_stack(uc, alt))   /* a fault, or not raised on the alternate stack */
        return uc;
    uintptr_t top = (uintptr_t)alt->ss_sp + alt->ss_size;
    for (uintptr_t p = (uintptr_t)uc + sizeof(uintptr_t); p + offsetof(ucontext_t, uc_sigmask) <= top;
         p += sizeof(uintptr_t)) {
        const ucontext_t *first = (const ucontext_t *)p;
        if (first->uc_stack.ss_sp != alt->ss_sp || first->uc_stack.ss_size != alt->ss_size ||
            first->uc_stack.ss_flags != alt->ss_flags || on_alt_stack(first, alt))
            continue;
        const siginfo_t *info = btc_siginfo_beside(first);
        bool named = info && (uintptr_t)info > (uintptr_t)uc && (uintptr_t)(info + 1) <= top && info->si_signo == sig;
        *si = named ? info : NULL;
        return first;
    }
    return uc;
}

static void restore_previous(void)
{
    for (int i = 0; i < NFATAL; i++)
        sigaction(fatal_signals[i], &previous[i], NULL);
}

static void header(btc_text *t, int sig, const siginfo_t *si, bool passed_on)
{
    btc_text_add(t, "\nFatal signal ");
    btc_text_add(t, signal_name(sig));
    btc_text_add(t, " (");
    btc_text_add_uint(t, (uint64_t)sig, 10);
    btc_text_add(t, ")");
    /* Sent by the kernel for a fault: the address is meaningful.  No siginfo
     * (passed on without one): neither address nor sender is known. */
    bool fault = si && si->si_code > 0 && sig != SIGABRT;
    if (fault) {
        btc_text_add(t, " at address ");
        btc_text_add_uint(t, (uintptr_t)si->si_addr, 16);
    } else if (si) {
        btc_text_add(t, ", sent by the process (raise, abort, kill)");
    }
    btc_text_add(t, ", thread ");
    btc_text_add_uint(t, (uint64_t)syscall(SYS_gettid), 10);
    if (passed_on)
        btc_text_add(t, PASSED_ON);
    btc_text_add(t, "\nbtcore crash report (most recent call first):\n");
}

/* The crashing thread's frames from the signal's context, kept in the record. */
static void thread_frames(btc_text *t, const btc_thread_info *info, const void *ucontext)
{
    btc_signal_capture(info, ucontext, &sample, nat);
    int n = sample.n < BTC_SIGNAL_FRAMES ? sample.n : BTC_SIGNAL_FRAMES;
    memcpy(record.frames, sample.frames, (size_t)n * sizeof *sample.frames);
    record.stacks[0] = (btc_crash_stack){.n = (uint32_t)n, .truncated = !!(sample.partial & BTC_PARTIAL_TRUNCATED),
                                         .partial = sample.partial};
    record.nstacks = 1;
    btc_frames_crash_text(record.frames, n, sample.partial, t);
}

/* "<type at 0xaddress>" of the crashing greenlet, its type read raw. */
static void greenlet_name(btc_text *t, uintptr_t g)
{
    uintptr_t type = 0, name = 0;
    if (btc_read_own(&type, g + offsetof(PyObject, ob_type), sizeof type) &&
        btc_read_own(&name, type + offsetof(PyTypeObject, tp_name), sizeof name))
        record.greenlet_type = name;
    btc_text_add(t, "<");
    btc_text_add_cstr_own(t, name, 128);
    btc_text_add(t, " at ");
    btc_text_add_uint(t, g, 16);
    btc_text_add(t, ">");
}

/* The crashing greenlet and where it was spawned, newest generation first,
 * when spawn tracking recorded it (nothing otherwise: tracking off, or the
 * thread's main greenlet crashed).  From this process's own records, read
 * without trusting them: the helper could read them too, but the helper
 * may not run (no fork, seccomp, ptrace refused), and this part is the
 * crash's own story. */
static void greenlet_chain(btc_text *t, const btc_thread_info *info, const void *ucontext)
{
    btc_regs regs;
    btc_crash_site sites[BTC_CRASH_SITES];
    uintptr_t g;
    int used = (int)record.stacks[0].n;
    int n = btc_regs_from_ucontext(ucontext, &regs)
                ? btc_spawn_crash_chain(regs.sp, info->stack_lo, info->stack_hi, &g, sites, BTC_CRASH_SITES,
                                        record.frames + used, BTC_CRASH_FRAMES - used)
                : -1;
    if (n < 0)
        return;
    record.greenlet = g;
    btc_text_add(t, "\nThe crashing greenlet: ");
    greenlet_name(t, g);
    btc_text_add(t, n ? "\n" : " (no spawn site: created before spawn tracking was on)\n");
    for (int i = 0; i < n; i++) {
        btc_crash_stack *s = &record.stacks[record.nstacks++];
        *s = (btc_crash_stack){(uint32_t)(used + sites[i].first), (uint32_t)sites[i].n, sites[i].truncated, 0,
                               sites[i].spawner};
        btc_text_add(t, "spawned by ");
        btc_text_add_str_own(t, sites[i].spawner);
        btc_text_add(t, sites[i].truncated ? " at (its outer frames not recorded):\n" : " at:\n");
        btc_frames_crash_text(record.frames + s->first, (int)s->n, 0, t);
    }
}

/* The crashing thread's part: its frames, then its greenlet's spawn chain. */
static void frames(btc_text *t, const void *ucontext)
{
    const btc_thread_info *info = btc_thread_info_of(btc_thread_slot_self());
    if (!info) {
        btc_text_add(t, "  (this thread is not registered with btcore: enable_crash_report() registers the "
                        "thread calling it)\n");
        return;
    }
    thread_frames(t, info, ucontext);
    greenlet_chain(t, info, ucontext);
}

/* Another thread crashed while one reports: wait (bounded) for that report
 * to end the process, then go on as if btcore were not there. */
static void wait_for_reporter(void)
{
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 300 && atomic_load(&report_fd) >= 0; i++)
        nanosleep(&ten_ms, NULL);
}

static void decimal(char *out, uint64_t n)
{
    char digits[24];
    int len = 0;
    do
        digits[len++] = (char)('0' + n % 10);
    while ((n /= 10) && len < 23);
    while (len)
        *out++ = digits[--len];
    *out = 0;
}

/* The helper's process: wait for leave to trace, write to fd, no signal blocked. */
static void helper_child(int gate, int fd)
{
    char go;
    while (read(gate, &go, 1) < 0 && errno == EINTR)
        ;
    if (dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
        _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);   /* a blocked SIGSEGV would stay blocked across execve */
    execve(helper_argv[0], helper_argv, environ);
    _exit(127);
}

/* Run the helper on fd and wait for it, at most helper_timeout_ms (then it is killed). */
static void run_helper(int fd)
{
    int gate[2];
    if (!helper_argv[0] || pipe2(gate, O_CLOEXEC) != 0)
        return;
    decimal(helper_pid, (uint64_t)getpid());
    pid_t child = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (child == 0)
        helper_child(gate[0], fd);
    if (child > 0)
        prctl(PR_SET_PTRACER, (unsigned long)child, 0, 0, 0);
    close(gate[0]);
    if (write(gate[1], "g", 1) < 0) {
        /* the child reads EOF as well: it goes on */
    }
    close(gate[1]);
    if (child <= 0)
        return;
    struct timespec step = {0, 10 * 1000 * 1000};
    int status;
    for (int waited = 0; waited < helper_timeout_ms; waited += 10) {
        pid_t done = waitpid(child, &status, WNOHANG);
        if (done == child || (done < 0 && errno != EINTR))   /* ECHILD: reaped by the program's own handler */
            return;
        nanosleep(&step, NULL);
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
}

static void on_fatal_signal(int sig, siginfo_t *si_here, void *ucontext_here)
{
    int saved_errno = errno;
    uintptr_t none = 0;
    if (atomic_compare_exchange_strong(&reporter, &none, (uintptr_t)pthread_self())) {
        int fd = atomic_load(&report_fd);
        btc_text t = {text_buf, sizeof text_buf, 0};
        const siginfo_t *si = si_here;
        const ucontext_t *ucontext = first_delivery(sig, ucontext_here, &si);
        text_buf[0] = 0;
        header(&t, sig, si, ucontext != ucontext_here);
        btc_text_write(&t, fd);   /* the header first: whatever happens next, it is out */
        t.len = 0;
        if (atomic_load(&fault_in_report))
            *(volatile int *)unmapped = 0;   /* a second crash, inside the report (tests) */
        record.signal = (uint32_t)sig;
        frames(&t, ucontext);
        btc_text_add(&t, "\n");
        btc_text_write(&t, fd);
        record.magic = BTC_CRASH_MAGIC;   /* complete: the helper may read it */
        run_helper(fd);
        atomic_store(&report_fd, -1);
    } else {
        wait_for_reporter();
    }
    restore_previous();
    raise(sig);   /* blocked until we return: then delivered to the previous disposition */
    errno = saved_errno;
}

int btc_crash_enable(int fd)
{
    if (fd < 0)
        return -1;
    /* This thread's alternate stack (a C stack overflow leaves no room on
     * the thread's own); kept for the thread's life.  One already there
     * (faulthandler's: a few pages) is replaced if smaller: the walk needs
     * more, and a handler on it runs on ours as well.  A mapping of its
     * own, not malloc's: a runtime that set up the thread's first alternate
     * stack may unmap whatever is current when the thread ends (ASan does:
     * munmap of a malloc'd block, not page-aligned, failed its CHECK and
     * aborted the exiting thread, ci16). */
    stack_t current;
    if (sigaltstack(NULL, &current) == 0 &&
        ((current.ss_flags & SS_DISABLE) || current.ss_size < ALT_STACK_BYTES)) {   /* faulthandler's is smaller */
        void *sp = mmap(NULL, ALT_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        stack_t alt = {.ss_sp = sp, .ss_size = ALT_STACK_BYTES, .ss_flags = 0};
        if (sp == MAP_FAILED || sigaltstack(&alt, NULL) != 0) {
            if (sp != MAP_FAILED)
                munmap(sp, ALT_STACK_BYTES);
            return -1;
        }
    }
    /* Every module's unwind table now: the handler cannot build one, and a
     * walk that reaches a module without its table ends there. */
    btc_modules_build_tables();
    atomic_store(&report_fd, fd);
    if (installed)
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < NFATAL; i++)
        sigaddset(&sa.sa_mask, fatal_signals[i]);   /* a second crash while reporting is fatal at once */
    for (int i = 0; i < NFATAL; i++)
        if (sigaction(fatal_signals[i], &sa, &previous[i]) != 0) {
            while (i-- > 0)
                sigaction(fatal_signals[i], &previous[i], NULL);
            return -1;
        }
    installed = true;
    return 0;
}

int btc_crash_set_helper(const char *const *argv, int argc, int timeout_ms)
{
    if (argc < 0 || argc > HELPER_ARGS || timeout_ms < 0)
        return -1;
    helper_argv[0] = NULL;   /* no helper while its command is half written: argv[0] comes last */
    char *at[HELPER_ARGS];
    size_t used = 0;
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(argv[i]) + 1;
        if (n > sizeof helper_text - used)
            return -1;
        at[i] = memcpy(helper_text + used, argv[i], n);
        used += n;
    }
    helper_argv[argc] = argc ? helper_pid : NULL;
    helper_argv[argc + 1] = NULL;
    helper_timeout_ms = timeout_ms;
    for (int i = argc - 1; i >= 0; i--)
        helper_argv[i] = at[i];
    return 0;
}

uint64_t btc_crash_record_address(void)
{
    return (uintptr_t)&record;
}

void btc_crash_disable(void)
{
    if (!installed)
        return;
    /* Only where our handler still is: a handler installed after ours stays. */
    for (int i = 0; i < NFATAL; i++) {
        struct sigaction now;
        if (sigaction(fatal_signals[i], NULL, &now) == 0 && now.sa_sigaction == on_fatal_signal)
            sigaction(fatal_signals[i], &previous[i], NULL);
    }
    installed = false;
    atomic_store(&report_fd, -1);
}

int btc_crash_enabled(void)
{
    return installed;
}

int btc_test_crash_handler_is_ours(void)
{
    struct sigaction now;
    return sigaction(SIGSEGV, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fatal_signal;
}

void btc_test_crash_fault_in_report(int on)
{
    atomic_store(&fault_in_report, on);
}

void btc_test_crash_holding_modules_lock(void)
{
    btc_modules_acquire();
    *(volatile int *)unmapped = 0;
}

int btc_test_crash_chain_here(uint64_t *greenlet)
{
    const btc_thread_info *info = btc_thread_info_of(btc_thread_slot_self());
    btc_crash_site sites[BTC_CRASH_SITES];
    uintptr_t g = 0, sp = (uintptr_t)__builtin_frame_address(0);
    int n = info ? btc_spawn_crash_chain(sp, info->stack_lo, info->stack_hi, &g, sites, BTC_CRASH_SITES, record.frames,
                                         BTC_CRASH_FRAMES)
                 : -2;
    *greenlet = g;
    return n;
}
