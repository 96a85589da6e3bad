/* The orchestrator's library parts (elastic/elastic.h) other than the
 * planner: capacity sources, the launcher's command line, process groups
 * that end whole, the trainer's log followed as it grows, and the choice of
 * the newest checkpoint that verifies. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../../elastic/elastic.h"
#include "../support/fixture.h"

TestSuite(elastic, .init = make_dir, .fini = remove_dir);

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* ------------------------------------------------------------- capacity */

Test(elastic, world_file_is_read_each_time)
{
    char path[600];
    snprintf(path, sizeof path, "%s/world", dir);
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_WORLD_FILE};
    strcpy(source.path, path);
    elastic_capacity c;
    write_text(path, "4\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 4);
    write_text(path, " 7 ");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 7);
    write_text(path, "seven");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), path), "the error names the file: %s", tp_errmsg());
    write_text(path, "-1");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_ERR_ARG);
    unlink(path);
    cr_assert_neq(elastic_capacity_read(&source, &c), TP_OK, "a missing world file is an error");
}

/* One rule for a number in a file (parse_int_in_file): whitespace around
 * it is ignored, anything else refused; the error shows what was found. */
Test(elastic, numbers_in_files_follow_one_whitespace_rule)
{
    char path[600];
    snprintf(path, sizeof path, "%s/world", dir);
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_WORLD_FILE};
    strcpy(source.path, path);
    elastic_capacity c;
    const char *good[] = {"1\n", " 1 ", "\t1\r\n", "1"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        write_text(path, good[i]);
        cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "'%s': %s", good[i], tp_errmsg());
        cr_assert_eq(c.world, 1);
    }
    const char *bad[] = {"1x", "+1", "1 2", "", " ", "0x10", "1.0", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(path, bad[i]);
        cr_assert_eq(elastic_capacity_read(&source, &c), TP_ERR_ARG, "'%s' is refused", bad[i]);
        cr_assert(strstr(tp_errmsg(), path), "the error names the file: %s", tp_errmsg());
    }
    write_text(path, "1x\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "got '1x"), "the error shows what was found: %s", tp_errmsg());
    cr_assert_null(strchr(tp_errmsg(), '\n'), "on one line: %s", tp_errmsg());
    /* a host file's slots=N: the same rule */
    snprintf(path, sizeof path, "%s/hosts", dir);
    source.kind = ELASTIC_CAPACITY_HOSTFILE;
    strcpy(source.path, path);
    write_text(path, "a slots=+4\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_ERR_ARG, "slots=+4 is refused");
    write_text(path, "a slots=4\t\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 4);
}

Test(elastic, hostfile_gives_nodes_and_slots)
{
    char path[600];
    snprintf(path, sizeof path, "%s/hosts", dir);
    write_text(path, "# the cluster\nnode-a slots=4\n\nnode-b slots=2   # a comment\nnode-c\n");
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_HOSTFILE};
    strcpy(source.path, path);
    elastic_capacity c;
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.nodes, 3);
    cr_assert_eq(c.world, 7);
    cr_assert_str_eq(c.node_names[1], "node-b");
    cr_assert_eq(c.node_ranks[1], 2);
    cr_assert_eq(c.node_ranks[2], 1, "no slots= is one slot");
    write_text(path, "node-a slots=zero\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "line 1"), "the error names the line: %s", tp_errmsg());
    /* No host at all is refused, as an empty world file is (it read as 0
     * ranks, waited on for --capacity-wait) */
    const char *hostless[] = {"", "\n  \n", "# nodes come later\n# node-a slots=4\n"};
    for (int i = 0; i < 3; i++) {
        write_text(path, hostless[i]);
        int status = elastic_capacity_read(&source, &c);
        cr_assert_eq(status, TP_ERR_ARG, "'%s': %s, world %d", hostless[i], tp_status_name(status), c.world);
        cr_assert(strstr(tp_errmsg(), path) && strstr(tp_errmsg(), "got no host"), "%s", tp_errmsg());
    }
}

/* ------------------------------------------------------------ launching */

static int count_args(char **argv)
{
    int n = 0;
    while (argv[n]) n++;
    return n;
}

static int has_entry(char **list, const char *entry);

static int has_pair(char **argv, const char *a, const char *b)
{
    for (int i = 0; argv[i] && argv[i + 1]; i++)
        if (strcmp(argv[i], a) == 0 && strcmp(argv[i + 1], b) == 0) return 1;
    return 0;
}

/* fake_slurm: squeue, scontrol and sinfo as small scripts in DIR/bin, put
 * first on PATH: an allocation of n1 and n2 (n2 down), 4 CPUs each, or as
 * DIR/nodes says (sinfo's lines "NAME STATE CPUS THREADS_PER_CORE"); squeue
 * fails as a controller that does not answer while DIR/down exists. */
static void fake_slurm(char *old_path, size_t size)
{
    char bin[600], path[8192];
    snprintf(bin, sizeof bin, "%s/bin", dir);
    cr_assert_eq(mkdir(bin, 0755), 0, "%s", bin);
    const char *scripts[][2] = {
        {"squeue", "#!/bin/sh\nif [ -e \"$(dirname \"$0\")/../down\" ]; then\n"
                   "  echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1\nfi\n"
                   "echo 'n[1-2]'\n"},
        /* the real one, given "", prints nothing and exits 0 */
        /* show job -d: DIR/job, when there is one (the job's CPUs per node) */
        /* -o show step JOB: DIR/steps */
        {"scontrol", "#!/bin/sh\n[ \"$2\" = job ] && { cat \"$(dirname \"$0\")/../job\" 2>/dev/null; exit 0; }\n"
                     "[ \"$3\" = step ] && { cat \"$(dirname \"$0\")/../steps\" 2>/dev/null; exit 0; }\n"
                     "case \"$3\" in 'n[1-2]') printf 'n1\\nn2\\n' ;; n*) echo \"$3\" ;; esac\nexit 0\n"},
        /* each call counted in DIR/sinfo.calls */
        {"sinfo", "#!/bin/sh\necho >>\"$(dirname \"$0\")/../sinfo.calls\"\n"
                  "case \"$*\" in *%N*) cat \"$(dirname \"$0\")/../nodes\" 2>/dev/null || printf 'n1 idle 4\\nn2 down* 4\\n' "
                  ";; *n2*) echo 'down* 4' ;; *) echo 'idle 4' ;; esac\n"},
    };
    for (size_t i = 0; i < sizeof scripts / sizeof *scripts; i++) {
        snprintf(path, sizeof path, "%s/%s", bin, scripts[i][0]);
        write_text(path, scripts[i][1]);
        cr_assert_eq(chmod(path, 0755), 0, "%s", path);
    }
    snprintf(old_path, size, "%s", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    snprintf(path, sizeof path, "%s:%s", bin, old_path);
    setenv("PATH", path, 1);
}

/* The allocation's nodes that are up, asked of Slurm; a controller that
 * does not answer is an error (the capacity unreadable: a launch goes on),
 * never an allocation of 0 nodes. Before, squeue ran inside scontrol's
 * arguments, its failure lost: world 0, and the trainer was stopped to
 * wait for capacity. */
Test(elastic, slurm_capacity_unreadable_is_not_zero_nodes)
{
    char old_path[4096];
    fake_slurm(old_path, sizeof old_path);
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_SLURM, .job_id = "77"};
    elastic_capacity c;
    int status = elastic_capacity_read(&source, &c);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.nodes, 1, "n2 is down");
    cr_assert_str_eq(c.node_names[0], "n1");
    cr_assert_eq(c.world, 4, "n1's CPUs");
    /* One sinfo for the allocation's nodes, not one per node: a query of
     * the controller per node every second. */
    char calls[600], *text = NULL;
    snprintf(calls, sizeof calls, "%s/sinfo.calls", dir);
    cr_assert_eq(store_read_text_file(calls, 4096, &text, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(text, "\n", "one sinfo for 2 nodes");
    free(text);
    char down[600];
    snprintf(down, sizeof down, "%s/down", dir);
    write_text(down, "");
    status = elastic_capacity_read(&source, &c);
    setenv("PATH", old_path, 1);
    cr_assert_eq(status, TP_ERR_IO, "a controller that does not answer: %s, world %d", tp_status_name(status),
                 c.world);
    cr_assert(strstr(tp_errmsg(), "squeue -h -j 77 -o %N' failed (exit status 1): slurm_load_jobs error: "
                                  "Unable to contact slurm controller"),
              "%s", tp_errmsg());
}

/* An allocation that holds part of its nodes (--ntasks-per-node=1 on
 * nodes of 4 CPUs, no --exclusive) has the job's CPUs there, as scontrol
 * show job -d says, not the node's: srun refused a step of the node's CPU
 * count ("More processors requested than permitted"), every relaunch
 * alike, and the run gave up calling it a bug. A task of several CPUs
 * (CPUs/Task) is one rank; SLURM_JOB_CPUS_PER_NODE says the job's CPUs. */
Test(elastic, slurm_capacity_is_the_jobs_cpus_not_the_nodes)
{
    char old_path[4096], job[600];
    fake_slurm(old_path, sizeof old_path);
    snprintf(job, sizeof job, "%s/job", dir);
    write_text(job, "JobId=77 JobName=a\n   NumNodes=2 NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:*\n"
                    "   JOB_GRES=(null)\n     Nodes=n1 CPU_IDs=0-1,3 Mem=0 GRES=\n"
                    "     Nodes=n2 CPU_IDs=2 Mem=0 GRES=\n   MinCPUsNode=1\n");
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_SLURM, .job_id = "77"};
    elastic_capacity c;
    int status = elastic_capacity_read(&source, &c);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.nodes, 1, "n2 is down");
    cr_assert_eq(c.world, 3, "the job's 3 CPUs of n1, not its 4: %d", c.world);
    cr_assert_eq(c.node_cpus[0], 3);
    char *train[] = {"tp-train", NULL};
    elastic_launch l = {ELASTIC_LAUNCHER_SRUN, NULL, 3, &c, train, dir};
    char **env = NULL;
    cr_assert_eq(elastic_launch_env(&l, &env), TP_OK, "%s", tp_errmsg());
    int said = 0;
    for (char **e = env; *e; e++) said |= strcmp(*e, "SLURM_JOB_CPUS_PER_NODE=3") == 0;
    elastic_argv_free(env);
    cr_assert(said, "SLURM_JOB_CPUS_PER_NODE=3");
    write_text(job, "JobId=77\n   NumNodes=1 NumCPUs=4 NumTasks=2 CPUs/Task=2\n     Nodes=n[1-2] CPU_IDs=0-3 Mem=0\n");
    status = elastic_capacity_read(&source, &c);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 2, "4 CPUs of 2 a task: 2 ranks, got %d", c.world);
    source.ranks_per_node = 5;
    status = elastic_capacity_read(&source, &c);
    setenv("PATH", old_path, 1);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 5, "--ranks-per-node decides where given");
}

