/* fault.c: the test hook (fault.h). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "fault.h"

static void fault_at(const char *point, const char *want);

void tp_fault_point(const char *point)
{
    const char *list = getenv("TP_CKPT_FAULT");
    /* Several points, separated by commas. */
    for (const char *want = list; want && *want;) {
        const char *comma = strchr(want, ',');
        char one[256];
        size_t n = comma ? (size_t)(comma - want) : strlen(want);
        if (n < sizeof one) {
            memcpy(one, want, n);
            one[n] = 0;
            fault_at(point, one);
        }
        want = comma ? comma + 1 : NULL;
    }
}

static void fault_at(const char *point, const char *want)
{
    size_t n = strlen(point);
    if (strcmp(want, point) == 0) raise(SIGKILL);
    if (strncmp(want, point, n) != 0 || want[n] != ':') return;
    /* POINT:TERM, :INT or :HUP: that signal, then the caller held at the
     * point long enough for the signal's handling (another thread) to act
     * while the window the point is in stays open. POINT:SLEEP:SECONDS: a
     * slow disk or store, the caller held there that long. POINT:WAIT:FILE:
     * held until FILE exists (a test's release: what it must see happen
     * while the caller is held has happened), 10 minutes at most; FILE.held
     * is made when the hold begins, for a test that waits for the point. */
    const char *name = want + n + 1;
    if (strncmp(name, "WAIT:", 5) == 0) {
        char held[4200];
        if ((size_t)snprintf(held, sizeof held, "%s.held", name + 5) < sizeof held) {
            int fd = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd >= 0) close(fd);
        }
        for (int tick = 0; tick < 60000 && access(name + 5, F_OK) != 0; tick++) sleep_seconds(0.01);
        return;
    }
    if (strncmp(name, "SLEEP:", 6) == 0) {
        sleep_seconds(atof(name + 6));
        return;
    }
    int signal = strcmp(name, "TERM") == 0 ? SIGTERM : strcmp(name, "INT") == 0 ? SIGINT : strcmp(name, "HUP") == 0 ? SIGHUP : 0;
    if (!signal) return;
    raise(signal);
    sleep_seconds(0.5);
}
