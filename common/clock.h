/* clock.h: elapsed time, for step times, stalls and rates; and the time of
 * day for records. */
#ifndef TP_CLOCK_H
#define TP_CLOCK_H

/* Seconds on a monotonic clock (differences are durations). */
double now_seconds(void);

/* Seconds since the Unix epoch (wall-clock time, for records that other
 * processes compare: logs, events). */
double unix_seconds(void);

/* Sleeps for seconds (nothing when not above 0), the whole time even when
 * a signal's handler interrupts the wait: a held writer, or a straggler,
 * does not hurry because it is asked to stop. */
void sleep_seconds(double seconds);

#endif
