/* Another process's modules: their CFI tables, built from the files on disk,
 * and the one walker (capture/unwind.c) run over a copy of a remote stack.
 *
 * A module is added from one of its mappings (/proc/PID/maps or a core's
 * NT_FILE note): the file's PT_LOAD segments give the load bias, and the
 * GNU build-id in the target's memory must equal the file's (a library
 * rebuilt or upgraded since the target loaded it would give wrong rows).
 * The file's loadable segments are read (pread, never mmap: see elf.c) into
 * one heap image laid out as the loader lays it out, so that
 * btc_table_build() parses it exactly like a module loaded here; rows are
 * relative to the bias, so they serve the target's addresses unchanged.
 * Images and tables are made on first use (a dump touches few modules),
 * and belong to the file: every set that adds the same file shares them,
 * and a few are kept after the last set lets go ("Kept files" below).
 *
 * The walk: the target's stack bytes were copied into a local buffer while
 * it was stopped; btc_memview's spill, which serves greenlet's heap copy of
 * a stack, here covers the whole view, so the walker reads the copy at the
 * target's addresses and needs no change.  Only where rows come from
 * differs (btc_context.rows).
 */
#include <Python.h>   /* first, as Python asks (through capture/greenlet_context.h) */
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capture/capture.h"
#include "capture/cpython/pyframes.h"
#include "capture/evalloop.h"
#include "capture/greenlet_context.h"
#include "capture/modules.h"
#include "capture/unwind.h"
#include "common/array.h"
#include "common/errors.h"
#include "common/search.h"
#include "remote/rmem.h"
#include "symbols/elf.h"

#define MAX_PHDRS 64
#define MAX_IMAGE (1ULL << 30)
#define MAX_NOTE (1u << 16)
#define MAX_RMODULES 4096

/* What a module's file gives, whoever maps it: shared, and kept (below). */
typedef struct rfile {
    dev_t dev;                /* the file: a file replaced or rewritten since is another one */
    ino_t ino;
    off_t size;
    struct timespec mtime;
    uint8_t *image;           /* the PT_LOAD segments as loaded, from vaddr `image_vaddr` */
    uint64_t image_vaddr, image_size;
    btc_table *table;         /* set once (release), read without the lock (acquire) */
    bool image_failed, table_failed;
    int users;                /* sets holding it */
    uint64_t released;        /* when its last user let go: the oldest kept goes first */
    struct rfile *next;
} rfile;

typedef struct {
    char *path;
    uintptr_t bias, lo, hi;   /* the target's load bias and executable span */
    Elf64_Phdr phdrs[MAX_PHDRS];
    int nphdrs;
    rfile *file;
} rmodule;

struct btc_rmodules {
    btc_row_source source;    /* first: the walker hands it back to find_row */
    rmodule **list;           /* sorted by lo */
    size_t n, cap;
};

static const btc_cfi_row *find_row(const btc_row_source *src, uintptr_t pc, bool *in_module);
static rfile *file_for(int fd);
static void let_go(rfile *f);

btc_rmodules *btc_rmodules_new(void)
{
    btc_rmodules *s = calloc(1, sizeof *s);
    if (s)
        s->source.find = find_row;
    return s;
}

void btc_rmodules_free(btc_rmodules *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        let_go(s->list[i]->file);
        free(s->list[i]->path);
        free(s->list[i]);
    }
    free(s->list);
    free(s);
}

/* ---- the file ---- */

static bool read_phdrs(int fd, rmodule *m)
{
    Elf64_Ehdr eh;
    m->nphdrs = btc_elf_phdrs(fd, &eh, m->phdrs, MAX_PHDRS);
    return m->nphdrs > 0 && m->nphdrs <= MAX_PHDRS;
}

