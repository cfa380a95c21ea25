/* btcore's own C threads (the watchdog, the dump thread, the second reader
 * of a dump's stop): how they start. */
#ifndef BTC_COMMON_OWN_THREAD_H
#define BTC_COMMON_OWN_THREAD_H

#include <pthread.h>

/* Start main(arg) in a new thread that blocks every signal (process
 * signals go to Python's threads, and the capture signal never lands in
 * it), and return once that thread is running: 0, or -1 if it could not
 * be created. */
int btc_own_thread_start(pthread_t *thread, void *(*main)(void *), void *arg);

#endif
