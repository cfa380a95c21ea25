/* aarch64 Linux: reading registers and machine code (arch.h). */
#if defined(__aarch64__)
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>

#include "capture/arch.h"
#include "capture/context.h"
#include "capture/modules.h"

/* btc_get_regs(btc_regs *r): the caller's pc (our return address, still in
 * x30: no frame, no signing here), its sp (this function moves none), x29
 * and x30.  "bti c" (HINT #34) lets it be a branch target where BTI is on
 * and is a no-op elsewhere. */
__asm__(
    ".text\n"
    ".globl btc_get_regs\n"
    ".hidden btc_get_regs\n"
    ".type btc_get_regs, %function\n"
    "btc_get_regs:\n"
    ".cfi_startproc\n"
    "    hint #34\n"
    "    str x30, [x0, #0]\n"      /* ip */
    "    mov x1, sp\n"
    "    str x1, [x0, #8]\n"       /* sp */
    "    str x29, [x0, #16]\n"     /* fp */
    "    str x30, [x0, #24]\n"     /* aux (lr) */
    "    ret\n"
    ".cfi_endproc\n"
    ".size btc_get_regs, .-btc_get_regs\n");

_Static_assert(offsetof(btc_regs, ip) == 0 && offsetof(btc_regs, sp) == 8 &&
               offsetof(btc_regs, fp) == 16 && offsetof(btc_regs, aux) == 24,
               "btc_get_regs stores registers at these offsets");

bool btc_regs_from_ucontext(const void *ucontext, btc_regs *out)
{
    const mcontext_t *mc = &((const ucontext_t *)ucontext)->uc_mcontext;
    *out = (btc_regs){.ip = mc->pc, .sp = mc->sp, .fp = mc->regs[29], .aux = mc->regs[30]};
    return true;
}

/* The kernel's frame is { siginfo_t info; ucontext_t uc; } (rt_sigframe). */
const void *btc_siginfo_beside(const void *ucontext)
{
    return (const char *)ucontext - sizeof(siginfo_t);
}

/* Not read here: qemu-user, where the arm64 lane runs, has no ptrace to test
 * it with, and the dump's Python side parses x86-64 registers (arch.h). */
int btc_ptrace_regs(int tid, btc_regs *out)
{
    (void)tid;
    memset(out, 0, sizeof *out);
    return -ENOSYS;
}

/* ---- instruction fields ---- */

static int64_t sign_extend(uint64_t v, int bits)
{
    return (int64_t)(v << (64 - bits)) >> (64 - bits);
}

static uint32_t insn_at(const uint8_t *code, size_t i)
{
    uint32_t insn;
    memcpy(&insn, code + i, 4);
    return insn;
}

/* bl imm26 */
static bool is_call(uint32_t insn, uintptr_t pc, uintptr_t *target)
{
    if ((insn & 0xfc000000u) != 0x94000000u)
        return false;
    *target = pc + (uintptr_t)(sign_extend(insn & 0x03ffffffu, 26) * 4);
    return true;
}

/* ---- greenlet's slp_switch (platform/switch_aarch64_gcc.h) ----
 * It declares x19-x28, x30 and v8-v15 clobbered, so the compiler saves them
 * in its prologue and its CFI describes them; x29 it stores itself
 * (`str x29, %0` into a local), which its CFI does not describe.  That
 * store is `str x29, [sp, #imm]`, or `str x29, [x29, #imm]` when the frame
 * record sits at sp (`mov x29, sp` in the prologue, where the stored x29 is
 * slp_switch's own: what a CFA based on x29 needs). */

#define STR_X29_SP_MASK 0xffc003ffu
#define STR_X29_SP      0xf90003fdu   /* str x29, [sp, #imm12 * 8] */
#define STR_X29_X29     0xf90003bdu   /* str x29, [x29, #imm12 * 8] */
#define MOV_X29_SP      0x910003fdu   /* mov x29, sp (add x29, sp, #0) */

