/* The architecture seam: everything a walk needs to know about the CPU.
 *
 * One header per architecture (arch/<name>.h) defines, inline, what the
 * walk runs on every frame: the registers it tracks (btc_regs), their DWARF
 * numbers, how a function's first instruction looks to CFI, and how to make
 * a return address usable (pointer authentication).  The functions below are
 * implemented once per architecture (arch/<name>.c): code that reads
 * machine code or machine state.  Everything else (CFI tables, the walk,
 * greenlet's saved state, the merge) is shared.
 *
 * Supported: x86-64 and aarch64 Linux.  Anywhere else the module still
 * builds and imports; native walks fail with a clear error (arch/other.h).
 */
#ifndef BTC_ARCH_H
#define BTC_ARCH_H

#if defined(__x86_64__)
#include "capture/arch/x86_64.h"
#elif defined(__aarch64__)
#include "capture/arch/aarch64.h"
#else
#include "capture/arch/other.h"
#endif

struct btc_memview;

/* Store the caller's registers: its pc (as a return address), sp, and the
 * tracked fp/aux registers.  The caller must stay on the stack while a walk
 * uses them.  Assembly: C cannot name the caller's registers without
 * changing them.  (Zeroes on an unsupported architecture.) */
void btc_get_regs(btc_regs *r);

/* The registers of the code a signal interrupted, from the ucontext_t a
 * SA_SIGINFO handler receives; false on an unsupported architecture. */
bool btc_regs_from_ucontext(const void *ucontext, btc_regs *out);

/* The siginfo_t the kernel pushed beside the ucontext_t at ucontext, in the
 * same signal frame (its layout is the architecture's); NULL where unknown. */
const void *btc_siginfo_beside(const void *ucontext);

/* The registers of thread tid of another process, stopped under ptrace by
 * us: 0, or -errno (-ENOSYS where btcore does not read them: the process
 * dump is x86-64 only, as are the core-file registers it parses). */
int btc_ptrace_regs(int tid, btc_regs *out);

/* greenlet's slp_switch, as compiled: where a suspended greenlet resumes
 * and where slp_switch keeps the registers its CFI does not describe. */
typedef struct {
    uintptr_t resume_pc;   /* right after the call that saves the stack */
    int fp_slot;           /* the caller's fp, relative to slp_switch's sp; -1: CFI describes it */
    int aux_slot;          /* the same for aux */
} btc_switch_shape;

/* Read slp_switch's code [lo, hi): the first direct call to one of the n
 * callee starts (slp_save_state_trampoline and its clones) and the register
 * stores before it.  False if the code does not have the shape this
 * architecture's greenlet switch has (platform/switch_*.h). */
bool btc_switch_shape_of(uintptr_t lo, uintptr_t hi, const uintptr_t *callee, int n, btc_switch_shape *out);

/* The direct jump (no call) at code[i], code being size readable bytes that
 * lie at address pc (in this process, or copied from another): its target
 * in *target and its length; 0 if code[i] starts no direct jump.  Callers
 * step by BTC_INSN_ALIGN. */
size_t btc_direct_jump_at(const uint8_t *code, size_t size, size_t i, uintptr_t pc, uintptr_t *target);

/* A signal return trampoline at r->ip (the handler's return address), with
 * the signal frame the kernel pushed at r->sp: replace r by the interrupted
 * registers and set *cfa to the interrupted sp.  Only architectures whose
 * trampoline CFI does not restore the interrupted sp need this
 * (BTC_ARCH_READS_SIGNAL_FRAMES); row is the CFI row at the trampoline
 * (NULL: no module covers it, as under qemu-user). */
bool btc_signal_frame(const btc_cfi_row *row, const struct btc_memview *m, btc_regs *r, uintptr_t *cfa);

#endif