/* On nodes of 2 hardware threads a core, Slurm's CPUs are threads: under
 * select/cons_tres with CR_Core the job holds whole cores, and CPU_IDs,
 * NumCPUs and SLURM_CPUS_ON_NODE count both threads of each. The trainer
 * computes with --threads threads a rank (1), each wanting a core: a rank a
 * core, not a rank a thread. Before, 8 ranks were planned on each node of 4
 * cores. The thread counts come from the sinfo that says the nodes' states
 * (%Z, threads a core); CPU_IDs number a node's CPUs core by core. */
Test(elastic, slurm_capacity_is_the_jobs_cores_not_its_threads)
{
    char old_path[4096], job[600], nodes[600];
    fake_slurm(old_path, sizeof old_path);
    snprintf(nodes, sizeof nodes, "%s/nodes", dir);
    write_text(nodes, "n1 idle 8 2\nn2 mixed 8 2\n");
    snprintf(job, sizeof job, "%s/job", dir);
    write_text(job, "JobId=77\n   NumNodes=2 NumCPUs=12 CPUs/Task=1\n     Nodes=n1 CPU_IDs=0-7 Mem=0\n"
                    "     Nodes=n2 CPU_IDs=0-1,4-5 Mem=0\n");
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_SLURM, .job_id = "77"};
    elastic_capacity c;
    int status = elastic_capacity_read(&source, &c);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.nodes, 2);
    cr_assert_eq(c.node_cpus[0], 8, "Slurm's CPUs stay threads (SLURM_JOB_CPUS_PER_NODE)");
    cr_assert_eq(c.node_ranks[0], 4, "a rank a core of n1, not a thread: %d", c.node_ranks[0]);
    cr_assert_eq(c.node_ranks[1], 2, "CPUs 0-1 and 4-5: cores 0 and 2, got %d", c.node_ranks[1]);
    cr_assert_eq(c.world, 6, "%d", c.world);
    cr_assert_eq(c.node_cores[0], 4);
    cr_assert_eq(c.node_cores[1], 2);
    /* A task of 2 CPUs is one core of 2 threads: still a rank a core. */
    write_text(job, "JobId=77\n   CPUs/Task=2\n     Nodes=n[1-2] CPU_IDs=0-7 Mem=0\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 8, "CPUs/Task=2 on 2 threads a core: %d", c.world);
    /* tp-train --threads 2: two cores a rank. */
    source.threads_per_rank = 2;
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 4, "2 compute threads a rank on 4 cores a node: %d", c.world);
    /* Nodes of a core a CPU, as before: the CPUs over --threads. */
    source.threads_per_rank = 0;
    write_text(nodes, "n1 idle 8 1\nn2 idle 8 1\n");
    cr_assert_eq(elastic_capacity_read(&source, &c), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 8, "8 CPUs of one thread on 2 nodes, CPUs/Task=2: %d", c.world);
    source.ranks_per_node = 3;
    status = elastic_capacity_read(&source, &c);
    setenv("PATH", old_path, 1);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.world, 6, "--ranks-per-node decides where given");
}