/* The same note, as mapped in the target. */
static size_t mapped_build_id(btc_rmem *mem, const rmodule *m, uint8_t *out)
{
    for (int i = 0; i < m->nphdrs; i++) {
        const Elf64_Phdr *ph = &m->phdrs[i];
        uint8_t note[MAX_NOTE];
        if (ph->p_type != PT_NOTE || ph->p_memsz > MAX_NOTE ||
            btc_rmem_read(mem, m->bias + ph->p_vaddr, note, ph->p_memsz) != 0)
            continue;
        size_t n = btc_note_build_id(note, ph->p_memsz, out, BTC_BUILD_ID_MAX);
        if (n)
            return n;
    }
    return 0;
}

/* The bias from the mapping of file offset map_offset at map_start, and the
 * executable span; false if no PT_LOAD maps that offset. */
static bool place(rmodule *m, uintptr_t map_start, uint64_t map_offset)
{
    bool placed = false;
    m->lo = UINTPTR_MAX;
    m->hi = 0;
    for (int i = 0; i < m->nphdrs; i++) {
        const Elf64_Phdr *ph = &m->phdrs[i];
        if (ph->p_type != PT_LOAD)
            continue;
        if (!placed && (ph->p_offset & ~4095ULL) == map_offset) {
            m->bias = map_start - (ph->p_vaddr & ~4095ULL);
            placed = true;
        }
    }
    for (int i = 0; placed && i < m->nphdrs; i++) {
        const Elf64_Phdr *ph = &m->phdrs[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            if (m->bias + ph->p_vaddr < m->lo) m->lo = m->bias + ph->p_vaddr;
            if (m->bias + ph->p_vaddr + ph->p_memsz > m->hi) m->hi = m->bias + ph->p_vaddr + ph->p_memsz;
        }
    }
    return placed && m->lo < m->hi;
}

static int insert_sorted(btc_rmodules *s, rmodule *m)
{
    size_t at = BTC_PARTITION_POINT(s->n, i, s->list[i]->lo < m->lo);
    if ((at < s->n && s->list[at]->lo < m->hi) || (at > 0 && s->list[at - 1]->hi > m->lo))
        return -2;   /* overlaps a module already added (the same file twice) */
    if (s->n >= MAX_RMODULES || !grow((void **)&s->list, &s->cap, s->n + 1, sizeof *s->list))
        return -1;
    memmove(s->list + at + 1, s->list + at, (s->n - at) * sizeof *s->list);
    s->list[at] = m;
    s->n++;
    return 0;
}

int btc_rmodules_add(btc_rmodules *s, btc_rmem *mem, const char *path, uintptr_t map_start,
                     uint64_t map_offset, uintptr_t *bias)
{
    rmodule *m = calloc(1, sizeof *m);
    int fd = btc_open_regular(path, NULL);   /* the target's maps name it: never a FIFO or a device */
    int rc = -1;
    uint8_t want[BTC_BUILD_ID_MAX], have[BTC_BUILD_ID_MAX];
    if (!m || fd < 0 || !read_phdrs(fd, m))
        goto fail;   /* -1: unreadable, or not a 64-bit ELF file */
    rc = -2;
    if (!place(m, map_start, map_offset))
        goto fail;
    size_t nwant = btc_elf_phdrs_build_id(fd, m->phdrs, m->nphdrs, want, BTC_BUILD_ID_MAX);
    size_t nhave = mem ? mapped_build_id(mem, m, have) : nwant;
    rc = -3;
    if (mem && (nwant != nhave || memcmp(want, have, nwant < BTC_BUILD_ID_MAX ? nwant : BTC_BUILD_ID_MAX) != 0))
        goto fail;   /* the file on disk is not the one the target mapped */
    rc = -1;
    m->file = file_for(fd);
    close(fd);
    fd = -1;
    m->path = strdup(path);
    *bias = m->bias;
    if (m->file && m->path && (rc = insert_sorted(s, m)) == 0)
        return 0;
fail:
    if (fd >= 0)
        close(fd);
    if (m) {
        let_go(m->file);
        free(m->path);
    }
    free(m);
    return rc;
}

