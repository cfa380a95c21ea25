/* ELF files on disk (elf.c): sections, symbols, separate debug files.  Read
 * with pread into the heap, never mmap, so a file truncated under us is an
 * error, not a SIGBUS. */
#ifndef BTC_ELF_H
#define BTC_ELF_H

#include <elf.h>

#include "common/reader.h"

/* btc_elf, btc_elf_open/close, btc_elf_symbol_value, btc_elf_file_build_id
 * and btc_core_read: btcore_api.h ("ELF files"). */

/* Exactly size bytes of the file fd at off (pread), or false (a short read:
 * the file is truncated). */
bool btc_read_exact(int fd, uint64_t off, void *buf, size_t size);

/* The file at path, read once and shared: opening a file already open
 * (same device, inode, size and mtime) returns the same btc_elf, counted;
 * the last close frees it.  Immutable once open: usable by any thread
 * without a lock. */
/* The same for the file open as fd (a regular file; the caller keeps fd:
 * the btc_elf reads through its own duplicate).  btc_elf_open(path) opens
 * path with btc_open_regular() first: nothing but a regular file is ever
 * opened, whoever named the path. */
btc_elf *btc_elf_open_fd(int fd);
/* The symbol covering the virtual address vaddr (module-relative). */
const char *btc_elf_symbolize(btc_elf *e, uintptr_t vaddr, uintptr_t *sym_vaddr);
/* Address range [lo, hi) of every function symbol whose name is `name` or
 * starts with `name` followed by '.' (gcc's .cold/.part clones); returns how
 * many ranges were written. */
int btc_elf_function_ranges(btc_elf *e, const char *name, uintptr_t *lo, uintptr_t *hi, int max);

void btc_bytes_free(btc_bytes *b);
/* The same for a big buffer read for one pass (a whole section scanned
 * once): its pages go back to the system now.  glibc raises its mmap
 * threshold after the first big free, so later big buffers come from the
 * heap, which keeps freed pages: resolution's memory bound would hold
 * for what the caches keep but not for RSS. */
void btc_bytes_free_transient(btc_bytes *b);

/* The contents of section `name`, decompressed (SHF_COMPRESSED or a legacy
 * .zdebug_ twin); false if the section is absent, unreadable or corrupt. */
bool btc_elf_read_section(btc_elf *e, const char *name, btc_bytes *out);
bool btc_elf_has_section(btc_elf *e, const char *name);
bool btc_elf_section_compressed(btc_elf *e, const char *name);

/* Random access into a compressed section: points recorded while it is
 * read whole once (NULL for a section stored plain). */
typedef struct btc_zindex btc_zindex;
bool btc_elf_read_section_indexed(btc_elf *e, const char *name, btc_bytes *out, btc_zindex **index);
void btc_zindex_free(btc_zindex *ix);
size_t btc_zindex_memory(const btc_zindex *ix);
/* At most size bytes of section `name`'s contents from off (fewer at its
 * end), read alone: pread for a plain section; a compressed one is
 * inflated from index's nearest point before off, never whole.  False if
 * off is past the end, or the section is compressed and index is NULL. */
bool btc_elf_read_section_part(btc_elf *e, const char *name, const btc_zindex *index, uint64_t off, uint64_t size,
                               btc_bytes *out);

/* The separate debug file holding e's DWARF (found through its build-id
 * under debug_root, or its .gnu_debuglink), or NULL.  path is e's own path. */
btc_elf *btc_elf_open_debug_file(btc_elf *e, const char *path, const char *debug_root);

/* ---- notes and program headers (not sections: what is mapped) ---- */

typedef struct {
    uint32_t type, namesz, descsz;
    const uint8_t *name, *desc;   /* inside the reader's buffer */
} btc_elf_note;
/* The next note of a note segment or section r spans; false at its end or
 * where a note does not fit (r is then bad). */
bool btc_elf_next_note(reader *r, btc_elf_note *n);
/* Whether the note's name is `name` (with its NUL). */
bool btc_elf_note_named(const btc_elf_note *n, const char *name);
/* The GNU build-id among the n bytes of notes at a (its first max bytes
 * copied to out): its full length, or 0. */
size_t btc_note_build_id(const uint8_t *a, size_t n, uint8_t *out, size_t max);
/* The ELF header of the 64-bit little-endian file open as fd, and its
 * program headers (at most max written, PN_XNUM counts followed): how many
 * it has, or -1 if it is not such a file or they lie outside it. */
int btc_elf_phdrs(int fd, Elf64_Ehdr *eh, Elf64_Phdr *out, int max);
/* The build-id in the PT_NOTE segments among ph[0..n) of the file open as fd
 * (first max bytes to out): its full length, or 0. */
size_t btc_elf_phdrs_build_id(int fd, const Elf64_Phdr *ph, int n, uint8_t *out, size_t max);

#endif
