/* Module identity for btcore's compact tokens (btcore/codec.py): which
 * loaded object a pc belongs to and its build-id, read from the object's
 * mapped notes, so that a token names the code that ran even when the file
 * on disk has been replaced since it was loaded. */
#include <link.h>
#include <string.h>
#include <unistd.h>

#include "btcore.h"

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
