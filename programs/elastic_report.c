/* elastic_report.c: `tp-elastic report RUN_DIR -o report.svg|png`
 * (docs/ELASTIC.md): the loss curve over steps across every launch of a run,
 * with failures, hangs, reshards and layout changes marked, drawn by gnuplot;
 * and the run's summary as text. It reads what `tp-elastic run` recorded:
 * <run>/elastic/train.jsonl (the trainer's log) and events.jsonl. The
 * picture is an output as every other (docs/TOOLS.md): whole or not at all,
 * an existing file replaced only with --force and only when it is an
 * earlier report, known by its mark. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../common/error.h"
#include "../common/file.h"
#include "../common/path.h"
#include "../elastic/elastic.h"
#include "cli.h"
#include "elastic_commands.h"

#define PROGRAM "tp-elastic report"

static const char report_usage[] =
    "usage: tp-elastic report RUN_DIR -o FILE.svg|FILE.png [--force] [--events FILE] [--state-dir DIR]\n"
    "Draws the loss over steps of every launch of a run kept by `tp-elastic run` (its --state-dir's\n"
    "train.jsonl: RUN_DIR/elastic, or $TMPDIR/tp-elastic-HASH for a RUN_DIR in an object store),\n"
    "marking failures, hangs, reshards and scale changes (from the events) and where the loss went\n"
    "non-finite, with gnuplot; prints the summary (its time lost by share, startup the time before the\n"
    "first step; the effective training time, \"none\" for a run that never trained), also when there is\n"
    "nothing to draw.\n"
    "\n"
    "  -o, --output FILE    the picture, a local file; it appears whole or not at all (written under a\n"
    "                       staging name beside it, renamed into place); never inside a checkpoint\n"
    "  --force              replace an existing FILE; only an earlier report (known by its mark)\n"
    "  --state-dir DIR      the run's state, as given to `tp-elastic run --state-dir` (the default above)\n"
    "  --events FILE        its events, as given to `tp-elastic run --events` (default: DIR/events.jsonl)\n"
    "\n"
    "An existing FILE is refused (exit 1) without --force, and anything but a report even with it.\n";

/* Reads a JSON-lines file into an array of objects; *unreadable (unless
 * NULL) counts the lines that are not JSON objects (a line being written; a
 * diverged step logged by a tp-train that wrote nan, before null). */
static int read_lines(const char *path, cJSON **out, int *unreadable)
{
    char *text = NULL;
    TP_TRY(store_read_text_file(path, CKPT_INDEX_MAX_BYTES, &text, NULL));
    cJSON *array = cJSON_CreateArray();
    int skipped = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (cJSON_IsObject(o)) cJSON_AddItemToArray(array, o);
        else cJSON_Delete(o), skipped++;
    }
    if (unreadable) *unreadable = skipped;
    free(text);
    *out = array;
    return TP_OK;
}

