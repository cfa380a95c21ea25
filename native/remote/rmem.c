/* Another process's memory, read through a bounded chunk cache.
 *
 * Sources: a live process (process_vm_readv; /proc/PID/mem where that
 * syscall is refused, as in some containers) or segments of files (a core
 * file's PT_LOAD data, and the files its NT_FILE note names for the
 * mappings the core left out).  Reads are served from chunks of one page
 * kept until the cache is full (then it is emptied): a dump reads
 * thousands of small objects (gc list links, frames) that lie together in
 * a few arenas.  A chunk is read page by page (one remote iovec per page),
 * so an unmapped page ends the chunk's valid part instead of failing it
 * all.  The stop of a dump reads few chunks one by one: it re-reads what a
 * rehearsal read (btc_rmem_chunk_bases, then btc_rmem_prefetch in batches)
 * and reads large ranges (stacks) in one call each.  Chunk buffers come
 * from slabs in transparent huge pages (chunk_buffer).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/array.h"
#include "common/own_thread.h"
#include "remote/rmem.h"

#define CHUNK_SHIFT 12
#define CHUNK_SIZE (1u << CHUNK_SHIFT)
#define PAGE 4096u
#define SLOT_BITS 16
#define SLOTS (1u << SLOT_BITS)     /* open addressing, at most half full: */
#define MAX_CHUNKS (SLOTS / 2)      /* 128 MiB of 4 KiB chunks at most, then the cache is emptied */
#define MAX_SEGMENTS 65536
#define SLAB_SIZE (2u << 20)        /* chunks are carved from slabs of one huge page each */
#define MAX_SLABS (MAX_CHUNKS * CHUNK_SIZE / SLAB_SIZE)

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

typedef struct {
    uint64_t syscalls;
    bool refused;   /* process_vm_readv is not allowed here */
} read_stats;

/* Reads items [lo, hi) of a job (pages, ranges): rmem.c's "two readers". */
typedef void slice_reader(int pid, void *job, int lo, int hi, read_stats *stats);

typedef struct {
    pthread_mutex_t lock;   /* over the fields below */
    sem_t wake;             /* posted when a job is offered, or to quit */
    pthread_t thread;
    pid_t owner;            /* the process that started it (a forked child has no helper) */
    bool running, quit;
    slice_reader *read;     /* the job on offer: items [next, n) not claimed yet, done of n read */
    void *job;
    int n, next, done, slice;
    read_stats stats;       /* of the slices read so far, by either thread */
} helper;

struct btc_rmem {
    helper helper;       /* the second reader (two readers, below) */
    int pid;             /* 0: segments only */
    int mem_fd;          /* /proc/PID/mem, opened when process_vm_readv is refused */
    int last_errno;
    segment *segments;
    size_t nsegments, cap;
    chunk slots[SLOTS];
    uint32_t nchunks;
    uint8_t *spare[MAX_CHUNKS];   /* buffers of forgotten chunks, used again */
    uint32_t nspare;
    uint8_t *slabs[MAX_SLABS];    /* where every chunk buffer lies (chunk_buffer) */
    uint32_t nslabs, slab_used;   /* bytes of the last slab handed out */
    chunk *last;         /* the chunk read last: a walk reads neighbours in a row */
    uint64_t syscalls;
};

static void start_helper(btc_rmem *m);
static void stop_helper(btc_rmem *m);

