/* signals.c - the stats dump on SIGTERM and SIGINT, invisible to the
 * program (signals.h).
 *
 * An unhandled SIGTERM or SIGINT (docker stop, Ctrl-C) skips atexit and
 * destructors, so no exit dump.  While the program's disposition of such a
 * signal is SIG_DFL, the kernel's is a handler of ours that writes the dump
 * and then lets the process die of the same signal.  The program never sees
 * it: it owns a "view" of each watched signal (what it last set, as the
 * kernel reports it), every set or query goes through here, and the kernel
 * gets the program's setting itself except in two cases: SIG_DFL (our dump
 * handler instead) and a handler with SA_RESETHAND (a one-shot wrapper that
 * puts the dump handler back where the kernel would have reset the
 * disposition to SIG_DFL). */
#define _GNU_SOURCE
#include "signals.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "report.h"
#include "../core/onstack.h"
#include "../core/options.h"
#include "../core/owner.h"

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef sighandler_t (*handler_fn)(int, sighandler_t);
typedef int (*ignore_fn)(int);
typedef int (*interrupt_fn)(int, int);

static const char *const call_names[FA_SIGCALL_COUNT] = {
#define FA_SIGNAL_CALL_NAME(id, name) #name,
    FA_SIGNAL_CALLS(FA_SIGNAL_CALL_NAME)
#undef FA_SIGNAL_CALL_NAME
};
static void *real_fn[FA_SIGCALL_COUNT];

/* glibc's definition of a call: the next one after ours in lookup order.
 * Resolved at start, before any handler of ours can run (dlsym is not
 * async-signal-safe); a call from another library's constructor that runs
 * before ours resolves it then. */
static void *real(enum fa_signal_call call)
{
    void *f = __atomic_load_n(&real_fn[call], __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, call_names[call]);
        __atomic_store_n(&real_fn[call], f, __ATOMIC_RELEASE);
    }
    return f;
}

static int real_sigaction(int sig, const struct sigaction *act, struct sigaction *oact)
{
    sigaction_fn f = (sigaction_fn)real(FA_SIGCALL_SIGACTION);
    if (!f) {
        errno = ENOSYS;
        return -1;
    }
    return f(sig, act, oact);
}

/* ---- the watched signals ------------------------------------------------ */

static const int dump_signals[] = {SIGTERM, SIGINT};
#define NWATCHED (sizeof dump_signals / sizeof dump_signals[0])

struct watched {
    struct sigaction view; /* the program's disposition, as sigaction(sig, NULL, &old) would report it */
    bool interrupt;        /* siginterrupt(sig, 1): signal() then sets no SA_RESTART */
};
static struct watched table[NWATCHED];
static unsigned long watched_bits; /* bit sig set: the signal is watched (set once at start) */

/* The table's lock: a word that starts free in the child of any fork, also
 * one that runs no fork handlers (_Fork, a raw fork or clone), where
 * another thread of the parent may have held it.  Whose the table is, is
 * owner.h's: such a child takes it over (fa_signals_fork_child) at its
 * first call here, and a vfork child still finds the parent's. */
static int *table_lock(void) { return fa_owner_lock_word(); }

static struct watched *find(int sig)
{
    if (sig <= 0 || sig >= (int)(8 * sizeof watched_bits) ||
        !(__atomic_load_n(&watched_bits, __ATOMIC_ACQUIRE) & (1UL << sig)))
        return NULL;
    for (size_t i = 0; i < NWATCHED; i++)
        if (dump_signals[i] == sig)
            return &table[i];
    return NULL;
}

/* A spin lock taken with every signal blocked: sigaction may be called from
 * a signal handler, which must not find its own thread holding the lock.
 * The child of any fork starts with it free. */
