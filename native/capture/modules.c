/* The loaded ELF objects, their executable ranges and their cached CFI tables.
 *
 * The list is rebuilt only when dl_iterate_phdr's adds/subs counters change
 * (dlopen/dlclose); every capture checks them first, so a table is never used
 * after its module was unloaded.  Tables of modules still loaded survive a
 * rebuild.  All of this runs under one mutex (btc_modules_acquire).
 *
 * A module is the same across a rebuild only if its mapping (bias, span),
 * its path and its build-id are: a different library loaded where an
 * unloaded one was, even with the same layout, is a new module (new id, no
 * table, its own symbols).
 */
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture/context.h"
#include "capture/modules.h"
#include "common/array.h"
#include "common/search.h"

static pthread_mutex_t modules_mutex = PTHREAD_MUTEX_INITIALIZER;
static btc_module **modules;    /* sorted by lo */
static int nmodules;
static unsigned long long seen_adds = ~0ULL, seen_subs = ~0ULL;
static uint64_t last_module_id;
uint64_t btc_modules_generation;

static pthread_t modules_owner;   /* valid while the lock is held */
/* Set while a signal handler holds the lock (btc_modules_try_acquire_prebuilt):
 * tables not built yet stay unbuilt (building allocates and takes the loader
 * lock).  Read and written only by the lock's holder. */
static bool tables_frozen;

static void modules_lock(void)
{
    pthread_mutex_lock(&modules_mutex);
    modules_owner = pthread_self();
}

void btc_modules_release(void)
{
    tables_frozen = false;
    modules_owner = 0;
    pthread_mutex_unlock(&modules_mutex);
}

/* ---- fork ----
 *
 * Another thread may hold the lock when a thread forks (resolution holds
 * it with the GIL released), and the child, where that thread does not
 * exist, would wait for it forever.  Worse, every dl_iterate_phdr call is
 * made under this lock, and glibc (2.36 here) resets in the child only the
 * loader's main lock, not the one dl_iterate_phdr holds: a fork while
 * another thread is inside dl_iterate_phdr leaves the child's loader list
 * locked for good (2 forks in ~4000 under a resolving thread).  So, unlike
 * the DWARF file cache (symbols/symbolize.c), the lock is taken before fork() and released
 * in both processes: no btcore thread is then inside dl_iterate_phdr.
 * This is safe because no holder waits for anything the forking thread
 * may hold: holders run C code only, never Python (so never wait for the
 * GIL), and take no other lock.  The wait is one lookup at most (a first
 * read of a library's symbols: milliseconds).  A thread that forks while
 * holding the lock itself (a crash handler) skips it. */
static bool fork_took_lock;

static void modules_before_fork(void)
{
    fork_took_lock = !(modules_owner && pthread_equal(modules_owner, pthread_self()));
    if (fork_took_lock)
        modules_lock();
}

static void modules_after_fork(void)
{
    if (fork_took_lock)
        btc_modules_release();
}

__attribute__((constructor)) static void modules_fork_safe(void)
{
    pthread_atfork(modules_before_fork, modules_after_fork, modules_after_fork);
}

/* ---- reading the loader's list ---- */

static bool has_counters(size_t size)
{
    return size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(unsigned long long);
}

static int read_counters(struct dl_phdr_info *info, size_t size, void *data)
{
    unsigned long long *c = data;
    if (has_counters(size)) {
        c[0] = info->dlpi_adds;
        c[1] = info->dlpi_subs;
    }
    return 1;   /* the counters are global: the first object is enough */
}

static bool exec_span(const struct dl_phdr_info *info, uintptr_t *lo, uintptr_t *hi)
{
    *lo = UINTPTR_MAX;
    *hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < *lo) *lo = a;
        if (a + ph->p_memsz > *hi) *hi = a + ph->p_memsz;
    }
    return *lo < *hi;
}

static char *module_path(const struct dl_phdr_info *info, bool first)
{
    if (info->dlpi_name && info->dlpi_name[0])
        return strdup(info->dlpi_name);
    char buf[4096];
    ssize_t n = first ? readlink("/proc/self/exe", buf, sizeof buf - 1) : -1;
    buf[n > 0 ? n : 0] = 0;
    return strdup(buf);
}

/* Is [a, a + n) inside one of info's readable PT_LOAD segments? */
static bool mapped_readable(const struct dl_phdr_info *info, uintptr_t a, size_t n)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && a >= lo && n <= ph->p_memsz &&
            a - lo <= ph->p_memsz - n)
            return true;
    }
    return false;
}

/* What tells modules apart: the mapping, the file and the build. */
typedef struct {
    uintptr_t bias, lo, hi;
    char *path;
    uint8_t build_id[BTC_BUILD_ID_MAX];
    size_t build_id_len;
} module_identity;

static bool identify(const struct dl_phdr_info *info, bool first, module_identity *id)
{
    memset(id, 0, sizeof *id);
    if (!exec_span(info, &id->lo, &id->hi))
        return false;
    id->bias = info->dlpi_addr;
    for (int i = 0; i < info->dlpi_phnum && !id->build_id_len; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_NOTE && mapped_readable(info, a, ph->p_memsz))
            id->build_id_len = btc_note_build_id((const uint8_t *)a, ph->p_memsz, id->build_id, BTC_BUILD_ID_MAX);
    }
    id->path = module_path(info, first);
    return id->path != NULL;
}

