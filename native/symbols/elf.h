/* ELF files on disk (elf.c): sections, symbols, separate debug files.  Read
 * with pread into the heap, never mmap, so a file truncated under us is an
 * error, not a SIGBUS. */
#ifndef BTC_ELF_H
#define BTC_ELF_H

#include "common/reader.h"

typedef struct btc_elf btc_elf;
/* The file at path, read once and shared: opening a file already open
 * (same device, inode, size and mtime) returns the same btc_elf, counted;
 * the last close frees it.  Immutable once open: usable by any thread
 * without a lock. */
btc_elf *btc_elf_open(const char *path);
void btc_elf_close(btc_elf *e);
/* The symbol covering the virtual address vaddr (module-relative). */
const char *btc_elf_symbolize(btc_elf *e, uintptr_t vaddr, uintptr_t *sym_vaddr);
/* Address range [lo, hi) of every function symbol whose name is `name` or
 * starts with `name` followed by '.' (gcc's .cold/.part clones); returns how
 * many ranges were written. */
int btc_elf_function_ranges(btc_elf *e, const char *name, uintptr_t *lo, uintptr_t *hi, int max);

void btc_bytes_free(btc_bytes *b);

/* The contents of section `name`, decompressed (SHF_COMPRESSED or a legacy
 * .zdebug_ twin); false if the section is absent, unreadable or corrupt. */
bool btc_elf_read_section(btc_elf *e, const char *name, btc_bytes *out);
bool btc_elf_has_section(btc_elf *e, const char *name);

/* The separate debug file holding e's DWARF (found through its build-id
 * under debug_root, or its .gnu_debuglink), or NULL.  path is e's own path. */
btc_elf *btc_elf_open_debug_file(btc_elf *e, const char *path, const char *debug_root);

#endif
