/* A signal-context sample as text, written by a thread that may not take
 * the GIL (the sampled thread may hold it, stuck in C).
 *
 * Native frames are named from the symbol tables in C (btc_resolve_native,
 * which reads ELF files without Python objects), with file:line where the
 * module has DWARF.  Python frames are read from
 * their code objects raw, as faulthandler does: the name and file strings'
 * characters and the line from PyCode_Addr2Line, which only reads the code
 * object's line table.  The code objects are owned by frames the sampled
 * thread is still running, so this runs while it is stuck there.
 */
#include <Python.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "capture/modules.h"
#include "watch/report.h"

void btc_text_add(btc_text *t, const char *s)
{
    size_t n = strlen(s), room = t->size - 1 - t->len;
    if (n > room)
        n = room;
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = 0;
}

void btc_text_addf(btc_text *t, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    btc_text_add(t, line);
}

/* n in `base` (10 or 16, with "0x"), without printf: a crash handler may
 * not call it (stdio's locale and buffers are not async-signal-safe). */
void btc_text_add_uint(btc_text *t, uint64_t n, unsigned base)
{
    char digits[24], *p = digits + sizeof digits;
    *--p = 0;
    do {
        *--p = "0123456789abcdef"[n % base];
        n /= base;
    } while (n);
    if (base == 16)
        btc_text_add(t, "0x");
    btc_text_add(t, p);
}

void btc_text_write(const btc_text *t, int fd)
{
    for (size_t done = 0; done < t->len;) {
        ssize_t w = write(fd, t->buf + done, t->len - done);
        if (w <= 0)
            return;
        done += (size_t)w;
    }
}

/* A str's characters, non-ASCII ones as '?', at most 200 (no allocation). */
static void add_str(btc_text *t, PyObject *s)
{
    if (!s || !PyUnicode_CheckExact(s)) {
        btc_text_add(t, "?");
        return;
    }
    char out[201];
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), i;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (i = 0; i < n && i < 200; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        out[i] = ch >= 32 && ch < 127 ? (char)ch : '?';
    }
    out[i] = 0;
    btc_text_add(t, out);
}

static void add_python(btc_text *t, const btc_frame *f)
{
    PyCodeObject *code = (PyCodeObject *)f->addr;
    if (!PyCode_Check((PyObject *)code)) {
        btc_text_add(t, "  (a Python frame whose code object is gone: ");
        btc_text_add_uint(t, f->addr, 16);
        btc_text_add(t, ")\n");
        return;
    }
    /* No printf: this also runs in the crash handler (crash.c).  Reading
     * the code object's strings and line table allocates nothing. */
    btc_text_add(t, "  File \"");
    add_str(t, code->co_filename);
    btc_text_add(t, "\", line ");
    int line = PyCode_Addr2Line(code, f->lasti);
    if (line < 0)
        btc_text_add(t, "?");
    else
        btc_text_add_uint(t, (uint64_t)line, 10);
    btc_text_add(t, ", in ");
    add_str(t, code->co_qualname);
    btc_text_add(t, "\n");
}

/* The module's file name without its directory. */
static const char *base_name(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : path && path[0] ? path : "?";
}

/* "  [module] function+0xoff (file:line)": the name from the symbol table,
 * the place from DWARF when the module has it (the innermost inlined
 * call's line: where the pc is).  This runs in the reporting thread, not
 * in a handler: the lookup may decode a compile unit (bounded, cached). */
static void add_native(btc_text *t, const btc_frame *f)
{
    btc_native_info info;
    btc_srcframe level;
    char names[1024];
    int levels = btc_resolve_native(f->addr, f->flags, &info, &level, 1, names, sizeof names);
    if (levels < 0) {
        btc_text_addf(t, "  [?] %#lx\n", (unsigned long)f->addr);
        return;
    }
    uintptr_t pc = f->flags & (BTC_F_EXACT | BTC_F_SIGNAL) ? f->addr : f->addr - 1;
    if (info.symbol)
        btc_text_addf(t, "  [%s] %s+%#lx", base_name(info.module), info.symbol, (unsigned long)(pc - info.symbol_addr));
    else
        btc_text_addf(t, "  [%s] +%#lx", base_name(info.module), (unsigned long)(pc - info.module_base));
    if (levels > 0 && level.file && level.line > 0)
        btc_text_addf(t, " (%s:%d)", level.file, level.line);
    btc_text_add(t, "\n");
}

