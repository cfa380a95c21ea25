/* A signal-context sample as text, written by a thread that may not take
 * the GIL (the sampled thread may hold it, stuck in C).
 *
 * Native frames are named from the symbol tables in C (btc_resolve_native,
 * which reads ELF files without Python objects), with file:line where the
 * module has DWARF.  Python frames are read from copies of their code
 * objects, strings and line tables (btc_read_own), as faulthandler reads
 * them raw but never in place: the sampled thread runs on while this
 * formats and may free a code object meanwhile (add_python).
 */
#include <Python.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "capture/modules.h"
#include "capture/signal_capture.h"
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

/* A str's characters, non-ASCII ones as '?', at most 200 (no allocation).
 * s may be a copy of the object (its header and characters), not the object. */
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

/* How a Python frame's objects are read: btc_read_own, or btc_read_sampled. */
typedef bool (*object_reader)(void *dst, uintptr_t src, size_t n);

static void add_str_read(btc_text *t, uintptr_t s, object_reader read)
{
    PyASCIIObject header;
    union {
        PyCompactUnicodeObject object;
        char bytes[sizeof(PyCompactUnicodeObject) + 200 * 4];   /* what add_str reads: its first 200 characters */
    } copy;
    if (!s || !read(&header, s, sizeof header) || header.ob_base.ob_type != &PyUnicode_Type ||
        !header.state.compact || header.state.kind < 1 || header.state.kind > 4) {
        btc_text_add(t, "?");
        return;
    }
    size_t chars = (size_t)(header.length < 200 ? header.length : 200) * header.state.kind;
    size_t fixed = header.state.ascii ? sizeof(PyASCIIObject) : sizeof(PyCompactUnicodeObject);
    if (header.length < 0 || !read(copy.bytes, s, fixed + chars)) {
        btc_text_add(t, "?");
        return;
    }
    copy.object._base.length = header.length < 200 ? header.length : 200;   /* what was copied */
    add_str(t, (PyObject *)&copy.object);
}

void btc_text_add_str_own(btc_text *t, uintptr_t s)
{
    add_str_read(t, s, btc_read_own);
}

void btc_text_add_cstr_own(btc_text *t, uintptr_t s, size_t max)
{
    char chunk[17];
    for (size_t done = 0; s && done < max; done += 16) {
        if (!btc_read_own(chunk, s + done, 16) && !btc_read_own(chunk, s + done, 1))
            return;
        chunk[16] = 0;
        btc_text_add(t, chunk);
        if (memchr(chunk, 0, 16))
            return;
    }
}

/* The line of instruction offset lasti in code, a copy of a code object:
 * its line table is copied too, into table (at most LINE_TABLE_BYTES: a
 * longer table's later lines are "?", as is a table that cannot be read),
 * and decoded by PyCode_Addr2Line on the copies. */
#define LINE_TABLE_BYTES 16384   /* all but 1 of the 58,209 code objects of 3.11's stdlib */

typedef union {
    PyBytesObject object;
    char bytes[sizeof(PyBytesObject) + LINE_TABLE_BYTES];
} line_table;

static int line_of(PyCodeObject *code, int lasti, object_reader read, line_table *table)
{
    PyBytesObject header;
    uintptr_t at = (uintptr_t)code->co_linetable;
    if (!at || !read(&header, at, sizeof header) || header.ob_base.ob_base.ob_type != &PyBytes_Type ||
        header.ob_base.ob_size < 0)
        return -1;
    size_t n = header.ob_base.ob_size < LINE_TABLE_BYTES ? (size_t)header.ob_base.ob_size : LINE_TABLE_BYTES;
    if (!read(table->bytes, at, offsetof(PyBytesObject, ob_sval) + n))
        return -1;
    table->object.ob_base.ob_size = (Py_ssize_t)n;
    code->co_linetable = (PyObject *)&table->object;
#if PY_VERSION_HEX < 0x030C0000
    code->_co_linearray = NULL;   /* 3.11's cache of decoded lines: not copied */
#else
    code->_co_monitoring = NULL;  /* 3.12+: lines from sys.monitoring's data when a tracer set it: not copied */
#endif
    return PyCode_Addr2Line(code, lasti);
}

