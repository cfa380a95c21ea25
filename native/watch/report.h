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
/* The same frames for a crash handler, async-signal-safe: Python frames as
 * above, native ones as "  [module] +0xoffset" (no symbol lookup: it reads
 * files and allocates), "  [?] 0xpc" when the module list is busy. */
void btc_sigsample_crash_text(const btc_sigsample *s, btc_text *t);

#endif
