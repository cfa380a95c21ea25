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

static bool listed(uintptr_t pc)
{
    for (int i = 0; i < n_eval; i++)
        if (pc >= eval_lo[i] && pc < eval_hi[i])
            return true;
    return false;
}

static const btc_cfi_row *row_at(const btc_module *m, const btc_table *t, uintptr_t pc)
{
    return pc >= m->bias && pc - m->bias <= UINT32_MAX ? btc_table_lookup(t, (uint32_t)(pc - m->bias)) : NULL;
}

static bool same_cfa(const btc_cfi_row *a, const btc_cfi_row *b)
{
    return a && b && a->cfa_kind == b->cfa_kind && a->cfa_reg == b->cfa_reg && a->cfa_off == b->cfa_off;
}

/* The jump at `site` goes to `target`: add target's part if it is one. */
static void consider(btc_module *m, const btc_table *t, uintptr_t site, uintptr_t target)
{
    uint32_t lo, hi;
    if (n_eval >= MAX_EVAL_RANGES || listed(target) || target < m->lo || target >= m->hi ||
        !btc_table_fde(t, (uint32_t)(target - m->bias), &lo, &hi))
        return;
    const btc_cfi_row *start = row_at(m, t, m->bias + lo);
    bool function_entry = start && start->cfa_kind == BTC_CFA_REG && start->cfa_reg == BTC_DWARF_SP &&
                          start->cfa_off == BTC_ENTRY_CFA_OFFSET;
    if (!start || function_entry || !same_cfa(row_at(m, t, site), row_at(m, t, target)))
        return;
    eval_lo[n_eval] = m->bias + lo;
    eval_hi[n_eval] = m->bias + hi;
    n_eval++;
}

/* Direct jumps out of [lo, hi). */
static void find_unnamed_parts(uintptr_t lo, uintptr_t hi)
{
    btc_module *m = btc_module_find(lo);
    const btc_table *t = m ? btc_module_table(m) : NULL;
    if (!t || hi > m->hi || hi - lo > MAX_SCAN_BYTES)
        return;
    const uint8_t *code = (const uint8_t *)lo;
    size_t size = hi - lo;
    for (size_t i = 0; i < size; i += BTC_INSN_ALIGN) {
        uintptr_t target;
        if (btc_direct_jump_at(code, size, i, &target) && (target < lo || target >= hi))
            consider(m, t, lo + i, target);
    }
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
