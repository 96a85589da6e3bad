/* capacity.c: how many ranks a run may use now, and where (elastic.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../common/buffer.h"
#include "../common/error.h"
#include "../common/parse.h"
#include "elastic.h"

#define MAX_RANKS_PER_NODE 4096
/* The most a Slurm command may say (bytes): `scontrol -o show step` of a
 * job of thousands of steps, `scontrol show job -d` of a thousand nodes and
 * sinfo of them are a few MiB at most; more is no answer of theirs. */
#define COMMAND_OUTPUT_MAX (16 << 20)

static int add_node(elastic_capacity *out, const char *name, int ranks, int cpus, const char *source)
{
    if (out->nodes == ELASTIC_MAX_NODES)
        return tp_fail(TP_ERR_ARG, "%s: more than %d nodes", source, ELASTIC_MAX_NODES);
    if (strlen(name) >= sizeof out->node_names[0])
        return tp_fail(TP_ERR_ARG, "%s: node name '%s' longer than %zu bytes", source, name,
                       sizeof out->node_names[0] - 1);
    strcpy(out->node_names[out->nodes], name);
    out->node_cpus[out->nodes] = cpus;
    out->node_ranks[out->nodes++] = ranks;
    out->world += ranks;
    return TP_OK;
}

/* A file holding one number: the ranks available (the whitespace rule of
 * parse_int_in_file, as for a host file's slots=N). */
static int read_world_file(const char *path, elastic_capacity *out)
{
    char *text = NULL;
    TP_TRY(store_read_text_file(path, 4096, &text, NULL));
    int64_t world = 0;
    int bad = parse_int_in_file(text, 0, ELASTIC_MAX_NODES * MAX_RANKS_PER_NODE, &world) != 0;
    for (char *c = text; bad && *c; c++) /* the message on one line */
        if ((unsigned char)*c < ' ') *c = ' ';
    int status = bad ? tp_fail(TP_ERR_ARG,
                               "%s: expected the number of ranks available (0 to %d, whitespace around it ignored), "
                               "got '%.40s'",
                               path, ELASTIC_MAX_NODES * MAX_RANKS_PER_NODE, text)
                     : TP_OK;
    free(text);
    if (!status) out->world = (int)world;
    return status;
}

/* An Open MPI host file: "host [slots=N]" per line, '#' comments. */
static int read_hostfile(const char *path, elastic_capacity *out)
{
    char *text = NULL;
    TP_TRY(store_read_text_file(path, 1 << 20, &text, NULL));
    int status = TP_OK, line_number = 0;
    for (char *line = text, *next; !status && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        line_number++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char host[256], slots_text[64] = "";
        int fields = sscanf(line, "%255s %63s", host, slots_text);
        if (fields <= 0) continue;
        int64_t slots = 1;
        if (fields == 2) {
            if (strncmp(slots_text, "slots=", 6) != 0 ||
                parse_int_in_file(slots_text + 6, 1, MAX_RANKS_PER_NODE, &slots) != 0)
                status = tp_fail(TP_ERR_ARG, "%s line %d: expected 'HOST slots=N' (N from 1 to %d), got '%s'", path,
                                 line_number, MAX_RANKS_PER_NODE, slots_text);
        }
        if (!status) status = add_node(out, host, (int)slots, 0, path);
    }
    free(text);
    /* No host is no number of ranks, as an empty world file is: refused
     * (at the start at once, later a moment of a file being rewritten,
     * waited out). Read as 0 ranks, the start waited --capacity-wait for
     * a mistake, and a rewrite stopped the trainer to scale down. */
    if (!status && out->nodes == 0)
        status = tp_fail(TP_ERR_ARG, "%s: expected 'HOST [slots=N]' lines, got no host (the file is empty or only "
                         "comments)", path);
    return status;
}

/* Runs a command and reads all its output (stderr with it) into *out
 * (malloc'ed, NUL-terminated; free it), up to COMMAND_OUTPUT_MAX bytes. A
 * command that fails, or says more, is an error saying how, with what it
 * said: its output is no answer. Read into a fixed buffer, a long answer
 * (the steps of a job of many steps, the nodes of a large job) was cut,
 * and the command, its pipe closed, died of SIGPIPE: capacity unknown. */