/* A step Slurm holds pending is known by srun's pid on this host in
 * `scontrol -o show step JOB` (StepId=JOB.TDB State=PENDING): srun says so
 * itself only after SlurmctldTimeout (120 s by default), and tp-elastic
 * ended the step as hung at --start-timeout before. Another srun's pending
 * step, of this host or another, is not this one's. */
Test(elastic, slurm_step_pending_is_this_sruns)
{
    char old_path[4096], steps[600], host[256] = "", text[2048], line[512] = "";
    fake_slurm(old_path, sizeof old_path);
    cr_assert_eq(gethostname(host, sizeof host - 1), 0);
    host[strcspn(host, ".")] = '\0';
    snprintf(steps, sizeof steps, "%s/steps", dir);
    snprintf(text, sizeof text,
             "StepId=77.0 UserId=0 State=RUNNING NodeList=n[1-2] CPUs=8 Tasks=8 Name=sleep SrunHost:Pid=%s:4100\n"
             "StepId=77.TDB UserId=0 State=PENDING NodeList=n[1-2] CPUs=4 Tasks=4 Dist=Unknown SrunHost:Pid=%s:4242\n"
             "StepId=77.TDB UserId=0 State=PENDING NodeList=n[1-2] CPUs=4 Tasks=4 SrunHost:Pid=%s-b:4243\n",
             host, host, host);
    write_text(steps, text);
    int pending = -1;
    cr_assert_eq(elastic_slurm_step_pending("77", 4242, &pending, line, sizeof line), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pending, 1);
    cr_assert(strstr(line, "scontrol show step: StepId=77.TDB ") && strstr(line, "State=PENDING"), "%s", line);
    cr_assert_eq(elastic_slurm_step_pending("77", 424, &pending, NULL, 0), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pending, 0, "pid 424 is not 4242's");
    cr_assert_eq(elastic_slurm_step_pending("77", 4243, &pending, NULL, 0), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pending, 0, "another host's srun");
    cr_assert_eq(elastic_slurm_step_pending("77", 4100, &pending, NULL, 0), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pending, 0, "a running step");
    int refused = elastic_slurm_step_pending("77; rm -rf x", 4242, &pending, NULL, 0);
    setenv("PATH", old_path, 1);
    cr_assert_eq(refused, TP_ERR_ARG, "a job id that is not a number goes into no command");
}

/* Slurm's answers of a large job are long: the steps of a job of
 * thousands of steps, `scontrol show job -d` of many nodes, sinfo of a
 * thousand nodes. Read into fixed buffers (256 KiB, 64 KiB, 1 MiB), they
 * were cut and the command died of SIGPIPE: the capacity unreadable, the
 * pending step not seen. Read whole now, up to 16 MiB; more is refused,
 * saying so. */
static void write_repeated(const char *path, const char *line, int times, const char *last)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    for (int i = 0; i < times; i++) fprintf(f, line, i);
    fputs(last, f);
    fclose(f);
}

Test(elastic, slurm_long_answers_are_read_whole, .timeout = 60)
{
    char old_path[4096], steps[600], job[600], nodes[600], host[256] = "", last[1024], line[512] = "";
    fake_slurm(old_path, sizeof old_path);
    cr_assert_eq(gethostname(host, sizeof host - 1), 0);
    host[strcspn(host, ".")] = '\0';
    /* 20000 running steps (2.6 MB), then this srun's pending one */
    snprintf(steps, sizeof steps, "%s/steps", dir);
    snprintf(last, sizeof last, "StepId=77.TDB UserId=0 State=PENDING NodeList=n[1-2] CPUs=4 Tasks=4 "
             "SrunHost:Pid=%s:4242\n", host);
    write_repeated(steps, "StepId=77.%d UserId=0 State=RUNNING NodeList=n[1-2] CPUs=1 Tasks=1 Name=sleep "
                   "SrunHost:Pid=other:1\n", 20000, last);
    int pending = -1;
    int status = elastic_slurm_step_pending("77", 4242, &pending, line, sizeof line);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(pending, 1, "the pending step after 2.6 MB of others");
    /* sinfo of 40000 other nodes (1.2 MB) before the job's; show job -d
     * with 100 KB of comment before its nodes' CPUs */
    snprintf(nodes, sizeof nodes, "%s/nodes", dir);
    write_repeated(nodes, "other%05d idle 8 1\n", 40000, "n1 idle 8 2\nn2 idle 8 2\n");
    snprintf(job, sizeof job, "%s/job", dir);
    write_repeated(job, "   Comment=%08d\n", 5000, "   CPUs/Task=1\n     Nodes=n[1-2] CPU_IDs=0-3 Mem=0\n");
    elastic_capacity_source source = {.kind = ELASTIC_CAPACITY_SLURM, .job_id = "77"};
    elastic_capacity c;
    status = elastic_capacity_read(&source, &c);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert_eq(c.nodes, 2);
    cr_assert_eq(c.node_cpus[0], 4, "the job's CPUs 0-3 of n1, read past 100 KB: %d", c.node_cpus[0]);
    cr_assert_eq(c.world, 4, "2 cores of the job on each node: %d", c.world);
    /* past 16 MiB: no answer of Slurm's, said so */
    write_repeated(steps, "%063d\n", (16 << 20) / 64 + 1, "");
    status = elastic_slurm_step_pending("77", 4242, &pending, NULL, 0);
    setenv("PATH", old_path, 1);
    cr_assert_eq(status, TP_ERR_IO, "%s", tp_status_name(status));
    cr_assert(strstr(tp_errmsg(), "'scontrol -o show step 77' said more than 16 MiB"), "%s", tp_errmsg());
}


