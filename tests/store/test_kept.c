/* The checks of what a store is trusted with (store/): what it kept of an
 * upload (store_check_kept: a PUT answered 201 proves nothing, the size is
 * asked and an index's bytes read back), S3's bare 400 said as what it
 * usually means (object_answer_error: the region the requests are signed
 * for, and where it came from), and whether a lease's holder is a live
 * process of this machine (store_process_running: said at once rather than
 * watched for a lease period, a pid taken by another program not it). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../common/error.h"
#include "../../store/object.h"
#include "../../store/staging.h"
#include "../../store/store.h"
#include "../support/http_answer.h"

static char dir[64];

static void make_file(const char *path, const char *bytes)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(bytes, f);
    fclose(f);
}

Test(kept, the_size_and_the_bytes_kept_are_those_sent)
{
    snprintf(dir, sizeof dir, "/tmp/tp_kept_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128], missing[128];
    snprintf(path, sizeof path, "%s/index.json", dir);
    snprintf(missing, sizeof missing, "%s/none.json", dir);
    const char sent[] = "{\"format\": \"1.2\"}";
    make_file(path, sent);
    cr_assert_eq(store_check_kept(path, sent, (int64_t)strlen(sent)), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(store_check_kept(path, NULL, (int64_t)strlen(sent)), TP_OK, "%s", tp_errmsg());
    /* Kept with one byte changed, the same size: only a read back tells. */
    make_file(path, "{\"format\": \"1.3\"}");
    cr_assert_eq(store_check_kept(path, NULL, (int64_t)strlen(sent)), TP_OK, "a size check alone passes it");
    cr_assert_eq(store_check_kept(path, sent, (int64_t)strlen(sent)), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "index.json: the store kept other bytes than were sent: byte 14 of 17 is 0x33, 0x32 "
                                  "was sent"), "%s", tp_errmsg());
    make_file(path, "{}");
    cr_assert_eq(store_check_kept(path, sent, (int64_t)strlen(sent)), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "index.json: 2 bytes arrived of 17 sent"), "%s", tp_errmsg());
    cr_assert_eq(store_check_kept(missing, sent, (int64_t)strlen(sent)), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "none.json: 0 bytes arrived of 17 sent (nothing is there"), "%s", tp_errmsg());
    unlink(path);
    rmdir(dir);
}


Test(kept, a_bare_400_from_s3_names_the_region_used)
{
    setenv("AWS_REGION", "eu-west-1", 1); /* read once, at the first use of S3 in this (forked) test */
    http_response bare = http_answer(400, "");
    cr_assert_eq(object_answer_error("HEAD", "s3://bkt/run/index.json", &bare), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "HEAD s3://bkt/run/index.json: HTTP 400 with no reason given (the answer to a HEAD has "
                                  "no body)"), "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "signed for eu-west-1, from AWS_REGION; set AWS_REGION or AWS_DEFAULT_REGION"),
              "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "or a bucket name S3 does not accept"), "%s", tp_errmsg());
    /* A 400 that says why is said as S3 said it; a WebDAV server's is no S3's. */
    http_response said = http_answer(400, "<Error><Code>InvalidBucketName</Code><Message>bad</Message></Error>");
    cr_assert_eq(object_answer_error("GET", "s3://b/k", &said), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "GET s3://b/k: HTTP 400 InvalidBucketName: bad"), "%s", tp_errmsg());
    cr_assert_null(strstr(tp_errmsg(), "region"), "%s", tp_errmsg());
    cr_assert_eq(object_answer_error("HEAD", "http://h/k", &bare), TP_ERR_IO);
    cr_assert_null(strstr(tp_errmsg(), "region"), "%s", tp_errmsg());
}

Test(kept, the_default_region_is_said_as_the_default)
{
    unsetenv("AWS_REGION");
    unsetenv("AWS_DEFAULT_REGION");
    http_response bare = http_answer(400, "");
    object_answer_error("PUT", "s3://bkt/k", &bare);
    cr_assert(strstr(tp_errmsg(), "PUT s3://bkt/k: HTTP 400 with no reason given: from S3"), "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "signed for us-east-1, the default: neither AWS_REGION nor AWS_DEFAULT_REGION is "
                                  "set"), "%s", tp_errmsg());
}

