/* Symbolization entries: what resolution asks of the native core.
 *
 *   btc_resolve_native()   a captured pc -> module, symbol, source lines and inline
 *                          chain, names demangled: one call per new pc
 *   btc_symbolize_file()   file + address -> source lines and inline chain (DWARF);
 *                          tests and decoded tokens
 *   btc_file_symbol()      file + address -> symbol, for a module not loaded (decoded
 *                          tokens)
 *
 * All go through one bounded cache of decoded files (path -> btc_dwarf, which
 * holds the file's symbol tables too), and release the GIL while they read
 * and decode files (common/gil.h).
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capture/evalloop.h"
#include "capture/modules.h"
#include "common/gil.h"
#include "symbols/dwarf.h"
#include "symbols/vdso.h"

/* ---- the cffi-facing cache: path -> decoded file ----
 *
 * One mutex guards everything below and every btc_dwarf (their lazy
 * decoding mutates them); lookups after the first per unit are a few
 * binary searches, so contention is short.  A file is identified by its
 * path and its inode/size/mtime, so a rebuilt library is read afresh. */

#define MAX_CACHED_FILES 64

typedef struct {
    char *path;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    btc_dwarf *dwarf;      /* NULL: not an ELF file we can read (remembered too) */
    uint8_t build_id[BTC_BUILD_ID_MAX];   /* the file's, from its PT_NOTE segments (first bytes) */
    int build_id_len;                     /* its full length; 0: none; -1: not ELF */
    uint64_t last_use;
} cached_file;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_file cache[MAX_CACHED_FILES];
static int cache_limit = 16;
static size_t byte_budget = BTC_SYMBOLIZE_DEFAULT_BUDGET;
static uint64_t use_clock;
static char debug_root[PATH_MAX] = "/usr/lib/debug";

/* Modules whose path names another build than the one loaded: where their
 * file was found instead ("": nowhere), so that each of their pcs does not
 * read /proc/self/maps again.  A few: upgrades under a running process
 * touch few libraries.  cache_lock held. */
#define SWAPPED_FILES 8
typedef struct {
    uint64_t module_id;
    char path[64];   /* /proc/self/map_files/LO-HI */
} swapped_file;
static swapped_file swapped[SWAPPED_FILES];
static unsigned swapped_next;

/* Fork: the lock is held with the GIL released, so another thread may hold
 * it at fork(); see modules.c for why the child, not a prepare handler,
 * deals with that.  A lock found held in the child means an entry may be
 * half made: every entry is abandoned (leaked, not freed) and the cache
 * starts empty. */
static void cache_after_fork_child(void)
{
    if (pthread_mutex_trylock(&cache_lock) == 0) {
        pthread_mutex_unlock(&cache_lock);
        return;
    }
    pthread_mutex_init(&cache_lock, NULL);
    memset(cache, 0, sizeof cache);
    memset(swapped, 0, sizeof swapped);
    debug_root[sizeof debug_root - 1] = 0;
}

__attribute__((constructor)) static void cache_fork_safe(void)
{
    pthread_atfork(NULL, NULL, cache_after_fork_child);
}

static void drop(cached_file *c)
{
    btc_dwarf_close(c->dwarf);
    free(c->path);
    memset(c, 0, sizeof *c);
}

