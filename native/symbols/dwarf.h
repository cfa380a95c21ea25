/* The DWARF engine (dwarf.c): one per ELF file, decoded lazily, kept:
 * address -> compile unit -> line rows and inline chain. */
#ifndef BTC_DWARF_H
#define BTC_DWARF_H

#include "common/base.h"

typedef struct btc_dwarf btc_dwarf;

/* The ELF file open as fd (path: its name, where its debug link is looked
 * for); NULL if it is not a readable ELF file.  A file without DWARF still
 * opens: lookups then answer 0. */
btc_dwarf *btc_dwarf_open(int fd, const char *path, const char *debug_root);
void btc_dwarf_close(btc_dwarf *d);
/* addr2line -f -i for module-relative vaddr: innermost inlined call first.
 * Without DWARF for vaddr, one level named from the symbol table with a
 * NULL file.  Strings point into d.  Returns the number of levels written. */
int btc_dwarf_lookup(btc_dwarf *d, uint64_t vaddr, btc_srcframe *out, int max);
/* The symbol covering vaddr: the module's own table's (what the loader and
 * addr2line see first), else its separate debug file's fuller .symtab (the
 * only name of a static function in a stripped library); *start: its
 * start.  The name points into d. */
const char *btc_dwarf_symbol(btc_dwarf *d, uint64_t vaddr, uintptr_t *start);
/* Bytes d holds: section copies plus decoded tables. */
size_t btc_dwarf_memory(const btc_dwarf *d);
/* Eviction by size (symbols/symbolize.c): when d's least recently used
 * decoded unit served its last lookup (UINT64_MAX: d has none to give
 * back; the unit of the latest lookup is never given back), and dropping
 * that unit's decoded state (its DIE bytes, abbreviations, rows, scopes),
 * returning the bytes freed.  The unit is decoded again when next needed. */
uint64_t btc_dwarf_oldest_use(const btc_dwarf *d);
/* Counts the decoding steps of every btc_dwarf (any that allocates): the
 * bytes held can only have grown when it has changed. */
uint64_t btc_dwarf_decodes(void);
size_t btc_dwarf_forget_oldest(btc_dwarf *d);
/* How many times d read a unit's DIE bytes (tests: what a lookup decoded). */
uint64_t btc_dwarf_units_read(const btc_dwarf *d);

#endif
