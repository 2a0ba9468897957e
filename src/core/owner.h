/* owner.h - which process the library's state belongs to.
 *
 * The state (the background thread's bookkeeping, the release policy, the
 * report buffers, the signal table) belongs to the process that loaded the
 * library, and after a fork to the child, once the fork handlers reset it
 * there.  Two kinds of process run this code without owning it:
 *  - a vfork child (posix_spawn, CPython's subprocess, clone with CLONE_VM)
 *    runs in the parent's memory until it execs or exits: it must change
 *    nothing there (an exit() instead of _exit() runs our destructor);
 *  - the child of a fork that runs no fork handlers (glibc's _Fork, the
 *    fork or clone system call) has a copy of the parent's state: threads
 *    it does not have, locks they held, the parent's numbers.
 * The owner's pid lives in a page the kernel zeroes in the child of any
 * fork (MADV_WIPEONFORK, Linux 4.14): a child that finds it zero takes the
 * state over at the first call that looks, and a vfork child, which shares
 * the page, finds its parent's pid.  Where the page cannot be had, only a
 * fork with handlers hands the state on (a handler-less child is then
 * treated as a vfork child). */
#ifndef FA_OWNER_H
#define FA_OWNER_H

#include <stdbool.h>

/* At start (constructor), before anything calls the others: this process
 * owns the state.  `adopt` resets it in a child of a handler-less fork; it
 * runs once, on the thread that found the page zero, and may make only
 * async-signal-safe calls (the parent may have had other threads, and the
 * child of such a fork may then make no other kind of call). */
void fa_owner_start(void (*adopt)(void));
/* In the child's fork handler, once the state is reset: this process owns
 * it now. */
void fa_owner_claim(void);
/* A child of a handler-less fork takes the state over (adopt) if it has not
 * yet; no system call otherwise.  For every path that uses state a parent's
 * thread may have held, before it does. */
void fa_owner_adopt(void);
/* fa_owner_adopt, then whether this process owns the state: false in a
 * vfork child before its exec.  True before fa_owner_start.  One getpid
 * system call. */
bool fa_owner_mine(void);
/* A spin-lock word (0 free) that starts free in the child of any fork:
 * for a lock a handler-less fork may copy held by a thread the child does
 * not have.  In the owner's page, so a vfork child shares it. */
int *fa_owner_lock_word(void);

#endif
