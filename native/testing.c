/* Test-only entry points (declared in btcore_api.h's introspection section):
 * they expose one internal contract each, on inputs a test builds, so the
 * contract is checked directly instead of through a whole capture. */
#include "capture/context.h"

int btc_test_mem_read(uintptr_t lo, uintptr_t hi, uintptr_t addr, uintptr_t *out)
{
    btc_memview view = {.lo = lo, .hi = hi};
    return btc_mem_read(&view, addr, out) ? 1 : 0;
}

int btc_test_unwind(uintptr_t ip, uintptr_t sp, uintptr_t lo, uintptr_t hi, uintptr_t *pcs, int max)
{
    btc_native_frame frames[16];
    btc_context ctx = {.regs = {.ip = ip, .sp = sp}, .ip_is_exact = true, .mem = {.lo = lo, .hi = hi}};
    if (max > 16)
        max = 16;
    btc_modules_lock();
    btc_modules_refresh();
    int n = btc_unwind(&ctx, frames, max);
    btc_modules_unlock();
    for (int i = 0; i < n; i++)
        pcs[i] = frames[i].pc;
    return n;
}
