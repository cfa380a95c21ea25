/* Module identity for btcore's compact tokens (btcore/codec.py): which
 * loaded object a pc belongs to and its build-id, read from the object's
 * mapped notes, so that a token names the code that ran even when the file
 * on disk has been replaced since it was loaded. */
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "btcore.h"
#include "gil.h"

#ifndef NT_GNU_BUILD_ID
#define NT_GNU_BUILD_ID 3
#endif

typedef struct {
    btc_modinfo *out;
    int max, n;
    char *buf;
    size_t size;
    bool overflow;
} listing;

/* Is [a, a + len) inside a PT_LOAD segment's file-backed part (mapped)? */
static bool mapped(const struct dl_phdr_info *info, uintptr_t a, size_t len)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && a >= lo && len <= ph->p_filesz && a - lo <= ph->p_filesz - len)
            return true;
    }
    return false;
}

/* The NT_GNU_BUILD_ID note in one mapped PT_NOTE segment; 0 if none. */
static int note_build_id(const uint8_t *p, size_t size, uint8_t *out)
{
    const uint8_t *end = p + size;
    while (end - p >= 12) {
        uint32_t namesz, descsz, type;
        memcpy(&namesz, p, 4);
        memcpy(&descsz, p + 4, 4);
        memcpy(&type, p + 8, 4);
        p += 12;
        uint64_t name_room = ((uint64_t)namesz + 3) & ~3ull, desc_room = ((uint64_t)descsz + 3) & ~3ull;
        if (name_room > (uint64_t)(end - p) || desc_room > (uint64_t)(end - p) - name_room)
            return 0;
        if (type == NT_GNU_BUILD_ID && namesz == 4 && memcmp(p, "GNU", 4) == 0 && descsz > 0 &&
            descsz <= BTC_BUILD_ID_MAX) {
            memcpy(out, p + name_room, descsz);
            return (int)descsz;
        }
        p += name_room + desc_room;
    }
    return 0;
}

static int build_id_of(const struct dl_phdr_info *info, uint8_t *out)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type != PT_NOTE || !mapped(info, a, ph->p_filesz))
            continue;
        int n = note_build_id((const uint8_t *)a, ph->p_filesz, out);
        if (n)
            return n;
    }
    return 0;
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

static const char *copy_path(listing *l, const struct dl_phdr_info *info, bool first)
{
    char exe[4096];
    const char *name = info->dlpi_name;
    if (!name || !name[0]) {   /* the executable: the loader gives no name */
        ssize_t n = first ? readlink("/proc/self/exe", exe, sizeof exe - 1) : -1;
        exe[n > 0 ? n : 0] = 0;
        name = exe;
    }
    size_t len = strlen(name) + 1;
    if (len > l->size) {
        l->overflow = true;
        return NULL;
    }
    memcpy(l->buf, name, len);
    const char *copy = l->buf;
    l->buf += len;
    l->size -= len;
    return copy;
}

static int list_one(struct dl_phdr_info *info, size_t size BTC_UNUSED, void *data)
{
    listing *l = data;
    uintptr_t lo, hi;
    bool first = l->n == 0;
    if (!exec_span(info, &lo, &hi))
        return 0;
    if (l->n < l->max) {
        btc_modinfo *m = &l->out[l->n];
        memset(m, 0, sizeof *m);
        m->path = copy_path(l, info, first);
        m->bias = info->dlpi_addr;
        m->lo = lo;
        m->hi = hi;
        m->build_id_len = build_id_of(info, m->build_id);
    }
    l->n++;
    return 0;
}

int btc_loaded_modules(btc_modinfo *out, int max, char *buf, size_t size)
{
    listing l = {.out = out, .max = max, .buf = buf, .size = size};
    dl_iterate_phdr(list_one, &l);
    return l.overflow ? -1 : l.n;
}

/* ---- symbols of a module that is not loaded: named from its file ---- */

#define OPEN_FILES 4

typedef struct {
    char *path;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    btc_elf *elf;
} open_file;

static open_file open_files[OPEN_FILES];
static int next_victim;
static pthread_mutex_t open_files_mutex = PTHREAD_MUTEX_INITIALIZER;

static bool same_file(const open_file *f, const char *path, const struct stat *st)
{
    return f->path && strcmp(f->path, path) == 0 && f->dev == st->st_dev && f->ino == st->st_ino &&
           f->size == st->st_size && f->mtime.tv_sec == st->st_mtim.tv_sec &&
           f->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* The file's btc_elf, opened on first use; the oldest one is closed to make
 * room.  With open_files_mutex held. */
static btc_elf *file_elf(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return NULL;
    for (int i = 0; i < OPEN_FILES; i++)
        if (same_file(&open_files[i], path, &st))
            return open_files[i].elf;
    btc_elf *elf = btc_elf_open(path);
    char *copy = strdup(path);
    if (!elf || !copy) {
        btc_elf_close(elf);
        free(copy);
        return NULL;
    }
    open_file *f = &open_files[next_victim];
    next_victim = (next_victim + 1) % OPEN_FILES;
    btc_elf_close(f->elf);
    free(f->path);
    *f = (open_file){.path = copy, .dev = st.st_dev, .ino = st.st_ino, .size = st.st_size,
                     .mtime = st.st_mtim, .elf = elf};
    return elf;
}

/* A child forked while another thread held the mutex inherits it locked and
 * the table maybe half-updated: it starts afresh (the parent's entries leak). */
static void forget_after_fork(void)
{
    pthread_mutex_init(&open_files_mutex, NULL);
    memset(open_files, 0, sizeof open_files);
    next_victim = 0;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, forget_after_fork);
}

int btc_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t size, uintptr_t *sym_vaddr)
{
    pthread_once(&atfork_once, install_atfork);
    PyThreadState *gil = btc_gil_release();   /* the first call per file reads its symbols */
    pthread_mutex_lock(&open_files_mutex);
    const char *name = btc_elf_symbolize(file_elf(path), vaddr, sym_vaddr);
    int rc = -1;
    if (name && size > 0) {
        snprintf(buf, size, "%s", name);
        rc = 0;
    }
    pthread_mutex_unlock(&open_files_mutex);
    btc_gil_restore(gil);
    return rc;
}