static void lock(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
    while (__atomic_exchange_n(table_lock(), 1, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void unlock(const sigset_t *old)
{
    __atomic_store_n(table_lock(), 0, __ATOMIC_RELEASE);
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

static bool is_handler(sighandler_t h) { return h != SIG_DFL && h != SIG_IGN; }

/* Whether the table belongs to another process.  A vfork child (posix_spawn,
 * CPython's subprocess) runs in our memory until it execs: it must not
 * write the table, which would change what the parent's queries return,
 * nor dump with the parent's buffers.  Its settings go to the kernel as
 * they are.  A forked child owns its copy (a child of a fork without
 * handlers takes it over here). */
static bool borrowed(void) { return !fa_owner_mine(); }

/* The first process of a pid namespace (a container's PID 1 with no init
 * in front): the kernel ignores a signal left at SIG_DFL, so there is no
 * death to write a dump for, and a handler of ours would interrupt the
 * program's system calls (EINTR) where the kernel would have done nothing:
 * there, SIG_DFL stays SIG_DFL.  Its forked children are not PID 1. */
static bool pid1;

/* ---- the handlers the kernel gets instead of the program's setting ------- */

static void on_dump(int sig);
static void on_dump_info(int sig, siginfo_t *info, void *ctx);
static void on_oneshot(int sig);
static void on_oneshot_info(int sig, siginfo_t *info, void *ctx);

/* Our dump handler, with every signal blocked while it runs. */
static void install_dump(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_dump_info;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);
    real_sigaction(sig, &sa, NULL);
}

/* What the kernel gets for a view of SIG_DFL. */
static void install_default(int sig)
{
    if (pid1) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(sig, &dfl, NULL);
    } else {
        install_dump(sig);
    }
}

/* Make `act` the program's disposition of w's signal.  The kernel first
 * gets the program's flags and mask exactly (with our handler in place of
 * SIG_DFL or of a one-shot handler, so there is never a moment without
 * one), and reports them back the way it stores them: that report is the
 * view a query returns.  Then SIG_DFL gets our own flags and mask, and a
 * one-shot handler loses SA_RESETHAND (on_oneshot does the reset).  Table
 * lock held.  Returns 0, or -1 with errno from libc. */
static int apply(struct watched *w, int sig, const struct sigaction *act)
{
    if (borrowed())
        return real_sigaction(sig, act, NULL);
    struct sigaction k = *act;
    bool dfl = act->sa_handler == SIG_DFL && !pid1;
    bool oneshot = is_handler(act->sa_handler) && (act->sa_flags & SA_RESETHAND);
    if (dfl || oneshot) {
        if (act->sa_flags & SA_SIGINFO)
            k.sa_sigaction = dfl ? on_dump_info : on_oneshot_info;
        else
            k.sa_handler = dfl ? on_dump : on_oneshot;
    }
    if (real_sigaction(sig, &k, NULL) != 0)
        return -1;
    struct sigaction stored;
    if (real_sigaction(sig, NULL, &stored) != 0)
        return -1;
    stored.sa_handler = act->sa_handler; /* the union: sa_sigaction too */
    w->view = stored;
    if (dfl) {
        install_dump(sig);
    } else if (oneshot) {
        k.sa_flags &= ~SA_RESETHAND;
        real_sigaction(sig, &k, NULL);
    }
    return 0;
}

/* After the dump: die of the signal, as SIG_DFL would have made us.  The
 * kernel ignores a SIG_DFL signal sent to the first process of a pid
 * namespace (a container's PID 1), so raise can return; the program then
 * goes on as it would have without us, and our handler goes back. */
static void die_of(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(sig, &dfl, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);

    sigset_t old;
    lock(&old);
    struct watched *w = find(sig);
    if (w && w->view.sa_handler == SIG_DFL)
        install_default(sig);
    unlock(&old);
}

/* The dump itself, on a stack of its own (onstack.h): the signal may have
 * landed on a small stack, or on a sigaltstack that already holds the
 * frame of the program's own handler. */
static void signal_dump(void *sig)
{
    fa_report_configured("signal", true);
    fa_report_abandon();
    die_of(*(int *)sig);
}

static void dump_and_die(int sig)
{
    int saved = errno;
    if (borrowed()) {
        die_of(sig); /* a vfork child before its exec: as SIG_DFL, no dump */
    } else if (fa_report_signal_enter()) {
        fa_on_stack(signal_dump, &sig);
        fa_report_signal_leave(); /* still alive (PID 1): the next signal dumps again */
    } else {
        die_of(sig);
    }
    errno = saved;
}

static void on_dump(int sig) { dump_and_die(sig); }

static void on_dump_info(int sig, siginfo_t *info, void *ctx)
{
    (void)info, (void)ctx;
    dump_and_die(sig);
}

/* The program's handler had SA_RESETHAND: the kernel would have reset the
 * disposition to SIG_DFL on this delivery, so the view becomes SIG_DFL
 * (flags and mask stay, as the kernel keeps them) and the dump handler goes
 * in; then the program's handler runs as the kernel would have run it.  If
 * another thread got there first, the disposition is already SIG_DFL: this
 * delivery dumps and dies. */
static void deliver_oneshot(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    struct watched *w = find(sig);
    struct sigaction v;
    memset(&v, 0, sizeof v);
    bool own = !borrowed();
    if (!own) {
        /* A vfork child before its exec: the table is the parent's, only
         * read; the child's own disposition resets, as the kernel's would. */
        struct sigaction k;
        if (real_sigaction(sig, NULL, &k) == 0) {
            k.sa_handler = SIG_DFL;
            real_sigaction(sig, &k, NULL);
        }
        if (w)
            v = w->view;
    } else {
        sigset_t old;
        lock(&old);
        if (w) {
            v = w->view;
            if (is_handler(v.sa_handler) && (v.sa_flags & SA_RESETHAND)) {
                w->view.sa_handler = SIG_DFL;
                install_default(sig);
            }
        }
        unlock(&old);
    }
    errno = saved;
    if (v.sa_handler == SIG_DFL && (!own || !pid1))
        dump_and_die(sig);
    else if (v.sa_handler == SIG_DFL || v.sa_handler == SIG_IGN)
        return;
    else if (v.sa_flags & SA_SIGINFO)
        v.sa_sigaction(sig, info, ctx);
    else
        v.sa_handler(sig);
}

static void on_oneshot(int sig) { deliver_oneshot(sig, NULL, NULL); }
static void on_oneshot_info(int sig, siginfo_t *info, void *ctx) { deliver_oneshot(sig, info, ctx); }

/* ---- start and fork ----------------------------------------------------- */

/* The child of a fork inherits the dispositions and the table as they are
 * (its lock starts free: owner.h). */
void fa_signals_fork_child(void)
{
    if (pid1) { /* a child of PID 1 dies of SIG_DFL signals: it dumps first */
        pid1 = false;
        for (size_t i = 0; i < NWATCHED; i++)
            if (table[i].view.sa_handler == SIG_DFL)
                install_dump(dump_signals[i]);
    }
}

void fa_signals_start(void)
{
    if (fa_opt_u64(FA_OPT_STATS) == FA_STATS_OFF || !fa_opt_u64(FA_OPT_STATS_ON_SIGNAL))
        return;
    for (int c = 0; c < FA_SIGCALL_COUNT; c++)
        real((enum fa_signal_call)c); /* now, not later inside a handler */
    if (!real(FA_SIGCALL_SIGACTION))
        return; /* no libc sigaction to forward to: leave the signals alone */
    pid1 = getpid() == 1;
    sigset_t old;
    lock(&old);
    unsigned long bits = 0;
    for (size_t i = 0; i < NWATCHED; i++) {
        int sig = dump_signals[i];
        /* What the program starts with: SIG_DFL after exec, or SIG_IGN
         * inherited (nohup, a shell's background job), which stays. */
        if (real_sigaction(sig, NULL, &table[i].view) != 0)
            continue;
        if (table[i].view.sa_handler == SIG_DFL && !pid1)
            install_dump(sig);
        bits |= 1UL << sig;
    }
    __atomic_store_n(&watched_bits, bits, __ATOMIC_RELEASE);
    unlock(&old);
}

/* ---- the calls ---------------------------------------------------------- */

int fa_signals_action(enum fa_signal_call call, int sig, const struct sigaction *act, struct sigaction *oact)
{
    struct watched *w = find(sig);
    if (!w) {
        sigaction_fn f = (sigaction_fn)real(call);
        if (!f) {
            errno = ENOSYS;
            return -1;
        }
        return f(sig, act, oact);
    }
    sigset_t old;
    lock(&old);
    struct sigaction prev = w->view;
    int rc = act ? apply(w, sig, act) : 0;
    int err = errno;
    unlock(&old);
    if (rc == 0 && oact)
        *oact = prev;
    errno = err;
    return rc;
}

/* glibc's signal-style calls, each with the flags and mask it uses. */
sighandler_t fa_signals_handler(enum fa_signal_call call, int sig, sighandler_t handler)
{
    struct watched *w = find(sig);
    if (!w) {
        handler_fn f = (handler_fn)real(call);
        if (!f) {
            errno = ENOSYS;
            return SIG_ERR;
        }
        return f(sig, handler);
    }
    struct sigaction act, oact;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    sigset_t set, oset;
    sigemptyset(&set);
    sigaddset(&set, sig);
    switch (call) {
    case FA_SIGCALL_SYSV_SIGNAL:
    case FA_SIGCALL_SYSV_SIGNAL_GLIBC:
        if (handler == SIG_ERR) {
            errno = EINVAL;
            return SIG_ERR;
        }
        act.sa_flags = (SA_ONESHOT | SA_NOMASK | SA_INTERRUPT) & ~SA_RESTART;
        break;
    case FA_SIGCALL_SIGSET:
        if (handler == SIG_HOLD) {
            /* Block it and report the disposition, which stays. */
            if (sigprocmask(SIG_BLOCK, &set, &oset) < 0)
                return SIG_ERR;
            if (sigismember(&oset, sig))
                return SIG_HOLD;
            fa_signals_action(FA_SIGCALL_SIGACTION, sig, NULL, &oact);
            return oact.sa_handler;
        }
        if (fa_signals_action(FA_SIGCALL_SIGACTION, sig, &act, &oact) < 0)
            return SIG_ERR;
        if (sigprocmask(SIG_UNBLOCK, &set, &oset) < 0)
            return SIG_ERR;
        return sigismember(&oset, sig) ? SIG_HOLD : oact.sa_handler;
    default: /* signal, bsd_signal, ssignal */
        if (handler == SIG_ERR) {
            errno = EINVAL;
            return SIG_ERR;
        }
        sigaddset(&act.sa_mask, sig);
        act.sa_flags = __atomic_load_n(&w->interrupt, __ATOMIC_RELAXED) ? 0 : SA_RESTART;
        break;
    }
    if (fa_signals_action(FA_SIGCALL_SIGACTION, sig, &act, &oact) < 0)
        return SIG_ERR;
    return oact.sa_handler;
}

int fa_signals_ignore(int sig)
{
    if (!find(sig)) {
        ignore_fn f = (ignore_fn)real(FA_SIGCALL_SIGIGNORE);
        if (!f) {
            errno = ENOSYS;
            return -1;
        }
        return f(sig);
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = SIG_IGN;
    sigemptyset(&act.sa_mask);
    return fa_signals_action(FA_SIGCALL_SIGACTION, sig, &act, NULL);
}

/* Whether a handler interrupts system calls (SA_RESTART off) or not; also
 * remembered for later signal() calls, as glibc does. */
int fa_signals_interrupt(int sig, int interrupt)
{
    struct watched *w = find(sig);
    if (!w) {
        interrupt_fn f = (interrupt_fn)real(FA_SIGCALL_SIGINTERRUPT);
        if (!f) {
            errno = ENOSYS;
            return -1;
        }
        return f(sig, interrupt);
    }
    sigset_t old;
    lock(&old);
    struct sigaction act = w->view;
    if (interrupt)
        act.sa_flags &= ~SA_RESTART;
    else
        act.sa_flags |= SA_RESTART;
    if (!borrowed())
        __atomic_store_n(&w->interrupt, interrupt != 0, __ATOMIC_RELAXED);
    int rc = apply(w, sig, &act);
    int err = errno;
    unlock(&old);
    errno = err;
    return rc;
}

bool fa_signals_handled(int sig)
{
    struct sigaction sa;
    return fa_signals_action(FA_SIGCALL_SIGACTION, sig, NULL, &sa) == 0 && is_handler(sa.sa_handler);
}