static int command_output(const char *command, char **out)
{
    *out = NULL;
    char *with_errors = malloc(strlen(command) + 8);
    if (!with_errors) return tp_fail(TP_ERR_NOMEM, "out of memory running '%s'", command);
    sprintf(with_errors, "%s 2>&1", command);
    FILE *p = popen(with_errors, "r");
    free(with_errors);
    if (!p) return tp_fail(TP_ERR_IO, "cannot run '%s': %s", command, strerror(errno));
    byte_buffer text = {0};
    buffer_put(&text, "", 0); /* "" for a command that says nothing */
    char chunk[65536];
    size_t n;
    while (!text.failed && text.size <= COMMAND_OUTPUT_MAX && (n = fread(chunk, 1, sizeof chunk, p)) > 0)
        buffer_put(&text, chunk, n);
    int too_long = text.size > COMMAND_OUTPUT_MAX;
    int status = pclose(p); /* a command still talking, past the limit, ends on SIGPIPE */
    if (text.failed) {
        free(text.data);
        return tp_fail(TP_ERR_NOMEM, "out of memory reading the output of '%s'", command);
    }
    if (too_long) {
        free(text.data);
        return tp_fail(TP_ERR_IO, "'%s' said more than %d MiB: no answer of Slurm's", command,
                       COMMAND_OUTPUT_MAX >> 20);
    }
    if (status == 0) {
        *out = text.data;
        return TP_OK;
    }
    n = text.size;
    char *said = text.data;
    while (n > 0 && (said[n - 1] == '\n' || said[n - 1] == ' ')) said[--n] = '\0';
    for (char *c = said; *c; c++) /* the message on one line */
        if ((unsigned char)*c < ' ') *c = ' ';
    char how[64];
    if (status == -1) snprintf(how, sizeof how, "could not be waited for");
    else if (WIFEXITED(status)) snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
    else snprintf(how, sizeof how, "wait status %d", status);
    status = tp_fail(TP_ERR_IO, "'%s' failed (%s): %.1000s", command, how, n ? said : "(it said nothing)");
    free(said);
    return status;
}

/* The CPUs of a CPU_IDs list of scontrol's ("0-3,8,10-11"): 7 there, -1
 * when it is not such a list; *cores: the cores they are on, of
 * threads_per_core threads each. Slurm numbers a node's CPUs core by core
 * (core c holds CPUs c*T to c*T + T - 1: scontrol builds the list from the
 * job's cores that way), in ascending order, so 0-3,8,10-11 with 2 threads
 * a core is cores 0, 1, 4 and 5. */
static int count_cpu_ids(const char *ids, size_t length, int threads_per_core, int *cores)
{
    int count = 0;
    long last_core = -1;
    *cores = 0;
    for (size_t i = 0; i < length;) {
        char *end = NULL;
        long a = strtol(ids + i, &end, 10), b = a;
        if (end == ids + i || a < 0) return -1;
        i = (size_t)(end - ids);
        if (i < length && ids[i] == '-') {
            const char *from = ids + i + 1;
            b = strtol(from, &end, 10);
            if (end == from || b < a) return -1;
            i = (size_t)(end - ids);
        }
        count += (int)(b - a + 1);
        for (long core = a / threads_per_core; core <= b / threads_per_core; core++)
            if (core > last_core) (*cores)++, last_core = core;
        if (i < length && ids[i] != ',') return -1;
        i++;
    }
    return count;
}

/* The job's own CPUs on each of its nodes, the cores they are on, and its
 * CPUs per task, from `scontrol show job -d JOB` (lines "Nodes=n[1-2]
 * CPU_IDs=0-3 Mem=..." and "CPUs/Task=N"): an allocation that does not hold
 * whole nodes (--ntasks-per-node=8 on nodes of 64 CPUs, no --exclusive) may
 * start only that many tasks there, and srun refused a step of the node's
 * CPU count ("More processors requested than permitted"), relaunched until
 * it was called a bug; SLURM_JOB_CPUS_PER_NODE (elastic_launch_env) says the
 * same. threads_per_core[i]: node i's (sinfo's). Nodes the answer does not
 * name keep the node's CPUs and cores (sinfo's). */
