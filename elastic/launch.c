/* launch.c: the trainer through a real launcher, in a process group of its
 * own so that nothing of it outlives a stop (elastic.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../common/clock.h"
#include "../common/error.h"
#include "elastic.h"

void elastic_argv_free(char **argv)
{
    if (!argv) return;
    for (char **a = argv; *a; a++) free(*a);
    free(argv);
}

typedef struct {
    char **items;
    int count, capacity, failed;
} argv_builder;

static void push(argv_builder *b, const char *text)
{
    if (b->failed) return;
    if (b->count + 2 > b->capacity) {
        int capacity = b->capacity ? 2 * b->capacity : 32;
        char **grown = realloc(b->items, (size_t)capacity * sizeof *grown);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->items = grown;
        b->capacity = capacity;
    }
    char *copy = strdup(text);
    if (!copy) b->failed = 1;
    else {
        b->items[b->count++] = copy;
        b->items[b->count] = NULL;
    }
}

static void push_int(argv_builder *b, int64_t value)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)value);
    push(b, text);
}

/* The nodes that take the ranks, in order, as many as needed: node i gets
 * min(its ranks, what is left). Returns how many nodes are used. */
static int nodes_used(const elastic_capacity *c, int ranks, int *per_node)
{
    int used = 0;
    for (int i = 0; i < c->nodes && ranks > 0; i++) {
        per_node[i] = c->node_ranks[i] < ranks ? c->node_ranks[i] : ranks;
        ranks -= per_node[i];
        used = i + 1;
    }
    return used;
}

/* A host file for mpirun naming the nodes used and their slots. */
static int write_hostfile(const elastic_launch *l, char *path, size_t path_size)
{
    int per_node[ELASTIC_MAX_NODES];
    int used = nodes_used(l->capacity, l->ranks, per_node);
    snprintf(path, path_size, "%s/hostfile.launch", l->work_dir);
    FILE *f = fopen(path, "w");
    if (!f) return tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    for (int i = 0; i < used; i++) fprintf(f, "%s slots=%d\n", l->capacity->node_names[i], per_node[i]);
    if (fclose(f) != 0) return tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return TP_OK;
}

int elastic_launch_argv(const elastic_launch *l, char ***out)
{
    *out = NULL;
    argv_builder b = {0};
    if (l->launcher == ELASTIC_LAUNCHER_MPIRUN) {
        push(&b, l->mpirun ? l->mpirun : "mpirun");
        push(&b, "-np");
        push_int(&b, l->ranks);
        /* ranks may outnumber cores (tests, small runs); the layout, not the
         * core count, decides */
        push(&b, "--oversubscribe");
        if (l->capacity && l->capacity->nodes > 0) {
            char hostfile[4200];
            int status = write_hostfile(l, hostfile, sizeof hostfile);
            if (status) {
                elastic_argv_free(b.items);
                return status;
            }
            push(&b, "--hostfile");
            push(&b, hostfile);
        }
    } else {
        int per_node[ELASTIC_MAX_NODES], used = l->capacity ? nodes_used(l->capacity, l->ranks, per_node) : 0;
        push(&b, l->mpirun ? l->mpirun : "srun");
        push(&b, "--mpi=pmix");
        push(&b, "--kill-on-bad-exit=1");
        push(&b, "-n");
        push_int(&b, l->ranks);
        if (used > 0) {
            char list[ELASTIC_MAX_NODES * 65] = "";
            for (int i = 0; i < used; i++) {
                if (i) strcat(list, ",");
                strcat(list, l->capacity->node_names[i]);
            }
            push(&b, "-N");
            push_int(&b, used);
            push(&b, "--nodelist");
            push(&b, list);
        }
    }
    for (char *const *a = l->argv; *a; a++) push(&b, *a);
    if (b.failed) {
        elastic_argv_free(b.items);
        return tp_fail(TP_ERR_NOMEM, "out of memory building the launch command");
    }
    *out = b.items;
    return TP_OK;
}

int elastic_spawn(char *const *argv, pid_t *pid)
{
    /* The child reports a failed exec through a close-on-exec pipe. */
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) return tp_fail(TP_ERR_IO, "pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0) {
        close(report[0]);
        close(report[1]);
        return tp_fail(TP_ERR_IO, "fork: %s", strerror(errno));
    }
    if (child == 0) {
        setpgid(0, 0);
        /* The launch ends with the orchestrator, however it ends (kill -9
         * included): a restarted orchestrator must not find it running. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(127);
        /* The orchestrator's own signal dispositions are not the trainer's. */
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGUSR1, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvp(argv[0], argv);
        int err = errno;
        if (write(report[1], &err, sizeof err) != (ssize_t)sizeof err) _exit(127);
        _exit(127);
    }
    setpgid(child, child); /* also here: no race with a signal sent to the group at once */
    close(report[1]);
    int err = 0;
    ssize_t n;
    while ((n = read(report[0], &err, sizeof err)) < 0 && errno == EINTR) {
    }
    close(report[0]);
    if (n == (ssize_t)sizeof err) {
        waitpid(child, NULL, 0);
        return tp_fail(TP_ERR_IO, "cannot run %s: %s", argv[0], strerror(err));
    }
    *pid = child;
    return TP_OK;
}

int elastic_stop_group(pid_t pid, double grace_seconds, int *status_out)
{
    int status = 0, reaped = 0;
    kill(-pid, SIGTERM);
    double deadline = now_seconds() + grace_seconds;
    /* Until the leader is reaped (our child) or the group is gone (a group
     * left by an earlier orchestrator, not our child). */
    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) reaped = 1;
        int group_alive = kill(-pid, 0) == 0;
        if ((reaped || done < 0) && !group_alive) break;
        if (now_seconds() >= deadline) break;
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    /* Whatever of the group is left (the leader, or ranks it left behind). */
    kill(-pid, SIGKILL);
    if (!reaped && waitpid(pid, &status, 0) == pid) reaped = 1;
    if (status_out) *status_out = status;
    return TP_OK;
}