/* S3 names the bucket's region in the answer to a request signed for
 * another: said with the remedy; an answer naming the region used (or no
 * region) is judged as before. */
Test(kept, the_bucket_region_s3_names_is_said)
{
    setenv("AWS_REGION", "us-east-1", 1);
    http_response wrong = http_answer(400, "");
    snprintf(wrong.bucket_region, sizeof wrong.bucket_region, "eu-central-1");
    object_answer_error("HEAD", "s3://bkt/k", &wrong);
    cr_assert(strstr(tp_errmsg(), "HEAD s3://bkt/k: HTTP 400: the bucket is in eu-central-1 (S3's "
                                  "x-amz-bucket-region), these requests are signed for us-east-1, from AWS_REGION: "
                                  "set AWS_REGION=eu-central-1"), "%s", tp_errmsg());
    http_response moved = http_answer(301, "<Error><Code>PermanentRedirect</Code><Message>use the endpoint</Message>"
                                           "</Error>");
    snprintf(moved.bucket_region, sizeof moved.bucket_region, "ap-south-1");
    object_answer_error("GET", "s3://bkt/k", &moved);
    cr_assert(strstr(tp_errmsg(), "HTTP 301 PermanentRedirect: use the endpoint: the bucket is in ap-south-1"), "%s",
              tp_errmsg());
    http_response busy = http_answer(503, "");
    busy.attempts = 7;
    snprintf(busy.bucket_region, sizeof busy.bucket_region, "ap-south-1");
    object_answer_error("GET", "s3://bkt/k", &busy);
    cr_assert(strstr(tp_errmsg(), "GET s3://bkt/k: HTTP 503 (after 7 attempts)"),
              "a store sending the header with every answer: %s", tp_errmsg());
    http_response same = http_answer(400, "");
    snprintf(same.bucket_region, sizeof same.bucket_region, "us-east-1");
    object_answer_error("GET", "s3://bkt/k", &same);
    cr_assert(strstr(tp_errmsg(), "GET s3://bkt/k: HTTP 400 with no reason given"), "the bucket's own region: %s",
              tp_errmsg());
    unsetenv("AWS_REGION");
}

Test(kept, a_live_process_of_this_machine_is_known_by_its_pid_and_name)
{
    char host[64], comm[32] = "";
    store_host_name(host, sizeof host);
    FILE *f = fopen("/proc/self/comm", "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(comm, sizeof comm, f));
    fclose(f);
    comm[strcspn(comm, "\n")] = '\0';
    cr_assert(store_process_running(host, (long)getpid(), comm), "this process, %s", comm);
    cr_assert_not(store_process_running(host, (long)getpid(), "tp-train"), "its pid, another program's name");
    cr_assert_not(store_process_running("another-host", (long)getpid(), comm), "another machine's is never known");
    pid_t child = fork();
    if (child == 0) _exit(0);
    /* Ended, not yet reaped (a zombie: a torn-down launch's rank 0): it
     * holds nothing, though kill(0) still finds it. */
    siginfo_t info;
    cr_assert_eq(waitid(P_PID, (id_t)child, &info, WEXITED | WNOWAIT), 0);
    cr_assert_not(store_process_running(host, (long)child, comm), "a zombie");
    cr_assert(store_process_ending(host, (long)child), "a zombie is ending");
    waitpid(child, NULL, 0);
    cr_assert_not(store_process_running(host, (long)child, comm), "a process that ended");
    cr_assert(store_process_gone(host, (long)child));
    cr_assert_not(store_process_ending(host, (long)child), "gone, not ending");
    cr_assert_not(store_process_ending(host, (long)getpid()), "this process runs");
    cr_assert_not(store_process_ending("another-host", (long)child), "another machine's is never known");
}
