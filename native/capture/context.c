/* Contexts of the calling thread: its stack range; memory mappings. */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture/context.h"

/* pthread_getattr_np reads /proc/self/maps for the main thread: ask once
 * per thread. */
static __thread uintptr_t stack_lo, stack_hi;

bool btc_pthread_stack(pthread_t thread, uintptr_t *lo, uintptr_t *hi)
{
    pthread_attr_t attr;
    void *addr;
    size_t size;
    if (pthread_getattr_np(thread, &attr) != 0)
        return false;
    int rc = pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        return false;
    *lo = (uintptr_t)addr;
    *hi = (uintptr_t)addr + size;
    return true;
}

bool btc_thread_stack(uintptr_t *lo, uintptr_t *hi)
{
    if (BTC_UNLIKELY(!stack_hi) && !btc_pthread_stack(pthread_self(), &stack_lo, &stack_hi))
        return false;
    *lo = stack_lo;
    *hi = stack_hi;
    return true;
}

/* Parse /proc/self/maps with plain read(): no stdio, no allocation.
 * *readable: the mapping's permissions start with 'r'. */
static bool find_mapping(uintptr_t addr, uintptr_t *lo, uintptr_t *hi, bool *readable)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char buf[4096];
    size_t have = 0;
    bool found = false;
    for (;;) {
        ssize_t got = read(fd, buf + have, sizeof buf - 1 - have);
        if (got <= 0)
            break;
        have += (size_t)got;
        buf[have] = 0;
        char *line = buf, *nl;
        while (!found && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
            char *end;
            uintptr_t a = strtoull(line, &end, 16);
            uintptr_t b = *end == '-' ? strtoull(end + 1, &end, 16) : 0;
            if (addr >= a && addr < b) {
                *lo = a;
                *hi = b;
                *readable = end[0] == ' ' && end[1] == 'r';
                found = true;
            }
            line = nl + 1;
        }
        if (found)
            break;
        have -= (size_t)(line - buf);   /* keep the partial last line */
        memmove(buf, line, have);
    }
    close(fd);
    return found;
}

bool btc_mapping_bounds(uintptr_t addr, uintptr_t *lo, uintptr_t *hi)
{
    bool readable;
    return find_mapping(addr, lo, hi, &readable);
}

/* The process's main-thread stack, [main_lo, main_hi): its mapping, learnt
 * once.  The mapping only grows down (main_lo is where it began when
 * learnt) and is never unmapped, a fork child's included.  hi is stored
 * last and read first: a reader that sees it sees lo (a signal handler
 * may read between the two stores). */
extern void *__libc_stack_end __attribute__((weak));   /* glibc's: an address in that stack */
static uintptr_t main_lo, main_hi;

bool btc_main_stack_end(uintptr_t addr, uintptr_t *hi)
{
    uintptr_t known_hi = __atomic_load_n(&main_hi, __ATOMIC_ACQUIRE), lo, found_hi;
    if (!known_hi && &__libc_stack_end && __libc_stack_end &&
        btc_mapping_bounds((uintptr_t)__libc_stack_end, &lo, &found_hi)) {
        main_lo = lo;
        __atomic_store_n(&main_hi, known_hi = found_hi, __ATOMIC_RELEASE);
    }
    if (!known_hi || addr < main_lo || addr >= known_hi)
        return false;
    *hi = known_hi;
    return true;
}

bool btc_mapping_readable(uintptr_t addr, uintptr_t *lo, uintptr_t *hi)
{
    bool readable;
    return find_mapping(addr, lo, hi, &readable) && readable;
}