/* ---- kept files ----
 *
 * An image and its table depend on the file alone (rows are relative to the
 * load bias), so the sets that add the same file share them, and the last
 * to let go keeps them: the next dump of the program, or of another of its
 * processes, finds them built (a dump of a gevent target: ~6.5 ms of
 * reading and building for the interpreter, the C library and the
 * extensions, every time).  Bounded: at most MAX_KEPT files no set uses,
 * MAX_KEPT_BYTES of their images, the longest unused go first.  One lock,
 * for the list and for making an image or a table (never taken from a
 * signal handler or a tracer); a fork child forgets the list (another
 * thread may have held the lock). */

#define MAX_KEPT 32
#define MAX_KEPT_BYTES (64ULL << 20)

static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;
static rfile *files;             /* in use or kept */
static uint64_t release_clock;
static uint64_t images_read;     /* btc_rmodules_images_read() */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void forget_in_child(void)
{
    pthread_mutex_init(&files_lock, NULL);
    files = NULL;   /* leaked: the parent's sets may be in this process and use them */
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, forget_in_child);
}

static bool same_file(const rfile *f, const struct stat *st)
{
    return f->dev == st->st_dev && f->ino == st->st_ino && f->size == st->st_size &&
           f->mtime.tv_sec == st->st_mtim.tv_sec && f->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* The file open at fd, shared (NULL: out of memory, or fstat failed). */
static rfile *file_for(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return NULL;
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&files_lock);
    rfile *f = files;
    while (f && !same_file(f, &st))
        f = f->next;
    if (!f && (f = calloc(1, sizeof *f)) != NULL) {
        *f = (rfile){.dev = st.st_dev, .ino = st.st_ino, .size = st.st_size, .mtime = st.st_mtim, .next = files};
        files = f;
    }
    if (f)
        f->users++;
    pthread_mutex_unlock(&files_lock);
    return f;
}

static void drop(rfile **at)
{
    rfile *f = *at;
    *at = f->next;
    btc_table_free(f->table);
    free(f->image);
    free(f);
}

static void drop_oldest_kept(void)
{
    rfile **oldest = NULL;
    for (rfile **at = &files; *at; at = &(*at)->next)
        if ((*at)->users == 0 && (!oldest || (*at)->released < (*oldest)->released))
            oldest = at;
    drop(oldest);
}

/* A set lets go of f: kept if its image was read (most of a dump's modules
 * never are), then the oldest kept dropped while there are too many. */
static void let_go(rfile *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&files_lock);
    f->released = ++release_clock;
    if (--f->users == 0 && !f->image) {
        rfile **at = &files;
        while (*at && *at != f)   /* (not there: a fork child's, from the parent's list) */
            at = &(*at)->next;
        if (*at)
            drop(at);
    }
    for (;;) {
        int kept = 0;
        uint64_t bytes = 0;
        for (const rfile *k = files; k; k = k->next)
            if (k->users == 0) {
                kept++;
                bytes += k->image_size;
            }
        if (kept <= MAX_KEPT && bytes <= MAX_KEPT_BYTES)
            break;
        drop_oldest_kept();
    }
    pthread_mutex_unlock(&files_lock);
}

uint64_t btc_rmodules_images_read(void)
{
    return __atomic_load_n(&images_read, __ATOMIC_RELAXED);
}

/* ---- the image and the table, on first use (with files_lock held) ---- */

