/* Another process's memory, read through a bounded chunk cache.
 *
 * Sources: a live process (process_vm_readv; /proc/PID/mem where that
 * syscall is refused, as in some containers) or segments of files (a core
 * file's PT_LOAD data, and the files its NT_FILE note names for the
 * mappings the core left out).  Reads are served from 16 KiB chunks kept
 * until the cache is full (then it is emptied): a dump reads thousands of
 * small objects (gc list links, frames) that lie together in a few arenas,
 * and one syscall per chunk instead of per object keeps the target's stop
 * short.  A chunk is read page by page (one remote iovec per page), so an
 * unmapped page ends the chunk's valid part instead of failing it all.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/array.h"
#include "remote/rmem.h"

#define CHUNK_SHIFT 13
#define CHUNK_SIZE (1u << CHUNK_SHIFT)
#define PAGE 4096u
#define SLOT_BITS 15
#define SLOTS (1u << SLOT_BITS)     /* open addressing, at most half full: */
#define MAX_CHUNKS (SLOTS / 2)      /* 128 MiB of chunks at most, then the cache is emptied */
#define MAX_SEGMENTS 65536

typedef struct {
    uintptr_t base;      /* chunk address + 1 (0: empty slot) */
    uint32_t valid;      /* bit i: page i is readable */
    uint8_t *data;
} chunk;

typedef struct {
    uintptr_t vaddr;
    uint64_t size, offset;
    int fd;
} segment;

struct btc_rmem {
    int pid;             /* 0: segments only */
    int mem_fd;          /* /proc/PID/mem, opened when process_vm_readv is refused */
    int last_errno;
    segment *segments;
    size_t nsegments, cap;
    chunk slots[SLOTS];
    uint32_t nchunks;
    uint64_t syscalls;
};

btc_rmem *btc_rmem_open_pid(int pid)
{
    btc_rmem *m = calloc(1, sizeof *m);
    if (m) {
        m->pid = pid;
        m->mem_fd = -1;
    }
    return m;
}

btc_rmem *btc_rmem_open_segments(void)
{
    return btc_rmem_open_pid(0);
}

int btc_rmem_add_segment(btc_rmem *m, uintptr_t vaddr, uint64_t size, int fd, uint64_t offset)
{
    if (m->nsegments >= MAX_SEGMENTS || size == 0 || vaddr + size < vaddr)
        return -1;
    segment s = {vaddr, size, offset, fd};
    return PUSH(m->segments, m->nsegments, m->cap, s) ? 0 : -1;
}

void btc_rmem_forget(btc_rmem *m)
{
    for (uint32_t i = 0; i < SLOTS; i++) {
        free(m->slots[i].data);
        m->slots[i] = (chunk){0};
    }
    m->nchunks = 0;
}

void btc_rmem_close(btc_rmem *m)
{
    if (!m)
        return;
    btc_rmem_forget(m);
    if (m->mem_fd >= 0)
        close(m->mem_fd);
    free(m->segments);
    free(m);
}

int btc_rmem_last_errno(btc_rmem *m) { return m->last_errno; }
uint64_t btc_rmem_syscalls(btc_rmem *m) { return m->syscalls; }

/* ---- filling one chunk ----
 *
 * Each page of a chunk is readable or not on its own (a chunk may begin
 * before a mapping or end after it): a bit per page says which. */

#define PAGES (CHUNK_SIZE / PAGE)

