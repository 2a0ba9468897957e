/* bits.h - power-of-two arithmetic shared by the device pools. */
#ifndef FA_BITS_H
#define FA_BITS_H

#include <stdint.h>

/* The smallest k with 2^k >= n (0 for n <= 1). */
static inline unsigned fa_ceil_log2(uint64_t n) { return n <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(n - 1); }

#endif
