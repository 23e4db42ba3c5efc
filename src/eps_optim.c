/* eps_optim.c — STUB until the optimizer kernels land. */
#include "internal.h"
l2l_status l2l_schedule_lr(double *out, const l2l_schedule_config *schedule, double base_lr, int64_t t) {
  (void)out; (void)schedule; (void)base_lr; (void)t;
  return FAIL(L2L_ERR_UNSUPPORTED, "not written yet");
}
