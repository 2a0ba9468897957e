/* onstack.h - run a function on a stack of the library's own.
 *
 * A signal dump runs inside whatever stack the signal interrupted: a
 * thread's small stack, or a program's sigaltstack already holding one
 * signal frame.  The kernel's frame alone takes 1-4 KiB there (the vector
 * registers: 3.4 KiB with AVX-512), so the dump's own work goes to a
 * stack mapped for it, with a guard page below, and leaves only a few
 * hundred bytes on the program's. */
#ifndef FA_ONSTACK_H
#define FA_ONSTACK_H

#include <stdbool.h>

/* Run fn(arg) on a fresh stack of FA_ONSTACK_SIZE bytes, with a guard
 * page below it, mapped for the call and unmapped after it (straight
 * system calls: async-signal-safe; each call has a stack of its own).
 * Where none can be mapped, or on an architecture other than x86-64 and AArch64, fn
 * runs on the caller's stack.  Returns whether it ran on the fresh one. */
bool fa_on_stack(void (*fn)(void *), void *arg);

#define FA_ONSTACK_SIZE ((unsigned long)64 * 1024)

#endif