static const struct {
    unsigned bit;
    const char *why;
} partial_reasons[] = {
    {BTC_PARTIAL_LOCKED, "the module list was busy: Python frames only"},
    {BTC_PARTIAL_NO_TABLE, "the walk stopped at a module whose unwind table was not built"},
    {BTC_PARTIAL_NO_MODULE, "the walk stopped at code in no known module"},
    {BTC_PARTIAL_TRUNCATED, "more frames than a sample holds"},
    {BTC_PARTIAL_OFF_STACK, "the stack pointer was outside the thread's stack: Python frames only"},
    {BTC_PARTIAL_PYTHON, "the Python frame chain could not be read to its end"},
    {BTC_PARTIAL_SWITCHING, "interrupted inside a greenlet switch: its innermost native frames only"},
    {BTC_PARTIAL_CUT, "the walk stopped before the stack's end (a caller could not be recovered)"},
};

/* The first `inner` frames, native ones written by add_native_frame, then
 * the partial reasons. */
static void sample_text(const btc_sigsample *s, int inner, btc_text *t,
                        void (*add_native_frame)(btc_text *, const btc_frame *))
{
    for (int i = 0; i < inner && i < s->n && i < BTC_SIGNAL_FRAMES; i++) {
        if (s->frames[i].kind == BTC_KIND_PYTHON)
            add_python(t, &s->frames[i]);
        else
            add_native_frame(t, &s->frames[i]);
    }
    for (size_t i = 0; i < sizeof partial_reasons / sizeof *partial_reasons; i++)
        if (s->partial & partial_reasons[i].bit) {
            btc_text_add(t, "  (partial: ");
            btc_text_add(t, partial_reasons[i].why);
            btc_text_add(t, ")\n");
        }
}

void btc_sigsample_inner_text(const btc_sigsample *s, int inner, btc_text *t)
{
    sample_text(s, inner, t, add_native);
}

void btc_sigsample_text(const btc_sigsample *s, btc_text *t)
{
    btc_sigsample_inner_text(s, s->n, t);
}

/* "  [module] +0xoff" (offset from the module's load bias, as `addr2line
 * -e module` takes it), or "  [?] 0xpc": no symbol is looked up (that reads
 * files and allocates).  The module list lock is held by the caller, or
 * not at all (modules_locked false: busy, perhaps held by the crashed code). */
static bool modules_locked;

static void add_native_module(btc_text *t, const btc_frame *f)
{
    uintptr_t pc = f->flags & (BTC_F_EXACT | BTC_F_SIGNAL) ? f->addr : f->addr - 1;
    const btc_module *m = modules_locked ? btc_module_find(pc) : NULL;
    btc_text_add(t, "  [");
    btc_text_add(t, m ? base_name(m->path) : "?");
    btc_text_add(t, m ? "] +" : "] ");
    btc_text_add_uint(t, m ? pc - m->bias : pc, 16);
    btc_text_add(t, "\n");
}

void btc_sigsample_crash_text(const btc_sigsample *s, btc_text *t)
{
    modules_locked = btc_modules_try_acquire_prebuilt();
    sample_text(s, s->n, t, add_native_module);
    if (modules_locked)
        btc_modules_release();
    modules_locked = false;
}

int btc_sigsample_format(const btc_sigsample *s, char *buf, size_t size)
{
    if (!size)
        return 0;
    btc_text t = {buf, size, 0};
    buf[0] = 0;
    btc_sigsample_text(s, &t);
    return (int)t.len;
}