static bool same_file(const cached_file *c, const char *path, const struct stat *st)
{
    return c->path && strcmp(c->path, path) == 0 && c->dev == st->st_dev && c->ino == st->st_ino &&
           c->size == st->st_size && c->mtime.tv_sec == st->st_mtim.tv_sec &&
           c->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* The slot to reuse: an empty one, else the least recently used. */
static cached_file *free_slot(void)
{
    cached_file *victim = &cache[0];
    for (int i = 0; i < cache_limit; i++) {
        if (!cache[i].path)
            return &cache[i];
        if (cache[i].last_use < victim->last_use)
            victim = &cache[i];
    }
    drop(victim);
    return victim;
}

/* The entry of the file path names, if it is cached as the file st
 * describes; an entry of path for another file (rebuilt, swapped) is
 * dropped.  cache_lock held. */
static cached_file *find_entry(const char *path, const struct stat *st)
{
    for (int i = 0; i < cache_limit; i++)
        if (cache[i].path && strcmp(cache[i].path, path) == 0) {
            if (same_file(&cache[i], path, st))
                return &cache[i];
            drop(&cache[i]);
        }
    return NULL;
}

/* The cache entry of the file open as fd, named path (made on first use);
 * NULL if it cannot be stat'ed or remembered.  cache_lock held. */
static cached_file *cached_fd(int fd, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return NULL;
    cached_file *c = find_entry(path, &st);
    if (!c) {
        c = free_slot();
        c->path = strdup(path);
        if (!c->path)
            return NULL;
        c->dev = st.st_dev;
        c->ino = st.st_ino;
        c->size = st.st_size;
        c->mtime = st.st_mtim;
        c->dwarf = btc_dwarf_open(fd, path, debug_root);
        c->build_id_len = btc_elf_file_build_id(fd, c->build_id, (int)sizeof c->build_id);
    }
    c->last_use = ++use_clock;
    return c;
}

/* The cache entry of the file at path: found by stat() (no open) when it
 * is cached, else opened as a regular file only (btc_open_regular) and
 * read through that descriptor.  cache_lock held. */
static cached_file *cached(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return NULL;
    cached_file *c = find_entry(path, &st);
    if (c) {
        c->last_use = ++use_clock;
        return c;
    }
    int fd = btc_open_regular(path, NULL);
    if (fd < 0)
        return NULL;
    c = cached_fd(fd, path);
    close(fd);
    return c;
}

static size_t memory_held(void)
{
    size_t n = 0;
    for (int i = 0; i < MAX_CACHED_FILES; i++)
        n += btc_dwarf_memory(cache[i].dwarf);
    return n;
}

/* The file to drop when no unit is left to give back: the least recently
 * used one other than the latest. */
static cached_file *oldest_file(void)
{
    cached_file *oldest = NULL;
    for (int i = 0; i < MAX_CACHED_FILES; i++)
        if (cache[i].path && cache[i].last_use != use_clock && (!oldest || cache[i].last_use < oldest->last_use))
            oldest = &cache[i];
    return oldest;
}

/* Give back decoded units, least recently used first, then whole files,
 * until the cache holds at most byte_budget bytes (the latest lookup's
 * unit and file stay, even alone over the budget).  Called after every
 * lookup, once its results are copied out.  cache_lock held. */
static uint64_t decodes_checked = UINT64_MAX;   /* btc_dwarf_decodes() at the last check */

static void keep_within_budget(void)
{
    if (btc_dwarf_decodes() == decodes_checked)
        return;   /* nothing decoded since: the sum is what it was (a lookup's hot path) */
    decodes_checked = btc_dwarf_decodes();
    size_t held = memory_held();
    while (held > byte_budget) {
        cached_file *unit_owner = NULL;
        uint64_t when = UINT64_MAX;
        for (int i = 0; i < MAX_CACHED_FILES; i++) {
            uint64_t t = btc_dwarf_oldest_use(cache[i].dwarf);
            if (t < when) {
                when = t;
                unit_owner = &cache[i];
            }
        }
        cached_file *file = unit_owner ? NULL : oldest_file();
        if (!unit_owner && !file)
            break;
        if (unit_owner) {
            held -= btc_dwarf_forget_oldest(unit_owner->dwarf);
        } else {
            held -= btc_dwarf_memory(file->dwarf);
            drop(file);
        }
    }
}

/* fd -1: the file at path, else the file open as fd. */
static btc_dwarf *cached_dwarf(int fd, const char *path)
{
    cached_file *c = fd < 0 ? cached(path) : cached_fd(fd, path);
    return c ? c->dwarf : NULL;
}

/* Copy s into [*cursor, end); false when it does not fit. */
static bool copy_string(const char **s, char **cursor, const char *end)
{
    if (!*s)
        return true;
    size_t n = strlen(*s) + 1;
    if (n > (size_t)(end - *cursor))
        return false;
    memcpy(*cursor, *s, n);
    *s = *cursor;
    *cursor += n;
    return true;
}

int btc_symbolize_file(const char *path, uintptr_t vaddr, btc_srcframe *out, int max, char *buf,
                       size_t size)
{
    return btc_symbolize_fd(-1, path, vaddr, out, max, buf, size);
}

int btc_symbolize_fd(int fd, const char *path, uintptr_t vaddr, btc_srcframe *out, int max, char *buf,
                     size_t size)
{
    if (!path || !out || max < 1 || !buf)
        return 0;
    PyThreadState *gil = btc_gil_release();
    pthread_mutex_lock(&cache_lock);
    int n = btc_dwarf_lookup(cached_dwarf(fd, path), vaddr, out, max);
    char *cursor = buf;
    for (int i = 0; i < n; i++)
        if (!copy_string(&out[i].function, &cursor, buf + size) || !copy_string(&out[i].file, &cursor, buf + size))
            n = -1;
    keep_within_budget();
    pthread_mutex_unlock(&cache_lock);
    btc_gil_restore(gil);
    return n;
}

#define AHEAD_LEVELS 32   /* inline levels decoded per address (symbols/resolve.py asks as many) */

void btc_symbolize_ahead(const char *const *paths, const uintptr_t *vaddrs, int n, const int *stop)
{
    PyThreadState *gil = btc_gil_release();
    btc_srcframe levels[AHEAD_LEVELS];
    for (int i = 0; paths && vaddrs && i < n && !(stop && __atomic_load_n(stop, __ATOMIC_RELAXED)); i++) {
        if (!paths[i])
            continue;
        uintptr_t start;
        pthread_mutex_lock(&cache_lock);
        btc_dwarf *d = cached_dwarf(-1, paths[i]);
        btc_dwarf_symbol(d, vaddrs[i], &start);
        btc_dwarf_lookup(d, vaddrs[i], levels, AHEAD_LEVELS);
        keep_within_budget();
        pthread_mutex_unlock(&cache_lock);
    }
    btc_gil_restore(gil);
}

int btc_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr)
{
    return btc_file_symbol_fd(-1, path, vaddr, buf, size, sym_vaddr);
}

