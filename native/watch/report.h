/* A signal-context sample as text, named without the GIL (report.c). */
#ifndef BTC_WATCH_REPORT_H
#define BTC_WATCH_REPORT_H

#include "common/base.h"

/* A bounded text buffer: appends never overflow; the text stays NUL-terminated. */
typedef struct {
    char *buf;
    size_t size, len;
} btc_text;

void btc_text_add(btc_text *t, const char *s);
void btc_text_addf(btc_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* From a crash handler: str object s's characters (as add_str: ASCII,
 * at most 200), "?" if it cannot be read; a C string at s, at most max
 * bytes.  Read with btc_read_own. */
void btc_text_add_str_own(btc_text *t, uintptr_t s);
void btc_text_add_cstr_own(btc_text *t, uintptr_t s, size_t max);
/* n in base 10 or 16 ("0x..."), async-signal-safe (no printf). */
void btc_text_add_uint(btc_text *t, uint64_t n, unsigned base);
/* Write the text to fd whole (a short write goes on; an error ends it). */
void btc_text_write(const btc_text *t, int fd);
/* The sample's frames, one a line, innermost first, then its partial reasons. */
void btc_sigsample_text(const btc_sigsample *s, btc_text *t);
/* Its inner frames only (the first `inner`, innermost first), then its
 * partial reasons: a later report of a stuck call whose outer frames were
 * already shown. */
void btc_sigsample_inner_text(const btc_sigsample *s, int inner, btc_text *t);
/* n frames (then the reasons in partial, BTC_PARTIAL_*) for a crash
 * handler, async-signal-safe: Python frames as above (read from copies);
 * native ones as "  [module] +0xoffset" (no symbol lookup: it
 * reads files and allocates), "  [?] 0xpc" when the module list is busy. */
void btc_frames_crash_text(const btc_frame *frames, int n, unsigned partial, btc_text *t);

#endif
