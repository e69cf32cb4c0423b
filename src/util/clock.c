/* The monotonic clock (contract in util.h). */
#include <time.h>

#include "util/util.h"

double evt_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