static int fp_store_slot(const uint8_t *code, size_t size)
{
    bool fp_is_sp = false;
    for (size_t i = 0; i + 4 <= size; i += 4) {
        uint32_t insn = insn_at(code, i);
        if (insn == MOV_X29_SP)
            fp_is_sp = true;
        else if ((insn & 0xff0003ffu) == 0xd10003ffu || (insn & 0xffc003e0u) == 0xa98003e0u)
            fp_is_sp = false;   /* sub sp, sp, #n / stp .., [sp, #n]!: sp moved below x29 */
        if ((insn & STR_X29_SP_MASK) == STR_X29_SP || (fp_is_sp && (insn & STR_X29_SP_MASK) == STR_X29_X29))
            return (int)((insn >> 10) & 0xfff) * 8;
    }
    return -1;
}

bool btc_switch_shape_of(uintptr_t lo, uintptr_t hi, const uintptr_t *callee, int n, btc_switch_shape *out)
{
    const uint8_t *code = (const uint8_t *)lo;
    out->resume_pc = 0;
    for (uintptr_t p = lo; !out->resume_pc && p + 4 <= hi; p += 4) {
        uintptr_t target;
        for (int i = 0; i < n && is_call(insn_at(code, p - lo), p, &target); i++)
            if (target == callee[i])
                out->resume_pc = p + 4;
    }
    out->fp_slot = out->resume_pc ? fp_store_slot(code, out->resume_pc - lo) : -1;
    out->aux_slot = -1;   /* x30: saved by the prologue, described by the CFI */
    return out->resume_pc && out->fp_slot >= 0;
}

/* b, b.cond, cbz/cbnz, tbz/tbnz */
size_t btc_direct_jump_at(const uint8_t *code, size_t size, size_t i, uintptr_t pc, uintptr_t *target)
{
    if (i + 4 > size)
        return 0;
    uint32_t insn = insn_at(code, i);
    int64_t words;
    if ((insn & 0xfc000000u) == 0x14000000u)
        words = sign_extend(insn & 0x03ffffffu, 26);
    else if ((insn & 0xff000010u) == 0x54000000u || (insn & 0x7e000000u) == 0x34000000u)
        words = sign_extend((insn >> 5) & 0x7ffffu, 19);
    else if ((insn & 0x7e000000u) == 0x36000000u)
        words = sign_extend((insn >> 5) & 0x3fffu, 14);
    else
        return 0;
    *target = pc + i + (uintptr_t)(words * 4);
    return 4;
}

/* ---- signal frames ----
 * A handler returns into `mov x8, #__NR_rt_sigreturn; svc #0`: the vDSO's
 * __kernel_rt_sigreturn, or qemu-user's trampoline page (no module, no
 * CFI).  Its sp is the kernel's struct rt_sigframe { siginfo_t info;
 * ucontext_t uc; }, whose uc_mcontext holds every interrupted register; the
 * vDSO's CFI only follows the frame record (x29, x30), which loses sp. */

#define MOV_X8_RT_SIGRETURN 0xd2801168u   /* mov x8, #139 */
#define SVC_0               0xd4000001u

static bool code_readable(uintptr_t pc, size_t len)
{
    btc_module *m = btc_module_find(pc);
    if (m)
        return pc + len <= m->hi;
    uintptr_t lo, hi;
    return btc_mapping_readable(pc, &lo, &hi) && pc + len <= hi;
}

static bool is_sigreturn(uintptr_t pc)
{
    return !(pc & 3) && code_readable(pc, 8) && insn_at((const uint8_t *)pc, 0) == MOV_X8_RT_SIGRETURN &&
           insn_at((const uint8_t *)pc, 4) == SVC_0;
}

#define SIGCONTEXT_AT (sizeof(siginfo_t) + offsetof(ucontext_t, uc_mcontext))

bool btc_signal_frame(const btc_cfi_row *row, const btc_memview *m, btc_regs *r, uintptr_t *cfa)
{
    if ((row && !(row->flags & BTC_ROW_SIGNAL)) || !is_sigreturn(r->ip))
        return false;
    uintptr_t sc = r->sp + SIGCONTEXT_AT;
    btc_regs in;
    if (!btc_mem_read(m, sc + offsetof(mcontext_t, pc), &in.ip) ||
        !btc_mem_read(m, sc + offsetof(mcontext_t, sp), &in.sp) ||
        !btc_mem_read(m, sc + offsetof(mcontext_t, regs[29]), &in.fp) ||
        !btc_mem_read(m, sc + offsetof(mcontext_t, regs[30]), &in.aux))
        return false;
    *r = in;
    *cfa = in.sp;
    return true;
}

#endif
