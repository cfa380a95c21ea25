/* A core file's segments and notes, for the dump of a crashed process
 * (btcore/remote/process.py): the PT_LOAD segments hold its memory, NT_PRSTATUS
 * each thread's registers, NT_AUXV where the vDSO was, NT_FILE which file
 * each mapping came from.  The headers and the note walker are elf.c's;
 * this file only decodes the notes' descriptions, each bounds-checked
 * against its note: a core is untrusted input like any file.
 *
 * Registers are read as x86-64's user_regs_struct: another machine's core
 * is refused (-2), not misread.
 */
#include <elf.h>
#include <stdlib.h>
#include <sys/auxv.h>   /* AT_SYSINFO_EHDR */
#include <string.h>
#include <sys/stat.h>

#include "symbols/elf.h"

/* A core's notes (a few KiB per thread, NT_FILE's paths) beyond this are
 * garbage. */
#define MAX_CORE_NOTES ((uint64_t)256 << 20)
/* elf_prstatus on x86-64: pr_pid at 32, pr_reg (27 words of
 * user_regs_struct) at 112, in which rip is word 16, rsp 19, rbp 4, rbx 5. */
#define PRSTATUS_PID 32
#define PRSTATUS_REGS 112
#define PRSTATUS_SIZE (PRSTATUS_REGS + 27 * 8)

static uint64_t word(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void add_thread(btc_core *c, const btc_elf_note *n)
{
    if (n->descsz < PRSTATUS_SIZE)
        return;
    if (c->nthreads < c->max_threads) {
        btc_core_thread *t = &c->threads[c->nthreads];
        const uint8_t *regs = n->desc + PRSTATUS_REGS;
        memcpy(&t->tid, n->desc + PRSTATUS_PID, 4);
        t->regs[0] = word(regs + 16 * 8);
        t->regs[1] = word(regs + 19 * 8);
        t->regs[2] = word(regs + 4 * 8);
        t->regs[3] = word(regs + 5 * 8);
    }
    c->nthreads++;
}

static void read_auxv(btc_core *c, const btc_elf_note *n)
{
    for (uint64_t at = 0; at + 16 <= n->descsz; at += 16)
        if (word(n->desc + at) == AT_SYSINFO_EHDR)
            c->vdso = word(n->desc + at + 8);
}

/* NT_FILE: count, page size, count x (start, end, page offset), then count
 * NUL-terminated paths.  A path cut off by the note's end ends the list. */
static void add_files(btc_core *c, const btc_elf_note *n)
{
    reader r = reader_over(n->desc, n->desc + n->descsz);
    uint64_t count = read_u64(&r), page = read_u64(&r);
    reader names = r;
    skip(&names, count <= n->descsz / 24 ? count * 24 : (uint64_t)n->descsz);   /* bad if count lies */
    for (uint64_t i = 0; i < count && !names.bad; i++) {
        uint64_t lo = read_u64(&r), hi = read_u64(&r), pages = read_u64(&r);
        const char *path = read_cstr(&names);
        if (!path || r.bad)
            break;
        size_t len = strlen(path) + 1;
        if (c->nfiles < c->max_files && c->paths_used + len <= c->paths_size) {
            memcpy(c->paths + c->paths_used, path, len);
            c->files[c->nfiles] = (btc_core_file){lo, hi, pages * page, (uint32_t)c->paths_used};
        }
        c->nfiles++;
        c->paths_used += len;
    }
}

static void read_notes(btc_core *c, const uint8_t *data, size_t size)
{
    reader r = reader_over(data, data + size);
    btc_elf_note n;
    while (btc_elf_next_note(&r, &n)) {
        if (!btc_elf_note_named(&n, "CORE"))
            continue;
        if (n.type == NT_PRSTATUS)
            add_thread(c, &n);
        else if (n.type == NT_AUXV)
            read_auxv(c, &n);
        else if (n.type == NT_FILE)
            add_files(c, &n);
    }
}

static void add_segment(btc_core *c, const Elf64_Phdr *ph)
{
    if (c->nsegments < c->max_segments)
        c->segments[c->nsegments] = (btc_core_segment){ph->p_vaddr, ph->p_filesz, ph->p_memsz, ph->p_offset};
    c->nsegments++;
}

/* Every PT_LOAD with file data, and the notes of every PT_NOTE. */
static void read_core(int fd, const Elf64_Phdr *ph, int n, uint64_t file_size, btc_core *c)
{
    for (int i = 0; i < n; i++) {
        if (ph[i].p_type == PT_LOAD && ph[i].p_filesz)
            add_segment(c, &ph[i]);
        if (ph[i].p_type != PT_NOTE || ph[i].p_filesz > MAX_CORE_NOTES || ph[i].p_offset > file_size ||
            ph[i].p_filesz > file_size - ph[i].p_offset)
            continue;
        uint8_t *notes = malloc(ph[i].p_filesz + 1);
        if (notes && btc_read_exact(fd, ph[i].p_offset, notes, ph[i].p_filesz))
            read_notes(c, notes, ph[i].p_filesz);
        free(notes);
    }
}

int btc_core_read(int fd, btc_core *c)
{
    c->nsegments = c->nthreads = c->nfiles = 0;
    c->paths_used = 0;
    c->vdso = 0;
    Elf64_Ehdr eh;
    struct stat st;
    int n = btc_elf_phdrs(fd, &eh, NULL, 0);
    if (n < 0 || fstat(fd, &st) != 0)
        return -1;
    if (eh.e_type != ET_CORE || eh.e_machine != EM_X86_64)
        return -2;
    Elf64_Phdr *ph = malloc((size_t)(n ? n : 1) * sizeof *ph);
    if (!ph || btc_elf_phdrs(fd, &eh, ph, n) != n) {
        free(ph);
        return -1;
    }
    read_core(fd, ph, n, (uint64_t)st.st_size, c);
    free(ph);
    bool fits = c->nsegments <= c->max_segments && c->nthreads <= c->max_threads && c->nfiles <= c->max_files &&
                c->paths_used <= c->paths_size;
    return fits ? 0 : -3;
}
