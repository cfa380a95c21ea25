/* The vDSO as a file (vdso.c): the kernel maps it into every process
 * without one, so its symbols are read from a copy of its image. */
#ifndef BTC_VDSO_H
#define BTC_VDSO_H

#include <stdbool.h>
#include <stdint.h>

/* Does the module spanning [lo, hi) hold the vDSO's image (AT_SYSINFO_EHDR)? */
bool btc_vdso_holds(uintptr_t lo, uintptr_t hi);
/* An anonymous file (memfd) holding a copy of the vDSO's image, made on
 * first use and kept open for the process's life; -1 if there is no vDSO
 * or it cannot be copied (no memfd, unreadable).  Callers serialize
 * (symbolize.c's cache lock). */
int btc_vdso_fd(void);

#endif