static double num(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *str(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The loss data (gnuplot's data file): one block for each launch that
 * logged a finite loss, launch[i] the number of block i's launch (a launch
 * with none has no block: gnuplot would warn of an empty one). Steps whose
 * loss is not finite (null in the log, JSON having no NaN; or missing) are
 * left out and counted, the first of each launch kept for a mark; a log
 * with no finite loss at all is an error saying so (gnuplot, given no
 * point, failed, and the failure was taken for gnuplot's). */
typedef struct {
    int launches;         /* launches in the log (start lines) */
    int blocks;           /* of them, those with a finite loss (plotted) */
    int *launch;          /* [blocks]: block i's launch number */
    int64_t *nonfinite;   /* [launches]: launch i+1's first step of a non-finite loss, or -1 */
    int64_t steps, nonfinite_steps, first_nonfinite;
    int first_nonfinite_launch;
} loss_data;

static void loss_data_free(loss_data *d)
{
    free(d->launch);
    free(d->nonfinite);
}

static int write_losses(const cJSON *log, const char *log_path, FILE *f, loss_data *d)
{
    memset(d, 0, sizeof *d);
    d->first_nonfinite = -1;
    int lines = cJSON_GetArraySize(log), launch = 0, plotted = 0; /* plotted: launch of the open block */
    d->launch = malloc(((size_t)lines + 1) * sizeof *d->launch);
    d->nonfinite = malloc(((size_t)lines + 1) * sizeof *d->nonfinite);
    if (!d->launch || !d->nonfinite) return tp_fail(TP_ERR_NOMEM, "out of memory");
    const cJSON *line;
    cJSON_ArrayForEach(line, log)
    {
        if (strcmp(str(line, "event"), "start") == 0) {
            d->nonfinite[launch++] = -1;
            continue;
        }
        if (*str(line, "event") || num(line, "step") < 0) continue;
        if (!launch) d->nonfinite[launch++] = -1; /* a log without its start line */
        double step = num(line, "step");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(line, "loss");
        d->steps++;
        if (!cJSON_IsNumber(loss) || !isfinite(loss->valuedouble)) {
            d->nonfinite_steps++;
            if (d->nonfinite[launch - 1] < 0) d->nonfinite[launch - 1] = (int64_t)step;
            if (d->first_nonfinite < 0) d->first_nonfinite = (int64_t)step, d->first_nonfinite_launch = launch;
            continue;
        }
        if (plotted != launch) {
            if (d->blocks) fprintf(f, "\n\n");
            fprintf(f, "# launch %d\n", launch);
            d->launch[d->blocks++] = plotted = launch;
        }
        fprintf(f, "%.0f %.9g\n", step, loss->valuedouble);
    }
    d->launches = launch;
    if (!d->steps)
        return tp_fail(TP_ERR_NOT_FOUND, "%s holds no steps: the run trained none, there is no loss to draw", log_path);
    if (!d->blocks)
        return tp_fail(TP_ERR_FORMAT, "%s: none of its %lld steps has a finite loss (null from step %lld on, "
                       "launch %d): nothing finite to plot; the run diverged", log_path, (long long)d->steps,
                       (long long)d->first_nonfinite, d->first_nonfinite_launch);
    return TP_OK;
}

/* Vertical marks at the steps where something happened: the events, and
 * where each launch's loss went non-finite. */
static void write_marks(const cJSON *events, const loss_data *d, FILE *script)
{
    const cJSON *e;
    int n = 0;
    int64_t low = -1, high = -1;
    for (int i = 0; i < d->launches; i++) {
        if (d->nonfinite[i] < 0) continue;
        fprintf(script, "set arrow %d from %lld, graph 0 to %lld, graph 1 nohead lc rgb 'dark-red' lw 2\n", ++n,
                (long long)d->nonfinite[i], (long long)d->nonfinite[i]);
        fprintf(script, "set label %d 'loss non-finite (launch %d)' at %lld, graph 0.5 rotate by 90 offset -1, 0 "
                "tc rgb 'dark-red' font ',8'\n", n, i + 1, (long long)d->nonfinite[i]);
        if (low < 0 || d->nonfinite[i] < low) low = d->nonfinite[i];
        if (d->nonfinite[i] > high) high = d->nonfinite[i];
    }
    /* The steps are autoscaled from the finite losses alone, which end where
     * the loss went non-finite: widened to hold that mark. */
    if (low >= 0) fprintf(script, "set xrange [*<%lld:%lld<*]\n", (long long)low, (long long)high);
    cJSON_ArrayForEach(e, events)
    {
        const char *name = str(e, "event"), *color = NULL, *label = NULL;
        if (strcmp(name, "failure") == 0) color = "red", label = "failure";
        else if (strcmp(name, "hang") == 0) color = "orange", label = "hang";
        else if (strcmp(name, "scale_change") == 0) color = "blue", label = "scale";
        else if (strcmp(name, "resumed") == 0) color = "gray", label = *str(e, "layout") ? str(e, "layout") : "resume";
        if (!color || num(e, "step") < 0) continue;
        double step = num(e, "step");
        fprintf(script, "set arrow %d from %.1f, graph 0 to %.1f, graph 1 nohead lc rgb '%s' dt 2\n", ++n, step, step,
                color);
        fprintf(script, "set label %d '%s' at %.1f, graph %.2f rotate by 90 tc rgb '%s' font ',8'\n", n, label, step,
                0.95 - 0.12 * (n % 4), color);
    }
}

/* A figure of the summary, or "(not recorded)" when it has none: a summary
 * of an earlier tp-elastic lacks the later ones (startup, trained), and a
 * missing number printed as -1 ("-100.0%"). */
static void print_figure(const char *name, const cJSON *o, const char *field, double scale, const char *format_unit)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    printf("%-22s ", name);
    if (cJSON_IsNumber(v)) printf(format_unit, scale * v->valuedouble);
    else printf("(not recorded)");
    printf("\n");
}

static void print_summary(const cJSON *events)
{
    const cJSON *e, *summary = NULL;
    int failures = 0, hangs = 0, reshards = 0, scales = 0, waits = 0;
    cJSON_ArrayForEach(e, events)
    {
        const char *name = str(e, "event");
        failures += strcmp(name, "failure") == 0;
        hangs += strcmp(name, "hang") == 0;
        reshards += strcmp(name, "reshard") == 0;
        scales += strcmp(name, "scale_change") == 0;
        waits += strcmp(name, "waiting_for_capacity") == 0 || strcmp(name, "step_pending") == 0;
        if (strcmp(name, "summary") == 0) summary = e;
        /* A later orchestrator's start makes an earlier summary stale: it
         * was printed as the run's (finished, at an earlier --steps' last
         * step) while a tp-elastic killed since had gone on. */
        if (strcmp(name, "orchestrator_start") == 0) summary = NULL;
    }
    printf("failures %d, hangs %d, reshards %d, scale changes %d, waits for capacity %d\n", failures, hangs, reshards,
           scales, waits);
    if (!summary) {
        printf("no summary yet (the run's latest tp-elastic has not ended, or was killed)\n");
        return;
    }
    printf("%-22s %s\n", "finished", cJSON_IsTrue(cJSON_GetObjectItem(summary, "finished")) ? "yes" : "no");
    print_figure("last step", summary, "step", 1, "%.0f");
    print_figure("launches", summary, "launches", 1, "%.0f");
    print_figure("restarts", summary, "restarts", 1, "%.0f");
    print_figure("steps recomputed", summary, "steps_recomputed", 1, "%.0f");
    print_figure("wall time", summary, "wall_seconds", 1, "%.1f s");
    const cJSON *lost = cJSON_GetObjectItem(summary, "lost_seconds");
    for (int i = 0; i < ELASTIC_LOST_KINDS; i++) {
        char name[32];
        snprintf(name, sizeof name, "lost: %s", elastic_lost_names[i]);
        print_figure(name, lost, elastic_lost_names[i], 1, "%.1f s");
    }
    /* A run that trained no step (it gave up waiting for capacity, its
     * step stayed pending, every launch failed loading) has no effective
     * training time: before, it said 100%. */
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(summary, "trained")))
        printf("%-22s none: never trained (no step in the trainer's log)\n", "effective training");
    else print_figure("effective training", summary, "ettr", 100, "%.1f%%");
    if (*str(summary, "reason")) printf("%-22s %s\n", "reason", str(summary, "reason"));
}

