/* Symbolization entries: what resolution asks of the native core.
 *
 *   btc_describe_native()  pc -> module, symbol (the loaded module list's ELF symbols)
 *   btc_symbolize_file()   file + address -> source lines and inline chain (DWARF),
 *                          through a bounded cache of decoded files
 *   btc_file_symbol()      file + address -> symbol, for a module not loaded (decoded
 *                          tokens), through the same cache
 *
 * Both release the GIL while they read and decode files (common/gil.h).
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capture/evalloop.h"
#include "capture/modules.h"
#include "common/gil.h"
#include "symbols/dwarf.h"

/* ---- loaded modules: pc -> module and symbol ---- */

/* Copy s into the caller's buffer; returns the copy or NULL if s is NULL. */
static const char *copy_out(const char *s, char **buf, size_t *left)
{
    if (!s || *left == 0)
        return NULL;
    size_t n = strnlen(s, *left - 1);
    char *dst = *buf;
    memcpy(dst, s, n);
    dst[n] = 0;
    *buf += n + 1;
    *left -= n + 1;
    return dst;
}

int btc_describe_native(uintptr_t pc, btc_syminfo *out, char *buf, size_t size)
{
    memset(out, 0, sizeof *out);
    PyThreadState *gil = btc_gil_release();   /* the first call per module reads its symbols */
    btc_modules_acquire();
    btc_module *m = btc_module_find(pc);
    if (m) {
        uintptr_t sym_vaddr = 0;
        btc_elf *elf = btc_module_elf(m);
        const char *sym = elf ? btc_elf_symbolize(elf, pc - m->bias, &sym_vaddr) : NULL;
        uintptr_t part_lo;
        if (!sym && (sym = btc_eval_part_name(pc, &part_lo)))   /* a stripped eval loop's unnamed part */
            sym_vaddr = part_lo - m->bias;
        out->module = copy_out(m->path, &buf, &size);
        out->module_base = m->bias;
        out->module_id = m->id;
        out->symbol = copy_out(sym, &buf, &size);
        out->symbol_addr = sym ? sym_vaddr + m->bias : 0;
    }
    btc_modules_release();
    btc_gil_restore(gil);
    return m ? 0 : -1;
}

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
    btc_elf *elf;          /* its symbol tables, for files not loaded (btc_file_symbol) */
    bool elf_tried;
    uint64_t last_use;
} cached_file;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_file cache[MAX_CACHED_FILES];
static int cache_limit = 16;
static uint64_t use_clock;
static char debug_root[PATH_MAX] = "/usr/lib/debug";

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
    debug_root[sizeof debug_root - 1] = 0;
}

__attribute__((constructor)) static void cache_fork_safe(void)
{
    pthread_atfork(NULL, NULL, cache_after_fork_child);
}

static void drop(cached_file *c)
{
    btc_dwarf_close(c->dwarf);
    btc_elf_close(c->elf);
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

/* The cache entry of the file at path (made on first use); NULL if it
 * cannot be stat'ed or remembered.  cache_lock held. */
static cached_file *cached(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return NULL;
    cached_file *c = NULL;
    for (int i = 0; i < cache_limit && !c; i++)
        if (cache[i].path && strcmp(cache[i].path, path) == 0)
            c = &cache[i];
    if (c && !same_file(c, path, &st))
        drop(c);
    if (!c || !c->path) {
        c = free_slot();
        c->path = strdup(path);
        if (!c->path)
            return NULL;
        c->dev = st.st_dev;
        c->ino = st.st_ino;
        c->size = st.st_size;
        c->mtime = st.st_mtim;
        c->dwarf = btc_dwarf_open(path, debug_root);
    }
    c->last_use = ++use_clock;
    return c;
}

static btc_dwarf *cached_dwarf(const char *path)
{
    cached_file *c = cached(path);
    return c ? c->dwarf : NULL;
}

static btc_elf *cached_elf(const char *path)
{
    cached_file *c = cached(path);
    if (c && !c->elf_tried) {
        c->elf = btc_elf_open(path);
        c->elf_tried = true;
    }
    return c ? c->elf : NULL;
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
    if (!path || !out || max < 1 || !buf)
        return 0;
    PyThreadState *gil = btc_gil_release();
    pthread_mutex_lock(&cache_lock);
    int n = btc_dwarf_lookup(cached_dwarf(path), vaddr, out, max);
    char *cursor = buf;
    for (int i = 0; i < n; i++)
        if (!copy_string(&out[i].function, &cursor, buf + size) || !copy_string(&out[i].file, &cursor, buf + size))
            n = -1;
    pthread_mutex_unlock(&cache_lock);
    btc_gil_restore(gil);
    return n;
}

int btc_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr)
{
    if (!path || !buf || size == 0)
        return -1;
    PyThreadState *gil = btc_gil_release();   /* the first call per file reads its symbols */
    pthread_mutex_lock(&cache_lock);
    btc_elf *elf = cached_elf(path);
    const char *name = elf ? btc_elf_symbolize(elf, vaddr, sym_vaddr) : NULL;
    int rc = -1;
    if (name && strlen(name) < size) {
        memcpy(buf, name, strlen(name) + 1);
        rc = 0;
    }
    pthread_mutex_unlock(&cache_lock);
    btc_gil_restore(gil);
    return rc;
}

size_t btc_symbolize_memory(void)
{
    size_t n = 0;
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < MAX_CACHED_FILES; i++)
        n += btc_dwarf_memory(cache[i].dwarf);
    pthread_mutex_unlock(&cache_lock);
    return n;
}

static void drop_all_locked(void)
{
    for (int i = 0; i < MAX_CACHED_FILES; i++)
        if (cache[i].path)
            drop(&cache[i]);
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
