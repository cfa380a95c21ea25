/* Calling a handler saved from sigaction(), from inside another handler. */
#ifndef BTC_CHAIN_HANDLER_H
#define BTC_CHAIN_HANDLER_H

#include <signal.h>

/* Call the handler h describes, as the kernel would have (with the siginfo
 * and context when it asked for them); nothing for SIG_DFL and SIG_IGN,
 * whose actions are the kernel's, not a function's.  Async-signal-safe. */
static inline void btc_call_handler(const struct sigaction *h, int signum, siginfo_t *si, void *ucontext)
{
    if (h->sa_flags & SA_SIGINFO) {
        if (h->sa_sigaction)
            h->sa_sigaction(signum, si, ucontext);
    } else if (h->sa_handler != SIG_DFL && h->sa_handler != SIG_IGN) {
        h->sa_handler(signum);
    }
}

#endif