/* ------------------------------------------------------------- the mark */

/* What --force may replace is a report this command wrote, known by the
 * mark it carries at a fixed place: in an SVG an XML comment right after
 * the XML declaration; in a PNG a tEXt chunk (keyword Software, as PNG
 * readers show it) right after the header chunk, where the format allows
 * text. Anything else (a checkpoint's file, another program's picture, a
 * user's drawing) is never replaced. */
#define REPORT_MARK "tp-elastic report (tp-toolkit): the loss over steps of a run"
#define REPORT_MARK_MAX 128
/* Bytes of the start of a file looked at for the mark. */
#define REPORT_HEAD_BYTES 4096

typedef enum { REPORT_SVG, REPORT_PNG } report_kind;

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* The mark's bytes for a picture of this kind; returns their length. */
static size_t report_mark(report_kind kind, unsigned char out[REPORT_MARK_MAX])
{
    if (kind == REPORT_SVG) return (size_t)snprintf((char *)out, REPORT_MARK_MAX, "<!-- %s -->\n", REPORT_MARK);
    static const char keyword[] = "Software"; /* NUL included: it ends the keyword */
    size_t data = sizeof keyword + strlen(REPORT_MARK);
    put_be32(out, (uint32_t)data);
    memcpy(out + 4, "tEXt", 4);
    memcpy(out + 8, keyword, sizeof keyword);
    memcpy(out + 8 + sizeof keyword, REPORT_MARK, strlen(REPORT_MARK));
    put_be32(out + 8 + data, crc32_gzip_refl(0, out + 4, 4 + data)); /* PNG's CRC-32, of type and data */
    return 12 + data;
}