Test(elastic, mpirun_command_line)
{
    char *train[] = {"tp-train", "--model", "tiny", NULL};
    elastic_capacity c = {.world = 6};
    elastic_launch l = {ELASTIC_LAUNCHER_MPIRUN, NULL, 4, &c, train, dir};
    char **argv = NULL;
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(argv[0], "mpirun");
    cr_assert(has_pair(argv, "-np", "4"));
    int n = count_args(argv);
    cr_assert_str_eq(argv[n - 3], "tp-train", "the trainer's command comes last, whole");
    cr_assert_str_eq(argv[n - 1], "tiny");
    elastic_argv_free(argv);
}

Test(elastic, mpirun_with_nodes_writes_a_hostfile_of_the_nodes_used)
{
    char *train[] = {"tp-train", NULL};
    elastic_capacity c = {.world = 7, .nodes = 3, .node_names = {"a", "b", "c"}, .node_ranks = {4, 2, 1}};
    elastic_launch l = {ELASTIC_LAUNCHER_MPIRUN, NULL, 5, &c, train, dir};
    char **argv = NULL, hostfile[700], text[256] = "";
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_OK, "%s", tp_errmsg());
    snprintf(hostfile, sizeof hostfile, "%s/hostfile.launch", dir);
    cr_assert(has_pair(argv, "--hostfile", hostfile));
    FILE *f = fopen(hostfile, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert_str_eq(text, "a slots=4\nb slots=1\n", "5 ranks: all of a, one of b, none of c");
    elastic_argv_free(argv);
}

/* A FIFO where the launch's host file goes is refused at once: opened to
 * write, it would block until something read it. */
Test(elastic, a_fifo_at_the_launch_hostfile_is_refused, .timeout = 10)
{
    char *train[] = {"tp-train", NULL};
    elastic_capacity c = {.world = 2, .nodes = 1, .node_names = {"a"}, .node_ranks = {2}};
    elastic_launch l = {ELASTIC_LAUNCHER_MPIRUN, NULL, 2, &c, train, dir};
    char hostfile[700], **argv = NULL;
    snprintf(hostfile, sizeof hostfile, "%s/hostfile.launch", dir);
    cr_assert_eq(mkfifo(hostfile, 0644), 0);
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), hostfile) && strstr(tp_errmsg(), "a FIFO"), "%s", tp_errmsg());
    cr_assert_null(argv);
}

Test(elastic, srun_command_line)
{
    char *train[] = {"tp-train", NULL};
    elastic_capacity c = {.world = 8, .nodes = 3, .node_names = {"n1", "n2", "n3"}, .node_ranks = {4, 4, 4}};
    elastic_launch l = {ELASTIC_LAUNCHER_SRUN, NULL, 8, &c, train, dir};
    char **argv = NULL;
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(argv[0], "srun");
    cr_assert(has_pair(argv, "-n", "8"));
    cr_assert(has_pair(argv, "-N", "2"));
    cr_assert(has_pair(argv, "--nodelist", "n1,n2"));
    int pmix = 0, kill_on_bad_exit = 0;
    for (char **a = argv; *a; a++) {
        pmix |= strcmp(*a, "--mpi=pmix") == 0;
        kill_on_bad_exit |= strcmp(*a, "--kill-on-bad-exit=1") == 0;
    }
    cr_assert(pmix && kill_on_bad_exit);
    elastic_argv_free(argv);
}

/* A rank a core (the capacity's plan): each task has a core's CPUs in the
 * step (the job's CPUs on a node over its tasks there: 8 over 4, the
 * least of the nodes used) and is bound to cores where Slurm binds
 * (task/affinity). Before, srun had a CPU a task and no binding: on nodes
 * of 2 threads a core, two ranks on one core's threads. */
Test(elastic, srun_gives_each_rank_its_cores)
{
    char *train[] = {"tp-train", NULL};
    elastic_capacity c = {.world = 10, .nodes = 3, .node_names = {"n1", "n2", "n3"}, .node_ranks = {4, 4, 2},
                          .node_cpus = {8, 8, 4}};
    elastic_launch l = {ELASTIC_LAUNCHER_SRUN, NULL, 8, &c, train, dir};
    char **argv = NULL;
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_OK, "%s", tp_errmsg());
    cr_assert(has_entry(argv, "--cpu-bind=cores"));
    cr_assert(has_entry(argv, "--cpus-per-task=2"), "8 CPUs a node over its 4 ranks");
    cr_assert(has_pair(argv, "-N", "2"));
    elastic_argv_free(argv);
    l.ranks = 10; /* n3 too: 4 CPUs over 2 ranks */
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_OK, "%s", tp_errmsg());
    cr_assert(has_entry(argv, "--cpus-per-task=2"));
    elastic_argv_free(argv);
    c.node_cpus[2] = 3; /* 3 CPUs over 2 ranks: 1 each, the least, for every node */
    cr_assert_eq(elastic_launch_argv(&l, &argv), TP_OK, "%s", tp_errmsg());
    for (char **a = argv; *a; a++) cr_assert(strncmp(*a, "--cpus-per-task", 15) != 0, "%s", *a);
    elastic_argv_free(argv);
    /* --ranks-per-node over the CPUs, or CPUs unknown: srun's default */
    elastic_capacity over = {.world = 8, .nodes = 2, .node_names = {"n1", "n2"}, .node_ranks = {4, 4},
                             .node_cpus = {2, 2}};
    elastic_capacity unknown = {.world = 8, .nodes = 2, .node_names = {"n1", "n2"}, .node_ranks = {4, 4}};
    const elastic_capacity *neither[] = {&over, &unknown};
    for (int k = 0; k < 2; k++) {
        elastic_launch m = {ELASTIC_LAUNCHER_SRUN, NULL, 8, neither[k], train, dir};
        cr_assert_eq(elastic_launch_argv(&m, &argv), TP_OK, "%s", tp_errmsg());
        cr_assert(has_entry(argv, "--cpu-bind=cores"));
        for (char **a = argv; *a; a++) cr_assert(strncmp(*a, "--cpus-per-task", 15) != 0, "%d: %s", k, *a);
        elastic_argv_free(argv);
    }
}

