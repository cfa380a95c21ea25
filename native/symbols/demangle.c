/* Demangling: Rust (legacy and v0) and Cython here, C++ through the C++ runtime.
 *
 * Rust legacy names are valid Itanium names, so they are recognised first
 * (by their trailing hash) or the C++ demangler would print the hash.
 * C++ goes to __cxa_demangle, looked up at run time so that the extension
 * does not link libstdc++: a process with C++ code already has it loaded.
 *
 * Rust v0 (_R...): paths (crate roots, nested names, closures and other
 * special namespaces, inherent and trait impls, generic arguments) with
 * basic types, references, pointers, slices, arrays and tuples; lifetimes
 * and const generic values print as '_ and _.  Function pointers, dyn
 * traits and punycode identifiers are not decoded: those names fail and
 * stay mangled.
 *
 * Cython names its C functions after the Python path, each part prefixed by
 * its length (__pyx_pw_6gevent_3hub_3Hub_5run: gevent.hub.Hub.run, the last
 * part after a per-module counter); shown dotted with a " [cython]" suffix.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base.h"

/* ---- output buffer ---- */

typedef struct {
    char *p, *end;    /* end leaves room for the NUL */
    bool overflow;
} out_buf;

static void put(out_buf *o, const char *s, size_t n)
{
    if (n == 0)
        return;
    if ((size_t)(o->end - o->p) < n) {
        o->overflow = true;
        return;
    }
    memcpy(o->p, s, n);
    o->p += n;
}

static void puts_(out_buf *o, const char *s) { put(o, s, strlen(s)); }

/* ---- C++ ---- */

typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);

static cxa_demangle_fn cxa_demangle;
static pthread_once_t cxa_once = PTHREAD_ONCE_INIT;

static void find_cxa_demangle(void)
{
    /* Prefer the runtime already loaded; load it privately otherwise. */
    void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (h)
        cxa_demangle = (cxa_demangle_fn)dlsym(h, "__cxa_demangle");
}

static bool demangle_cpp(const char *name, out_buf *o)
{
    pthread_once(&cxa_once, find_cxa_demangle);
    int status = -1;
    char *s = cxa_demangle ? cxa_demangle(name, NULL, NULL, &status) : NULL;
    if (s && status == 0)
        puts_(o, s);
    free(s);
    return status == 0;
}

/* ---- Rust legacy: _ZN <len><ident>... 17h<16 hex digits> E ---- */

static const struct {
    const char *code, *text;
} legacy_escapes[] = {
    {"SP", "@"}, {"BP", "*"}, {"RF", "&"}, {"LT", "<"}, {"GT", ">"}, {"LP", "("}, {"RP", ")"}, {"C", ","},
};

/* One "$...$" escape at s (after the '$'); returns its length or 0. */
static size_t legacy_escape(const char *s, size_t n, out_buf *o)
{
    const char *close = memchr(s, '$', n);
    if (!close)
        return 0;
    size_t len = (size_t)(close - s);
    for (size_t k = 0; k < sizeof legacy_escapes / sizeof *legacy_escapes; k++)
        if (strlen(legacy_escapes[k].code) == len && memcmp(s, legacy_escapes[k].code, len) == 0) {
            puts_(o, legacy_escapes[k].text);
            return len + 1;
        }
    if (len >= 2 && len <= 3 && s[0] == 'u') {   /* $u7e$: an ASCII code in hex */
        char hex[3] = {s[1], len == 3 ? s[2] : 0, 0}, *end;
        long c = strtol(hex, &end, 16);
        if (*end == 0 && c >= 0x20 && c < 0x7f) {
            char ch = (char)c;
            put(o, &ch, 1);
            return len + 1;
        }
    }
    return 0;
}

static bool legacy_ident(const char *s, size_t n, out_buf *o)
{
    if (n >= 2 && s[0] == '_' && s[1] == '$') {   /* "_$" protects a leading '$' */
        s++;
        n--;
    }
    for (size_t i = 0; i < n;) {
        if (s[i] == '$') {
            size_t used = legacy_escape(s + i + 1, n - i - 1, o);
            if (!used)
                return false;
            i += 1 + used;
        } else if (s[i] == '.' && i + 1 < n && s[i + 1] == '.') {
            puts_(o, "::");
            i += 2;
        } else {
            put(o, s + i++, 1);
        }
    }
    return true;
}

