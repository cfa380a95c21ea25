/* Any other architecture (arch/other.h): nothing can be read, every
 * function says so, and capture.c refuses native walks before using them. */
#if !defined(__x86_64__) && !defined(__aarch64__)
#include <errno.h>
#include <string.h>

#include "capture/arch.h"

void btc_get_regs(btc_regs *r)
{
    memset(r, 0, sizeof *r);
}

bool btc_regs_from_ucontext(const void *ucontext, btc_regs *out)
{
    (void)ucontext;
    memset(out, 0, sizeof *out);
    return false;
}

const void *btc_siginfo_beside(const void *ucontext)
{
    (void)ucontext;
    return NULL;
}

int btc_ptrace_regs(int tid, btc_regs *out)
{
    (void)tid;
    memset(out, 0, sizeof *out);
    return -ENOSYS;
}

bool btc_switch_shape_of(uintptr_t lo, uintptr_t hi, const uintptr_t *callee, int n, btc_switch_shape *out)
{
    (void)lo, (void)hi, (void)callee, (void)n;
    memset(out, 0, sizeof *out);
    return false;
}

size_t btc_direct_jump_at(const uint8_t *code, size_t size, size_t i, uintptr_t pc, uintptr_t *target)
{
    (void)code, (void)size, (void)i, (void)pc, (void)target;
    return 0;
}

#endif
