/* owner.c - which process the library's state belongs to (owner.h). */
#define _GNU_SOURCE
#include "owner.h"

#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

struct owner_page {
    int pid;     /* the owner; 0 in a child of any fork until it claims the state */
    int adopter; /* thread id taking the state over, 0 if none */
    int lock;    /* fa_owner_lock_word */
};
static struct owner_page fallback;
static struct owner_page *page = &fallback;
static bool wiped_on_fork; /* `page` is the kernel's wipe-on-fork one */
static void (*adopt_fn)(void);

void fa_owner_start(void (*adopt)(void))
{
    int saved = errno;
    adopt_fn = adopt;
    void *m = mmap(NULL, sizeof *page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
        if (madvise(m, sizeof *page, MADV_WIPEONFORK) == 0) {
            struct owner_page *p = m;
            p->pid = (int)getpid();
            __atomic_store_n(&page, p, __ATOMIC_RELEASE);
            __atomic_store_n(&wiped_on_fork, true, __ATOMIC_RELEASE);
        } else {
            munmap(m, sizeof *page);
        }
    }
    __atomic_store_n(&page->pid, (int)getpid(), __ATOMIC_RELEASE);
    errno = saved;
}

void fa_owner_claim(void)
{
    struct owner_page *p = __atomic_load_n(&page, __ATOMIC_ACQUIRE);
    p->lock = 0; /* the kernel cleared it already, unless the page is the fallback */
    p->adopter = 0;
    __atomic_store_n(&p->pid, (int)getpid(), __ATOMIC_RELEASE);
}

/* The first thread to find the page zero resets the state; any other
 * waits until it has.  A signal handler that interrupted its own thread's
 * takeover goes on with the state as it is. */
static __attribute__((noinline)) void take_over(struct owner_page *p)
{
    int self = (int)gettid(), expect = 0;
    if (__atomic_compare_exchange_n(&p->adopter, &expect, self, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        int saved = errno;
        if (adopt_fn)
            adopt_fn();
        errno = saved;
        __atomic_store_n(&p->pid, (int)getpid(), __ATOMIC_RELEASE);
        return;
    }
    if (expect == self)
        return;
    while (__atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) == 0)
        sched_yield();
}

void fa_owner_adopt(void)
{
    if (!__atomic_load_n(&wiped_on_fork, __ATOMIC_ACQUIRE))
        return;
    struct owner_page *p = __atomic_load_n(&page, __ATOMIC_ACQUIRE);
    if (__builtin_expect(__atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) == 0, 0))
        take_over(p);
}

bool fa_owner_mine(void)
{
    fa_owner_adopt();
    int pid = __atomic_load_n(&__atomic_load_n(&page, __ATOMIC_ACQUIRE)->pid, __ATOMIC_ACQUIRE);
    return pid == 0 || pid == (int)getpid();
}

int *fa_owner_lock_word(void) { return &__atomic_load_n(&page, __ATOMIC_ACQUIRE)->lock; }