/* Where the mark goes in a picture starting with head[0, n), or SIZE_MAX
 * when it is no such picture: in an SVG after the XML declaration's line (a
 * comment may not come before it) or at the start; in a PNG after the
 * signature and the 13-byte IHDR chunk that must come first. */
static size_t report_mark_offset(report_kind kind, const unsigned char *head, size_t n)
{
    if (kind == REPORT_PNG) {
        static const unsigned char start[16] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H',
                                                'D', 'R'};
        return n >= 33 && memcmp(head, start, sizeof start) == 0 ? 33 : SIZE_MAX;
    }
    if (n < 5 || memcmp(head, "<?xml", 5) != 0) return 0;
    const unsigned char *end = memchr(head, '\n', n);
    return end ? (size_t)(end - head) + 1 : SIZE_MAX;
}

static int report_is_marked(report_kind kind, const unsigned char *head, size_t n)
{
    unsigned char mark[REPORT_MARK_MAX];
    size_t length = report_mark(kind, mark), at = report_mark_offset(kind, head, n);
    return at != SIZE_MAX && n >= at && n - at >= length && memcmp(head + at, mark, length) == 0;
}

/* The store_replace_check of reports (ctx: the report_kind of the output):
 * not a run directory, and a file carrying the mark of its kind. */
static int report_may_replace(const store_ops *storage, const char *path, void *ctx)
{
    TP_TRY(ckpt_refuse_run_directory(storage, path));
    report_kind kind = *(const report_kind *)ctx;
    const char *only = "--force replaces only a report of tp-elastic report (an earlier output, known by its mark)";
    store_stat st;
    TP_TRY(storage->stat(storage, path, &st));
    if (!st.exists) return TP_OK; /* gone meanwhile */
    if (st.is_dir) return tp_fail(TP_ERR_EXISTS, "%s is a directory; %s", path, only);
    /* Its head, read through the store as every replace check reads (its
     * open refuses a FIFO or device). */
    unsigned char head[REPORT_HEAD_BYTES];
    size_t n = st.size < (int64_t)sizeof head ? (size_t)st.size : sizeof head;
    store_file *file = NULL;
    int read = storage->open(storage, path, STORE_OPEN_READ, &file);
    if (!read) read = storage->read_at(file, head, n, 0);
    if (file) storage->close(file);
    if (read) {
        char why[1024];
        snprintf(why, sizeof why, "%s", tp_errmsg());
        return tp_fail(TP_ERR_EXISTS, "%s; %s", why, only);
    }
    if (!report_is_marked(kind, head, n))
        return tp_fail(TP_ERR_EXISTS, "%s is not a report of tp-elastic report (its %s mark is missing); %s", path,
                       kind == REPORT_SVG ? "SVG" : "PNG", only);
    return TP_OK;
}

/* Copies the picture gnuplot drew at from into the staging file at to,
 * the mark inserted at its place. */
static int write_marked(report_kind kind, const char *from, const char *to)
{
    const store_ops *s = store_posix();
    store_file *in = NULL, *out = NULL;
    store_stat st;
    unsigned char *picture = NULL, mark[REPORT_MARK_MAX];
    size_t length = report_mark(kind, mark);
    int status = s->stat(s, from, &st);
    if (!status && (!st.exists || st.size <= 0))
        status = tp_fail(TP_ERR_FORMAT, "gnuplot drew nothing at %s", from);
    if (!status) status = (picture = malloc((size_t)st.size)) ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = s->open(s, from, STORE_OPEN_READ, &in);
    if (!status) status = s->read_at(in, picture, (size_t)st.size, 0);
    size_t at = status ? 0 : report_mark_offset(kind, picture, (size_t)st.size);
    if (!status && at == SIZE_MAX)
        status = tp_fail(TP_ERR_FORMAT, "%s: gnuplot's picture is not the %s expected; not marked", from,
                         kind == REPORT_SVG ? "SVG" : "PNG");
    /* The staging file exists (store_stage made it): opened, never made
     * again, so that a signal's clean-up that removed it stays done. */
    if (!status) status = s->open(s, to, STORE_OPEN_WRITE, &out);
    if (!status) status = s->write_at(out, picture, at, 0);
    if (!status) status = s->write_at(out, mark, length, (int64_t)at);
    if (!status) status = s->write_at(out, picture + at, (size_t)st.size - at, (int64_t)(at + length));
    if (in) s->close(in);
    if (out) s->close(out);
    free(picture);
    return status;
}