static bool read_page_live(btc_rmem *m, uintptr_t a, uint8_t *buf)
{
    struct iovec local = {buf, PAGE}, remote = {(void *)a, PAGE};
    m->syscalls++;
    if (m->mem_fd < 0) {
        if (process_vm_readv(m->pid, &local, 1, &remote, 1, 0) == PAGE)
            return true;
        m->last_errno = errno;
        if (errno != ENOSYS && errno != EPERM)
            return false;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/mem", m->pid);
        if ((m->mem_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            m->last_errno = errno;
            return false;
        }
    }
    return pread(m->mem_fd, buf, PAGE, (off_t)a) == PAGE;
}

/* All pages in one syscall where they are all mapped (the common case). */
static uint32_t read_live(btc_rmem *m, uintptr_t base, uint8_t *buf)
{
    if (m->mem_fd < 0) {
        struct iovec local = {buf, CHUNK_SIZE}, remote[PAGES];
        for (unsigned i = 0; i < PAGES; i++)
            remote[i] = (struct iovec){(void *)(base + i * PAGE), PAGE};
        m->syscalls++;
        if (process_vm_readv(m->pid, &local, 1, remote, PAGES, 0) == CHUNK_SIZE)
            return (1u << PAGES) - 1;
    }
    uint32_t valid = 0;
    for (unsigned i = 0; i < PAGES; i++)
        if (read_page_live(m, base + i * PAGE, buf + i * PAGE))
            valid |= 1u << i;
    return valid;
}

static const segment *segment_at(const btc_rmem *m, uintptr_t a)
{
    for (size_t i = 0; i < m->nsegments; i++)   /* in the order added: core data first */
        if (a >= m->segments[i].vaddr && a - m->segments[i].vaddr < m->segments[i].size)
            return &m->segments[i];
    return NULL;
}

static uint32_t read_segments(btc_rmem *m, uintptr_t base, uint8_t *buf)
{
    uint32_t valid = 0;
    for (unsigned i = 0; i < PAGES; i++) {
        uintptr_t a = base + i * PAGE;
        const segment *s = segment_at(m, a);
        if (!s || s->size - (a - s->vaddr) < PAGE)
            continue;
        m->syscalls++;
        if (pread(s->fd, buf + i * PAGE, PAGE, (off_t)(s->offset + (a - s->vaddr))) == PAGE)
            valid |= 1u << i;
    }
    return valid;
}

/* The slot of the chunk at base: its own, or the empty one it would take. */
static chunk *slot_for(btc_rmem *m, uintptr_t base)
{
    /* Fibonacci hashing, high bits: neighbouring chunks (an arena, a stack)
     * must not fill neighbouring slots, or linear probing walks long runs. */
    uint32_t i = (uint32_t)(((uint64_t)(base >> CHUNK_SHIFT) * 0x9E3779B97F4A7C15ull) >> (64 - SLOT_BITS));
    while (m->slots[i].base && m->slots[i].base != base + 1)
        i = (i + 1) & (SLOTS - 1);
    return &m->slots[i];
}

static chunk *chunk_for(btc_rmem *m, uintptr_t base)
{
    chunk *c = slot_for(m, base);
    if (c->base)
        return c;
    if (m->nchunks >= MAX_CHUNKS) {   /* bounded: start over */
        btc_rmem_forget(m);
        return chunk_for(m, base);
    }
    uint8_t *data = malloc(CHUNK_SIZE);
    if (!data)
        return NULL;
    uint32_t valid = m->pid ? read_live(m, base, data) : read_segments(m, base, data);
    *c = (chunk){base + 1, valid, data};
    m->nchunks++;
    return c;
}

/* ---- prefetching: many chunks in one syscall ----
 *
 * Following thousands of pointers (greenlets' implementations, their
 * frames) one chunk fill at a time is one syscall each; knowing the
 * addresses first, their chunks are filled together, one remote iovec per
 * page.  process_vm_readv stops at the first page it cannot read: that
 * page stays invalid and the batch goes on after it. */

#define PREFETCH_PAGES 1024   /* IOV_MAX */

typedef struct {
    struct iovec remote[PREFETCH_PAGES], local[PREFETCH_PAGES];
    chunk *owner[PREFETCH_PAGES];
    int n;
} page_batch;

static void flush(btc_rmem *m, page_batch *b)
{
    for (int start = 0; start < b->n;) {
        m->syscalls++;
        ssize_t got = process_vm_readv(m->pid, b->local + start, b->n - start, b->remote + start, b->n - start, 0);
        int pages = got > 0 ? (int)(got / PAGE) : 0;
        for (int j = start; j < start + pages; j++)
            b->owner[j]->valid |= 1u << (((uintptr_t)b->remote[j].iov_base & (CHUNK_SIZE - 1)) / PAGE);
        start += pages + 1;   /* past the page that failed */
    }
    b->n = 0;
}

void btc_rmem_prefetch(btc_rmem *m, const uintptr_t *addr, int n)
{
    if (!m->pid || m->mem_fd >= 0)
        return;   /* reads that are not process_vm_readv gain nothing from batches */
    static __thread page_batch b;
    b.n = 0;
    for (int i = 0; i < n && m->nchunks < MAX_CHUNKS; i++) {
        uintptr_t base = addr[i] & ~(uintptr_t)(CHUNK_SIZE - 1);
        chunk *c = addr[i] ? slot_for(m, base) : NULL;
        uint8_t *data = c && !c->base ? malloc(CHUNK_SIZE) : NULL;
        if (!data)
            continue;
        *c = (chunk){base + 1, 0, data};
        m->nchunks++;
        if (b.n + PAGES > PREFETCH_PAGES)
            flush(m, &b);
        for (unsigned p = 0; p < PAGES; p++, b.n++) {
            b.remote[b.n] = (struct iovec){(void *)(base + p * PAGE), PAGE};
            b.local[b.n] = (struct iovec){data + p * PAGE, PAGE};
            b.owner[b.n] = c;
        }
    }
    flush(m, &b);
}

/* Are the pages under [at, at + n) of c all readable? */
static bool readable(const chunk *c, size_t at, size_t n)
{
    for (size_t p = at / PAGE; p <= (at + n - 1) / PAGE; p++)
        if (!(c->valid & (1u << p)))
            return false;
    return true;
}

int btc_rmem_read(btc_rmem *m, uintptr_t addr, void *buf, size_t n)
{
    uint8_t *out = buf;
    if (addr + n < addr)
        return -1;
    while (n) {
        uintptr_t base = addr & ~(uintptr_t)(CHUNK_SIZE - 1);
        chunk *c = chunk_for(m, base);
        size_t at = addr - base, take = CHUNK_SIZE - at < n ? CHUNK_SIZE - at : n;
        if (!c || !readable(c, at, take))
            return -1;
        memcpy(out, c->data + at, take);
        out += take;
        addr += take;
        n -= take;
    }
    return 0;
}

/* Many ranges in few syscalls, bypassing the cache (greenlets' heap copies
 * of their stacks: thousands of blocks, each read once).  process_vm_readv
 * stops at the first range it cannot read; the batch goes on after it. */
#define BATCH 1024   /* IOV_MAX */

static int read_batch_live(btc_rmem *m, const struct iovec *remote, const struct iovec *local, int n)
{
    m->syscalls++;
    ssize_t got = process_vm_readv(m->pid, local, n, remote, n, 0);
    int done = 0;
    for (; done < n && got >= (ssize_t)remote[done].iov_len; done++)
        got -= (ssize_t)remote[done].iov_len;
    return done;   /* ranges [0, done) were read whole */
}

void btc_rmem_read_many(btc_rmem *m, const uintptr_t *addr, const size_t *size, uint8_t *const *dest, int n,
                        uint8_t *ok)
{
    for (int i = 0; i < n;) {
        if (!m->pid || m->mem_fd >= 0) {   /* segments, /proc/PID/mem: one range at a time */
            ok[i] = btc_rmem_read(m, addr[i], dest[i], size[i]) == 0;
            i++;
            continue;
        }
        struct iovec remote[BATCH], local[BATCH];
        int k = 0;
        for (; k < BATCH && i + k < n; k++) {
            remote[k] = (struct iovec){(void *)addr[i + k], size[i + k]};
            local[k] = (struct iovec){dest[i + k], size[i + k]};
        }
        int done = read_batch_live(m, remote, local, k);
        for (int j = 0; j < done; j++)
            ok[i + j] = 1;
        if (done < k)   /* the range that failed: through the cache (page by page) */
            ok[i + done] = btc_rmem_read(m, addr[i + done], dest[i + done], size[i + done]) == 0;
        i += done < k ? done + 1 : k;
    }
}

bool btc_rmem_word(btc_rmem *m, uintptr_t addr, uintptr_t *out)
{
    return btc_rmem_read(m, addr, out, sizeof *out) == 0;
}