static bool load_image(const rmodule *m, rfile *f)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < m->nphdrs; i++) {
        const Elf64_Phdr *ph = &m->phdrs[i];
        if (ph->p_type != PT_LOAD || ph->p_filesz > ph->p_memsz)
            continue;
        if ((ph->p_vaddr & ~4095ULL) < lo) lo = ph->p_vaddr & ~4095ULL;
        if (ph->p_vaddr + ph->p_memsz > hi) hi = ph->p_vaddr + ph->p_memsz;
    }
    if (lo >= hi || hi - lo > MAX_IMAGE)
        return false;
    int fd = btc_open_regular(m->path, NULL);
    struct stat st;
    uint8_t *image = fd >= 0 && fstat(fd, &st) == 0 && same_file(f, &st) ? calloc(1, hi - lo) : NULL;
    bool ok = image != NULL;   /* (the file at the path now must be the one added) */
    for (int i = 0; ok && i < m->nphdrs; i++) {
        const Elf64_Phdr *ph = &m->phdrs[i];
        if (ph->p_type == PT_LOAD && ph->p_filesz <= ph->p_memsz)
            ok = btc_read_exact(fd, ph->p_offset, image + (ph->p_vaddr - lo), ph->p_filesz);
    }
    if (fd >= 0)
        close(fd);
    if (!ok) {
        free(image);
        return false;
    }
    f->image = image;
    f->image_vaddr = lo;
    f->image_size = hi - lo;
    images_read++;
    return true;
}

/* The local address of the image byte at module-relative vaddr v. */
static uintptr_t local(const rmodule *m, uint64_t v)
{
    return (uintptr_t)m->file->image + (v - m->file->image_vaddr);
}

static bool have_image_locked(rmodule *m)
{
    rfile *f = m->file;
    if (!f->image && !f->image_failed)
        f->image_failed = !load_image(m, f);
    return f->image != NULL;
}

static bool have_image(rmodule *m)
{
    pthread_mutex_lock(&files_lock);
    bool have = have_image_locked(m);
    pthread_mutex_unlock(&files_lock);
    return have;
}

static void describe(const rmodule *m, btc_image *img)
{
    const rfile *f = m->file;
    memset(img, 0, sizeof *img);
    img->bias = local(m, 0);
    for (int i = 0; i < m->nphdrs; i++) {
        const Elf64_Phdr *ph = &m->phdrs[i];
        if (ph->p_type == PT_GNU_EH_FRAME && ph->p_vaddr >= f->image_vaddr &&
            ph->p_vaddr < f->image_vaddr + f->image_size)
            img->eh_frame_hdr = (const uint8_t *)local(m, ph->p_vaddr);
        if (ph->p_type == PT_LOAD && ph->p_filesz <= ph->p_memsz && img->nreadable < 8) {
            img->readable_lo[img->nreadable] = local(m, ph->p_vaddr);
            img->readable_hi[img->nreadable++] = local(m, ph->p_vaddr + ph->p_memsz);
        }
    }
}

