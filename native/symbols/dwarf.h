/* Source locations from DWARF, and the ELF-file helpers they are built on.
 *
 *   elf.c    reads sections (decompressing them) and finds separate debug files
 *   dwarf.c  address -> compile unit -> line rows and inline chain
 */
#ifndef BTC_DWARF_H
#define BTC_DWARF_H

#include "common/btcore.h"

/* A heap buffer holding a section's contents, followed by one NUL byte
 * (not counted in size) so strings at its end are terminated. */
typedef struct {
    uint8_t *data;
    size_t size;
} btc_bytes;

void btc_bytes_free(btc_bytes *b);

/* The contents of section `name`, decompressed (SHF_COMPRESSED or a legacy
 * .zdebug_ twin); false if the section is absent, unreadable or corrupt. */
bool btc_elf_read_section(btc_elf *e, const char *name, btc_bytes *out);

#endif

bool btc_elf_has_section(btc_elf *e, const char *name);

/* The separate debug file holding e's DWARF (found through its build-id
 * under debug_root, or its .gnu_debuglink), or NULL.  path is e's own path. */
btc_elf *btc_elf_open_debug_file(btc_elf *e, const char *path, const char *debug_root);

/* ---- DWARF engine (dwarf.c): one per ELF file, decoded lazily, kept ---- */

typedef struct btc_dwarf btc_dwarf;

/* NULL if path is not a readable ELF file.  A file without DWARF still
 * opens: lookups then answer 0. */
btc_dwarf *btc_dwarf_open(const char *path, const char *debug_root);
void btc_dwarf_close(btc_dwarf *d);
/* addr2line -f -i for module-relative vaddr: innermost inlined call first.
 * Without DWARF for vaddr, one level named from the symbol table with a
 * NULL file.  Strings point into d.  Returns the number of levels written. */
int btc_dwarf_lookup(btc_dwarf *d, uint64_t vaddr, btc_srcframe *out, int max);
/* Bytes d holds: section copies plus decoded tables. */
size_t btc_dwarf_memory(const btc_dwarf *d);
