/* aarch64 (AAPCS64, Linux): the registers a walk tracks (arch.h). */
#ifndef BTC_ARCH_AARCH64_H
#define BTC_ARCH_AARCH64_H

#include "common/base.h"

#define BTC_ARCH_NAME "aarch64"
#define BTC_ARCH_SUPPORTED 1

/* DWARF register numbers (DWARF for the Arm 64-bit Architecture).  x30 (lr)
 * is the return-address column, so its rule is the row's ra rule; the row's
 * aux rule stays unused and aux (lr) of a caller is its return address. */
#define BTC_DWARF_SP 31
#define BTC_DWARF_FP 29    /* x29 */
#define BTC_DWARF_AUX 30   /* x30, lr */
#define BTC_DWARF_IP 32    /* pc: never a CFI column in practice */

/* At a function's first instruction CFA = sp: the call left the return
 * address in lr, the stack untouched. */
#define BTC_ENTRY_CFA_OFFSET 0
/* A leaf function may keep its return address in lr for its whole life. */
#define BTC_LINK_REGISTER 1
/* The vDSO's __kernel_rt_sigreturn has CFI for x29/x30 only (not sp), and
 * qemu-user's trampoline has none: the walk reads the signal frame itself. */
#define BTC_ARCH_READS_SIGNAL_FRAMES 1
#define BTC_INSN_ALIGN 4
/* PLT stubs have no CFI here. */
#define BTC_PLT_CFA_EXPRESSION 0
/* Return addresses may be signed (-mbranch-protection): CFI says where
 * (DW_CFA_AARCH64_negate_ra_state). */
#define BTC_POINTER_AUTHENTICATION 1

typedef struct {
    uintptr_t ip, sp;
    uintptr_t fp;    /* x29 */
    uintptr_t aux;   /* x30 (lr) */
} btc_regs;

/* Pointer authentication: a signed return address carries a code in its
 * top bits, whose width depends on the kernel's address size.  xpaclri
 * (HINT #7) removes it from x30 and is a no-op on CPUs without PAC, so the
 * same code runs everywhere; libgcc strips the same way. */
static inline uintptr_t btc_strip_ra(uintptr_t ra)
{
    register uintptr_t x30 __asm__("x30") = ra;
    __asm__("hint #7" : "+r"(x30));
    return x30;
}

#endif
