/* elastic_report.c: `tp-elastic report RUN_DIR -o report.svg|png`
 * (docs/ELASTIC.md): the loss curve over steps across every launch of a run,
 * with failures, hangs, reshards and layout changes marked, drawn by gnuplot;
 * and the run's summary as text. It reads what `tp-elastic run` recorded:
 * <run>/elastic/train.jsonl (the trainer's log) and events.jsonl. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../ckpt/ckpt.h"
#include "../common/error.h"
#include "../elastic/elastic.h"
#include "cli.h"
#include "elastic_commands.h"

#define PROGRAM "tp-elastic report"

static const char report_usage[] =
    "usage: tp-elastic report RUN_DIR -o FILE.svg|FILE.png [--events FILE] [--state-dir DIR]\n"
    "Draws the loss over steps of every launch of a run kept by `tp-elastic run` (its --state-dir's\n"
    "train.jsonl: RUN_DIR/elastic, or $TMPDIR/tp-elastic-HASH for a RUN_DIR in an object store),\n"
    "marking failures, hangs, reshards and scale changes (from the events), with gnuplot; prints the summary.\n";

/* Reads a JSON-lines file into an array of objects (NULL entries skipped). */
static int read_lines(const char *path, cJSON **out)
{
    char *text = NULL;
    TP_TRY(store_read_text_file(path, CKPT_INDEX_MAX_BYTES, &text, NULL));
    cJSON *array = cJSON_CreateArray();
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (cJSON_IsObject(o)) cJSON_AddItemToArray(array, o);
        else cJSON_Delete(o);
    }
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

/* The loss data: one block per launch ("launch N" as its title), steps and
 * losses as logged; gnuplot draws each block as its own line. */
static int write_losses(const cJSON *log, FILE *f, int *launches)
{
    int block = 0;
    const cJSON *line;
    cJSON_ArrayForEach(line, log)
    {
        if (strcmp(str(line, "event"), "start") == 0) {
            if (block) fprintf(f, "\n\n");
            fprintf(f, "# launch %d\n", ++block);
        } else if (!*str(line, "event") && num(line, "step") >= 0) {
            if (!block) fprintf(f, "# launch %d\n", ++block);
            fprintf(f, "%.0f %.9g\n", num(line, "step"), num(line, "loss"));
        }
    }
    *launches = block;
    return block ? TP_OK : tp_fail(TP_ERR_NOT_FOUND, "the trainer's log holds no steps");
}

/* Vertical marks at the steps where something happened. */
static void write_marks(const cJSON *events, FILE *script)
{
    const cJSON *e;
    int n = 0;
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

static void print_summary(const cJSON *events)
{
    const cJSON *e, *summary = NULL;
    int failures = 0, hangs = 0, reshards = 0, scales = 0;
    cJSON_ArrayForEach(e, events)
    {
        const char *name = str(e, "event");
        failures += strcmp(name, "failure") == 0;
        hangs += strcmp(name, "hang") == 0;
        reshards += strcmp(name, "reshard") == 0;
        scales += strcmp(name, "scale_change") == 0;
        if (strcmp(name, "summary") == 0) summary = e;
    }
    printf("failures %d, hangs %d, reshards %d, scale changes %d\n", failures, hangs, reshards, scales);
    if (!summary) {
        printf("no summary yet (the run has not ended)\n");
        return;
    }
    printf("%-22s %s\n", "finished", cJSON_IsTrue(cJSON_GetObjectItem(summary, "finished")) ? "yes" : "no");
    printf("%-22s %.0f\n", "last step", num(summary, "step"));
    printf("%-22s %.0f\n", "launches", num(summary, "launches"));
    printf("%-22s %.0f\n", "restarts", num(summary, "restarts"));
    printf("%-22s %.0f\n", "steps recomputed", num(summary, "steps_recomputed"));
    printf("%-22s %.1f s\n", "wall time", num(summary, "wall_seconds"));
    const cJSON *lost = cJSON_GetObjectItem(summary, "lost_seconds");
    for (int i = 0; i < 5; i++) printf("lost: %-16s %.1f s\n", elastic_lost_names[i], num(lost, elastic_lost_names[i]));
    printf("%-22s %.1f%%\n", "effective training", 100 * num(summary, "ettr"));
}

int elastic_report_main(int argc, char **argv)
{
    static const struct option options[] = {
        {"output", required_argument, 0, 'o'}, {"events", required_argument, 0, 'e'},
        {"state-dir", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *output = NULL, *events_path = NULL, *state_dir = NULL;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "o:", options, NULL)) != -1) {
        if (c == 'o') output = optarg;
        else if (c == 'e') events_path = optarg;
        else if (c == 's') state_dir = optarg;
        else if (c == 'h') return fputs(report_usage, stdout), 0;
        else cli_usage_error(PROGRAM, "unknown option or missing value: '%s'", cli_rejected_option(argv));
    }
    if (optind != argc - 1) cli_usage_error(PROGRAM, "takes one run directory");
    if (!output) cli_usage_error(PROGRAM, "-o FILE.svg or FILE.png is required");
    size_t n = strlen(output);
    const char *terminal = n > 4 && strcmp(output + n - 4, ".svg") == 0   ? "svg size 1000,600 dynamic"
                           : n > 4 && strcmp(output + n - 4, ".png") == 0 ? "png size 1000,600"
                                                                         : NULL;
    if (!terminal) cli_usage_error(PROGRAM, "-o takes a file ending in .svg or .png, not '%s'", output);
    if (strchr(output, '\'')) cli_usage_error(PROGRAM, "-o: a file name without a single quote, please");
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
    cJSON *log = NULL, *events = NULL;
    if (read_lines(log_path, &log)) return cli_error(PROGRAM, "%s", tp_errmsg());
    if (read_lines(events_path, &events)) {
        cJSON_Delete(log);
        return cli_error(PROGRAM, "%s", tp_errmsg());
    }
    char dir[] = "/tmp/tp-elastic-report-XXXXXX", data[64], script[64];
    int status = mkdtemp(dir) ? TP_OK : tp_fail(TP_ERR_IO, "cannot make a temporary directory: %s", strerror(errno));
    snprintf(data, sizeof data, "%s/loss.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *d = status ? NULL : fopen(data, "w"), *g = status ? NULL : fopen(script, "w");
    int launches = 0;
    if (!status && (!d || !g)) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", dir, strerror(errno));
    if (!status) status = write_losses(log, d, &launches);
    if (!status) {
        fprintf(g, "set terminal %s\nset output '%s'\n", terminal, output);
        fprintf(g, "set title 'loss over steps, %d launches'\nset xlabel 'step'\nset ylabel 'loss'\nset key top right\n",
                launches);
        write_marks(events, g);
        fprintf(g, "plot for [i=0:%d] '%s' index i using 1:2 with linespoints pt 7 ps 0.4 title sprintf('launch %%d', i+1)\n",
                launches - 1, data);
    }
    if (d) fclose(d);
    if (g) fclose(g);
    if (!status) {
        char command[8400];
        snprintf(command, sizeof command, "gnuplot '%s' 2>&1", script);
        int rc = system(command);
        if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
            status = tp_fail(TP_ERR_IO, "gnuplot failed drawing %s (status %d; is gnuplot installed? make deps)", output,
                             rc);
    }
    if (!status) {
        printf("%s: loss curve of %d launches\n", output, launches);
        print_summary(events);
    }
    unlink(data);
    unlink(script);
    rmdir(dir);
    cJSON_Delete(log);
    cJSON_Delete(events);
    return status ? cli_error(PROGRAM, "%s", tp_errmsg()) : 0;
}
