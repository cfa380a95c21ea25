/* Internal interfaces between the units of btcore's native core.
 *
 *   context  (context.h)  where a walk starts and how it reads memory
 *   cfi.c                 .eh_frame -> compact rows (btc_table)
 *   modules.c             loaded ELF objects and their cached tables
 *   unwind.c              the one DWARF CFI walker, for every context
 *   elf.c                 ELF files on disk: sections, symbols
 *   cpython/pyNNN.c       one unit per CPython version family: frame chain
 *   evalloop.c            which native pcs run the eval loop
 *   greenlet_context.c    the saved context of a suspended greenlet
 *   capture.c             btc_collect(): context -> walk -> merge -> frames
 *   spawn.c               spawn tracking: greenlet creation hook, interned sites, records
 */
#ifndef BTCORE_H
#define BTCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "btcore_api.h"

#define BTC_UNUSED __attribute__((unused))
#define BTC_LIKELY(x) __builtin_expect(!!(x), 1)
#define BTC_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- errors: a short reason kept per thread for btc_last_error() ---- */
int btc_fail(int code, const char *reason);
/* The same for the Python exception set now: its type and message become the
 * reason (prefixed by what), and the exception is cleared.  Never silent:
 * the caller returns code, which the Python layer raises with that reason. */
int btc_fail_python(int code, const char *what);

/* ---- compact CFI table of one module (cfi.c) ---- */

typedef struct btc_table {
    btc_cfi_row *rows;     /* sorted by pc; gaps between FDEs are BTC_CFA_NONE rows */
    uint32_t nrows;
    uint32_t page_shift;   /* page index granularity */
    uint32_t pc_lo;        /* first row's pc */
    uint32_t npages;
    uint32_t *page_first;  /* page k: index of the row covering pc_lo + (k << page_shift) */
    uint32_t *fde_ranges;  /* [lo0, hi0, lo1, hi1, ...]: the FDEs the rows came from, sorted */
    uint32_t nfdes;
} btc_table;

/* Where a module's unwind data is, as the loader mapped it. */
typedef struct btc_image {
    uintptr_t bias;                 /* load bias (dlpi_addr) */
    const uint8_t *eh_frame_hdr;    /* NULL if the module has none */
    const uint8_t *eh_frame;        /* NULL if unknown; found through eh_frame_hdr otherwise */
    size_t eh_frame_size;           /* 0 if unknown: the walk trusts the terminator */
    uintptr_t readable_lo[8], readable_hi[8];   /* PT_LOAD ranges (absolute) */
    int nreadable;
} btc_image;

/* Parse the module's .eh_frame into a table; NULL on failure (bad data is
 * skipped, never trusted: every read is bounded by the readable ranges). */
btc_table *btc_table_build(const btc_image *img);
void btc_table_free(btc_table *t);
/* The row covering pc (relative to bias), or NULL if no FDE covers it. */
const btc_cfi_row *btc_table_lookup(const btc_table *t, uint32_t rel_pc);
/* [lo, hi) of the FDE covering rel_pc (relative to bias); false if none.
 * Rows with equal rules merge across FDEs: this keeps the functions apart
 * (evalloop.c uses it to find a stripped eval loop's unnamed parts). */
bool btc_table_fde(const btc_table *t, uint32_t rel_pc, uint32_t *lo, uint32_t *hi);

/* ---- loaded modules (modules.c) ---- */

#define BTC_BUILD_ID_MAX 32

typedef struct btc_module {
    uintptr_t lo, hi;           /* span of executable PT_LOAD segments (absolute) */
    uintptr_t bias;
    char *path;                 /* "" for the vDSO */
    uint8_t build_id[BTC_BUILD_ID_MAX];   /* the GNU build-id note, as mapped (first bytes) */
    size_t build_id_len;                  /* its full length; 0: none */
    uint64_t id;                /* unique in the process: a new one for every mapping seen */
    btc_table *table;           /* built on first use */
    int table_failed;
    struct btc_elf *elf;        /* symbols, opened on first use (elf.c) */
} btc_module;

/* Call before a walk (with the module lock held): notices dlopen/dlclose
 * through dl_iterate_phdr's adds/subs counters and drops stale tables. */
void btc_modules_lock(void);
void btc_modules_unlock(void);
void btc_modules_refresh(void);
btc_module *btc_module_find(uintptr_t pc);
/* The module's CFI table, built on first use (under the loader lock so the
 * module cannot be unloaded while we parse its mapped .eh_frame). */
const btc_table *btc_module_table(btc_module *m);
/* btc_elf_function_ranges() on the module containing `inside`, as absolute
 * addresses. */
int btc_module_function_ranges(uintptr_t inside, const char *name, uintptr_t *lo, uintptr_t *hi, int max);

/* ---- the interpreter's eval loop (evalloop.c) ---- */

/* Find the eval loop's code ranges once (with the module lock held). */
void btc_eval_ranges_init(void);
/* Is pc (already adjusted for return addresses) in the eval loop? */
bool btc_in_eval_loop(uintptr_t pc);
/* For a pc in an unnamed part of the eval loop (a stripped interpreter):
 * the name an unstripped build gives that part ("_PyEval_EvalFrameDefault.cold")
 * and its start; NULL otherwise.  With the module lock held. */
const char *btc_eval_part_name(uintptr_t pc, uintptr_t *lo);

/* ---- ELF files on disk (elf.c): read with pread into the heap, never mmap,
 * so a file truncated under us is an error, not a SIGBUS. ---- */

typedef struct btc_elf btc_elf;
btc_elf *btc_elf_open(const char *path);
void btc_elf_close(btc_elf *e);
/* The symbol covering the virtual address vaddr (module-relative). */
const char *btc_elf_symbolize(btc_elf *e, uintptr_t vaddr, uintptr_t *sym_vaddr);
/* Address range [lo, hi) of every function symbol whose name is `name` or
 * starts with `name` followed by '.' (gcc's .cold/.part clones); returns how
 * many ranges were written. */
int btc_elf_function_ranges(btc_elf *e, const char *name, uintptr_t *lo, uintptr_t *hi, int max);

#endif
