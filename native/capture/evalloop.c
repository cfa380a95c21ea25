/* Where the interpreter's eval loop code lies: the native frames the merge
 * replaces with Python frames.
 *
 * The version unit names the eval-loop functions; their ranges (with gcc's
 * .cold/.part clones) come from the interpreter module's symbol table.
 *
 * A stripped interpreter (Debian's python3.X: libpython linked statically
 * into the executable, .dynsym only) names only the exported entry point,
 * and gcc's hot/cold splitting can leave most of the loop in parts that have
 * no symbol at all (Debian 3.13: a 2.4 KB named part, a 77 KB unnamed one,
 * where the eval loop's calls return to).  Those parts are found from the
 * named part's code: every direct jump (arch.h: btc_direct_jump_at) out of it lands in a
 * part of the same function, or is a tail call.  A part is taken when
 *   - an FDE of its own covers the target (its [lo, hi) is the part), and
 *   - that FDE does not begin like a function (CFA = sp + 8 on x86-64, sp on
 *     aarch64: BTC_ENTRY_CFA_OFFSET): a split-off
 *     part starts inside its parent's frame, and
 *   - the CFA rule at the jump equals the rule at its target: a jump within
 *     one function keeps the frame as it is.
 * The bytes are scanned without decoding instructions (on x86-64, whose
 * instructions have any length); the last two tests are what keeps a stray
 * jump opcode in an immediate from counting.  Such a part is
 * what an unstripped build calls "<function>.cold", and resolution names it
 * so (btc_eval_part_name).
 */
#include <Python.h>
#include <stdio.h>
#include <string.h>

#include "capture/arch.h"
#include "capture/cpython/pyframes.h"
#include "capture/evalloop.h"
#include "capture/modules.h"

#define MAX_EVAL_RANGES 16
#define MAX_SCAN_BYTES (1u << 20)

static uintptr_t eval_lo[MAX_EVAL_RANGES], eval_hi[MAX_EVAL_RANGES];
static int n_eval = -1;   /* -1: not looked up yet */
static int n_named;       /* eval_lo[0..n_named) have symbols; the rest were found from jumps */
static char part_name[128];

static const btc_cfi_row *row_at(uintptr_t bias, const btc_table *t, uintptr_t pc)
{
    return pc >= bias && pc - bias <= UINT32_MAX ? btc_table_lookup(t, (uint32_t)(pc - bias)) : NULL;
}

static bool same_cfa(const btc_cfi_row *a, const btc_cfi_row *b)
{
    return a && b && a->cfa_kind == b->cfa_kind && a->cfa_reg == b->cfa_reg && a->cfa_off == b->cfa_off;
}

static bool among(uintptr_t pc, const uintptr_t *lo, const uintptr_t *hi, int n)
{
    for (int i = 0; i < n; i++)
        if (pc >= lo[i] && pc < hi[i])
            return true;
    return false;
}

static bool listed(uintptr_t pc)
{
    return among(pc, eval_lo, eval_hi, n_eval);
}

/* The jump at `site` goes to `target`: is target's part one to add?  Then
 * its range, in the caller's addresses. */
static bool part_at(const btc_jump_scan *scan, uintptr_t site, uintptr_t target, uintptr_t *lo, uintptr_t *hi)
{
    uint32_t flo, fhi;
    if (target < scan->span_lo || target >= scan->span_hi ||
        !btc_table_fde(scan->table, (uint32_t)(target - scan->bias), &flo, &fhi))
        return false;
    const btc_cfi_row *start = row_at(scan->bias, scan->table, scan->bias + flo);
    bool function_entry = start && start->cfa_kind == BTC_CFA_REG && start->cfa_reg == BTC_DWARF_SP &&
                          start->cfa_off == BTC_ENTRY_CFA_OFFSET;
    if (!start || function_entry ||
        !same_cfa(row_at(scan->bias, scan->table, site), row_at(scan->bias, scan->table, target)))
        return false;
    *lo = scan->bias + flo;
    *hi = scan->bias + fhi;
    return true;
}

int btc_jump_parts(const btc_jump_scan *scan, uintptr_t *out_lo, uintptr_t *out_hi, int n, int max)
{
    uintptr_t lo = scan->lo, hi = scan->hi;
    if (!scan->table || hi > scan->span_hi || lo < scan->span_lo || hi - lo > MAX_SCAN_BYTES)
        return n;
    const uint8_t *code = scan->code;
    size_t size = hi - lo;
    for (size_t i = 0; i < size && n < max; i += BTC_INSN_ALIGN) {
        uintptr_t target;
        if (btc_direct_jump_at(code, size, i, lo, &target) && (target < lo || target >= hi) &&
            !among(target, out_lo, out_hi, n) && part_at(scan, lo + i, target, &out_lo[n], &out_hi[n]))
            n++;
    }
    return n;
}

/* Direct jumps out of this process's named part [lo, hi). */
static void find_unnamed_parts(uintptr_t lo, uintptr_t hi)
{
    btc_module *m = btc_module_find(lo);
    const btc_table *t = m ? btc_module_table(m) : NULL;
    if (!t)
        return;
    btc_jump_scan scan = {(const uint8_t *)lo, lo, hi, m->lo, m->hi, m->bias, t};
    n_eval = btc_jump_parts(&scan, eval_lo, eval_hi, n_eval, MAX_EVAL_RANGES);
}

void btc_eval_ranges_init(void)
{
    if (n_eval >= 0)
        return;
    n_eval = 0;
    /* Any exported CPython function locates the interpreter's module. */
    uintptr_t inside = (uintptr_t)&PyEval_EvalCode;
    for (const char *const *name = btc_py_eval_functions; *name && n_eval < MAX_EVAL_RANGES; name++)
        n_eval += btc_module_function_ranges(inside, *name, eval_lo + n_eval, eval_hi + n_eval,
                                             MAX_EVAL_RANGES - n_eval);
    n_named = n_eval;
    for (int i = 0; i < n_named; i++)
        find_unnamed_parts(eval_lo[i], eval_hi[i]);
    snprintf(part_name, sizeof part_name, "%s.cold", btc_py_eval_functions[0] ? btc_py_eval_functions[0] : "");
}

const char *btc_eval_part_name(uintptr_t pc, uintptr_t *lo)
{
    btc_eval_ranges_init();
    for (int i = n_named; i < n_eval; i++)
        if (pc >= eval_lo[i] && pc < eval_hi[i]) {
            *lo = eval_lo[i];
            return part_name;
        }
    return NULL;
}

int btc_eval_ranges_found(void)
{
    return n_eval;
}

bool btc_in_eval_loop(uintptr_t pc)
{
    return listed(pc);
}

int btc_eval_ranges(uintptr_t *lo, uintptr_t *hi, int max)
{
    btc_modules_acquire();
    btc_eval_ranges_init();
    int n = n_eval < max ? n_eval : max;
    memcpy(lo, eval_lo, n * sizeof *lo);
    memcpy(hi, eval_hi, n * sizeof *hi);
    btc_modules_release();
    return n_eval;
}
