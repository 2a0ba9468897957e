/* background.h - the process's one helper thread.
 *
 * It runs the work that must happen while the program makes no allocator
 * call: the release policy's ticks (an idle process still gets its RSS
 * back), the periodic stats dump, and the device pool's give-back.  It is
 * started lazily, only in processes that need it, with every signal
 * blocked, and is named "forgealloc". */
#ifndef FA_BACKGROUND_H
#define FA_BACKGROUND_H

#include <stdbool.h>

/* At library start: register with the release policy; start the thread at
 * once only when periodic dumps are configured. */
void fa_background_start(void);
/* Wake the thread, starting it on first use.  False where no thread can
 * run (exit under way, pthread_create failed): the caller does the work. */
bool fa_background_wake(void);
/* At exit: ask the thread to stop and wait (bounded) until it is out of
 * the allocator, so the exit dump is not written beside a release. */
void fa_background_stop(void);
/* Around fork: a thread that runs only for the release policy leaves
 * before it, and the memory it watched goes back (the process forks with
 * one thread); after it, in the parent, threads may start again. */
void fa_background_fork_prepare(void);
void fa_background_fork_parent(void);
/* In the child after fork: no thread there.  With periodic dumps one
 * starts at once; otherwise the next need starts one. */
void fa_background_fork_child(void);
/* The same for the child of a fork that ran no fork handlers
 * (core/owner.h), async-signal-safe: nothing starts here. */
void fa_background_adopt(void);

#endif
