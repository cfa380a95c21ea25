/* Errors: a short reason kept per thread for btc_last_error(). */
#ifndef BTC_ERRORS_H
#define BTC_ERRORS_H

#include "common/base.h"

/* Remember reason (a string that outlives the thread's next failure) and
 * return code. */
int btc_fail(int code, const char *reason);
/* The same for the Python exception set now: its type and message become the
 * reason (prefixed by what), and the exception is cleared.  Never silent:
 * the caller returns code, which the Python layer raises with that reason.
 * GIL held. */
int btc_fail_python(int code, const char *what);

#endif
