/* x86-64: reading registers and machine code (arch.h). */
#if defined(__x86_64__)
#include <errno.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <ucontext.h>

#include "capture/arch.h"

/* btc_get_regs(btc_regs *r): the caller's pc (our return address), the sp
 * the caller has once we return, and its rbp/rbx. */
__asm__(
    ".text\n"
    ".globl btc_get_regs\n"
    ".hidden btc_get_regs\n"
    ".type btc_get_regs, @function\n"
    "btc_get_regs:\n"
    ".cfi_startproc\n"
    "    movq (%rsp), %rax\n"
    "    movq %rax, 0(%rdi)\n"     /* ip */
    "    leaq 8(%rsp), %rax\n"
    "    movq %rax, 8(%rdi)\n"     /* sp */
    "    movq %rbp, 16(%rdi)\n"    /* fp */
    "    movq %rbx, 24(%rdi)\n"    /* aux */
    "    ret\n"
    ".cfi_endproc\n"
    ".size btc_get_regs, .-btc_get_regs\n");

_Static_assert(offsetof(btc_regs, ip) == 0 && offsetof(btc_regs, sp) == 8 &&
               offsetof(btc_regs, fp) == 16 && offsetof(btc_regs, aux) == 24,
               "btc_get_regs stores registers at these offsets");

bool btc_regs_from_ucontext(const void *ucontext, btc_regs *out)
{
    const greg_t *g = ((const ucontext_t *)ucontext)->uc_mcontext.gregs;
    *out = (btc_regs){.ip = (uintptr_t)g[REG_RIP], .sp = (uintptr_t)g[REG_RSP],
                      .fp = (uintptr_t)g[REG_RBP], .aux = (uintptr_t)g[REG_RBX]};
    return true;
}

/* The kernel's frame is { pretcode; struct ucontext uc; siginfo_t info; },
 * and its ucontext ends after a one-word signal mask where glibc's
 * ucontext_t goes on (a 128-byte mask, the FP registers). */
const void *btc_siginfo_beside(const void *ucontext)
{
    return (const char *)ucontext + offsetof(ucontext_t, uc_sigmask) + sizeof(uint64_t);
}

int btc_ptrace_regs(int tid, btc_regs *out)
{
    struct user_regs_struct r;
    if (ptrace(PTRACE_GETREGS, tid, 0, &r) != 0)
        return -errno;
    *out = (btc_regs){.ip = r.rip, .sp = r.rsp, .fp = r.rbp, .aux = r.rbx};
    return 0;
}

/* ---- greenlet's slp_switch (platform/switch_amd64_unix.h) ----
 * It pushes r15..r12 and rbx, then stores rbp and rbx with plain moves into
 * its own frame; its CFI does not describe rbp (inline asm), so the caller's
 * rbp must come from that slot. */

/* Bytes between rbp and rsp after a frame-pointer prologue
 * `push %rbp; mov %rsp,%rbp; push %r..*; sub $n,%rsp` at code (*at: the
 * byte after it), or -1 if code does not start that way. */
static int frame_pointer_prologue(const uint8_t *code, size_t size, size_t *at)
{
    if (size < 8 || code[0] != 0x55 || code[1] != 0x48 || code[2] != 0x89 || code[3] != 0xe5)
        return -1;
    size_t i = 4;
    int below = 0;
    while (i + 2 <= size && ((code[i] >= 0x50 && code[i] <= 0x57) ||
                             (code[i] == 0x41 && code[i + 1] >= 0x50 && code[i + 1] <= 0x57))) {
        i += code[i] == 0x41 ? 2 : 1;
        below += 8;
    }
    if (i + 4 <= size && code[i] == 0x48 && code[i + 1] == 0x83 && code[i + 2] == 0xec) {
        below += code[i + 3];
        i += 4;
    }
    *at = i;
    return below;
}

/* Where slp_switch stores reg (5 = rbp, 3 = rbx), relative to its sp after
 * the prologue; -1 if not found.  Without frame pointers: `mov %reg,
 * disp8(%rsp)` (48 89 /r, ModRM mod=01 rm=100, SIB 0x24).  With them (the
 * default for extensions of CPython 3.15): `mov %reg, disp8(%rbp)` (ModRM
 * mod=01 rm=101) after the frame-pointer prologue; the rbp stored is then
 * slp_switch's own, the frame base its CFI (CFA = rbp + 16) needs. */
static int find_spill_slot(const uint8_t *code, size_t size, int reg)
{
    uint8_t modrm = (uint8_t)(0x44 | (reg << 3));
    for (size_t i = 0; i + 5 <= size; i++)
        if (code[i] == 0x48 && code[i + 1] == 0x89 && code[i + 2] == modrm && code[i + 3] == 0x24)
            return code[i + 4];
    size_t i;
    int below = frame_pointer_prologue(code, size, &i);
    modrm = (uint8_t)(0x45 | (reg << 3));
    for (; below >= 0 && i + 4 <= size; i++)
        if (code[i] == 0x48 && code[i + 1] == 0x89 && code[i + 2] == modrm)
            return below + (int8_t)code[i + 3] >= 0 ? below + (int8_t)code[i + 3] : -1;
    return -1;
}

/* The pc after the first direct call (e8 rel32) in [lo, hi) to the start
 * of one of the n callee ranges (a function and its .cold clones), or 0. */
static uintptr_t after_call_to(uintptr_t lo, uintptr_t hi, const uintptr_t *callee, int n)
{
    for (uintptr_t p = lo; p + 5 <= hi; p++) {
        const uint8_t *c = (const uint8_t *)p;
        int32_t rel;
        memcpy(&rel, c + 1, 4);
        for (int i = 0; c[0] == 0xe8 && i < n; i++)
            if (p + 5 + (intptr_t)rel == callee[i])
                return p + 5;
    }
    return 0;
}

bool btc_switch_shape_of(uintptr_t lo, uintptr_t hi, const uintptr_t *callee, int n, btc_switch_shape *out)
{
    out->resume_pc = after_call_to(lo, hi, callee, n);
    size_t prologue = out->resume_pc ? out->resume_pc - lo : 0;
    out->fp_slot = find_spill_slot((const uint8_t *)lo, prologue, 5);
    out->aux_slot = find_spill_slot((const uint8_t *)lo, prologue, 3);
    return out->resume_pc && out->fp_slot >= 0 && out->aux_slot >= 0;
}

/* jmp rel32 (e9) and jcc rel32 (0f 80..8f). */
size_t btc_direct_jump_at(const uint8_t *code, size_t size, size_t i, uintptr_t pc, uintptr_t *target)
{
    if (i + 5 > size)
        return 0;
    size_t len = code[i] == 0xe9 ? 5 : (code[i] == 0x0f && (code[i + 1] & 0xf0) == 0x80 && i + 6 <= size) ? 6 : 0;
    if (!len)
        return 0;
    int32_t rel;
    memcpy(&rel, code + i + len - 4, 4);
    *target = pc + i + len + (uintptr_t)(intptr_t)rel;
    return len;
}

#endif