/* Called for every frame the walk steps through: the lock only until the table is made. */
static const btc_table *table_of(rmodule *m)
{
    rfile *f = m->file;
    const btc_table *t = __atomic_load_n(&f->table, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    pthread_mutex_lock(&files_lock);
    if (!f->table && !f->table_failed && have_image_locked(m)) {
        btc_image img;
        describe(m, &img);
        btc_table *built = btc_table_build(&img);
        f->table_failed = built == NULL;
        __atomic_store_n(&f->table, built, __ATOMIC_RELEASE);
    }
    t = f->table;
    pthread_mutex_unlock(&files_lock);
    return t;
}

static rmodule *module_at(const btc_rmodules *s, uintptr_t pc)
{
    size_t i = BTC_PARTITION_POINT(s->n, k, s->list[k]->hi <= pc);
    return i < s->n && s->list[i]->lo <= pc ? s->list[i] : NULL;
}

static const btc_cfi_row *find_row(const btc_row_source *src, uintptr_t pc, bool *in_module)
{
    rmodule *m = module_at((const btc_rmodules *)src, pc);
    *in_module = m != NULL;
    const btc_table *t = m ? table_of(m) : NULL;
    return t && pc - m->bias <= UINT32_MAX ? btc_table_lookup(t, (uint32_t)(pc - m->bias)) : NULL;
}

/* ---- the walk ---- */

_Static_assert(BTC_REMOTE_MAX_FRAMES == BTC_REMOTE_MAX_NATIVE + BTC_REMOTE_MAX_PYFRAMES, "btcore_api.h's sum");

static bool copied_word(const btc_remote_stack *st, int32_t at, uintptr_t *out)
{
    if (at < 0 || (uint64_t)at + sizeof *out > st->size)
        return false;
    memcpy(out, st->copy + at, sizeof *out);
    return true;
}

/* A suspended greenlet resumes in slp_switch, whose saved rbp and rbx lie
 * in its copy at the slots read from greenlet's code (x86-64's registers:
 * remote/process.py refuses other machines). */
static bool greenlet_regs(const btc_remote_target *t, btc_remote_stack *st)
{
    st->regs[0] = t->resume_pc;
    st->regs[1] = st->lo;
    return copied_word(st, t->bp_slot, &st->regs[2]) && copied_word(st, t->bx_slot, &st->regs[3]);
}

/* One stack of the target: walked over its copy, its frames marked as the
 * in-process walk marks them (the target's eval loop, greenlet's module),
 * then merged with its Python frames by collect()'s merge (capture.c). */
static int remote_stack(btc_rmodules *s, const btc_remote_target *t, btc_remote_stack *st, btc_pyframe *py,
                        btc_frame *out, int max)
{
    btc_native_frame nat[BTC_REMOTE_MAX_NATIVE];
    int n = 0, npy = st->npy < BTC_REMOTE_MAX_PYFRAMES ? st->npy : BTC_REMOTE_MAX_PYFRAMES;
    st->unwalked = st->greenlet && st->size && !greenlet_regs(t, st);
    if (st->size && !st->unwalked && (t->want & BTC_WANT_NATIVE)) {
        btc_context ctx = {
            .regs = {st->regs[0], st->regs[1], st->regs[2], st->regs[3]},
            .ip_is_exact = !st->greenlet,   /* a thread stopped at its pc; a greenlet at a return address */
            .mem = {.lo = st->lo, .hi = st->lo + st->size, .spill_lo = st->lo, .spill_hi = st->lo + st->size,
                    .spill = st->copy},
            .last_cfa = st->last_cfa,
            .rows = &s->source,
        };
        for (; !st->greenlet && ctx.nend < t->nstub; ctx.nend++) {   /* a thread's stack ends at greenlet's stub */
            ctx.end_lo[ctx.nend] = t->stub_lo[ctx.nend];
            ctx.end_hi[ctx.nend] = t->stub_hi[ctx.nend];
        }
        n = btc_unwind(&ctx, nat, BTC_REMOTE_MAX_NATIVE);
        for (int i = 0; i < n; i++) {
            uintptr_t at = nat[i].pc - !nat[i].exact;
            nat[i].eval = false;
            for (int k = 0; k < t->neval && !nat[i].eval; k++)
                nat[i].eval = at >= t->eval_lo[k] && at < t->eval_hi[k];
        }
    }
    st->cut = 0;
    if (npy > 0 && st->py[npy - 1].code == 0)   /* a chain cut short: the last frame says why */
        st->cut = st->py[--npy].lasti;
    for (int i = 0; i < npy; i++)
        py[i] = (btc_pyframe){.code = (PyObject *)st->py[i].code, .lasti = st->py[i].lasti,
                              .entry = st->py[i].entry};
    btc_merge_input in = {.nat = nat, .n = n, .complete = n < BTC_REMOTE_MAX_NATIVE, .greenlet = st->greenlet,
                          /* [0, 1) when the target has no greenlet: nothing is
                           * greenlet's, and this process's greenlet is not asked */
                          .internal_lo = t->greenlet_lo, .internal_hi = t->greenlet_hi ? t->greenlet_hi : 1,
                          .py = py, .npy = npy, .want = t->want};
    bool truncated;
    st->n = btc_merge_frames(&in, out, max, &truncated);
    st->truncated = truncated || npy < st->npy - (st->cut != 0);
    return st->n;
}

int btc_remote_stacks(btc_rmodules *s, const btc_remote_target *t, btc_remote_stack *stacks, int n,
                      btc_frame *out, int max)
{
    int done = 0, used = 0, each = t->capacity < BTC_REMOTE_MAX_FRAMES ? t->capacity : BTC_REMOTE_MAX_FRAMES;
    btc_pyframe *py = malloc(BTC_REMOTE_MAX_PYFRAMES * sizeof *py);   /* ~100 KiB: not on the stack */
    if (!py)
        return btc_fail(BTC_E_NOMEMORY, "out of memory");
    for (; done < n && max - used >= each; done++) {
        stacks[done].at = used;
        used += remote_stack(s, t, &stacks[done], py, out + used, each);
    }
    free(py);
    return done;
}

/* ---- greenlet's switching code, read from its file ---- */

int btc_rmodules_greenlet_shape(btc_rmodules *s, uintptr_t inside, btc_remote_greenlet_code *out)
{
    rmodule *m = module_at(s, inside);
    btc_elf *elf = m && have_image(m) ? btc_elf_open(m->path) : NULL;
    if (!elf)
        return -1;
    uintptr_t lo[2], hi[2], tlo[4], thi[4];
    int n = btc_elf_function_ranges(elf, "slp_switch", lo, hi, 2);
    int t = btc_elf_function_ranges(elf, "slp_save_state_trampoline", tlo, thi, 4);
    out->nstub = btc_elf_function_ranges(elf, BTC_GREENLET_INITIAL_STUB, out->stub_lo, out->stub_hi, 2);
    btc_elf_close(elf);
    bool inside_image = n == 1 && lo[0] >= m->file->image_vaddr &&
                        hi[0] <= m->file->image_vaddr + m->file->image_size;
    for (int i = 0; i < t; i++)
        tlo[i] = local(m, tlo[i]);
    btc_switch_shape shape;
    if (!inside_image || t < 1 || !btc_switch_shape_of(local(m, lo[0]), local(m, hi[0]), tlo, t, &shape))
        return -2;
    out->resume_pc = shape.resume_pc - local(m, 0) + m->bias;
    out->bp_slot = shape.fp_slot;
    out->bx_slot = shape.aux_slot;
    for (int i = 0; i < out->nstub; i++) {
        out->stub_lo[i] += m->bias;
        out->stub_hi[i] += m->bias;
    }
    return 0;
}

int btc_rmodules_eval_ranges(btc_rmodules *s, uintptr_t inside, uintptr_t *lo, uintptr_t *hi, int max)
{
    rmodule *m = module_at(s, inside);
    const btc_table *t = m ? table_of(m) : NULL;
    btc_elf *elf = t ? btc_elf_open(m->path) : NULL;
    if (!elf)
        return 0;
    int named = 0;
    for (const char *const *name = btc_py_eval_functions; *name && named < max; name++)
        named += btc_elf_function_ranges(elf, *name, lo + named, hi + named, max - named);
    btc_elf_close(elf);
    for (int i = 0; i < named; i++) {   /* module-relative -> the target's addresses */
        lo[i] += m->bias;
        hi[i] += m->bias;
    }
    int n = named;
    for (int i = 0; i < named; i++) {
        uint64_t vlo = lo[i] - m->bias, vhi = hi[i] - m->bias;
        if (vlo < m->file->image_vaddr || vhi > m->file->image_vaddr + m->file->image_size || vlo >= vhi)
            continue;   /* its bytes are not in the image read from the file */
        btc_jump_scan scan = {(const uint8_t *)local(m, vlo), lo[i], hi[i], m->lo, m->hi, m->bias, t};
        n = btc_jump_parts(&scan, lo, hi, n, max);
    }
    return n;
}
