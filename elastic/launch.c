/* launch.c: the trainer through a real launcher, in a process group of its
 * own so that nothing of it outlives a stop (elastic.h). */
#include <dirent.h>
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
#include "../common/file.h"
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

static void push_int_setting(argv_builder *b, const char *name, int64_t value)
{
    char text[128];
    snprintf(text, sizeof text, "%s=%lld", name, (long long)value);
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
    int fd = -1;
    TP_TRY(tp_open_regular_flags(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &fd)); /* a FIFO would block */
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return tp_fail(TP_ERR_NOMEM, "%s: cannot write: %s", path, strerror(errno));
    }
    for (int i = 0; i < used; i++) fprintf(f, "%s slots=%d\n", l->capacity->node_names[i], per_node[i]);
    if (fclose(f) != 0) return tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return TP_OK;
}

/* The CPUs each srun task is given: the job's CPUs on each node used over
 * the tasks placed there, the least of them (a step must fit every node):
 * every CPU of the cores the plan gave the rank (elastic_capacity_read: a
 * core, or --threads cores). srun's default is a CPU a task, which Slurm
 * (CR_Core) rounds up to one core: a rank of tp-train --threads 2, bound
 * to its cores (--cpu-bind=cores), ran its two threads on one. 0 when a
 * node's CPUs are unknown (not Slurm's capacity) or fewer than its tasks
 * (--ranks-per-node over them): srun's default. */
static int srun_cpus_per_task(const elastic_capacity *c, const int *per_node, int used)
{
    int least = 0;
    for (int i = 0; i < used; i++) {
        if (c->node_cpus[i] <= 0 || per_node[i] <= 0) return 0;
        int each = c->node_cpus[i] / per_node[i];
        if (i == 0 || each < least) least = each;
    }
    return least;
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
        /* The plan's cores a rank: each task bound to its cores where Slurm
         * binds (task/affinity), over a site's default binding (CpuBind,
         * TaskPluginParam: threads). srun(1): --cpu-bind is "used only when
         * the task/affinity plugin is enabled"; under task/none (the test
         * cluster) srun says "cluster configuration lacks support for cpu
         * binding" and runs the step unbound, as before. */
        push(&b, "--cpu-bind=cores");
        int cpus_per_task = srun_cpus_per_task(l->capacity, per_node, used);
        if (cpus_per_task > 1) {
            char setting[64];
            snprintf(setting, sizeof setting, "--cpus-per-task=%d", cpus_per_task);
            push(&b, setting);
        }
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

/* push_list(b, "NAME=", c, cpus): NAME=<each node's name, or CPUs>,... */
static void push_list(argv_builder *b, const char *name, const elastic_capacity *c, int cpus)
{
    size_t size = strlen(name) + (size_t)c->nodes * (sizeof c->node_names[0] + 1) + 1;
    char *text = malloc(size);
    if (!text) {
        b->failed = 1;
        return;
    }
    size_t used = (size_t)snprintf(text, size, "%s", name);
    for (int i = 0; i < c->nodes; i++) {
        used += (size_t)(cpus ? snprintf(text + used, size - used, "%s%d", i ? "," : "", c->node_cpus[i])
                              : snprintf(text + used, size - used, "%s%s", i ? "," : "", c->node_names[i]));
    }
    push(b, text);
    free(text);
}

int elastic_launch_env(const elastic_launch *l, char ***out)
{
    *out = NULL;
    argv_builder b = {0};
    b.items = calloc(1, sizeof *b.items); /* an empty list, never NULL */
    b.capacity = 1;
    if (!b.items) b.failed = 1;
    const elastic_capacity *c = l->capacity;
    if (l->launcher == ELASTIC_LAUNCHER_SRUN && c && c->nodes > 0) {
        /* A comma list is a hostlist too; srun expands either. */
        push_list(&b, "SLURM_JOB_NODELIST=", c, 0);
        push_list(&b, "SLURM_NODELIST=", c, 0); /* the older name, still read */
        push_int_setting(&b, "SLURM_JOB_NUM_NODES", c->nodes);
        push_int_setting(&b, "SLURM_NNODES", c->nodes);
        int cpus_known = 1;
        for (int i = 0; i < c->nodes; i++) cpus_known &= c->node_cpus[i] > 0;
        if (cpus_known) push_list(&b, "SLURM_JOB_CPUS_PER_NODE=", c, 1);
        else push(&b, "SLURM_JOB_CPUS_PER_NODE");
        /* the allocation's tasks per node as it was, not this step's */
        push(&b, "SLURM_TASKS_PER_NODE");
    }
    if (b.failed) {
        elastic_argv_free(b.items);
        return tp_fail(TP_ERR_NOMEM, "out of memory building the launch's environment");
    }
    *out = b.items;
    return TP_OK;
}

int elastic_spawn(char *const *argv, char *const *env, pid_t *pid)
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
        /* Every process of the launch inherits the marker, ranks too, which
         * Open MPI puts in process groups of their own. */
        char marker[32];
        snprintf(marker, sizeof marker, "%d", (int)getpid());
        setenv(ELASTIC_LAUNCH_MARKER, marker, 1);
        /* putenv: the entry as it is, no allocation between fork and exec */
        for (char *const *e = env; e && *e; e++) strchr(*e, '=') ? putenv(*e) : unsetenv(*e);
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

/* Bytes of /proc/PID/NAME read into buf (0 when it reads empty or the
 * process is gone). */
static size_t read_proc(const char *pid, const char *name, char *buf, size_t size)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/%s", pid, name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, size, f);
    fclose(f);
    return n;
}

