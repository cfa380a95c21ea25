/* x86-64 (System V psABI): the registers a walk tracks (arch.h). */
#ifndef BTC_ARCH_X86_64_H
#define BTC_ARCH_X86_64_H

#include "common/base.h"

#define BTC_ARCH_NAME "x86-64"
#define BTC_ARCH_SUPPORTED 1

/* DWARF register numbers.  rbx: code that realigns its stack can keep the
 * frame base in it, so CFA rules may name it. */
#define BTC_DWARF_SP 7     /* rsp */
#define BTC_DWARF_FP 6     /* rbp */
#define BTC_DWARF_AUX 3    /* rbx */
#define BTC_DWARF_IP 16    /* rip: the return-address column */

/* At a function's first instruction CFA = rsp + 8: the call pushed the
 * return address. */
#define BTC_ENTRY_CFA_OFFSET 8
/* No link register: the return address is on the stack from the call on. */
#define BTC_LINK_REGISTER 0
/* glibc's __restore_rt carries CFI that restores every register we track. */
#define BTC_ARCH_READS_SIGNAL_FRAMES 0
/* Instructions have any length: a code scan steps byte by byte. */
#define BTC_INSN_ALIGN 1
/* PLT stubs carry one CFA expression (rsp + off + 8 once rip passes a
 * fixed offset in the 16-byte slot): recognised as BTC_CFA_PLT. */
#define BTC_PLT_CFA_EXPRESSION 1
#define BTC_POINTER_AUTHENTICATION 0

typedef struct {
    uintptr_t ip, sp;
    uintptr_t fp;    /* rbp */
    uintptr_t aux;   /* rbx */
} btc_regs;

/* Return addresses are plain addresses. */
static inline uintptr_t btc_strip_ra(uintptr_t ra)
{
    return ra;
}

#endif