int btc_file_symbol_fd(int fd, const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr)
{
    if (!path || !buf || size == 0)
        return -1;
    PyThreadState *gil = btc_gil_release();   /* the first call per file reads its symbols */
    pthread_mutex_lock(&cache_lock);
    const char *name = btc_dwarf_symbol(cached_dwarf(fd, path), vaddr, sym_vaddr);
    int rc = -1;
    if (name && strlen(name) < size) {
        memcpy(buf, name, strlen(name) + 1);
        rc = 0;
    }
    pthread_mutex_unlock(&cache_lock);
    btc_gil_restore(gil);
    return rc;
}

long btc_symbolize_units_read(const char *path)
{
    long n = -1;
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < cache_limit; i++)
        if (cache[i].path && strcmp(cache[i].path, path) == 0)
            n = (long)btc_dwarf_units_read(cache[i].dwarf);
    pthread_mutex_unlock(&cache_lock);
    return n;
}

size_t btc_symbolize_memory(void)
{
    pthread_mutex_lock(&cache_lock);
    size_t n = memory_held();
    pthread_mutex_unlock(&cache_lock);
    return n;
}

void btc_symbolize_budget(size_t bytes)
{
    pthread_mutex_lock(&cache_lock);
    byte_budget = bytes;
    decodes_checked = UINT64_MAX;
    keep_within_budget();
    pthread_mutex_unlock(&cache_lock);
}

static void drop_all_locked(void)
{
    for (int i = 0; i < MAX_CACHED_FILES; i++)
        if (cache[i].path)
            drop(&cache[i]);
    memset(swapped, 0, sizeof swapped);
}

void btc_symbolize_limit(int max_files)
{
    pthread_mutex_lock(&cache_lock);
    drop_all_locked();
    cache_limit = max_files < 1 ? 1 : max_files > MAX_CACHED_FILES ? MAX_CACHED_FILES : max_files;
    pthread_mutex_unlock(&cache_lock);
}

void btc_symbolize_reset(void)
{
    pthread_mutex_lock(&cache_lock);
    drop_all_locked();
    pthread_mutex_unlock(&cache_lock);
}

void btc_symbolize_debug_root(const char *dir)
{
    pthread_mutex_lock(&cache_lock);
    drop_all_locked();
    snprintf(debug_root, sizeof debug_root, "%s", dir ? dir : "/usr/lib/debug");
    pthread_mutex_unlock(&cache_lock);
}

/* ---- one entry per captured native pc ---- */

/* Copy s, demangled when it is a mangled name, into [*cursor, end); false
 * when it does not fit. */
static bool copy_name(const char **s, char **cursor, const char *end)
{
    if (*s && btc_demangle(*s, *cursor, (size_t)(end - *cursor)) == 0) {
        *s = *cursor;
        *cursor += strlen(*cursor) + 1;
        return true;
    }
    return copy_string(s, cursor, end);
}

/* What the module list says of a pc, copied out of it: the module may be
 * unloaded once its lock is released. */
typedef struct {
    char path[PATH_MAX];
    uintptr_t bias;
    uint64_t id;
    char part[128];      /* a stripped eval loop's unnamed part: its name ("" if not one) */
    uintptr_t part_lo;
    bool vdso;           /* read from a copy of its image (symbols/vdso.c): it has no file */
    uintptr_t lo;        /* where its code is mapped */
    uint8_t build_id[BTC_BUILD_ID_MAX];   /* as mapped: its file must have it (btc_module_file) */
    size_t build_id_len;
} located_pc;

