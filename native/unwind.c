/* The one DWARF CFI walker: every context (current thread, suspended greenlet,
 * signal handler) goes through btc_unwind(); only the context differs. */
#include "context.h"

#define BTC_HOT static inline __attribute__((always_inline))

BTC_HOT uintptr_t reg_value(const btc_regs *r, unsigned dwarf_reg, bool *ok)
{
    switch (dwarf_reg) {
    case 7: return r->sp;
    case 6: return r->bp;
    case 3: return r->bx;
    case 16: return r->ip;
    default: *ok = false; return 0;
    }
}

BTC_HOT bool compute_cfa(const btc_cfi_row *row, const btc_regs *r, const btc_memview *m,
                        uintptr_t *cfa)
{
    bool ok = true;
    switch (row->cfa_kind) {
    case BTC_CFA_REG:
        *cfa = reg_value(r, row->cfa_reg, &ok) + row->cfa_off;
        return ok;
    case BTC_CFA_REG_DEREF:
        return btc_mem_read(m, reg_value(r, row->cfa_reg, &ok) + row->cfa_off, cfa) && ok;
    case BTC_CFA_PLT:
        /* The expression every PLT section carries: the stub pushes 8 bytes
         * once the pc passes a fixed offset within its 16-byte slot. */
        *cfa = r->sp + row->cfa_off + (((r->ip & 15) >= row->cfa_reg) ? 8 : 0);
        return true;
    default:
        return false;
    }
}

/* Apply one register rule; the value is unchanged for BTC_RULE_SAME. */
BTC_HOT bool apply_rule(uint8_t rule, int16_t off, uintptr_t cfa, const btc_regs *r,
                       const btc_memview *m, uintptr_t *value)
{
    bool ok = true;
    switch (rule & 15) {
    case BTC_RULE_SAME:
        return true;
    case BTC_RULE_AT_CFA:
        return btc_mem_read(m, cfa + off, value);
    case BTC_RULE_AT_REG:
        return btc_mem_read(m, reg_value(r, rule >> 4, &ok) + off, value) && ok;
    default:
        return false;
    }
}

/* One step from callee registers r to caller registers; false ends the walk. */
BTC_HOT bool step(const btc_cfi_row *row, const btc_context *ctx, btc_regs *r, uintptr_t *cfa_out)
{
    const btc_memview *m = &ctx->mem;
    uintptr_t cfa;
    if (!compute_cfa(row, r, m, &cfa))
        return false;
    *cfa_out = cfa;   /* even if the step fails: the caller checks whose frame this is */
    /* A frame's CFA lies above its sp; a signal frame's CFA is the sp the
     * interrupted code had, which may be anywhere in the view. */
    if (!row->signal && cfa <= r->sp)
        return false;
    if (cfa < m->lo || cfa > m->hi)
        return false;
    if (row->ra_rule == BTC_RULE_UNDEFINED)
        return false;   /* the outermost frame (_start, clone, thread start) */
    btc_regs next = *r;
    if (!apply_rule(row->ra_rule, row->ra_off, cfa, r, m, &next.ip) || row->ra_rule == BTC_RULE_SAME)
        return false;
    if (!apply_rule(row->rbp_rule, row->rbp_off, cfa, r, m, &next.bp) ||
        !apply_rule(row->rbx_rule, row->rbx_off, cfa, r, m, &next.bx))
        return false;
    next.sp = cfa;
    *r = next;
    return next.ip != 0;
}

int btc_unwind(const btc_context *ctx, btc_native_frame *out, int max)
{
    btc_regs r = ctx->regs;
    bool exact = ctx->ip_is_exact;
    btc_module *m = NULL;
    int n = 0;
    while (n < max) {
        /* A return address points after the call: look up the call itself. */
        uintptr_t pc = exact ? r.ip : r.ip - 1;
        if (!m || pc < m->lo || pc >= m->hi)
            m = btc_module_find(pc);
        if (!m)
            break;
        const btc_table *t = btc_module_table(m);
        const btc_cfi_row *row = t ? btc_table_lookup(t, (uint32_t)(pc - m->bias)) : NULL;
        uintptr_t cfa = 0;
        bool more = row && step(row, ctx, &r, &cfa);
        if (cfa && ctx->last_cfa && cfa > ctx->last_cfa)
            break;  /* this frame belongs to whoever is below the target's stack */
        out[n].pc = exact ? pc : pc + 1;
        out[n].cfa = cfa;
        out[n].exact = exact;
        n++;
        if (!more)
            break;
        exact = row->signal;   /* the frame a signal interrupted resumes at its exact pc */
    }
    return n;
}
