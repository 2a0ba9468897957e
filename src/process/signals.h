/* signals.h - the stats dump on SIGTERM and SIGINT, invisible to the
 * program: the libc calls that set or query a disposition come here
 * (override_signal.c) and answer with what the program last set. */
#ifndef FA_SIGNALS_H
#define FA_SIGNALS_H

#include <signal.h> /* sighandler_t needs _GNU_SOURCE, defined by every .c file */
#include <stdbool.h>

/* Every libc name that sets or queries a disposition: (id, name).  For the
 * signals the dump does not watch, each forwards to the next definition of
 * the same name (glibc's). */
#define FA_SIGNAL_CALLS(X)                                                                                       \
    X(SIGACTION, sigaction)                                                                                      \
    X(SIGACTION_GLIBC, __sigaction)                                                                              \
    X(SIGNAL, signal)                                                                                            \
    X(BSD_SIGNAL, bsd_signal)                                                                                    \
    X(SSIGNAL, ssignal)                                                                                          \
    X(SYSV_SIGNAL, sysv_signal)                                                                                  \
    X(SYSV_SIGNAL_GLIBC, __sysv_signal)                                                                          \
    X(SIGSET, sigset)                                                                                            \
    X(SIGIGNORE, sigignore)                                                                                      \
    X(SIGINTERRUPT, siginterrupt)

enum fa_signal_call {
#define FA_SIGNAL_CALL_ID(id, name) FA_SIGCALL_##id,
    FA_SIGNAL_CALLS(FA_SIGNAL_CALL_ID)
#undef FA_SIGNAL_CALL_ID
    FA_SIGCALL_COUNT
};

/* At start (constructor): when FORGEALLOC_STATS is on and
 * FORGEALLOC_STATS_ON_SIGNAL is 1, watch SIGTERM and SIGINT.  Before this,
 * and for every other signal, all calls go to libc unchanged. */
void fa_signals_start(void);
/* In the child of a fork (from the fork handler, or where the child of a
 * fork without handlers takes the state over): async-signal-safe. */
void fa_signals_fork_child(void);

/* sigaction and __sigaction. */
int fa_signals_action(enum fa_signal_call call, int sig, const struct sigaction *act, struct sigaction *oact);
/* signal, bsd_signal, ssignal, sysv_signal, __sysv_signal and sigset, each
 * with glibc's flags and mask for its kind. */
sighandler_t fa_signals_handler(enum fa_signal_call call, int sig, sighandler_t handler);
int fa_signals_ignore(int sig);
int fa_signals_interrupt(int sig, int interrupt);
/* Whether the program has a handler set for sig, as its own sigaction
 * query would say (not the dump's handler standing in for SIG_DFL). */
bool fa_signals_handled(int sig);

#endif