static bool locate(uintptr_t pc, located_pc *at)
{
    btc_modules_acquire();
    btc_module *m = btc_module_find(pc);
    if (m) {
        snprintf(at->path, sizeof at->path, "%s", m->path);
        at->bias = m->bias;
        at->id = m->id;
        at->vdso = m->path[0] != '/' && btc_vdso_holds(m->lo, m->hi);
        at->lo = m->lo;
        memcpy(at->build_id, m->build_id, sizeof at->build_id);
        at->build_id_len = m->build_id_len;
        at->part_lo = 0;
        const char *part = btc_eval_part_name(pc, &at->part_lo);
        snprintf(at->part, sizeof at->part, "%s", part ? part : "");
    }
    btc_modules_release();
    return m != NULL;
}

static swapped_file *swapped_of(uint64_t module_id)
{
    for (int i = 0; i < SWAPPED_FILES; i++)
        if (swapped[i].module_id == module_id && module_id)
            return &swapped[i];
    return NULL;
}

static void remember_swapped(uint64_t module_id, const char *path)
{
    swapped_file *s = &swapped[swapped_next++ % SWAPPED_FILES];
    s->module_id = module_id;
    snprintf(s->path, sizeof s->path, "%s", strlen(path) < sizeof s->path ? path : "");
}

static bool is_module_build(const cached_file *c, const located_pc *at)
{
    return btc_module_build_is(c->build_id, c->build_id_len, at->build_id, at->build_id_len);
}

/* The located module's file, decoded: found by stat() at its path when
 * that is cached as the module's build (a lookup's hot path), else opened
 * by btc_module_file(): its path's file if it is the module's build, else
 * the inode mapped (a library upgraded on disk since it was loaded), else
 * none.  The vDSO's is a copy of its image.  cache_lock held. */
static btc_dwarf *module_dwarf(const located_pc *at)
{
    if (at->vdso) {
        int fd = btc_vdso_fd();
        return fd >= 0 ? cached_dwarf(fd, at->path) : NULL;
    }
    struct stat st;
    cached_file *c = stat(at->path, &st) == 0 ? find_entry(at->path, &st) : NULL;
    if (c && is_module_build(c, at)) {
        c->last_use = ++use_clock;
        return c->dwarf;
    }
    swapped_file *known = swapped_of(at->id);
    if (known)   /* its path's file is another build: the inode mapped, or none */
        return known->path[0] && (c = cached(known->path)) && is_module_build(c, at) ? c->dwarf : NULL;
    static char used[PATH_MAX];   /* cache_lock held */
    int fd = btc_module_file(at->path, at->build_id, at->build_id_len, at->lo, used, sizeof used);
    c = fd >= 0 ? cached_fd(fd, used) : NULL;
    if (fd >= 0)
        close(fd);
    if (strcmp(used, at->path) != 0)
        remember_swapped(at->id, c ? used : "");
    return c && is_module_build(c, at) ? c->dwarf : NULL;
}

/* The symbol and source levels of pc in the located module; cache_lock held. */
static int symbolize_located(const located_pc *at, uintptr_t pc, btc_native_info *out, btc_srcframe *levels,
                             int max, char *buf, size_t size)
{
    btc_dwarf *d = module_dwarf(at);
    uintptr_t vaddr = pc - at->bias, start = 0;
    const char *symbol = btc_dwarf_symbol(d, vaddr, &start);
    out->symbol_addr = symbol ? start + at->bias : at->part_lo;
    if (!symbol && at->part[0])
        symbol = at->part;
    int n = btc_dwarf_lookup(d, vaddr, levels, max);
    char *cursor = buf, *end = buf + size;
    out->module = at->path;
    bool fits = copy_string(&out->module, &cursor, end) && copy_name(&symbol, &cursor, end);
    out->symbol = symbol;
    for (int i = 0; i < n && fits; i++)
        fits = copy_name(&levels[i].function, &cursor, end) && copy_string(&levels[i].file, &cursor, end);
    return fits ? n : -2;
}

int btc_resolve_native(uintptr_t pc, int flags, btc_native_info *out, btc_srcframe *levels, int max, char *buf,
                       size_t size)
{
    if (!out || !levels || max < 1 || !buf || size == 0)
        return -2;
    memset(out, 0, sizeof *out);
    uintptr_t lookup = flags & (BTC_F_EXACT | BTC_F_SIGNAL) ? pc : pc - 1;
    PyThreadState *gil = btc_gil_release();
    static __thread located_pc at;   /* 4 KiB: kept off small thread stacks */
    int n = -1;
    if (locate(lookup, &at)) {
        out->module_base = at.bias;
        out->module_id = at.id;
        pthread_mutex_lock(&cache_lock);
        n = symbolize_located(&at, lookup, out, levels, max, buf, size);
        keep_within_budget();
        pthread_mutex_unlock(&cache_lock);
    }
    btc_gil_restore(gil);
    return n;
}
