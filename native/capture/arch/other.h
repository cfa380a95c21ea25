/* Any architecture btcore cannot walk: the module builds and imports, and
 * Python-only captures work; native walks fail with a clear error
 * (capture.c).  The definitions below only let the shared code compile. */
#ifndef BTC_ARCH_OTHER_H
#define BTC_ARCH_OTHER_H

#include "common/base.h"

#define BTC_ARCH_NAME "this architecture"
#define BTC_ARCH_SUPPORTED 0

/* Numbers no CFI uses as a register: every rule naming one is unsupported. */
#define BTC_DWARF_SP 0xfff0
#define BTC_DWARF_FP 0xfff1
#define BTC_DWARF_AUX 0xfff2
#define BTC_DWARF_IP 0xfff3
#define BTC_ENTRY_CFA_OFFSET 0
#define BTC_LINK_REGISTER 0
#define BTC_ARCH_READS_SIGNAL_FRAMES 0
#define BTC_INSN_ALIGN 1
#define BTC_PLT_CFA_EXPRESSION 0
#define BTC_POINTER_AUTHENTICATION 0

typedef struct {
    uintptr_t ip, sp, fp, aux;
} btc_regs;

static inline uintptr_t btc_strip_ra(uintptr_t ra)
{
    return ra;
}

#endif
