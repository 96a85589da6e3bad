/* mapped.c: reading files in place through read-only mappings without the
 * process dying when one of them shrinks.
 *
 * A page of a mapping that lies past the end of its file (the file truncated
 * by someone else while mapped), or one the disk fails to read, raises
 * SIGBUS on access, and SIGBUS kills the process by default: a library must
 * fail instead. Code that reads mapped bytes in user space runs through
 * ckpt_mapped_call. The first mapping installs a SIGBUS handler that, for a
 * fault in a thread inside such a call, jumps back out of the call, which
 * then fails naming the file and offset; any other SIGBUS goes where it went
 * before (the default: the process dies as it would have). What runs inside
 * a call only reads and computes (hashes, copies, digests): it holds no lock
 * and allocates nothing, so that leaving it at a fault leaves nothing half
 * done but its own result, which the failure discards. The kernel's own
 * accesses (a write(2) from a mapping) fail with EFAULT instead of a signal;
 * ckpt_mapped_describe names the file for those.
 *
 * A program that installs a SIGBUS handler of its own after the first
 * mapping replaces this one: its handler then sees such faults. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
    sigjmp_buf jump;
} guard;

/* The innermost call of this thread, and the address of its fault. Initial-
 * exec TLS: read in the signal handler, where a lazily allocated TLS block
 * could not be allocated safely. */
static _Thread_local guard *active __attribute__((tls_model("initial-exec")));
static _Thread_local const void *fault_address __attribute__((tls_model("initial-exec")));

static struct sigaction previous; /* the disposition before ours */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_errno;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    guard *g = active;
    if (g && info->si_code > 0) { /* a fault (not a kill(2)) inside a guarded call */
        fault_address = info->si_addr;
        siglongjmp(g->jump, 1);
    }
    /* Not ours: as the previous disposition would have it. */
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction) {
        previous.sa_sigaction(sig, info, context);
        return;
    }
    if (previous.sa_handler == SIG_IGN && info->si_code <= 0) return;
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    /* The default: die of the signal. A fault recurs when this returns,
     * now unhandled; a signal that was sent is sent again. */
    struct sigaction fatal;
    memset(&fatal, 0, sizeof fatal);
    fatal.sa_handler = SIG_DFL;
    sigemptyset(&fatal.sa_mask);
    sigaction(SIGBUS, &fatal, NULL);
    if (info->si_code <= 0) raise(SIGBUS);
}

static void install(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    /* SA_NODEFER: the handler leaves by siglongjmp, and the jump saves no
     * signal mask (sigsetjmp(..., 0), no system call per guarded call), so
     * SIGBUS must not stay blocked after it. */
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous) != 0) install_errno = errno;
}

/* ------------------------------------------------------------- registry */

/* The mappings made, so that a fault's address can be named: looked up
 * after a fault, outside the handler. */
typedef struct {
    const char *base;
    int64_t size;
    char *path;
} mapping;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *registry;
static int registry_count, registry_capacity;

int ckpt_mapped_add(const void *base, int64_t size, const char *path)
{
    pthread_once(&install_once, install);
    if (install_errno)
        return tp_fail(TP_ERR_STATE, "%s: cannot guard a mapping (sigaction: %s)", path, strerror(install_errno));
    char *copy = strdup(path);
    if (!copy) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&registry_lock);
    int status = TP_OK;
    if (registry_count == registry_capacity) {
        int capacity = registry_capacity ? 2 * registry_capacity : 64;
        mapping *grown = realloc(registry, (size_t)capacity * sizeof *grown);
        if (grown) {
            registry = grown;
            registry_capacity = capacity;
        } else {
            status = tp_fail(TP_ERR_NOMEM, "out of memory");
        }
    }
    if (!status) registry[registry_count++] = (mapping){base, size, copy};
    pthread_mutex_unlock(&registry_lock);
    if (status) free(copy);
    return status;
}

void ckpt_mapped_remove(const void *base)
{
    pthread_mutex_lock(&registry_lock);
    for (int k = 0; k < registry_count; k++)
        if (registry[k].base == base) {
            free(registry[k].path);
            registry[k] = registry[--registry_count];
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}

int ckpt_mapped_describe(const void *address, char *out, size_t out_size)
{
    const char *a = address;
    int found = 0;
    pthread_mutex_lock(&registry_lock);
    for (int k = 0; k < registry_count && !found; k++)
        if (a >= registry[k].base && a < registry[k].base + registry[k].size) {
            if (out_size > 0)
                snprintf(out, out_size, "%s: its bytes at offset %lld could not be read through its mapping (the file "
                     "truncated while being read, or a disk error)", registry[k].path,
                     (long long)(a - registry[k].base));
            found = 1;
        }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

int ckpt_mapped_call(int (*fn)(void *ctx), void *ctx)
{
    guard g, *outer = active;
    if (sigsetjmp(g.jump, 0)) {
        active = outer;
        char message[CKPT_PATH_MAX + 160];
        if (!ckpt_mapped_describe(fault_address, message, sizeof message))
            snprintf(message, sizeof message, "a mapped file's bytes could not be read (SIGBUS at %p)", fault_address);
        return tp_fail(TP_ERR_IO, "%s", message);
    }
    active = &g;
    int status = fn(ctx);
    active = outer;
    return status;
}
