/* What every unit of the native core starts from: fixed-width types, the
 * cffi API's types (btcore_api.h) and branch hints.
 *
 * The tree follows the data flow (docs/design.md, "Layers"):
 *   common/   errors, this header, the GIL helper
 *   capture/  context -> walk (CFI tables, module list) -> merge with the
 *             interpreter's frames (cpython/) -> raw frames in a Backtrace
 *   symbols/  resolution of those frames: ELF symbols, DWARF, demangling
 *   testing.c test- and benchmark-only entry points
 */
#ifndef BTC_BASE_H
#define BTC_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "btcore_api.h"

#define BTC_UNUSED __attribute__((unused))
/* A global read only from another process, found by its name in the symbol
 * table: kept, and kept under that name, through link-time optimisation. */
#define BTC_FOUND_BY_NAME __attribute__((used, externally_visible))
#define BTC_LIKELY(x) __builtin_expect(!!(x), 1)
#define BTC_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* A per-frame step of a walk, inlined into its caller whatever the
 * compiler's estimate (its constant arguments then fold away). */
#define BTC_HOT static inline __attribute__((always_inline))

#endif
