/* override_signal.c - the libc names that set or query a signal
 * disposition, each a one-line forward to signals.c, which answers for the
 * signals the stats dump watches and passes every other call to glibc.
 *
 * Each name needs its own definition: glibc's signal(), sysv_signal(),
 * sigset(), sigignore() and siginterrupt() call its internal sigaction, not
 * the exported one, so defining sigaction alone would not see them.
 * __sigaction and __sysv_signal are exported aliases some programs call. */
#define _GNU_SOURCE
#include <signal.h>

#include "../core/export.h"
#include "signals.h"

FA_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *oact) { return fa_signals_action(FA_SIGCALL_SIGACTION, sig, act, oact); }
FA_EXPORT int __sigaction(int sig, const struct sigaction *act, struct sigaction *oact) { return fa_signals_action(FA_SIGCALL_SIGACTION_GLIBC, sig, act, oact); }
FA_EXPORT sighandler_t signal(int sig, sighandler_t h) { return fa_signals_handler(FA_SIGCALL_SIGNAL, sig, h); }
FA_EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) { return fa_signals_handler(FA_SIGCALL_BSD_SIGNAL, sig, h); }
FA_EXPORT sighandler_t ssignal(int sig, sighandler_t h) { return fa_signals_handler(FA_SIGCALL_SSIGNAL, sig, h); }
FA_EXPORT sighandler_t sysv_signal(int sig, sighandler_t h) { return fa_signals_handler(FA_SIGCALL_SYSV_SIGNAL, sig, h); }
FA_EXPORT sighandler_t __sysv_signal(int sig, sighandler_t h) { return fa_signals_handler(FA_SIGCALL_SYSV_SIGNAL_GLIBC, sig, h); }
FA_EXPORT sighandler_t sigset(int sig, sighandler_t h) { return fa_signals_handler(FA_SIGCALL_SIGSET, sig, h); }
FA_EXPORT int sigignore(int sig) { return fa_signals_ignore(sig); }
FA_EXPORT int siginterrupt(int sig, int interrupt) { return fa_signals_interrupt(sig, interrupt); }