/* --------------------------------------------------------------- output */

/* Refuses an output inside a checkpoint (a directory step_N, committed or
 * being written, or any committed checkpoint), the run's or another's:
 * nothing is written among a checkpoint's files (a stray entry in it). 2,
 * the exit status of tp-ckpt's refusals of an output inside its input,
 * with one line naming it; 0 when apart, or when the parent does not
 * resolve (the staging reports that). */
static int output_in_checkpoint(const char *output)
{
    char ckpt[PATH_MAX];
    if (!cli_checkpoint_around(output, ckpt, sizeof ckpt)) return 0;
    cli_error(PROGRAM, "the output %s lies inside the checkpoint %s: a report is never written into a checkpoint; "
              "choose a path outside it", output, ckpt);
    return 2;
}

/* Runs gnuplot on the plot's script (which draws into this command's
 * temporary directory). Its messages go to stderr, stdout being the
 * summary; a missing gnuplot is told apart (127, without the shell's own
 * line) from gnuplot failing. */
static int run_gnuplot(const char *script, const char *output)
{
    char command[8400];
    snprintf(command, sizeof command, "command -v gnuplot >/dev/null 2>&1 || exit 127; exec gnuplot '%s' >&2", script);
    int rc = system(command);
    if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return TP_OK;
    if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 127) /* the shell found no gnuplot */
        return tp_fail(TP_ERR_IO, "cannot draw %s: gnuplot is not installed (make deps installs it)", output);
    return tp_fail(TP_ERR_IO, "gnuplot failed drawing %s (%s %d; its message is above)", output,
                   rc != -1 && WIFEXITED(rc) ? "exit status" : "wait status", rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : rc);
}

