/* Capture from a signal handler (signal_capture.c): a registry of threads
 * that may be sampled, the handler, and the request that sends the signal
 * and waits for the answer. */
#ifndef BTC_SIGNAL_CAPTURE_H
#define BTC_SIGNAL_CAPTURE_H

#include <Python.h>

#include "capture/unwind.h"

#define BTC_WATCHED_THREADS 64
#define BTC_SIGNAL_NATIVE 192   /* native frames a walk may give (Python frames replace some) */

/* What a handler needs of its thread, noted in advance (nothing of this
 * can be asked for inside a handler). */
typedef struct {
    PyThreadState *tstate;
    uintptr_t stack_lo, stack_hi;
} btc_thread_info;

/* Capture the thread that info describes, interrupted with ucontext, into
 * out: no allocation, no waiting, no loader call.  nat: scratch room for
 * BTC_SIGNAL_NATIVE frames. */
void btc_signal_capture(const btc_thread_info *info, const void *ucontext, btc_sigsample *out,
                        btc_native_frame *nat);
/* The calling thread's slot (-1: none), found without TLS: a dlopen'ed
 * module's __thread variables may be allocated on first touch. */
int btc_thread_slot_self(void);
/* The registered thread's info, or NULL. */
const btc_thread_info *btc_thread_info_of(int slot);
/* The registered thread's ident (pthread_t, threading.get_ident()), 0 if none. */
uint64_t btc_thread_ident_of(int slot);
/* The slot of a thread by its threading ident (pthread_t), or -1. */
int btc_thread_slot_of(uint64_t ident);
/* Copy n bytes of this process's memory at src into dst with
 * process_vm_readv: false (EFAULT) instead of a fault where src is not
 * mapped.  Async-signal-safe: how a crash handler reads what it cannot
 * trust (a corrupt heap). */
bool btc_read_own(void *dst, uintptr_t src, size_t n);
/* btc_read_own's checked copy made through a pipe (written from src, read
 * into dst): 5 system calls, at most BTC_READ_PIPED_MAX bytes (what a pipe
 * takes without blocking).  Async-signal-safe. */
#define BTC_READ_PIPED_MAX 4096
bool btc_read_piped(void *dst, uintptr_t src, size_t n);
/* btc_read_own, or btc_read_piped where process_vm_readv is not emulated
 * (qemu-user): for reads made rarely. */
bool btc_read_own_anywhere(void *dst, uintptr_t src, size_t n);
/* A signal sample's objects, read after the capture: copied with
 * btc_read_own where process_vm_readv works; in place under qemu-user,
 * which does not emulate it (as the capture itself reads them there). */
bool btc_read_sampled(void *dst, uintptr_t src, size_t n);
/* btc_signal_sample() by slot. */
int btc_signal_sample_slot(int slot, int timeout_ms, btc_sigsample *out);

#endif
