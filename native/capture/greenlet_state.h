/* greenlet's StackState: what greenlet itself can have written there.  One
 * rule for the in-process capture (greenlet_context.c, which learns where
 * the state lies by it) and for the outside dump (remote/rpython.c, which
 * marks a greenlet whose state breaks it as a corrupt target's). */
#ifndef BTC_CAPTURE_GREENLET_STATE_H
#define BTC_CAPTURE_GREENLET_STATE_H

#include <stdbool.h>
#include <stdint.h>

/* A main greenlet's stop: its stack is its thread's, to the top. */
#define BTC_GREENLET_MAIN_STACK_STOP ((uintptr_t)-1)
/* 1 GiB: larger than any thread's stack, so larger than any greenlet's. */
#define BTC_GREENLET_MAX_STACK ((uintptr_t)1 << 30)

/* Could greenlet have written this started greenlet's [start, stop), heap
 * copy and saved byte count: its stack below its stop and no larger than a
 * thread's, no more of it saved than it has, a saved part exactly when it
 * has a heap copy? */
static inline bool btc_greenlet_state_written(uintptr_t start, uintptr_t stop, uintptr_t copy, intptr_t saved)
{
    uintptr_t room = stop == BTC_GREENLET_MAIN_STACK_STOP ? BTC_GREENLET_MAX_STACK : stop - start;
    return start > 1 && start < stop && room <= BTC_GREENLET_MAX_STACK && saved >= 0 && (uintptr_t)saved <= room &&
           (saved == 0) == (copy == 0);
}

#endif