/* Whether the NULL-terminated list holds the entry. */
static int has_entry(char **list, const char *entry)
{
    for (; *list; list++)
        if (strcmp(*list, entry) == 0) return 1;
    return 0;
}

/* srun reads the allocation's size from the environment, which Slurm does
 * not update when the job grows: the settings describe it as read now. */
Test(elastic, srun_environment_describes_the_allocation_now)
{
    char *train[] = {"tp-train", NULL};
    elastic_capacity c = {.world = 3, .nodes = 3, .node_names = {"n1", "n2", "n7"}, .node_ranks = {1, 1, 1},
                          .node_cpus = {8, 8, 4}};
    elastic_launch l = {ELASTIC_LAUNCHER_SRUN, NULL, 3, &c, train, dir};
    char **env = NULL;
    cr_assert_eq(elastic_launch_env(&l, &env), TP_OK, "%s", tp_errmsg());
    cr_assert(has_entry(env, "SLURM_JOB_NODELIST=n1,n2,n7"));
    cr_assert(has_entry(env, "SLURM_NODELIST=n1,n2,n7"));
    cr_assert(has_entry(env, "SLURM_JOB_NUM_NODES=3"));
    cr_assert(has_entry(env, "SLURM_NNODES=3"));
    cr_assert(has_entry(env, "SLURM_JOB_CPUS_PER_NODE=8,8,4"));
    cr_assert(has_entry(env, "SLURM_TASKS_PER_NODE"), "the stale tasks per node are removed");
    elastic_argv_free(env);
    c.node_cpus[1] = 0;
    cr_assert_eq(elastic_launch_env(&l, &env), TP_OK, "%s", tp_errmsg());
    cr_assert(has_entry(env, "SLURM_JOB_CPUS_PER_NODE"), "CPUs unknown: removed, not guessed");
    elastic_argv_free(env);
    l.launcher = ELASTIC_LAUNCHER_MPIRUN;
    cr_assert_eq(elastic_launch_env(&l, &env), TP_OK, "%s", tp_errmsg());
    cr_assert_null(env[0], "mpirun: nothing to set");
    elastic_argv_free(env);
}

/* The settings reach the launched program: set, and removed. */
Test(elastic, spawn_applies_the_environment_settings)
{
    char out[600], script[900];
    snprintf(out, sizeof out, "%s/env.out", dir);
    snprintf(script, sizeof script, "echo \"$TP_SET_ME ${TP_REMOVE_ME-removed}\" > %s", out);
    setenv("TP_REMOVE_ME", "still here", 1);
    char *argv[] = {"sh", "-c", script, NULL};
    char *env[] = {"TP_SET_ME=set", "TP_REMOVE_ME", NULL};
    pid_t pid = 0;
    cr_assert_eq(elastic_spawn(argv, env, &pid), TP_OK, "%s", tp_errmsg());
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    unsetenv("TP_REMOVE_ME");
    char text[64] = "";
    FILE *f = fopen(out, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(text, sizeof text, f));
    fclose(f);
    cr_assert_str_eq(text, "set removed\n");
}

Test(elastic, spawn_reports_a_missing_program)
{
    char *argv[] = {"/nonexistent/tp-train", NULL};
    pid_t pid = 0;
    cr_assert_eq(elastic_spawn(argv, NULL, &pid), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "/nonexistent/tp-train"), "%s", tp_errmsg());
}

/* Whether a process has ended (a zombie waits for whoever adopted it). */
static int gone_or_zombie(pid_t pid)
{
    for (int i = 0; i < 100; i++) {
        char path[64], state = 0;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) return 1;
        int read = fscanf(f, "%*d %*s %c", &state);
        fclose(f);
        if (read == 1 && state == 'Z') return 1;
        usleep(10000);
    }
    return 0;
}

/* A launch's whole process group ends, children that ignore SIGTERM too. */
Test(elastic, stopping_a_group_ends_every_process_of_it)
{
    char pids[600], script[900];
    snprintf(pids, sizeof pids, "%s/pids", dir);
    snprintf(script, sizeof script, "trap '' TERM; sleep 300 & echo $! > %s; wait", pids);
    char *argv[] = {"sh", "-c", script, NULL};
    pid_t pid = 0;
    cr_assert_eq(elastic_spawn(argv, NULL, &pid), TP_OK, "%s", tp_errmsg());
    struct stat st;
    for (int i = 0; i < 500 && (stat(pids, &st) != 0 || st.st_size == 0); i++) usleep(10000);
    FILE *f = fopen(pids, "r");
    cr_assert_not_null(f);
    int child = 0;
    cr_assert_eq(fscanf(f, "%d", &child), 1);
    fclose(f);
    int status = 0;
    cr_assert_eq(elastic_stop_group(pid, 0.3, &status), TP_OK);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the leader ignored SIGTERM: killed after grace");
    cr_assert(gone_or_zombie(child), "the grandchild %d is gone too", child);
}

/* The pid a test's shell wrote into PATH (waiting up to 5 s for the file). */
static int read_pid_file(const char *path)
{
    FILE *f = NULL;
    for (int i = 0; i < 500 && !(f = fopen(path, "r")); i++) usleep(10000);
    cr_assert_not_null(f, "%s never appeared", path);
    int pid = 0;
    cr_assert_eq(fscanf(f, "%d", &pid), 1, "%s holds no pid", path);
    fclose(f);
    return pid;
}