static bool is_legacy_hash(const char *s, size_t n)
{
    if (n != 17 || s[0] != 'h')
        return false;
    for (size_t i = 1; i < n; i++)
        if (!strchr("0123456789abcdef", s[i]))
            return false;
    return true;
}

static bool demangle_rust_legacy(const char *name, out_buf *o)
{
    const char *p = name + 3;   /* past "_ZN" */
    bool first = true;
    while (*p >= '0' && *p <= '9') {
        char *end;
        unsigned long len = strtoul(p, &end, 10);
        if (len == 0 || len > strlen(end))
            return false;
        p = end + len;
        if (*p == 'E' && is_legacy_hash(end, len))
            return p[1] == 0 || p[1] == '.';   /* ".llvm.N" and similar suffixes are dropped */
        if (!first)
            puts_(o, "::");
        first = false;
        if (!legacy_ident(end, len, o))
            return false;
    }
    return false;   /* no hash: an ordinary C++ name */
}

/* ---- Rust v0 ---- */

/* Nesting bound: names are short, recursion on garbage must stop. */
#define MAX_V0_DEPTH 64

/* Every read goes through v0_peek/v0_next, which never pass end: garbage
 * and truncated names stop there instead of reading past the string. */
typedef struct {
    const char *start, *p;   /* start: just past "_R", where backrefs count from */
    const char *end;         /* the name's terminating NUL */
    out_buf *o;
    int depth;
    bool bad;
} v0;

static bool v0_fail(v0 *s)
{
    s->bad = true;
    return false;
}

/* The next character, or 0 at the end of the name. */
static char v0_peek(const v0 *s)
{
    return s->p < s->end ? *s->p : 0;
}

/* The next character, consumed; 0 (and no move) at the end of the name. */
static char v0_next(v0 *s)
{
    return s->p < s->end ? *s->p++ : 0;
}

static bool v0_eat(v0 *s, char c)
{
    if (c == 0 || v0_peek(s) != c)
        return false;
    s->p++;
    return true;
}

/* base-62-number: digits 0-9 a-z A-Z, closed by '_' ("_" alone is 0). */
static uint64_t v0_base62(v0 *s)
{
    if (v0_eat(s, '_'))
        return 0;
    uint64_t v = 0;
    for (int i = 0; i < 12; i++) {
        char c = v0_next(s);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10
              : c >= 'A' && c <= 'Z' ? c - 'A' + 36 : c == '_' ? -2 : -1;
        if (d == -2)
            return v + 1;
        if (d < 0)
            break;
        v = v * 62 + (uint64_t)d;
    }
    v0_fail(s);
    return 0;
}

/* Optional disambiguator "s<base62>": its value, or 0 (check s->bad). */
static uint64_t v0_disambiguator(v0 *s)
{
    if (!v0_eat(s, 's'))
        return 0;
    uint64_t v = v0_base62(s);
    return s->bad ? 0 : v + 1;
}

/* "<decimal length>[_]<bytes>": the bytes must lie inside the name. */
static bool v0_ident(v0 *s, const char **text, size_t *len)
{
    if (s->bad || v0_peek(s) == 'u')
        return v0_fail(s);   /* punycode: not decoded */
    const char *digits = s->p;
    size_t n = 0;
    for (char c; (c = v0_peek(s)) >= '0' && c <= '9'; s->p++) {
        n = n * 10 + (size_t)(c - '0');
        if (n > (size_t)(s->end - s->start))
            return v0_fail(s);   /* longer than the whole name */
    }
    if (s->p == digits)
        return v0_fail(s);
    v0_eat(s, '_');
    if (n > (size_t)(s->end - s->p))
        return v0_fail(s);
    *text = s->p;
    *len = n;
    s->p += n;
    return true;
}

static bool v0_path(v0 *s);
static bool v0_type(v0 *s);

/* "B<base62>": continue at an earlier position, then come back. */
static bool v0_backref(v0 *s, bool (*parse)(v0 *))
{
    uint64_t at = v0_base62(s);
    if (s->bad || at >= (uint64_t)(s->p - s->start))
        return v0_fail(s);
    const char *resume = s->p;
    s->p = s->start + at;
    bool ok = parse(s);
    s->p = resume;
    return ok;
}

static bool v0_enter(v0 *s)
{
    return ++s->depth <= MAX_V0_DEPTH || v0_fail(s);
}