btc_rmem *btc_rmem_open_pid(int pid)
{
    btc_rmem *m = calloc(1, sizeof *m);
    if (m) {
        m->pid = pid;
        m->mem_fd = -1;
        if (pid)
            start_helper(m);
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

/* Forgotten chunks keep their buffers for the next ones: a dump forgets
 * what it read before stopping the target, and the stop then fills the
 * same number of chunks without allocating (or faulting in) any memory. */
void btc_rmem_forget(btc_rmem *m)
{
    for (uint32_t i = 0; i < SLOTS; i++) {
        if (m->slots[i].data)
            m->spare[m->nspare++] = m->slots[i].data;   /* nchunks <= MAX_CHUNKS: room */
        m->slots[i] = (chunk){0};
    }
    m->nchunks = 0;
}

/* A slab aligned to its size, so that the kernel can back it with one
 * transparent huge page (the dumper's own memory, never the target's); 4 KiB
 * pages where it gives none.  A dump of 10,000 greenlets reads ~48 MB of
 * chunks: malloc'd one by one, each faulted in 4 KiB pages while the dump
 * waited (~12,000 faults in a fresh `python -m btcore dump`). */
static uint8_t *new_slab(void)
{
    size_t span = 2 * (size_t)SLAB_SIZE;
    uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uint8_t *slab = (uint8_t *)(((uintptr_t)p + SLAB_SIZE - 1) & ~(uintptr_t)(SLAB_SIZE - 1));
    if (slab > p)
        munmap(p, (size_t)(slab - p));
    munmap(slab + SLAB_SIZE, (size_t)(p + span - (slab + SLAB_SIZE)));
#ifdef MADV_HUGEPAGE
    madvise(slab, SLAB_SIZE, MADV_HUGEPAGE);   /* refused: 4 KiB pages, as before */
#endif
    return slab;
}

static uint8_t *chunk_buffer(btc_rmem *m)
{
    if (m->nspare)
        return m->spare[--m->nspare];
#ifdef __SANITIZE_ADDRESS__
    return malloc(CHUNK_SIZE);   /* its own allocation: ASan sees a read past a chunk */
#endif
    if (!m->nslabs || m->slab_used == SLAB_SIZE) {
        uint8_t *slab = m->nslabs < MAX_SLABS ? new_slab() : NULL;
        if (!slab)
            return NULL;
        m->slabs[m->nslabs++] = slab;
        m->slab_used = 0;
    }
    uint8_t *out = m->slabs[m->nslabs - 1] + m->slab_used;
    m->slab_used += CHUNK_SIZE;
    return out;
}

void btc_rmem_close(btc_rmem *m)
{
    if (!m)
        return;
    stop_helper(m);
    btc_rmem_forget(m);
#ifdef __SANITIZE_ADDRESS__
    while (m->nspare)
        free(m->spare[--m->nspare]);
#endif
    while (m->nslabs)
        munmap(m->slabs[--m->nslabs], SLAB_SIZE);
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
    uint8_t *data = chunk_buffer(m);
    if (!data)
        return NULL;
    uint32_t valid = m->pid ? read_live(m, base, data) : read_segments(m, base, data);
    *c = (chunk){base + 1, valid, data};
    m->nchunks++;
    return c;
}

/* ---- two readers ----
 *
 * A dump's stop is mostly the kernel's work in process_vm_readv: pinning
 * each remote page, then copying it.  The target's threads are stopped, so
 * a core may be idle: a helper thread, started with the reader (outside
 * any stop) and parked, is offered each large job, and it and the caller
 * claim slices of it in turn until none is left.  The caller
 * never waits for a helper that is not running yet (on a loaded machine
 * it may wake late, or after the job: it then finds nothing to claim);
 * it waits only for the slices the helper claimed.  (Before: the job was
 * cut in two halves and a thread started for one of them in the stop; on
 * a loaded 2-core machine, waiting for that thread to start and end took
 * ~20 ms of a 1 ms job.)  A slice stops at once where process_vm_readv is
 * refused (a seccomp filter, qemu-user): the caller then reads what is
 * left through /proc/PID/mem.  The cache and the counters are touched by
 * the caller only, after the job. */

#define SPLIT_BYTES (1u << 20)
#define IOV_BATCH 1024   /* IOV_MAX */
#define SLICES 8      /* a job is claimed in about this many slices (of pages, or of ranges: greenlets' heap
                        copies, ~4 KiB each), of 64 to IOV_BATCH items: one syscall reads a slice */
#define MIN_SLICE 64

static bool refused(ssize_t got)
{
    return got < 0 && (errno == ENOSYS || errno == EPERM);
}

static bool second_cpu(void)
{
    static int cpus;   /* 0: not asked yet (a race only asks twice) */
    if (!cpus) {
        cpu_set_t set;
        cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    }
    return cpus > 1;
}

/* Claim the next slice [*lo, *hi) of the job on offer; false if none is left. */
static bool claim(helper *h, slice_reader **read, void **job, int *lo, int *hi)
{
    pthread_mutex_lock(&h->lock);
    bool some = h->next < h->n;
    if (some) {
        *read = h->read;
        *job = h->job;
        *lo = h->next;
        *hi = h->n - h->next > h->slice ? h->next + h->slice : h->n;
        h->next = *hi;
    }
    pthread_mutex_unlock(&h->lock);
    return some;
}

static void read_slices(helper *h, int pid)
{
    slice_reader *read;
    void *job;
    int lo, hi;
    while (claim(h, &read, &job, &lo, &hi)) {
        read_stats stats = {0, false};
        read(pid, job, lo, hi, &stats);
        pthread_mutex_lock(&h->lock);
        h->done += hi - lo;
        h->stats.syscalls += stats.syscalls;
        h->stats.refused |= stats.refused;
        pthread_mutex_unlock(&h->lock);
    }
}

static void *helper_main(void *arg)
{
    btc_rmem *m = arg;
    helper *h = &m->helper;
    for (;;) {
        while (sem_wait(&h->wake) != 0 && errno == EINTR)
            ;
        pthread_mutex_lock(&h->lock);
        bool quit = h->quit;
        pthread_mutex_unlock(&h->lock);
        if (quit)
            return NULL;
        read_slices(h, m->pid);
    }
}

static void start_helper(btc_rmem *m)
{
    helper *h = &m->helper;
    if (!second_cpu() || pthread_mutex_init(&h->lock, NULL) != 0)
        return;
    if (sem_init(&h->wake, 0, 0) != 0) {
        pthread_mutex_destroy(&h->lock);
        return;
    }
    h->owner = getpid();
    h->running = btc_own_thread_start(&h->thread, helper_main, m) == 0;
    if (!h->running) {
        sem_destroy(&h->wake);
        pthread_mutex_destroy(&h->lock);
    }
}

static void stop_helper(btc_rmem *m)
{
    helper *h = &m->helper;
    if (!h->running || h->owner != getpid())   /* a forked child: no thread to join (POSIX leaves it undefined) */
        return;
    pthread_mutex_lock(&h->lock);
    h->quit = true;
    pthread_mutex_unlock(&h->lock);
    sem_post(&h->wake);
    pthread_join(h->thread, NULL);
    sem_destroy(&h->wake);
    pthread_mutex_destroy(&h->lock);
}

/* read(pid, job, lo, hi, &stats) over [0, n), shared with the helper when
 * bytes (the job's size) make it worth it; true if it was refused. */
static bool read_shared(btc_rmem *m, slice_reader *read, void *job, int n, size_t bytes)
{
    helper *h = &m->helper;
    /* (a forked child has no helper, and its lock may have been held by the helper when it forked) */
    if (!h->running || bytes < SPLIT_BYTES || n < 2 * MIN_SLICE || h->owner != getpid()) {
        read_stats alone = {0, false};
        read(m->pid, job, 0, n, &alone);
        m->syscalls += alone.syscalls;
        return alone.refused;
    }
    pthread_mutex_lock(&h->lock);
    h->read = read;
    h->job = job;
    h->n = n;
    h->next = h->done = 0;
    h->slice = n / SLICES < MIN_SLICE ? MIN_SLICE : n / SLICES > IOV_BATCH ? IOV_BATCH : n / SLICES;
    h->stats = (read_stats){0, false};
    pthread_mutex_unlock(&h->lock);
    sem_post(&h->wake);
    read_slices(h, m->pid);
    for (;;) {   /* the slices the helper claimed */
        pthread_mutex_lock(&h->lock);
        bool all = h->done == n;
        read_stats stats = h->stats;
        if (all)
            h->n = h->next = 0;   /* nothing on offer: a late wake finds nothing */
        pthread_mutex_unlock(&h->lock);
        if (all) {
            m->syscalls += stats.syscalls;
            return stats.refused;
        }
        sched_yield();
    }
}

/* ---- prefetching: many chunks in one syscall ----
 *
 * Following thousands of pointers (greenlets' implementations, their
 * frames, the gc lists) one chunk fill at a time is one syscall each;
 * knowing the addresses first, their chunks are filled together.  The
 * pages are sorted and neighbours share one remote iovec: the kernel pins
 * a remote iovec's pages together, and one iovec per page cost ~4x the
 * time here (2 048 pages: 6.6 ms against 2.3 ms).  process_vm_readv stops
 * at the first page it cannot read: that page stays invalid and the reads
 * go on after it. */

typedef struct {
    uintptr_t addr;
    uint8_t *data;
    chunk *owner;
    bool read;
} page_entry;

static int by_address(const void *a, const void *b)
{
    uintptr_t x = ((const page_entry *)a)->addr, y = ((const page_entry *)b)->addr;
    return (x > y) - (x < y);
}

/* One syscall for the first *tried (at most IOV_BATCH) pages of
 * [start, end): how many of them, from start, were read. */
static int read_pages(int pid, page_entry *page, int start, int end, int *tried, read_stats *stats)
{
    struct iovec remote[IOV_BATCH], local[IOV_BATCH];
    int nremote = 0, nlocal = 0;
    for (int j = start; j < end && nlocal < IOV_BATCH; j++) {
        struct iovec *last = nremote ? &remote[nremote - 1] : NULL;
        local[nlocal++] = (struct iovec){page[j].data, PAGE};
        if (last && (uintptr_t)last->iov_base + last->iov_len == page[j].addr)
            last->iov_len += PAGE;
        else
            remote[nremote++] = (struct iovec){(void *)page[j].addr, PAGE};
    }
    *tried = nlocal;
    stats->syscalls++;
    ssize_t got = process_vm_readv(pid, local, nlocal, remote, nremote, 0);
    stats->refused = refused(got);
    return got > 0 ? (int)(got / PAGE) : 0;
}

static void read_page_range(int pid, void *job, int lo, int hi, read_stats *stats)
{
    page_entry *page = job;
    for (int start = lo, tried; start < hi && !stats->refused;) {
        int pages = read_pages(pid, page, start, hi, &tried, stats);
        for (int j = start; j < start + pages; j++)
            page[j].read = true;
        start += pages < tried ? pages + 1 : pages;   /* past the page that failed */
    }
}

void btc_rmem_prefetch(btc_rmem *m, const uintptr_t *addr, int n)
{
    if (!m->pid || m->mem_fd >= 0 || n <= 0)
        return;   /* reads that are not process_vm_readv gain nothing from batches */
    page_entry *page = malloc((size_t)n * PAGES * sizeof *page);
    int npages = 0;
    for (int i = 0; page && i < n && m->nchunks < MAX_CHUNKS; i++) {
        uintptr_t base = addr[i] & ~(uintptr_t)(CHUNK_SIZE - 1);
        chunk *c = addr[i] ? slot_for(m, base) : NULL;
        uint8_t *data = c && !c->base ? chunk_buffer(m) : NULL;
        if (!data)
            continue;
        *c = (chunk){base + 1, 0, data};
        m->nchunks++;
        for (unsigned p = 0; p < PAGES; p++)
            page[npages++] = (page_entry){base + p * PAGE, data + p * PAGE, c, false};
    }
    qsort(page, npages, sizeof *page, by_address);
    bool refused = read_shared(m, read_page_range, page, npages, (size_t)npages * PAGE);
    for (int j = 0; j < npages; j++)   /* a chunk's pages may lie in both halves */
        if (page[j].read || (refused && read_page_live(m, page[j].addr, page[j].data)))
            page[j].owner->valid |= 1u << ((page[j].addr & (CHUNK_SIZE - 1)) / PAGE);
    free(page);
}

/* Are the pages under [at, at + n) of c all readable? */
static bool readable(const chunk *c, size_t at, size_t n)
{
    for (size_t p = at / PAGE; p <= (at + n - 1) / PAGE; p++)
        if (!(c->valid & (1u << p)))
            return false;
    return true;
}

int btc_rmem_chunk_bases(btc_rmem *m, uintptr_t *out, int max)
{
    int n = 0;
    for (uint32_t i = 0; i < SLOTS && n < max; i++)
        if (m->slots[i].base)
            out[n++] = m->slots[i].base - 1;
    return n;
}

/* A read of many chunks (a thread's stack) in one syscall, past the cache:
 * true if it was read whole (else the caller goes chunk by chunk). */
#define DIRECT_READ (4 * CHUNK_SIZE)

static bool read_direct(btc_rmem *m, uintptr_t addr, void *buf, size_t n)
{
    if (n < DIRECT_READ || !m->pid || m->mem_fd >= 0)
        return false;
    struct iovec local = {buf, n}, remote = {(void *)addr, n};
    m->syscalls++;
    return process_vm_readv(m->pid, &local, 1, &remote, 1, 0) == (ssize_t)n;
}

int btc_rmem_read(btc_rmem *m, uintptr_t addr, void *buf, size_t n)
{
    uint8_t *out = buf;
    if (addr + n < addr)
        return -1;
    if (read_direct(m, addr, buf, n))
        return 0;
    while (n) {
        uintptr_t base = addr & ~(uintptr_t)(CHUNK_SIZE - 1);
        chunk *c = m->last && m->last->base == base + 1 ? m->last : chunk_for(m, base);
        m->last = c;
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
 * stops at the first range it cannot read: the reads go on after it, and
 * the caller reads each range that failed again through the cache (page by
 * page: its readable part is not lost). */

typedef struct {
    const uintptr_t *addr;
    const size_t *size;
    uint8_t *const *dest;
    uint8_t *ok;
} range_job;

static void read_range_span(int pid, void *arg, int lo, int hi, read_stats *stats)
{
    range_job *job = arg;
    for (int i = lo; i < hi && !stats->refused;) {
        struct iovec remote[IOV_BATCH], local[IOV_BATCH];
        int k = 0;
        for (; k < IOV_BATCH && i + k < hi; k++) {
            remote[k] = (struct iovec){(void *)job->addr[i + k], job->size[i + k]};
            local[k] = (struct iovec){job->dest[i + k], job->size[i + k]};
        }
        stats->syscalls++;
        ssize_t got = process_vm_readv(pid, local, k, remote, k, 0);
        stats->refused = refused(got);
        int done = 0;
        for (; done < k && got >= (ssize_t)remote[done].iov_len; done++)
            got -= (ssize_t)remote[done].iov_len;
        for (int j = 0; j < k; j++)
            job->ok[i + j] = j < done;
        i += done < k ? done + 1 : k;   /* past the range that failed */
    }
}

void btc_rmem_read_many(btc_rmem *m, const uintptr_t *addr, const size_t *size, uint8_t *const *dest, int n,
                        uint8_t *ok)
{
    memset(ok, 0, (size_t)n);
    if (m->pid && m->mem_fd < 0) {   /* else (segments, /proc/PID/mem) one range at a time, below */
        size_t bytes = 0;
        for (int i = 0; i < n; i++)
            bytes += size[i];
        range_job job = {addr, size, dest, ok};
        read_shared(m, read_range_span, &job, n, bytes);
    }
    for (int i = 0; i < n; i++)
        if (!ok[i])
            ok[i] = btc_rmem_read(m, addr[i], dest[i], size[i]) == 0;
}

void btc_rmem_read_each(btc_rmem *m, const uintptr_t *addr, int n, size_t size, uint8_t *dest, uint8_t *ok)
{
    if (n <= 0 || size == 0)
        return;
    uintptr_t *under = malloc((size_t)n * 2 * sizeof *under);   /* a range's first and last byte */
    if (under) {   /* (else each chunk is read when first asked) */
        for (int i = 0; i < n; i++) {
            bool fits = addr[i] && addr[i] <= UINTPTR_MAX - (size - 1);
            under[2 * i] = fits ? addr[i] : 0;
            under[2 * i + 1] = fits ? addr[i] + (size - 1) : 0;
        }
        btc_rmem_prefetch(m, under, 2 * n);
        free(under);
    }
    for (int i = 0; i < n; i++)
        ok[i] = btc_rmem_read(m, addr[i], dest + (size_t)i * size, size) == 0;
}

bool btc_rmem_word(btc_rmem *m, uintptr_t addr, uintptr_t *out)
{
    return btc_rmem_read(m, addr, out, sizeof *out) == 0;
}