/* A process of the launch in a session of its own (as Open MPI puts ranks
 * in groups of their own) outlives its launcher; the marker finds it. */
Test(elastic, leftovers_of_a_launch_are_found_by_their_marker)
{
    char pids[600], script[900];
    snprintf(pids, sizeof pids, "%s/pids", dir);
    snprintf(script, sizeof script, "setsid sleep 300 & echo $! > %s", pids);
    char *argv[] = {"sh", "-c", script, NULL};
    pid_t pid = 0;
    cr_assert_eq(elastic_spawn(argv, NULL, &pid), TP_OK, "%s", tp_errmsg());
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    int leftover = read_pid_file(pids);
    cr_assert_eq(kill(leftover, 0), 0, "the leftover %d runs after its launcher ended", leftover);
    /* setsid may not have run yet when the launcher exits */
    for (int i = 0; i < 500 && getpgid(leftover) == pid; i++) usleep(10000);
    cr_assert_neq(getpgid(leftover), pid, "and is not in the launcher's process group");
    elastic_end_leftovers(pid, 0.5);
    cr_assert(gone_or_zombie(leftover), "the leftover %d is gone", leftover);
}

/* A leftover caught while it starts a program shows an empty environment
 * for an instant; one that does nothing but execute itself again is caught
 * so in about one read of eight. Ended every time, 60 times over. */
Test(elastic, a_leftover_starting_programs_is_found)
{
    char program[600], pids[600], script[1400];
    snprintf(program, sizeof program, "%s/again.sh", dir);
    FILE *p = fopen(program, "w");
    cr_assert_not_null(p);
    fprintf(p, "#!/bin/sh\nexec \"$0\"\n");
    fclose(p);
    cr_assert_eq(chmod(program, 0755), 0);
    for (int trial = 0; trial < 60; trial++) {
        snprintf(pids, sizeof pids, "%s/pids%d", dir, trial);
        snprintf(script, sizeof script, "setsid %s & echo $! > %s", program, pids);
        char *argv[] = {"sh", "-c", script, NULL};
        pid_t pid = 0;
        cr_assert_eq(elastic_spawn(argv, NULL, &pid), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(waitpid(pid, NULL, 0), pid);
        int leftover = read_pid_file(pids);
        for (int i = 0; i < 500 && getpgid(leftover) == pid; i++) usleep(10000);
        elastic_end_leftovers(pid, 0.5);
        cr_assert(gone_or_zombie(leftover), "trial %d: the leftover %d is gone", trial, leftover);
    }
}

/* Whether a state file's pid is a launch of ours: only with the launch's
 * marker, as the leader of its group, started when recorded; never pid 0,
 * 1, a negative one or this process's own. */
Test(elastic, a_launch_is_owned_only_when_it_proves_it)
{
    char *argv[] = {"sleep", "30", NULL};
    pid_t launch = 0;
    cr_assert_eq(elastic_spawn(argv, NULL, &launch), TP_OK, "%s", tp_errmsg());
    uint64_t start = 0;
    cr_assert_eq(elastic_process_start(launch, &start), TP_OK, "%s", tp_errmsg());
    /* until the child has executed sleep (the marker is set before) */
    cr_assert_eq(elastic_launch_owned(launch, 0), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(elastic_launch_owned(launch, start), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(elastic_launch_owned(launch, start + 1), TP_ERR_STATE, "another start time: a reused pid");
    cr_assert(strstr(tp_errmsg(), "reused"), "%s", tp_errmsg());
    /* a stranger: a process group of its own, no marker */
    pid_t stranger = fork();
    cr_assert_geq(stranger, 0);
    if (stranger == 0) {
        setpgid(0, 0);
        unsetenv(ELASTIC_LAUNCH_MARKER);
        execlp("sleep", "sleep", "30", (char *)NULL);
        _exit(127);
    }
    setpgid(stranger, stranger);
    usleep(100 * 1000);
    cr_assert_eq(elastic_launch_owned(stranger, 0), TP_ERR_STATE);
    cr_assert(strstr(tp_errmsg(), "does not carry " ELASTIC_LAUNCH_MARKER), "%s", tp_errmsg());
    const pid_t never[] = {0, 1, -1, -5, getpid(), getpgrp()};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        cr_assert_eq(elastic_launch_owned(never[i], 0), TP_ERR_STATE, "pid %d", (int)never[i]);
        cr_assert(strstr(tp_errmsg(), "never signalled"), "%s", tp_errmsg());
    }
    kill(stranger, SIGKILL);
    waitpid(stranger, NULL, 0);
    cr_assert_eq(elastic_launch_owned(stranger, 0), TP_ERR_NOT_FOUND, "a process that is gone");
    elastic_stop_group(launch, 0.5, NULL);
}

/* Groups 0 (our own), 1 (kill(-1): every process we may signal) and this
 * process's are refused before any signal. Not run on the code before the
 * guard: there it would signal them. */
Test(elastic, stop_group_never_signals_init_or_its_own)
{
    const pid_t never[] = {0, 1, -3, getpgrp(), getpid()};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        cr_assert_eq(elastic_stop_group(never[i], 0.1, NULL), TP_ERR_ARG, "group %d", (int)never[i]);
    cr_assert_eq(elastic_end_leftovers(1, 0.1), 0);
}

/* ---------------------------------------------------------------- the log */

typedef struct {
    int steps, starts, others, stops, save_waits, saves;
    int64_t saved_step;
    int64_t last_step;
    double last_loss, last_time;
} log_count;

static void count_line(void *ctx, const elastic_log_line *line)
{
    log_count *c = ctx;
    c->steps += line->kind == ELASTIC_LOG_STEP;
    c->starts += line->kind == ELASTIC_LOG_START;
    c->others += line->kind == ELASTIC_LOG_OTHER;
    c->stops += line->kind == ELASTIC_LOG_STOP;
    c->save_waits += line->kind == ELASTIC_LOG_SAVE_WAIT;
    c->saves += line->kind == ELASTIC_LOG_SAVE;
    if (line->kind == ELASTIC_LOG_SAVE) c->saved_step = line->step;
    if (line->kind == ELASTIC_LOG_START) cr_assert_float_eq(line->seconds, 0.5, 1e-12);
    if (line->kind == ELASTIC_LOG_STEP) {
        c->last_step = line->step;
        c->last_loss = line->loss;
        c->last_time = line->time;
    }
}

/* A FIFO at the trainer's log is refused, not opened: opened to read, it
 * would block until a writer came. */
Test(elastic, a_fifo_log_is_refused, .timeout = 10)
{
    char path[600];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    cr_assert_eq(mkfifo(path, 0644), 0);
    elastic_log_follower f;
    elastic_log_follow(&f, path, 0);
    log_count c = {0};
    cr_assert_eq(elastic_log_read(&f, count_line, &c), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), path) && strstr(tp_errmsg(), "a FIFO"), "%s", tp_errmsg());
}