static int slurm_job_cpus(const char *job_id, const int *threads_per_core, elastic_capacity *out,
                          int *cpus_per_task)
{
    char *detail = NULL, command[4200];
    *cpus_per_task = 1;
    snprintf(command, sizeof command, "scontrol show job -d %s", job_id);
    TP_TRY(command_output(command, &detail));
    const char *per_task = strstr(detail, "CPUs/Task=");
    if (per_task && atoi(per_task + 10) > 1) *cpus_per_task = atoi(per_task + 10);
    char *lines = NULL;
    int status = TP_OK;
    for (char *line = strtok_r(detail, "\n", &lines); !status && line; line = strtok_r(NULL, "\n", &lines)) {
        line += strspn(line, " ");
        if (strncmp(line, "Nodes=", 6) != 0) continue;
        char *ids = strstr(line, " CPU_IDs=");
        if (!ids) continue;
        size_t list_length = (size_t)(ids - line) - 6;
        ids += 9;
        size_t ids_length = strcspn(ids, " ");
        int cores = 0;
        if (count_cpu_ids(ids, ids_length, 1, &cores) < 1) continue;
        char list[4096], *names = NULL;
        if (list_length >= sizeof list) continue;
        memcpy(list, line + 6, list_length);
        list[list_length] = '\0';
        if (strspn(list, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.,-[]") != list_length) continue;
        snprintf(command, sizeof command, "scontrol show hostnames '%s'", list);
        char *save = NULL;
        if ((status = command_output(command, &names))) break;
        for (char *name = strtok_r(names, "\n", &save); name; name = strtok_r(NULL, "\n", &save))
            for (int i = 0; i < out->nodes; i++)
                if (strcmp(out->node_names[i], name) == 0)
                    out->node_cpus[i] = count_cpu_ids(ids, ids_length, threads_per_core[i], &out->node_cores[i]);
        free(names);
    }
    free(detail);
    return status;
}

/* The nodes of the allocation as Slurm sees them now (the SLURM_*
 * environment of the allocation is not updated when it shrinks): its node
 * list from squeue, expanded by scontrol, less the nodes that are down.
 * Each command's failure is the capacity's failure to be read, never an
 * answer: squeue was once run inside scontrol's arguments
 * (`scontrol show hostnames "$(squeue ...)"`), which lost its exit status,
 * and a controller that did not answer read as an allocation of 0 nodes
 * (the trainer stopped, waiting for capacity). */
/* A job id goes into a shell command: digits (and an array's '_') only. */
static int check_job_id(const char *job_id)
{
    for (const char *c = job_id; *c; c++)
        if ((*c < '0' || *c > '9') && *c != '_') return tp_fail(TP_ERR_ARG, "Slurm job id '%s' is not a number", job_id);
    return job_id[0] ? TP_OK : tp_fail(TP_ERR_ARG, "no Slurm job id");
}

/* Runs `before LIST after`, the job's hostlist quoted between (any
 * length: a command line of a fixed size cut a long one). */
static int command_on_list(const char *before, const char *list, const char *after, char **out)
{
    byte_buffer command = {0};
    buffer_put_text(&command, before);
    buffer_put_text(&command, list);
    buffer_put_text(&command, after);
    if (command.failed) {
        free(command.data);
        return tp_fail(TP_ERR_NOMEM, "out of memory asking Slurm of the nodes %.200s", list);
    }
    int status = command_output(command.data, out);
    free(command.data);
    return status;
}

static int slurm_nodes_up(const elastic_capacity_source *source, char *nodes, const char *states,
                          elastic_capacity *out);

static int read_slurm(const elastic_capacity_source *source, elastic_capacity *out)
{
    TP_TRY(check_job_id(source->job_id));
    char *list = NULL, *nodes = NULL, *states = NULL, command[128];
    snprintf(command, sizeof command, "squeue -h -j %s -o %%N", source->job_id);
    TP_TRY(command_output(command, &list));
    list[strcspn(list, "\n")] = '\0';
    int status = TP_OK;
    /* a hostlist ("n[1-3,7],gpu-a"), passed to a shell quoted: nothing else */
    for (const char *c = list; !status && *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.,-[]", *c))
            status = tp_fail(TP_ERR_FORMAT, "squeue -j %s: expected the job's node list, got '%.200s'",
                             source->job_id, list);
    /* none: a job that holds no node now (scontrol would read stdin) */
    if (!status && list[0]) status = command_on_list("scontrol show hostnames '", list, "'", &nodes);
    /* Every node's state in one sinfo of the job's node list: one each
     * (sinfo -n NODE) was a query of the controller per node, every second,
     * the capacity read taking longer than the second it was read in on a
     * large allocation. A line per node and partition: the first counts. */
    if (!status && list[0]) status = command_on_list("sinfo -h -N -n '", list, "' -o '%N %T %c %Z'", &states);
    if (!status && nodes) status = slurm_nodes_up(source, nodes, states, out);
    free(list);
    free(nodes);
    free(states);
    return status;
}

/* The nodes of the allocation that are up (nodes: scontrol's names, a
 * line each, cut up here; states: sinfo's lines "NAME STATE CPUS
 * THREADS_PER_CORE"), and the ranks each offers. */
static int slurm_nodes_up(const elastic_capacity_source *source, char *nodes, const char *states,
                          elastic_capacity *out)
{
    char *names_left = NULL;
    int threads_per_core[ELASTIC_MAX_NODES]; /* of each node of out */
    for (char *name = strtok_r(nodes, "\n", &names_left); name; name = strtok_r(NULL, "\n", &names_left)) {
        char state[256] = "", cpus[64], threads[64] = "";
        size_t name_length = strlen(name);
        for (const char *line = states; *line; line += strcspn(line, "\n"), line += *line == '\n')
            if (strncmp(line, name, name_length) == 0 && line[name_length] == ' ') {
                size_t length = strcspn(line + name_length + 1, "\n");
                if (length >= sizeof state) length = sizeof state - 1;
                memcpy(state, line + name_length + 1, length);
                state[length] = '\0';
                break;
            }
        if (sscanf(state, "%*s %63s %63s", cpus, threads) < 1)
            return tp_fail(TP_ERR_IO, "sinfo on node %s said '%s'", name, state);
        /* down, drained, failing or not responding ("*"): not usable */
        if (strstr(state, "down") || strstr(state, "drain") || strstr(state, "fail") || strchr(state, '*')) continue;
        int64_t node_cpus = 0, node_threads = 1; /* unknown when sinfo says something else; a core a CPU */
        if (parse_int_in_file(cpus, 0, 1 << 20, &node_cpus) != 0) node_cpus = 0;
        if (parse_int_in_file(threads, 1, 1 << 10, &node_threads) != 0) node_threads = 1;
        TP_TRY(add_node(out, name, 0, (int)node_cpus, "the Slurm allocation"));
        threads_per_core[out->nodes - 1] = (int)node_threads;
        out->node_cores[out->nodes - 1] = (int)(node_cpus / node_threads);
    }
    /* The ranks of each node: the job's cores there (not the node's: the
     * job may hold part of it), a task's cores each (its CPUs, over the
     * node's threads a core), or the trainer's compute threads (one a core)
     * where those are more; or --ranks-per-node. Not the job's CPUs: on a
     * node of 2 threads a core they are hardware threads (Slurm's CPUs,
     * SLURM_CPUS_ON_NODE and CPU_IDs count threads, under CR_Core as under
     * CR_CPU), and a rank a thread put two ranks on each core, each with
     * half its arithmetic units. */
    int cpus_per_task = 1;
    if (out->nodes > 0) TP_TRY(slurm_job_cpus(source->job_id, threads_per_core, out, &cpus_per_task));
    out->world = 0;
    for (int i = 0; i < out->nodes; i++) {
        int cores_per_task = (cpus_per_task + threads_per_core[i] - 1) / threads_per_core[i];
        int cores_per_rank = source->threads_per_rank > cores_per_task ? source->threads_per_rank : cores_per_task;
        int ranks = source->ranks_per_node > 0 ? source->ranks_per_node : out->node_cores[i] / cores_per_rank;
        out->node_ranks[i] = ranks < 1 ? 1 : ranks;
        out->world += out->node_ranks[i];
    }
    return TP_OK;
}

int elastic_slurm_step_pending(const char *job_id, pid_t srun_pid, int *pending, char *line, size_t size)
{
    *pending = 0;
    TP_TRY(check_job_id(job_id));
    char *steps = NULL, command[128], host[256] = "", mark[320];
    /* srun names itself by its host's short name (Slurm's xshort_hostname) */
    if (gethostname(host, sizeof host - 1) != 0) return tp_fail(TP_ERR_IO, "gethostname: %s", strerror(errno));
    host[strcspn(host, ".")] = '\0';
    snprintf(command, sizeof command, "scontrol -o show step %s", job_id);
    TP_TRY(command_output(command, &steps));
    int length = snprintf(mark, sizeof mark, " SrunHost:Pid=%s:%d", host, (int)srun_pid);
    for (char *step = steps, *next; *step; step = next) {
        next = step + strcspn(step, "\n");
        if (*next) *next++ = '\0';
        const char *at = strstr(step, mark);
        if (!at || (at[length] != '\0' && at[length] != ' ')) continue;
        *pending = strstr(step, " State=PENDING") != NULL;
        if (*pending && line) snprintf(line, size, "scontrol show step: %s", step);
        break;
    }
    free(steps);
    return TP_OK;
}

int elastic_capacity_read(const elastic_capacity_source *source, elastic_capacity *out)
{
    memset(out, 0, sizeof *out);
    switch (source->kind) {
    case ELASTIC_CAPACITY_WORLD:
        out->world = source->world;
        return TP_OK;
    case ELASTIC_CAPACITY_WORLD_FILE: return read_world_file(source->path, out);
    case ELASTIC_CAPACITY_HOSTFILE: return read_hostfile(source->path, out);
    case ELASTIC_CAPACITY_SLURM: return read_slurm(source, out);
    }
    return tp_fail(TP_ERR_ARG, "unknown capacity source %d", (int)source->kind);
}