static bool same_module(const btc_module *m, const module_identity *id)
{
    size_t n = id->build_id_len < BTC_BUILD_ID_MAX ? id->build_id_len : BTC_BUILD_ID_MAX;
    return m->bias == id->bias && m->lo == id->lo && m->hi == id->hi && strcmp(m->path, id->path) == 0 &&
           m->build_id_len == id->build_id_len && memcmp(m->build_id, id->build_id, n) == 0;
}

/* The module of the previous list that id names, or NULL. */
static btc_module *take_existing(const module_identity *id)
{
    for (int i = 0; i < nmodules; i++) {
        btc_module *m = modules[i];
        if (m && same_module(m, id)) {
            modules[i] = NULL;
            return m;
        }
    }
    return NULL;
}

static btc_module *new_module(module_identity *id)
{
    btc_module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->bias = id->bias;
    m->lo = id->lo;
    m->hi = id->hi;
    m->path = id->path;
    id->path = NULL;   /* the module owns it now */
    memcpy(m->build_id, id->build_id, sizeof m->build_id);
    m->build_id_len = id->build_id_len;
    m->id = ++last_module_id;
    return m;
}

typedef struct {
    btc_module **list;
    int n;
    size_t cap;
} module_list;

static int collect_module(struct dl_phdr_info *info, size_t size BTC_UNUSED, void *data)
{
    module_list *ml = data;
    module_identity id;
    bool first = ml->n == 0;
    if (!identify(info, first, &id))
        return 0;
    if (!grow((void **)&ml->list, &ml->cap, (size_t)ml->n + 1, sizeof *ml->list)) {
        free(id.path);
        return 1;
    }
    btc_module *m = take_existing(&id);
    if (!m)
        m = new_module(&id);
    free(id.path);
    if (!m)
        return 1;
    ml->list[ml->n++] = m;
    return 0;
}

static void module_free(btc_module *m)
{
    if (!m)
        return;
    btc_table_free(m->table);
    btc_elf_close(m->elf);
    free(m->path);
    free(m);
}

static int by_lo(const void *a, const void *b)
{
    const btc_module *x = *(btc_module *const *)a, *y = *(btc_module *const *)b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void rebuild(void)
{
    module_list ml = {0};
    dl_iterate_phdr(collect_module, &ml);
    for (int i = 0; i < nmodules; i++)
        module_free(modules[i]);   /* those not taken over: unloaded */
    free(modules);
    qsort(ml.list, ml.n, sizeof *ml.list, by_lo);
    modules = ml.list;
    nmodules = ml.n;
    btc_modules_generation++;
}

static void modules_refresh(void)
{
    unsigned long long c[2] = {0, 0};
    dl_iterate_phdr(read_counters, c);
    if (c[0] == seen_adds && c[1] == seen_subs && modules)
        return;
    rebuild();
    seen_adds = c[0];
    seen_subs = c[1];
}

void btc_modules_acquire(void)
{
    modules_lock();
    modules_refresh();
}

/* From a signal handler: never waits (the holder may be the interrupted
 * code itself), never calls the loader (dl_iterate_phdr takes the loader's
 * lock, which the interrupted code may hold), never allocates.  The list
 * may be stale: a module loaded since the last refresh is in no module (the
 * walk stops there); one unloaded since keeps its table, a heap copy, so a
 * walk through it can be wrong, never crash. */
bool btc_modules_try_acquire_prebuilt(void)
{
    if (pthread_mutex_trylock(&modules_mutex) != 0)
        return false;
    modules_owner = pthread_self();
    tables_frozen = true;
    return true;
}

bool btc_module_table_pending(const btc_module *m)
{
    return !m->table && !m->table_failed;
}

btc_module *btc_module_find(uintptr_t pc)
{
    /* Spans do not overlap, so sorted by lo they are sorted by hi too. */
    size_t i = BTC_PARTITION_POINT(nmodules, k, modules[k]->hi <= pc);
    return i < (size_t)nmodules && modules[i]->lo <= pc ? modules[i] : NULL;
}

/* ---- building a table while the loader cannot unmap the module ---- */

static void describe_image(const struct dl_phdr_info *info, btc_image *img)
{
    memset(img, 0, sizeof *img);
    img->bias = info->dlpi_addr;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_GNU_EH_FRAME)
            img->eh_frame_hdr = (const uint8_t *)a;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && img->nreadable < 8) {
            img->readable_lo[img->nreadable] = a;
            img->readable_hi[img->nreadable++] = a + ph->p_memsz;
        }
    }
}

typedef struct {
    btc_module *module;
    bool seen_first;   /* the first object listed is the program (its path is /proc/self/exe's) */
} table_build;