Test(elastic, log_is_followed_line_by_line_as_it_grows)
{
    char path[600];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    elastic_log_follower f;
    elastic_log_follow(&f, path, 0);
    log_count c = {0};
    cr_assert_eq(elastic_log_read(&f, count_line, &c), TP_OK, "a log not there yet is no error");
    FILE *out = fopen(path, "w");
    fputs("{\"event\":\"start\",\"step\":0,\"load_seconds\":0.5}\n{\"step\":1,\"loss\":5.5,\"time\":1700000000.25}\n"
          "{\"step\":2,\"lo",
          out);
    fflush(out);
    cr_assert_eq(elastic_log_read(&f, count_line, &c), TP_OK);
    cr_assert_eq(c.starts, 1);
    cr_assert_eq(c.steps, 1, "the line being written waits for its end");
    cr_assert_float_eq(c.last_time, 1700000000.25, 1e-6, "the trainer's clock, by which steps are timed");
    fputs("ss\":5.25}\nnot json\n{\"event\":\"note\",\"step\":2}\n{\"event\":\"save_wait\",\"step\":1}\n"
          "{\"event\":\"save\",\"step\":2,\"seconds\":0.1}\n{\"event\":\"stop\",\"step\":2,\"reason\":\"finished\"}\n",
          out);
    fclose(out);
    cr_assert_eq(elastic_log_read(&f, count_line, &c), TP_OK);
    cr_assert_eq(c.steps, 2);
    cr_assert_eq(c.last_step, 2);
    cr_assert_float_eq(c.last_loss, 5.25, 1e-12);
    cr_assert_eq(c.last_time, 0, "a line without a time has none");
    cr_assert_eq(c.others, 1, "an event of another kind is passed on as such");
    cr_assert_eq(c.stops, 1);
    cr_assert_eq(c.save_waits, 1, "a wait for a save is told apart");
    cr_assert_eq(c.saves, 1, "a committed checkpoint is told apart (--keep counts it intact)");
    cr_assert_eq(c.saved_step, 2);
    cr_assert_eq(elastic_log_read(&f, count_line, &c), TP_OK);
    cr_assert_eq(c.steps, 2, "nothing read twice");
}

/* A diverged step's loss, written null (JSON has no NaN), is a step all the
 * same (a heartbeat: a run is not taken for hung when its loss goes NaN),
 * its loss NaN. A line holding a bare nan, as the trainer once wrote, is no
 * JSON and was dropped. */
Test(elastic, a_null_loss_is_a_step_with_a_nan_loss)
{
    char path[600];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    FILE *out = fopen(path, "w");
    fputs("{\"step\":1,\"loss\":5.5}\n{\"step\":2,\"loss\":null,\"grad_norm\":null}\n", out);
    fclose(out);
    elastic_log_follower f;
    elastic_log_follow(&f, path, 0);
    log_count c = {0};
    cr_assert_eq(elastic_log_read(&f, count_line, &c), TP_OK);
    cr_assert_eq(c.steps, 2);
    cr_assert_eq(c.last_step, 2);
    cr_assert(isnan(c.last_loss), "a null loss reads as NaN, not %g", c.last_loss);
}

/* ----------------------------------------------------------------- hangs */

/* The allowance of each silence is its timeout, and never less than
 * heartbeat_multiple times the slowest step: steps of 100 s under a 60 s
 * heartbeat are not hangs, a stop after such a step gets the step and its
 * save, and a multiple of 0 leaves the timeouts alone. */
Test(elastic, hang_allowance_grows_with_the_slowest_step)
{
    elastic_run_options o;
    elastic_run_options_init(&o);
    cr_assert_float_eq(o.heartbeat_multiple, 5, 0, "the default multiple");
    const elastic_silence kinds[3] = {ELASTIC_SILENT_START, ELASTIC_SILENT_STEP, ELASTIC_SILENT_SAVE};
    const double timeouts[3] = {300, 60, 600};
    for (int k = 0; k < 3; k++) {
        cr_assert_float_eq(elastic_hang_allowance(&o, kinds[k], 0), timeouts[k], 0, "no step seen: the timeout");
        cr_assert_float_eq(elastic_hang_allowance(&o, kinds[k], 0.5), timeouts[k], 0, "fast steps: the timeout");
        cr_assert_float_eq(elastic_hang_allowance(&o, kinds[k], 100), timeouts[k] > 500 ? timeouts[k] : 500, 1e-9,
                           "steps of 100 s: at least 500 s (silence %d)", k);
        cr_assert_float_eq(elastic_hang_allowance(&o, kinds[k], 1000), 5000, 1e-9, "steps of 1000 s (silence %d)", k);
    }
    o.heartbeat_multiple = 0;
    for (int k = 0; k < 3; k++)
        cr_assert_float_eq(elastic_hang_allowance(&o, kinds[k], 1000), timeouts[k], 0, "multiple 0: the timeout");
    o.heartbeat_multiple = 2;
    o.heartbeat_seconds = 1;
    cr_assert_float_eq(elastic_hang_allowance(&o, ELASTIC_SILENT_STEP, 2.5), 5, 1e-12);
}

/* ----------------------------------------------------------- checkpoints */

static void small_checkpoint(const char *run, int64_t step)
{
    char path[CKPT_PATH_MAX];
    cr_assert_eq(ckpt_step_path(run, step, path, sizeof path), TP_OK);
    seed_random((uint64_t)step);
    test_tensor t[6];
    int tps[] = {2};
    int n = random_tensors(t, 6, tps, 1, 2);
    ckpt_layout layout = {2, 1, 1, 2, 1}; /* tp 2, pp 1, dp 1, 2 layers */
    write_tensors(path, &layout, t, n, 0, step);
    for (int i = 0; i < n; i++) free(t[i].logical);
}