static const char *basic_type(char c)
{
    static const char codes[] = "abcdefhijlmnostuvxyz";
    static const char *const names[] = {"i8", "bool", "char", "f64", "str", "f32", "u8", "isize", "usize",
                                        "i32", "u32", "i128", "u128", "i16", "u16", "()", "...", "i64",
                                        "u64", "!"};
    const char *k = c ? strchr(codes, c) : NULL;
    return k ? names[k - codes] : NULL;
}

/* A const value (array length, const generic): its basic type, then an
 * optional 'n' (negative) and hex digits closed by '_'; shown as "_". */
static bool v0_const(v0 *s)
{
    puts_(s->o, "_");
    if (v0_eat(s, 'p'))
        return true;
    if (v0_eat(s, 'B')) {
        v0_base62(s);
        return !s->bad;
    }
    if (!basic_type(v0_next(s)))
        return v0_fail(s);
    v0_eat(s, 'n');
    while (v0_peek(s) && strchr("0123456789abcdef", v0_peek(s)))
        s->p++;
    return v0_eat(s, '_') || v0_fail(s);
}

static bool v0_generic_arg(v0 *s)
{
    if (v0_eat(s, 'L')) {
        v0_base62(s);
        puts_(s->o, "'_");
        return !s->bad;
    }
    return v0_eat(s, 'K') ? v0_const(s) : v0_type(s);
}

/* Items up to 'E', separated by ", ". */
static bool v0_list(v0 *s, bool (*item)(v0 *))
{
    for (int n = 0; !v0_eat(s, 'E'); n++) {
        if (v0_peek(s) == 0 || s->bad)
            return v0_fail(s);
        if (n)
            puts_(s->o, ", ");
        if (!item(s))
            return false;
    }
    return true;
}

/* open, a list of items, close: "(A, B)", "<T, U>". */
static bool v0_enclosed(v0 *s, const char *open, bool (*item)(v0 *), const char *close)
{
    puts_(s->o, open);
    if (!v0_list(s, item))
        return false;
    puts_(s->o, close);
    return true;
}

static bool v0_type_inner(v0 *s)
{
    char c = v0_peek(s);
    const char *basic = basic_type(c);
    if (basic) {
        s->p++;
        puts_(s->o, basic);
        return true;
    }
    switch (c) {
    case 'R': case 'Q':
        s->p++;
        puts_(s->o, c == 'R' ? "&" : "&mut ");
        if (v0_eat(s, 'L'))
            v0_base62(s);
        return !s->bad && v0_type(s);
    case 'P': case 'O':
        s->p++;
        puts_(s->o, c == 'P' ? "*const " : "*mut ");
        return v0_type(s);
    case 'S': case 'A':
        s->p++;
        puts_(s->o, "[");
        if (!v0_type(s))
            return false;
        if (c == 'A') {
            puts_(s->o, "; ");
            if (!v0_const(s))
                return false;
        }
        puts_(s->o, "]");
        return true;
    case 'T':
        s->p++;
        return v0_enclosed(s, "(", v0_type, ")");
    case 'B':
        s->p++;
        return v0_backref(s, v0_type);
    default:
        return v0_path(s);   /* F (fn pointers) and D (dyn) fail inside */
    }
}

/* One grammar rule, one level deeper (the recursion is bounded). */
static bool v0_nested(v0 *s, bool (*rule)(v0 *))
{
    if (!v0_enter(s))
        return false;
    bool ok = rule(s);
    s->depth--;
    return ok && !s->bad;
}

static bool v0_type(v0 *s) { return v0_nested(s, v0_type_inner); }

/* "<type>" (an inherent impl) or "<type as trait-path>" (a trait impl). */
static bool v0_qualified(v0 *s, bool trait)
{
    puts_(s->o, "<");
    if (!v0_type(s))
        return false;
    if (trait) {
        puts_(s->o, " as ");
        if (!v0_path(s))
            return false;
    }
    puts_(s->o, ">");
    return true;
}

