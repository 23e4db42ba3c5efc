/* SPDX-License-Identifier: MIT */
/* timeline.c — a relay's record of its units of work (see core.h, "the timeline").
 *
 * Purpose: let every thread (compute, copies, optimizer workers) append what it did and
 * when, under one lock, for Chrome-trace export and the stats' busy seconds.
 * Must never: fail a step: without memory for an event, the event is dropped.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"

void timeline_init(struct core_timeline *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
  t->origin = core_now();
}

void timeline_free(struct core_timeline *t) {
  pthread_mutex_destroy(&t->lock);
  free(t->events);
  t->events = NULL;
}

void timeline_reset(struct core_timeline *t) {
  pthread_mutex_lock(&t->lock);
  t->count = 0;
  memset(t->phase_seconds, 0, sizeof t->phase_seconds);
  memset(t->thread_seconds, 0, sizeof t->thread_seconds);
  pthread_mutex_unlock(&t->lock);
}

void timeline_add(struct core_timeline *t, int layer, int micro_batch, int phase, int thread,
                  double start, double end) {
  pthread_mutex_lock(&t->lock);
  if (phase >= 0 && phase < L2L_TIMELINE_PHASES) t->phase_seconds[phase] += end - start;
  if (thread >= 0 && thread < L2L_TIMELINE_THREADS) t->thread_seconds[thread] += end - start;
  if (t->count == t->cap) {
    int64_t cap = t->cap ? 2 * t->cap : 1024;
    l2l_relay_event *events = realloc(t->events, (size_t)cap * sizeof *events);
    if (events == NULL) {   /* the timeline is best effort: drop the event */
      pthread_mutex_unlock(&t->lock);
      return;
    }
    t->events = events;
    t->cap = cap;
  }
  t->events[t->count++] = (l2l_relay_event){layer, micro_batch, phase, thread,
                                            start - t->origin, end - t->origin};
  pthread_mutex_unlock(&t->lock);
}
