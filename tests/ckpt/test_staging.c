/* Staged outputs (store/staging.c, docs/RELIABILITY.md): private staging
 * names, dead writers' leftovers removed and live ones kept, what --force
 * may replace, no publish over a result that appeared meanwhile, and no
 * replacement of a checkpoint while it is read. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/clock.h"
#include "../../store/staging.h"
#include "../support/fixture.h"

TestSuite(staging, .init = make_dir, .fini = remove_dir);

/* Entries of dir whose names start with prefix. */
static int count_prefixed(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s", path);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* One small checkpoint at path (tp 1), step as given. */
static void small_checkpoint(const char *path, int64_t step, int overwrite, int *status_out)
{
    ckpt_layout layout = {1, 1, 1, 1, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.overwrite = overwrite;
    ckpt_tensor_desc d = {.name = "w", .dtype = TP_FP32, .ndim = 1, .shape = {64}, .anchor = CKPT_ANCHOR_FIRST};
    float data[64];
    for (int i = 0; i < 64; i++) data[i] = (float)(step * 100 + i);
    ckpt_writer *w = NULL;
    int status = ckpt_writer_create(&w, path, &layout, &options), id;
    if (!status) status = ckpt_writer_add_tensor(w, &d, &id);
    if (!status) status = ckpt_writer_put_piece(w, id, 0, data);
    ckpt_train_state state = {.step = step, .model_json = "{}"};
    if (!status) status = ckpt_writer_commit(w, &state);
    else if (w) ckpt_writer_abort(w);
    *status_out = status;
}

Test(staging, two_writers_of_one_path_stage_apart)
{
    char path[700];
    snprintf(path, sizeof path, "%s/out", dir);
    store_stage_options options = {.directory = 1};
    store_staged *a = NULL, *b = NULL;
    cr_assert_eq(store_stage(NULL, path, &options, &a), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(store_stage(NULL, path, &options, &b), TP_OK, "%s", tp_errmsg());
    cr_assert_str_neq(store_staged_path(a), store_staged_path(b), "each writer has its own staging directory");
    cr_assert(exists(store_staged_path(a)) && exists(store_staged_path(b)), "the second did not remove the first's");
    cr_assert_eq(store_staged_publish(a), TP_OK, "%s", tp_errmsg());
    /* The second finds the first's result there: refused, not replaced. */
    cr_assert_eq(store_staged_publish(b), TP_ERR_EXISTS);
    cr_assert(strstr(tp_errmsg(), path), "names the output: %s", tp_errmsg());
    cr_assert_eq(count_prefixed(dir, ".out."), 0, "no staging left");
    cr_assert(exists(path));
}

/* A file output at a path ending in '/' (`-o m.gguf/`) is refused before
 * anything is staged: the rename of a staged file to a name that says
 * "directory" failed only after the whole output was written, naming the
 * staging file. A directory output may end in '/'. */
Test(staging, a_file_output_ending_in_a_slash_is_refused_at_once)
{
    char path[700], base[700];
    snprintf(path, sizeof path, "%s/m.gguf/", dir);
    snprintf(base, sizeof base, "%s/m.gguf", dir);
    store_stage_options file = {.directory = 0}, directory = {.directory = 1};
    store_staged *s = NULL;
    cr_assert_eq(store_stage(NULL, path, &file, &s), TP_ERR_ARG, "%s", tp_errmsg());
    cr_assert_null(s);
    cr_assert(strstr(tp_errmsg(), "m.gguf/ ends with '/'") && strstr(tp_errmsg(), "this output is a file"), "%s",
              tp_errmsg());
    cr_assert_eq(count_prefixed(dir, ".m.gguf."), 0, "nothing staged");
    cr_assert_eq(store_stage(NULL, path, &directory, &s), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(store_staged_publish(s), TP_OK, "%s", tp_errmsg());
    cr_assert(exists(base));
}

Test(staging, a_dead_writers_leftover_goes_and_a_live_ones_stays)
{
    char path[700], dead[800], live[800];
    snprintf(path, sizeof path, "%s/ck", dir);
    snprintf(dead, sizeof dead, "%s/.ck.otherhost-1-00000001.staging", dir);
    snprintf(live, sizeof live, "%s/.ck.otherhost-2-00000002.staging", dir);
    cr_assert_eq(mkdir(dead, 0755), 0);
    cr_assert_eq(mkdir(live, 0755), 0);
    char inside[900];
    snprintf(inside, sizeof inside, "%s/shard_pp00_tp00.h5", dead);
    write_file(inside, "half written");
    /* A live writer holds the lock on its entry (here through a child that
     * keeps the lock; flock locks of one process on two descriptors would
     * conflict as well, but a separate process is the real case). */
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t child = fork();
    if (child == 0) {
        int fd = open(live, O_RDONLY);
        if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
        char c = 1;
        if (write(ready[1], &c, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1);
    int status;
    small_checkpoint(path, 1, 0, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert(!exists(dead), "the dead writer's staging directory was removed");
    cr_assert(exists(live), "the live writer's staging directory was kept");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    cr_assert_eq(store_remove_dead_staging(dir), TP_OK, "%s", tp_errmsg());
    cr_assert(!exists(live), "once its writer is gone, it goes too");
    cr_assert(ckpt_is_committed(path));
}

/* An owner name (HOST-PID-NONCE) read back as its host and process, the
 * host's own '-' kept; anything else is not an owner. */
Test(staging, an_owner_names_its_host_and_process)
{
    char owner[STORE_OWNER_MAX], host[64];
    long pid = 0;
    cr_assert_eq(store_staging_owner(owner, sizeof owner), TP_OK);
    cr_assert(store_owner_process(owner, host, sizeof host, &pid));
    cr_assert_eq(pid, (long)getpid());
    cr_assert(store_owner_process("my-host-41-0badf00d", host, sizeof host, &pid));
    cr_assert_str_eq(host, "my-host");
    cr_assert_eq(pid, 41);
    const char *not_owners[] = {"nohyphen", "41-0badf00d", "host-4x1-0badf00d", "host--0badf00d", "host-0-0badf00d"};
    for (size_t i = 0; i < sizeof not_owners / sizeof *not_owners; i++)
        cr_assert(!store_owner_process(not_owners[i], host, sizeof host, &pid), "%s", not_owners[i]);
    cr_assert(!store_owner_process("a-very-long-host-name-12-0badf00d", host, 8, &pid), "a host beyond the buffer");
}

/* Claims (.staging.new: a staging entry in the instant before its writer
 * locks it) hold no lock to tell: one whose claimer (host-pid in its name) is
 * a process of this machine that is gone goes; one of a live process, or of
 * another machine, stays. */
Test(staging, a_gone_claimers_claim_goes_and_others_stay)
{
    char owner[STORE_OWNER_MAX];
    cr_assert_eq(store_staging_owner(owner, sizeof owner), TP_OK);
    *strrchr(owner, '-') = '\0';
    *strrchr(owner, '-') = '\0'; /* this machine's name, as in owners */
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    cr_assert_eq(waitpid(gone, NULL, 0), gone);
    char dead[900], live[900], elsewhere[900], inside[1000];
    snprintf(dead, sizeof dead, "%s/.ck.%s-%ld-0000000a.staging.new", dir, owner, (long)gone);
    snprintf(live, sizeof live, "%s/.ck.%s-%ld-0000000b.staging.new", dir, owner, (long)getpid());
    snprintf(elsewhere, sizeof elsewhere, "%s/.ck.otherhost-%ld-0000000c.staging.new", dir, (long)gone);
    cr_assert_eq(mkdir(dead, 0755), 0);
    cr_assert_eq(mkdir(live, 0755), 0);
    cr_assert_eq(mkdir(elsewhere, 0755), 0);
    snprintf(inside, sizeof inside, "%s/shard_pp00_tp00.h5", dead);
    write_file(inside, "half written");
    cr_assert_eq(store_remove_dead_staging(dir), TP_OK, "%s", tp_errmsg());
    cr_assert(!exists(dead), "the claim of a process that is gone was removed");
    cr_assert(exists(live), "the claim of a live process was kept");
    cr_assert(exists(elsewhere), "the claim of another machine's process was kept");
    /* A writer of the same path clears it as well, and stages beside the
     * live claim. */
    cr_assert_eq(mkdir(dead, 0755), 0);
    char path[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    int status;
    small_checkpoint(path, 1, 0, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    cr_assert(!exists(dead), "the writer of ck removed the gone claimer's claim");
    cr_assert(exists(live) && exists(elsewhere));
}

Test(staging, force_replaces_only_checkpoints)
{
    char notes[700], run[700], step[800], ck[700], note_file[800];
    snprintf(notes, sizeof notes, "%s/notes", dir);
    snprintf(note_file, sizeof note_file, "%s/todo.txt", notes);
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(step, sizeof step, "%s/step_00000001", run);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    cr_assert_eq(mkdir(notes, 0755), 0);
    write_file(note_file, "keep me");
    cr_assert_eq(mkdir(run, 0755), 0);
    int status;
    small_checkpoint(step, 1, 0, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());

    small_checkpoint(notes, 2, 1, &status);
    cr_assert_eq(status, TP_ERR_EXISTS);
    cr_assert(strstr(tp_errmsg(), "todo.txt"), "names what is there: %s", tp_errmsg());
    cr_assert(exists(note_file));
    small_checkpoint(run, 2, 1, &status);
    cr_assert_eq(status, TP_ERR_EXISTS);
    cr_assert(strstr(tp_errmsg(), "run directory"), "%s", tp_errmsg());
    cr_assert(ckpt_is_committed(step));

    small_checkpoint(ck, 1, 0, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    small_checkpoint(ck, 2, 0, &status);
    cr_assert_eq(status, TP_ERR_EXISTS, "without overwrite, never");
    small_checkpoint(ck, 2, 1, &status);
    cr_assert_eq(status, TP_OK, "a checkpoint is replaced: %s", tp_errmsg());
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, ck, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_state(r)->step, 2);
    ckpt_reader_close(r);
    cr_assert_eq(count_prefixed(dir, ".ck."), 0);
}

Test(staging, a_checkpoint_being_read_is_not_replaced)
{
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    int status;
    small_checkpoint(ck, 1, 0, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, ck, NULL), TP_OK, "%s", tp_errmsg());
    small_checkpoint(ck, 2, 1, &status);
    cr_assert_eq(status, TP_ERR_EXISTS, "refused while a reader has it open");
    cr_assert(strstr(tp_errmsg(), "being read"), "%s", tp_errmsg());
    float back[64];
    cr_assert_eq(ckpt_reader_read_piece(r, ckpt_reader_find(r, "w"), 0, back, sizeof back), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(back[5], 105.0f, "the reader still reads the checkpoint it opened");
    ckpt_reader_close(r);
    small_checkpoint(ck, 2, 1, &status);
    cr_assert_eq(status, TP_OK, "replaced once the reader is done: %s", tp_errmsg());
    cr_assert_eq(count_prefixed(dir, ".ck."), 0);
}

/* A checkpoint removed (tp-elastic --keep) while a reader holds it: kept,
 * saying it is being read; removed once the reader is done. */
Test(staging, a_checkpoint_being_read_is_not_removed)
{
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    int status;
    small_checkpoint(ck, 1, 0, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, ck, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(store_remove_unless_read(store_posix(), ck), TP_ERR_EXISTS, "removed under its reader");
    cr_assert(strstr(tp_errmsg(), "ck is being read") && strstr(tp_errmsg(), "not removed"), "%s", tp_errmsg());
    float back[64];
    cr_assert_eq(ckpt_reader_read_piece(r, ckpt_reader_find(r, "w"), 0, back, sizeof back), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(back[5], 105.0f, "the reader still reads the checkpoint it opened");
    ckpt_reader_close(r);
    cr_assert_eq(store_remove_unless_read(store_posix(), ck), TP_OK, "removed once the reader is done: %s",
                 tp_errmsg());
    cr_assert(!exists(ck));
    cr_assert_eq(store_remove_unless_read(store_posix(), ck), TP_OK, "nothing there is fine: %s", tp_errmsg());
}

Test(staging, latest_ignores_names_that_are_not_steps)
{
    char run[700], step[800], other[800], latest[800];
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(step, sizeof step, "%s/step_00000005", run);
    snprintf(other, sizeof other, "%s/step_00000005_tp1pp1", run);
    snprintf(latest, sizeof latest, "%s/latest", run);
    cr_assert_eq(mkdir(run, 0755), 0);
    ckpt_layout layout = {1, 1, 1, 1, 1};
    ckpt_tensor_desc d = {.name = "w", .dtype = TP_FP32, .ndim = 1, .shape = {4}, .anchor = CKPT_ANCHOR_FIRST};
    float data[4] = {1, 2, 3, 4};
    const char *paths[2] = {step, other};
    for (int k = 0; k < 2; k++) {
        ckpt_write_options options;
        ckpt_write_options_init(&options);
        options.update_latest = 1;
        ckpt_writer *w = NULL;
        int id;
        cr_assert_eq(ckpt_writer_create(&w, paths[k], &layout, &options), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_writer_add_tensor(w, &d, &id), TP_OK);
        cr_assert_eq(ckpt_writer_put_piece(w, id, 0, data), TP_OK);
        ckpt_train_state state = {.step = 5 + k, .model_json = "{}"};
        cr_assert_eq(ckpt_writer_commit(w, &state), TP_OK, "%s", tp_errmsg());
    }
    FILE *f = fopen(latest, "r");
    cr_assert_not_null(f);
    char line[64] = "";
    cr_assert_not_null(fgets(line, sizeof line, f));
    fclose(f);
    cr_assert_str_eq(line, "step_00000005\n", "latest names step_* checkpoints only");
}

/* ------------------------------------------------------ run directory claim */

Test(staging, a_run_directory_has_one_claim_at_a_time)
{
    ckpt_run_claim *first = NULL, *second = NULL;
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-train", &first), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_run_claim_check(first), TP_OK, "a local claim cannot be lost");
    /* Another open file description conflicts, even in this process. */
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-other", &second), TP_ERR_EXISTS);
    cr_assert_null(second);
    char pid[64];
    snprintf(pid, sizeof pid, "in use by tp-train (pid %ld on host ", (long)getpid());
    cr_assert(strstr(tp_errmsg(), pid), "the refusal names the holder: %s", tp_errmsg());
    ckpt_run_claim_release(first);
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-other", &second), TP_OK, "free once released: %s", tp_errmsg());
    ckpt_run_claim_release(second);
    ckpt_run_claim_release(NULL);
}

/* Whether a directory is claimed, asked without claiming it (tp-elastic,
 * before it launches a trainer there): free when never claimed (and nothing
 * is made there) or released; held, the refusal names the holder. */
Test(staging, a_claim_is_seen_without_being_taken)
{
    char lock[800];
    snprintf(lock, sizeof lock, "%s/.tp-run.lock", dir);
    cr_assert_eq(ckpt_run_claim_free(dir), TP_OK, "never claimed: %s", tp_errmsg());
    cr_assert(!exists(lock), "asking makes nothing");
    ckpt_run_claim *held = NULL;
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-train", &held), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_run_claim_free(dir), TP_ERR_EXISTS, "held");
    char pid[64];
    snprintf(pid, sizeof pid, "in use by tp-train (pid %ld on host ", (long)getpid());
    cr_assert(strstr(tp_errmsg(), pid) && strstr(tp_errmsg(), "one run per directory"), "%s", tp_errmsg());
    cr_assert_eq(ckpt_run_claim_check(held), TP_OK, "asking leaves the holder's claim alone");
    ckpt_run_claim_release(held);
    cr_assert_eq(ckpt_run_claim_free(dir), TP_OK, "released: %s", tp_errmsg());
    ckpt_run_claim *again = NULL;
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-train", &again), TP_OK, "asking took nothing: %s", tp_errmsg());
    ckpt_run_claim_release(again);
}

Test(staging, a_claim_held_by_a_killed_process_is_free, .timeout = 30)
{
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t child = fork();
    if (child == 0) {
        ckpt_run_claim *held = NULL;
        char ok = ckpt_run_claim_take(dir, NULL, "tp-train", &held) == TP_OK ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char ok = 0;
    cr_assert_eq(read(ready[0], &ok, 1), 1);
    cr_assert_eq(ok, 'y');
    ckpt_run_claim *claim = NULL;
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-train", &claim), TP_ERR_EXISTS, "the child holds it");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-train", &claim), TP_OK, "kill -9 frees it: %s", tp_errmsg());
    ckpt_run_claim_release(claim);
}

/* Closes fd after a moment: the holder's lock released while a claimant waits. */
static void *close_later(void *fd)
{
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    close(*(int *)fd);
    return NULL;
}

/* A holder that is ending keeps its lock until the kernel has closed its
 * files (a rank of a launch tp-elastic tore down, whose takeover was
 * refused by it under the sanitizers): waited for, not refused. Here the
 * named holder has ended (a zombie) while a process it forked still holds
 * the lock's open file, until the test lets it go. */
Test(staging, a_claim_whose_holder_is_ending_is_waited_for, .timeout = 30)
{
    int ready[2], release[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(release), 0);
    pid_t child = fork();
    if (child == 0) {
        ckpt_run_claim *held = NULL;
        char ok = ckpt_run_claim_take(dir, NULL, "tp-train", &held) == TP_OK ? 'y' : 'n';
        close(release[1]);
        pid_t keeper = fork(); /* shares the lock's open file; gone once release is closed */
        if (keeper == 0) {
            char byte;
            ssize_t n = read(release[0], &byte, 1);
            _exit(n == 0 ? 0 : 4);
        }
        if (keeper < 0) ok = 'n';
        if (write(ready[1], &ok, 1) != 1) _exit(3);
        _exit(0);
    }
    close(release[0]);
    char ok = 0, host[64];
    cr_assert_eq(read(ready[0], &ok, 1), 1);
    cr_assert_eq(ok, 'y');
    siginfo_t info;
    cr_assert_eq(waitid(P_PID, (id_t)child, &info, WEXITED | WNOWAIT), 0, "the holder ended");
    store_host_name(host, sizeof host);
    cr_assert(store_process_ending(host, (long)child));
    pthread_t closer;
    double start = now_seconds(); /* before the closer starts: a pause of this thread cannot shorten the wait seen */
    cr_assert_eq(pthread_create(&closer, NULL, close_later, &release[1]), 0);
    cr_assert_eq(ckpt_run_claim_free(dir), TP_OK, "waited for: %s", tp_errmsg());
    cr_assert_geq(now_seconds() - start, 0.2, "the lock was still held when asked");
    pthread_join(closer, NULL);
    waitpid(child, NULL, 0);
    ckpt_run_claim *claim = NULL;
    cr_assert_eq(ckpt_run_claim_take(dir, NULL, "tp-train", &claim), TP_OK, "%s", tp_errmsg());
    ckpt_run_claim_release(claim);
    close(ready[0]);
    close(ready[1]);
}

Test(staging, a_fifo_or_a_link_in_the_claims_place_is_refused_at_once, .timeout = 10)
{
    char lock[800], fifo_dir[700], link_dir[700];
    snprintf(fifo_dir, sizeof fifo_dir, "%s/fifo", dir);
    snprintf(link_dir, sizeof link_dir, "%s/link", dir);
    cr_assert_eq(mkdir(fifo_dir, 0755), 0);
    cr_assert_eq(mkdir(link_dir, 0755), 0);
    snprintf(lock, sizeof lock, "%s/.tp-run.lock", fifo_dir);
    cr_assert_eq(mkfifo(lock, 0644), 0);
    ckpt_run_claim *claim = NULL;
    cr_assert_eq(ckpt_run_claim_take(fifo_dir, NULL, "tp-train", &claim), TP_ERR_FORMAT); /* as every special file */
    cr_assert(strstr(tp_errmsg(), "not a regular file"), "%s", tp_errmsg());
    snprintf(lock, sizeof lock, "%s/.tp-run.lock", link_dir);
    cr_assert_eq(symlink("elsewhere", lock), 0);
    cr_assert_neq(ckpt_run_claim_take(link_dir, NULL, "tp-train", &claim), TP_OK, "a link is not followed");
    cr_assert_null(claim);
}