static int build_table_cb(struct dl_phdr_info *info, size_t size BTC_UNUSED, void *data)
{
    table_build *tb = data;
    btc_module *m = tb->module;
    bool first = !tb->seen_first;
    tb->seen_first = true;
    module_identity id;
    if (info->dlpi_addr != m->bias || !identify(info, first, &id))
        return 0;
    bool same = same_module(m, &id);
    free(id.path);
    if (!same)
        return 0;
    btc_image img;
    describe_image(info, &img);
    m->table = btc_table_build(&img);
    return 1;
}

const btc_table *btc_module_table(btc_module *m)
{
    if (BTC_LIKELY(m->table != NULL) || m->table_failed || tables_frozen)
        return m->table;
    table_build tb = {m, false};
    dl_iterate_phdr(build_table_cb, &tb);
    m->table_failed = m->table == NULL;
    return m->table;
}

int btc_modules_build_tables(void)
{
    btc_modules_acquire();
    int built = 0;
    for (int i = 0; i < nmodules; i++)
        built += btc_module_table(modules[i]) != NULL;
    btc_modules_release();
    return built;
}

/* ---- the file of a module ----
 *
 * A module's symbols and eval-loop ranges come from its file, found by
 * its path; but the file at that path may no longer be the one loaded: a
 * package upgraded under the running process (dpkg renames the new file
 * over the old name) leaves the old inode mapped and a new build at the
 * path, whose names at the same offsets are other functions'.  So the
 * file's build-id must be the one mapped (the module's PT_NOTE); else the
 * inode mapped is opened through /proc/self/map_files (the kernel allows
 * it to a process with CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), else
 * there is no file: unnamed frames, not wrongly named ones. */

bool btc_module_build_is(const uint8_t *file_id, int file_len, const uint8_t *id, size_t len)
{
    size_t n = len < BTC_BUILD_ID_MAX ? len : BTC_BUILD_ID_MAX;
    return len == 0 || (file_len >= 0 && (size_t)file_len == len && memcmp(file_id, id, n) == 0);
}

static int open_if_build(const char *path, const uint8_t *id, size_t len)
{
    int fd = btc_open_regular(path, NULL);
    uint8_t got[BTC_BUILD_ID_MAX];
    if (fd >= 0 && !btc_module_build_is(got, btc_elf_file_build_id(fd, got, (int)sizeof got), id, len)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int btc_module_file(const char *path, const uint8_t *id, size_t id_len, uintptr_t inside, char *used, size_t size)
{
    if (size)
        used[0] = 0;
    if (!path[0])   /* the vDSO: no file (one named like it is another build) */
        return -1;
    int fd = open_if_build(path, id, id_len);   /* relative too: dlopen("./lib.so") keeps its name as given */
    const char *opened = path;
    char mapped[64];
    uintptr_t lo, hi;
    if (fd < 0 && btc_mapping_bounds(inside, &lo, &hi)) {
        snprintf(mapped, sizeof mapped, "/proc/self/map_files/%lx-%lx", (unsigned long)lo, (unsigned long)hi);
        fd = open_if_build(mapped, id, id_len);
        opened = mapped;
    }
    if (fd >= 0 && size)
        snprintf(used, size, "%s", opened);
    return fd;
}

btc_elf *btc_module_elf(btc_module *m)
{
    if (!m->elf) {
        int fd = btc_module_file(m->path, m->build_id, m->build_id_len, m->lo, NULL, 0);
        m->elf = fd >= 0 ? btc_elf_open_fd(fd) : NULL;
        if (fd >= 0)
            close(fd);
    }
    return m->elf;
}

/* ---- the cffi API ---- */

uint64_t btc_module_key(uintptr_t pc, uint64_t *module_id, uintptr_t *offset)
{
    btc_modules_acquire();
    btc_module *m = btc_module_find(pc);
    *module_id = m ? m->id : 0;
    *offset = m ? pc - m->bias : pc;
    uint64_t generation = btc_modules_generation;
    btc_modules_release();
    return generation;
}

int btc_loaded_modules(btc_modinfo *out, int max, char *buf, size_t size)
{
    btc_modules_acquire();
    bool fits = true;
    for (int i = 0; i < nmodules && i < max; i++) {
        const btc_module *m = modules[i];
        size_t len = strlen(m->path) + 1;
        fits = fits && len <= size;
        if (!fits)
            break;
        memcpy(buf, m->path, len);
        out[i] = (btc_modinfo){.path = buf, .bias = m->bias, .lo = m->lo, .hi = m->hi,
                               .build_id_len = m->build_id_len <= BTC_BUILD_ID_MAX ? (int)m->build_id_len : 0};
        memcpy(out[i].build_id, m->build_id, sizeof out[i].build_id);
        buf += len;
        size -= len;
    }
    int n = nmodules;
    btc_modules_release();
    return fits ? n : -1;
}

int btc_module_function_ranges(uintptr_t inside, const char *name, uintptr_t *lo, uintptr_t *hi, int max)
{
    btc_module *m = btc_module_find(inside);
    btc_elf *elf = m ? btc_module_elf(m) : NULL;
    int n = elf ? btc_elf_function_ranges(elf, name, lo, hi, max) : 0;
    for (int i = 0; i < n; i++) {
        lo[i] += m->bias;
        hi[i] += m->bias;
    }
    return n;
}
