/* The loaded ELF objects (modules.c): their executable ranges, identity,
 * CFI tables and symbols, kept current across dlopen/dlclose. */
#ifndef BTC_MODULES_H
#define BTC_MODULES_H

#include "capture/cfi_build.h"
#include "common/base.h"
#include "symbols/elf.h"

/* BTC_BUILD_ID_MAX: btcore_api.h (through common/base.h) */

typedef struct btc_module {
    uintptr_t lo, hi;           /* span of executable PT_LOAD segments (absolute) */
    uintptr_t bias;
    char *path;                 /* "" for the vDSO */
    uint8_t build_id[BTC_BUILD_ID_MAX];   /* the GNU build-id note, as mapped (first bytes) */
    size_t build_id_len;                  /* its full length; 0: none */
    uint64_t id;                /* unique in the process: a new one for every mapping seen */
    btc_table *table;           /* built on first use */
    int table_failed;
    btc_elf *elf;               /* symbols, opened on first use (symbols/elf.c) */
} btc_module;

/* Take the module lock and bring the list up to date (dlopen/dlclose are
 * noticed through dl_iterate_phdr's adds/subs counters; stale tables are
 * dropped).  Everything below needs it held; release it when done. */
void btc_modules_acquire(void);
void btc_modules_release(void);
/* Bumped whenever the list is rebuilt: tables and symbols of the previous
 * generation may be freed, so whoever caches pointers into them (the
 * walker's row cache) drops its entries when this changes. */
extern uint64_t btc_modules_generation;

/* The same from a signal handler: the lock if it is free (false: busy,
 * perhaps held by the interrupted code), the list as it is (no refresh), and
 * no table built until btc_modules_release(): btc_module_table() answers
 * NULL for a module whose table is pending. */
bool btc_modules_try_acquire_prebuilt(void);
/* Has m's table simply not been built yet (not failed)? */
bool btc_module_table_pending(const btc_module *m);

btc_module *btc_module_find(uintptr_t pc);
/* The module's CFI table, built on first use (under the loader lock so the
 * module cannot be unloaded while we parse its mapped .eh_frame). */
const btc_table *btc_module_table(btc_module *m);
/* Build the CFI table of every module loaded now (a crash handler may
 * not build one: it allocates).  Takes the lock.  Returns how many have one. */
int btc_modules_build_tables(void);
/* The module's symbols, opened on first use (btc_module_file); NULL for
 * the vDSO, an unreadable file or none that is the module. */
btc_elf *btc_module_elf(btc_module *m);
/* A read descriptor on the file of the module at path with the mapped
 * build-id (id, id_len), mapped at `inside`: the file at path if it still
 * has that build-id, else the inode mapped (/proc/self/map_files), if the
 * kernel lets it be opened and it has; -1 if none.  used (size bytes, may
 * be 0): the path opened, "" if none.  The vDSO has none. */
int btc_module_file(const char *path, const uint8_t *id, size_t id_len, uintptr_t inside, char *used, size_t size);
/* Is a file's build-id (file_id, file_len: btc_elf_file_build_id()'s
 * answer) the module's (id, len)?  A module without one (len 0) has
 * nothing to check by: any file is taken. */
bool btc_module_build_is(const uint8_t *file_id, int file_len, const uint8_t *id, size_t len);
/* btc_elf_function_ranges() on the module containing `inside`, as absolute
 * addresses. */
int btc_module_function_ranges(uintptr_t inside, const char *name, uintptr_t *lo, uintptr_t *hi, int max);

#endif
