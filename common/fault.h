/* fault.h: the test hook of the libraries (docs/FORMAT.md "Test hook"). */
#ifndef TP_FAULT_H
#define TP_FAULT_H

/* Kills the process with SIGKILL when the environment variable
 * TP_CKPT_FAULT names this point; with POINT:TERM (INT, HUP) raises that
 * signal there and holds the caller at the point for half a second;
 * POINT:SLEEP:S holds it S seconds; POINT:WAIT:FILE holds it until FILE
 * exists (10 minutes at most), and makes FILE.held as it begins to. Several
 * points are separated by commas. */
void tp_fault_point(const char *point);

#endif
