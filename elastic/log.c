/* log.c: following the trainer's --log as it grows (elastic.h). Lines are
 * JSON objects: steps {"step":N,"loss":X,...} (X null when not finite), and events {"event":"start" |
 * "stop" | "save_wait" | "save", "step":N, ...} (docs/TOOLS.md). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../common/error.h"
#include "../common/file.h"
#include "elastic.h"

void elastic_log_follow(elastic_log_follower *f, const char *path, int64_t from_offset)
{
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->offset = from_offset;
}

static double number(const cJSON *o, const char *name, double fallback)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v->valuedouble : fallback;
}

static void parse_line(const char *text, void (*visit)(void *, const elastic_log_line *), void *ctx)
{
    cJSON *o = cJSON_Parse(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return;
    }
    elastic_log_line line = {ELASTIC_LOG_OTHER, -1, 0, 0, 0, ""};
    line.step = (int64_t)number(o, "step", -1);
    /* A diverged step's loss is null in the log (JSON has no NaN): still a
     * step, a heartbeat like any other, its loss NaN for the progress line. */
    line.loss = cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "loss")) ? NAN : number(o, "loss", 0);
    line.seconds = number(o, "load_seconds", 0); /* start lines */
    line.time = number(o, "time", 0);
    const cJSON *event = cJSON_GetObjectItemCaseSensitive(o, "event");
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(o, "reason");
    if (cJSON_IsString(reason)) snprintf(line.reason, sizeof line.reason, "%s", reason->valuestring);
    if (!event) line.kind = line.step >= 0 ? ELASTIC_LOG_STEP : ELASTIC_LOG_OTHER;
    else if (cJSON_IsString(event) && strcmp(event->valuestring, "start") == 0) line.kind = ELASTIC_LOG_START;
    else if (cJSON_IsString(event) && strcmp(event->valuestring, "stop") == 0) line.kind = ELASTIC_LOG_STOP;
    else if (cJSON_IsString(event) && strcmp(event->valuestring, "save_wait") == 0) line.kind = ELASTIC_LOG_SAVE_WAIT;
    else if (cJSON_IsString(event) && strcmp(event->valuestring, "save") == 0) line.kind = ELASTIC_LOG_SAVE;
    cJSON_Delete(o);
    visit(ctx, &line);
}

int elastic_log_read(elastic_log_follower *f, void (*visit)(void *ctx, const elastic_log_line *line), void *ctx)
{
    int fd = -1;
    int status = tp_open_regular(f->path, &fd); /* a FIFO would block */
    if (status) return status == TP_ERR_NOT_FOUND ? TP_OK : status;
    FILE *file = fdopen(fd, "r");
    if (!file) {
        close(fd);
        return tp_fail(TP_ERR_IO, "%s: cannot read: %s", f->path, strerror(errno));
    }
    if (fseek(file, (long)f->offset, SEEK_SET) != 0) {
        fclose(file);
        return tp_fail(TP_ERR_IO, "%s: cannot seek: %s", f->path, strerror(errno));
    }
    /* Complete lines only: a line the trainer is still writing waits in
     * `partial` for its end. A line longer than the buffer is dropped. */
    char chunk[4096];
    size_t n, used = strlen(f->partial); /* partial's length, kept as it grows (not measured each byte) */
    while ((n = fread(chunk, 1, sizeof chunk, file)) > 0) {
        f->offset += (int64_t)n;
        for (size_t i = 0; i < n; i++) {
            if (chunk[i] == '\n') {
                parse_line(f->partial, visit, ctx);
                f->partial[0] = '\0';
                used = 0;
            } else if (used + 1 < sizeof f->partial) {
                f->partial[used++] = chunk[i];
                f->partial[used] = '\0';
            }
        }
    }
    fclose(file);
    return TP_OK;
}