/* Whether process `pid`'s environment holds marker=value. A process in the
 * middle of an execve shows an empty environment, and an empty command
 * line, until the new program's are in place: 13% of the reads of a
 * process that executes itself in a loop, and under load that instant can
 * outlast several milliseconds (10 reads 1 ms apart once missed a leftover
 * beside `make asan`). So an empty environment is read again, for up to a
 * second, while the command line reads empty too and the executable is
 * readable; a process with an empty environment of its own (it has a
 * command line: three reads), a kernel thread and a zombie (no executable)
 * are answered at once. */
static int carries_marker(const char *pid, const char *entry, size_t entry_length)
{
    char exe[300], target[8], first_argument;
    snprintf(exe, sizeof exe, "/proc/%s/exe", pid);
    static char environment[1 << 20];
    size_t n;
    double deadline = 0;
    int with_command_line = 0; /* reads of an empty environment beside a command line */
    while ((n = read_proc(pid, "environ", environment, sizeof environment)) == 0) {
        if (readlink(exe, target, sizeof target) < 0) return 0;
        /* execve sets the two one after the other: a few reads to be sure */
        if (read_proc(pid, "cmdline", &first_argument, 1) > 0 && ++with_command_line >= 3) return 0;
        double now = now_seconds();
        if (deadline == 0) deadline = now + 1.0;
        else if (now > deadline) return 0;
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    for (size_t i = 0; i + entry_length <= n;) {
        if (memcmp(environment + i, entry, entry_length) == 0) return 1;
        const char *end = memchr(environment + i, '\0', n - i);
        if (!end) break;
        i = (size_t)(end - environment) + 1;
    }
    return 0;
}

/* Sends sig to every process of this machine that carries the launch's
 * marker; returns how many there were. */
static int signal_marked(pid_t launch, int sig)
{
    char entry[64];
    int length = snprintf(entry, sizeof entry, ELASTIC_LAUNCH_MARKER "=%d", (int)launch) + 1; /* with its NUL */
    DIR *proc = opendir("/proc");
    if (!proc) return 0;
    int found = 0;
    for (struct dirent *e; (e = readdir(proc)) != NULL;) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid()) continue;
        if (carries_marker(e->d_name, entry, (size_t)length)) {
            kill((pid_t)pid, sig);
            found++;
        }
    }
    closedir(proc);
    return found;
}

