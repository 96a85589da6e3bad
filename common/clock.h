/* clock.h: elapsed time, for step times, stalls and rates. */
#ifndef TP_CLOCK_H
#define TP_CLOCK_H

/* Seconds on a monotonic clock (differences are durations). */
double now_seconds(void);

#endif