static bool v0_path_inner(v0 *s)
{
    const char *text;
    size_t len;
    char kind = v0_next(s);
    switch (kind) {
    case 'C':
        v0_disambiguator(s);
        if (!v0_ident(s, &text, &len))
            return false;
        put(s->o, text, len);
        return true;
    case 'N': {
        char ns = v0_next(s);
        if (!((ns >= 'a' && ns <= 'z') || (ns >= 'A' && ns <= 'Z')) || !v0_path(s))
            return v0_fail(s);
        uint64_t dis = v0_disambiguator(s);
        if (!v0_ident(s, &text, &len))
            return false;
        puts_(s->o, "::");
        if (ns >= 'a') {   /* a lowercase namespace is an ordinary name */
            put(s->o, text, len);
            return true;
        }
        /* Special namespaces: C closure, S shim, others by letter. */
        char tag[64];
        int n = snprintf(tag, sizeof tag, "{%s%s%.*s#%llu}", ns == 'C' ? "closure" : ns == 'S' ? "shim" : "",
                         len ? ":" : "", (int)(len < 32 ? len : 32), text, (unsigned long long)dis);
        put(s->o, tag, n > 0 && (size_t)n < sizeof tag ? (size_t)n : 0);
        return true;
    }
    case 'M':
    case 'X': {
        bool trait = kind == 'X';
        v0_disambiguator(s);
        if (s->bad)
            return false;
        /* The impl's own path only says where the impl is: skip it silently. */
        out_buf *real = s->o, sink = {NULL, NULL, false};
        s->o = &sink;
        bool ok = v0_path(s);
        s->o = real;
        return ok && v0_qualified(s, trait);
    }
    case 'Y':
        return v0_qualified(s, true);
    case 'I':
        if (!v0_path(s))
            return false;
        return v0_enclosed(s, "<", v0_generic_arg, ">");
    case 'B':
        return v0_backref(s, v0_path);
    default:
        return v0_fail(s);
    }
}

static bool v0_path(v0 *s) { return v0_nested(s, v0_path_inner); }

static bool demangle_rust_v0(const char *name, out_buf *o)
{
    v0 s = {.start = name + 2, .p = name + 2, .end = name + strlen(name), .o = o};
    while (v0_peek(&s) >= '0' && v0_peek(&s) <= '9')   /* encoding version */
        s.p++;
    s.start = s.p;
    return v0_path(&s);   /* an instantiating crate may follow: not shown */
}

/* ---- Cython ---- */

/* The path after a Cython prefix; *counted: def functions (wrappers pw_,
 * implementations pf_), whose name follows a counter, not a length. */
static const char *cython_path(const char *name, bool *counted)
{
    static const char *const prefixes[] = {"__pyx_pw_", "__pyx_pf_", "__pyx_f_", "__pyx_gb_", "__pyx_pymod_"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) {
            *counted = i < 2;
            return name + strlen(prefixes[i]);
        }
    return NULL;
}

static bool starts_with_digit(const char *s) { return *s >= '0' && *s <= '9'; }

/* Length-prefixed parts "6gevent_3hub_3Hub_5run": "N<N chars>_" is a path
 * component, unless (def functions) no counted part follows it: then it is
 * the counter and the whole name ("3set_default_hub_class": counter 3,
 * set_default_hub_class).  A part without digits is a cdef function's bare
 * name. */
static bool demangle_cython(const char *name, out_buf *o)
{
    bool counted;
    const char *rest = cython_path(name, &counted);
    if (!rest || !*rest)
        return false;
    for (bool first = true; *rest; first = false) {
        if (!first)
            puts_(o, ".");
        size_t digits = strspn(rest, "0123456789");
        const char *body = rest + digits;
        size_t size = digits && digits < 8 ? (size_t)strtoul(rest, NULL, 10) : 0;
        bool component = digits && strlen(body) > size && body[size] == '_' &&
                         !(counted && !starts_with_digit(body + size + 1));
        if (component) {
            put(o, body, size);
            rest = body + size + 1;
        } else {
            puts_(o, body);
            break;
        }
    }
    puts_(o, " [cython]");
    return true;
}

int btc_demangle(const char *name, char *buf, size_t size)
{
    if (!name || !buf || size == 0)
        return -1;
    out_buf o = {buf, buf + size - 1, false};
    bool ok;
    if (strncmp(name, "_R", 2) == 0)
        ok = demangle_rust_v0(name, &o);
    else if (strncmp(name, "_ZN", 3) == 0 && demangle_rust_legacy(name, &o))
        ok = true;
    else if (strncmp(name, "_Z", 2) == 0) {
        o = (out_buf){buf, buf + size - 1, false};   /* discard a partial Rust attempt */
        ok = demangle_cpp(name, &o);
    } else
        ok = demangle_cython(name, &o);
    if (!ok || o.overflow)
        return -1;
    *o.p = 0;
    return 0;
}
