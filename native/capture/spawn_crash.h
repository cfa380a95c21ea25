/* The crashing greenlet's spawn chain, read by the crash handler
 * (watch/crash.c) from spawn.c's records without trusting them. */
#ifndef BTC_SPAWN_CRASH_H
#define BTC_SPAWN_CRASH_H

#include "common/base.h"

typedef struct {
    uintptr_t spawner;   /* the spawner's repr (a str in this process), 0 if none */
    int first, n;        /* its site's frames in the caller's buffer */
    bool truncated;      /* the site, or the copy of it, holds only its innermost frames */
} btc_crash_site;

/* The greenlet running in the crashed thread (the thread's stack
 * [stack_lo, stack_hi], its sp at the fault): the one tracked greenlet
 * whose stack is in place (started, nothing of it saved away) and ends in
 * that stack above sp, its address in *greenlet (0: none, or more than one).  Its spawn sites, newest first, into sites (at most max_sites),
 * their frames copied into frames (at most max_frames in all).  Returns the
 * sites written, or -1 if no record of the greenlet was found.
 * Async-signal-safe: every read with btc_read_own, bounded. */
int btc_spawn_crash_chain(uintptr_t sp, uintptr_t stack_lo, uintptr_t stack_hi, uintptr_t *greenlet,
                          btc_crash_site *sites, int max_sites, btc_frame *frames, int max_frames);

#endif