/* From /proc/PID/stat: the state, the process group and the start time
 * (clock ticks after boot). The command's name, in parentheses, may hold
 * anything: the fields are read after its last ')'. */
static int proc_stat(pid_t pid, char *state, pid_t *group, uint64_t *start)
{
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return tp_fail(TP_ERR_NOT_FOUND, "no process %d (%s: %s)", (int)pid, path, strerror(errno));
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *paren = strrchr(text, ')');
    int pgrp = 0;
    unsigned long long ticks = 0;
    if (!paren || sscanf(paren + 1, " %c %*d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                         state, &pgrp, &ticks) != 3)
        return tp_fail(TP_ERR_FORMAT, "%s: expected the fields of proc(5), got '%.80s'", path, text);
    *group = (pid_t)pgrp;
    *start = (uint64_t)ticks;
    return TP_OK;
}

int elastic_process_start(pid_t pid, uint64_t *ticks)
{
    char state;
    pid_t group;
    return proc_stat(pid, &state, &group, ticks);
}

/* Pids never signalled, whatever a state file says: 0 and below (kill(2)
 * takes them for this process's group, or every process), 1 (init; -1 is
 * every process the user may signal) and this process and its group. */
static int never_signalled(pid_t pid)
{
    return pid <= 1 || pid == getpid() || pid == getpgrp();
}

int elastic_launch_owned(pid_t pid, uint64_t start_ticks)
{
    if (never_signalled(pid))
        return tp_fail(TP_ERR_STATE, "pid %d is never signalled (0, 1, negative, or this orchestrator's own)",
                       (int)pid);
    char state;
    pid_t group;
    uint64_t started;
    TP_TRY(proc_stat(pid, &state, &group, &started));
    if (start_ticks && started != start_ticks)
        return tp_fail(TP_ERR_STATE,
                       "process %d started at %llu clock ticks after boot, the launch at %llu: the pid was reused",
                       (int)pid, (unsigned long long)started, (unsigned long long)start_ticks);
    if (group != pid)
        return tp_fail(TP_ERR_STATE, "process %d is not the leader of its process group (the group is %d), as a "
                       "launch is", (int)pid, (int)group);
    char name[32], entry[64];
    snprintf(name, sizeof name, "%d", (int)pid);
    int length = snprintf(entry, sizeof entry, ELASTIC_LAUNCH_MARKER "=%d", (int)pid) + 1; /* with its NUL */
    if (!carries_marker(name, entry, (size_t)length))
        return tp_fail(TP_ERR_STATE, "process %d does not carry %s=%d in its environment, as every process of a "
                       "launch does: not a launch of tp-elastic's", (int)pid, ELASTIC_LAUNCH_MARKER, (int)pid);
    return TP_OK;
}

static void pause_briefly(void)
{
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

int elastic_end_leftovers(pid_t launch, double grace_seconds)
{
    if (never_signalled(launch)) return 0; /* no launch has such a marker */
    if (!signal_marked(launch, SIGTERM)) return 0;
    double deadline = now_seconds() + grace_seconds;
    int left;
    while ((left = signal_marked(launch, 0)) > 0 && now_seconds() < deadline) pause_briefly();
    if (left) signal_marked(launch, SIGKILL);
    for (int i = 0; i < 250 && signal_marked(launch, 0) > 0; i++) pause_briefly(); /* until the kernel has them */
    return left;
}

int elastic_stop_group(pid_t pid, double grace_seconds, int *status_out)
{
    int status = 0, reaped = 0;
    /* kill(-1) is every process the user may signal; -0 is our own group */
    if (never_signalled(pid)) return tp_fail(TP_ERR_ARG, "process group %d is never signalled", (int)pid);
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
        pause_briefly();
    }
    /* Whatever of the group is left (the leader, or ranks it left behind). */
    kill(-pid, SIGKILL);
    if (!reaped && waitpid(pid, &status, 0) == pid) reaped = 1;
    elastic_end_leftovers(pid, grace_seconds);
    if (status_out) *status_out = status;
    return TP_OK;
}