typedef struct {
    int count;
    char first[700];
} rejected_list;

static void on_rejected(void *ctx, const char *path, const char *why)
{
    rejected_list *r = ctx;
    cr_assert(why[0], "a rejection says why");
    if (!r->count++) snprintf(r->first, sizeof r->first, "%s", path);
}

/* Damage in the newest checkpoint: the one before it is chosen, and the
 * newest is reported with why. */
Test(elastic, the_newest_checkpoint_that_verifies_is_chosen)
{
    small_checkpoint(dir, 2);
    small_checkpoint(dir, 4);
    elastic_checkpoint chosen;
    rejected_list rejected = {0};
    cr_assert_eq(elastic_choose_checkpoint(dir, 2, on_rejected, &rejected, &chosen), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(chosen.step, 4);
    cr_assert_eq(chosen.tp, 2);
    cr_assert_eq(rejected.count, 0);
    /* flip a byte in the middle of the newest checkpoint's first shard
     * (data: its bytes are mostly tensor data) */
    char shard[800];
    snprintf(shard, sizeof shard, "%s/step_00000004/shard_pp00_tp00.h5", dir);
    FILE *f = fopen(shard, "r+b");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    int damaged = 0;
    for (long at = size / 2; at < size && !damaged; at += 97) { /* a byte that changes the outcome */
        fseek(f, at, SEEK_SET);
        int b = fgetc(f);
        fseek(f, at, SEEK_SET);
        fputc(b ^ 0x40, f);
        fflush(f);
        rejected_list probe = {0};
        elastic_checkpoint c;
        damaged = elastic_choose_checkpoint(dir, 1, on_rejected, &probe, &c) == TP_OK && c.step == 2;
        if (!damaged) {
            fseek(f, at, SEEK_SET);
            fputc(b, f);
            fflush(f);
        }
    }
    fclose(f);
    cr_assert(damaged, "some byte of the shard's data is covered by a checksum");
    rejected = (rejected_list){0};
    cr_assert_eq(elastic_choose_checkpoint(dir, 2, on_rejected, &rejected, &chosen), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(chosen.step, 2);
    cr_assert_eq(rejected.count, 1);
    cr_assert(strstr(rejected.first, "step_00000004"), "%s", rejected.first);
    /* Every checkpoint damaged is not "none there" (TP_ERR_NOT_FOUND, a
     * fresh start): before, the trainer was launched, refused them, and was
     * called a bug. */
    snprintf(shard, sizeof shard, "%s/step_00000002/shard_pp00_tp00.h5", dir);
    cr_assert_eq(unlink(shard), 0, "%s", shard);
    rejected = (rejected_list){0};
    int status = elastic_choose_checkpoint(dir, 2, on_rejected, &rejected, &chosen);
    cr_assert_eq(status, TP_ERR_CHECKSUM, "%s (%s)", tp_status_name(status), tp_errmsg());
    cr_assert_eq(rejected.count, 2);
    cr_assert(strstr(tp_errmsg(), "none of its 2 checkpoints verifies"), "%s", tp_errmsg());
}

/* A newest checkpoint the store cannot read (a shard that fails to open
 * with a system error: ELOOP here, standing for EIO or EACCES, which root
 * does not meet) is not damage: the choice stops there, naming it, and no
 * older checkpoint is chosen or the newest called rejected. Before, step 4
 * was "rejected" for the store's error and step 2 chosen, which the
 * trainer then refused to resume from. */
Test(elastic, a_checkpoint_the_store_cannot_read_is_not_rejected)
{
    small_checkpoint(dir, 2);
    small_checkpoint(dir, 4);
    char shard[800];
    snprintf(shard, sizeof shard, "%s/step_00000004/shard_pp00_tp00.h5", dir);
    cr_assert_eq(unlink(shard), 0, "%s", shard);
    cr_assert_eq(symlink("shard_pp00_tp00.h5", shard), 0, "%s", shard); /* a loop: ELOOP on open */
    elastic_checkpoint chosen;
    rejected_list rejected = {0};
    int status = elastic_choose_checkpoint(dir, 1, on_rejected, &rejected, &chosen);
    cr_assert_eq(status, TP_ERR_IO, "%s (%s)", tp_status_name(status), tp_errmsg());
    cr_assert_eq(rejected.count, 0, "rejected %s", rejected.first);
    cr_assert_neq(chosen.step, 2, "an older checkpoint was chosen in its place");
    cr_assert(strstr(tp_errmsg(), "step_00000004 could not be read, and no older checkpoint is taken"), "%s",
              tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5: Too many levels of symbolic links"), "%s", tp_errmsg());
}

Test(elastic, no_checkpoint_at_all_is_not_found)
{
    elastic_checkpoint chosen;
    cr_assert_eq(elastic_choose_checkpoint(dir, 1, NULL, NULL, &chosen), TP_ERR_NOT_FOUND);
}

static void collect_steps(void *ctx, const elastic_log_line *line)
{
    int64_t *steps = ctx;
    if (line->kind == ELASTIC_LOG_STEP) steps[steps[0]++ + 1] = line->step;
}

/* A line the trainer is still writing waits for its end across reads, and
 * the lines after it are read whole (the partial line's length is kept as
 * it grows, not measured again at each byte). */
Test(elastic, log_line_written_in_parts)
{
    char path[700];
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo", f);
    fclose(f);
    elastic_log_follower follower;
    elastic_log_follow(&follower, path, 0);
    int64_t steps[8] = {0};
    cr_assert_eq(elastic_log_read(&follower, collect_steps, steps), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(steps[0], 1, "the complete line alone");
    f = fopen(path, "a");
    fputs("ss\":1.5}\n{\"step\":3,\"loss\":1}\n", f);
    fclose(f);
    cr_assert_eq(elastic_log_read(&follower, collect_steps, steps), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(steps[0], 3, "the line finished, then the next");
    cr_assert_eq(steps[2], 2);
    cr_assert_eq(steps[3], 3);
}