/* "  File "...", line N, in name".  No printf: this also runs in the crash
 * handler (crash.c).  Nothing is read in place: the code object, its strings
 * and its line table are copied first (btc_read_own; under qemu-user, which
 * does not emulate process_vm_readv, a sample's are read in place, as its
 * capture read them).  The thread that owned
 * the code object ran on while this formats (a sample is formatted without
 * the GIL) and may have freed it (module code after its import), and a
 * crashed process's heap may be corrupt: either gives "?" or a note, never
 * a read of freed or unmapped memory. */
static void add_python(btc_text *t, const btc_frame *f, object_reader read, line_table *table)
{
    PyCodeObject code;
    if (!read(&code, f->addr, sizeof code) || !PyCode_Check((PyObject *)&code)) {
        btc_text_add(t, "  (a Python frame whose code object is gone: ");
        btc_text_add_uint(t, f->addr, 16);
        btc_text_add(t, ")\n");
        return;
    }
    btc_text_add(t, "  File \"");
    add_str_read(t, (uintptr_t)code.co_filename, read);
    btc_text_add(t, "\", line ");
    int line = line_of(&code, f->lasti, read, table);
    if (line < 0)
        btc_text_add(t, "?");
    else
        btc_text_add_uint(t, (uint64_t)line, 10);
    btc_text_add(t, ", in ");
    add_str_read(t, (uintptr_t)code.co_qualname, read);
    btc_text_add(t, "\n");
}

/* A sample's frame: where process_vm_readv is not emulated (qemu-user), in
 * place, as the capture read it (btc_read_sampled). */
static void add_python_sampled(btc_text *t, const btc_frame *f)
{
    line_table table;   /* (on the stack of the thread that formats: the watchdog's, the signal dump's) */
    add_python(t, f, btc_read_sampled, &table);
}

/* A crashed process's frame: copied or not read at all (a corrupt heap).
 * Its line table goes to static memory, not the stack: the crash handler
 * runs on the thread's alternate stack, which may be faulthandler's (~16 KB,
 * malloc'd: enabled after btcore, it replaces ours), and a 16 KB copy there
 * wrote past its bottom into the heap below it: a parked greenlet's saved
 * stack, seen in the core as that greenlet's walk cut short.  One report
 * at a time per process (crash.c's reporter), so one table serves. */
static void add_python_crashed(btc_text *t, const btc_frame *f)
{
    static line_table table;
    add_python(t, f, btc_read_own, &table);
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

typedef void (*frame_writer)(btc_text *, const btc_frame *);

/* n frames, Python ones written by add_python_frame and native ones by
 * add_native_frame, then the partial reasons. */
static void frames_text(const btc_frame *frames, int n, unsigned partial, btc_text *t,
                        frame_writer add_python_frame, frame_writer add_native_frame)
{
    for (int i = 0; i < n; i++) {
        if (frames[i].kind == BTC_KIND_PYTHON)
            add_python_frame(t, &frames[i]);
        else
            add_native_frame(t, &frames[i]);
    }
    for (size_t i = 0; i < sizeof partial_reasons / sizeof *partial_reasons; i++)
        if (partial & partial_reasons[i].bit) {
            btc_text_add(t, "  (partial: ");
            btc_text_add(t, partial_reasons[i].why);
            btc_text_add(t, ")\n");
        }
}

void btc_sigsample_inner_text(const btc_sigsample *s, int inner, btc_text *t)
{
    int n = inner < s->n ? inner : s->n;
    frames_text(s->frames, n < BTC_SIGNAL_FRAMES ? n : BTC_SIGNAL_FRAMES, s->partial, t, add_python_sampled, add_native);
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

void btc_frames_crash_text(const btc_frame *frames, int n, unsigned partial, btc_text *t)
{
    modules_locked = btc_modules_try_acquire_prebuilt();
    frames_text(frames, n, partial, t, add_python_crashed, add_native_module);
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