int elastic_report_main(int argc, char **argv)
{
    enum { O_FORCE = 256 };
    static const struct option options[] = {
        {"output", required_argument, 0, 'o'}, {"events", required_argument, 0, 'e'},
        {"state-dir", required_argument, 0, 's'}, {"force", no_argument, 0, O_FORCE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *output = NULL, *events_path = NULL, *state_dir = NULL;
    int force = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "o:", options, NULL)) != -1) {
        if (c == 'o') output = optarg;
        else if (c == 'e') events_path = optarg;
        else if (c == 's') state_dir = optarg;
        else if (c == O_FORCE) force = 1;
        else if (c == 'h') return fputs(report_usage, stdout), 0;
        else cli_usage_error(PROGRAM, "unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 1) cli_usage_error(PROGRAM, "takes one run directory");
    if (!output) cli_usage_error(PROGRAM, "-o FILE.svg or FILE.png is required");
    size_t n = strlen(output);
    int svg = n > 4 && strcmp(output + n - 4, ".svg") == 0, png = n > 4 && strcmp(output + n - 4, ".png") == 0;
    if (!svg && !png) cli_usage_error(PROGRAM, "-o takes a file ending in .svg or .png, not '%s'", output);
    if (tp_path_is_url(output)) cli_usage_error(PROGRAM, "-o takes a local file, not '%s'", output);
    report_kind kind = svg ? REPORT_SVG : REPORT_PNG;
    int apart = output_in_checkpoint(output);
    if (apart) return apart;
    const char *run = argv[optind];
    char log_path[4300], default_events[4300], state[4200];
    /* Where tp-elastic run kept them: its --state-dir, by default RUN/elastic,
     * or for a run in an object store the local directory named after it. */
    if (state_dir) snprintf(state, sizeof state, "%s", state_dir);
    else if (!ckpt_is_remote(run)) snprintf(state, sizeof state, "%s/elastic", run);
    else if (ckpt_local_dir_for(run, "elastic", state, sizeof state)) return cli_error(PROGRAM, "%s", tp_errmsg());
    snprintf(log_path, sizeof log_path, "%s/train.jsonl", state);
    snprintf(default_events, sizeof default_events, "%s/events.jsonl", state);
    if (!events_path) events_path = default_events;
    if (cli_clean_up_on_signals() != 0) return cli_error(PROGRAM, "cannot set up signal handling: %s", strerror(errno));
    /* The output is staged first: an existing one is refused before
     * anything is read or drawn, and the picture appears whole or not at
     * all. gnuplot draws into a temporary directory of this command's; the
     * picture is copied, marked, into the staging file. */
    store_stage_options stage = {.overwrite = force, .may_replace = report_may_replace, .ctx = &kind};
    store_staged *staged = NULL;
    if (store_stage(store_posix(), output, &stage, &staged)) return cli_error(PROGRAM, "%s", tp_errmsg());
    cJSON *log = NULL, *events = NULL;
    int unreadable = 0;
    int status = read_lines(log_path, &log, &unreadable);
    if (status) {
        /* No log (a run that never launched the trainer: it gave up waiting
         * for capacity): nothing to draw, but the events' summary says what
         * became of the run; read for it, the log's error kept. */
        char why[2048];
        snprintf(why, sizeof why, "%s", tp_errmsg());
        if (read_lines(events_path, &events, NULL)) events = NULL;
        status = tp_fail(status, "%s", why);
    } else {
        status = read_lines(events_path, &events, NULL);
    }
    if (!status && unreadable)
        fprintf(stderr, "%s: warning: %s: %d lines are not JSON, left out (a line being written; or NaN losses "
                "written as nan by an older tp-train)\n", PROGRAM, log_path, unreadable);
    /* In $TMPDIR, as the other tools' temporary files (it drew in /tmp whatever TMPDIR said). */
    char dir[4096], data[4200], script[4200], picture[4200];
    int made_dir = 0;
    if (snprintf(dir, sizeof dir, "%s/tp-elastic-report-XXXXXX", tp_temporary_dir()) >= (int)sizeof dir)
        status = status ? status : tp_fail(TP_ERR_ARG, "TMPDIR is too long");
    if (!status && mkdtemp(dir)) made_dir = 1;
    else if (!status) status = tp_fail(TP_ERR_IO, "%s: cannot make a temporary directory: %s", dir, strerror(errno));
    snprintf(data, sizeof data, "%s/loss.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    snprintf(picture, sizeof picture, "%s/plot.%s", dir, svg ? "svg" : "png");
    FILE *d = status ? NULL : fopen(data, "w"), *g = status ? NULL : fopen(script, "w");
    loss_data losses = {0};
    if (!status && (!d || !g)) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", dir, strerror(errno));
    if (!status) status = write_losses(log, log_path, d, &losses);
    if (!status) {
        fprintf(g, "set terminal %s\nset output '%s'\n", svg ? "svg size 1000,600 dynamic" : "png size 1000,600",
                picture);
        fprintf(g, "set title 'loss over steps, %d launch%s'\nset xlabel 'step'\nset ylabel 'loss'\nset key top right\n",
                losses.launches, losses.launches == 1 ? "" : "es");
        write_marks(events, &losses, g);
        fprintf(g, "plot");
        for (int b = 0; b < losses.blocks; b++)
            fprintf(g, "%s '%s' index %d using 1:2 with linespoints pt 7 ps 0.4 title 'launch %d'", b ? "," : "", data,
                    b, losses.launch[b]);
        fprintf(g, "\n");
    }
    if (d) fclose(d);
    if (g) fclose(g);
    if (!status) status = run_gnuplot(script, output);
    if (!status) status = write_marked(kind, picture, store_staged_path(staged));
    if (!status) status = store_staged_publish(staged); /* synced, then renamed; removed on failure */
    else store_staged_discard(staged);
    if (!status) {
        printf("%s: loss curve of %d launch%s\n", output, losses.launches, losses.launches == 1 ? "" : "es");
        if (losses.first_nonfinite >= 0)
            fprintf(stderr, "%s: warning: the loss went non-finite at step %lld (launch %d): %lld of %lld steps "
                    "logged have no finite loss and are not drawn\n", PROGRAM, (long long)losses.first_nonfinite,
                    losses.first_nonfinite_launch, (long long)losses.nonfinite_steps, (long long)losses.steps);
        print_summary(events);
    } else if (events) {
        print_summary(events); /* what the run came to, said even when nothing could be drawn */
    }
    unlink(data);
    unlink(script);
    unlink(picture);
    if (made_dir) rmdir(dir);
    loss_data_free(&losses);
    cJSON_Delete(log);
    cJSON_Delete(events);
    return status ? cli_error(PROGRAM, "%s", tp_errmsg()) : 0;
}
