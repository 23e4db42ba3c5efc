/* SPDX-License-Identifier: MIT */
/* optim_emulated.h — kernels/optim.cu's launchers (a gradient's add, per-layer clipping's
 * factor, one update of a record placed on the device, on f32 or compact state), compiled
 * for the CPU by optim_emulated.cpp (kernel_emulation.h's threads), under names of their
 * own.
 *
 * Purpose: test_optim_emulated.c calls emu_k_optim_update and the rest exactly as the CUDA
 * backend calls k_optim_update, with host pointers (the stream NULL): the launchers' own
 * plans, and the kernels' source, run in make test. Only where L2L_KERNEL_EMULATION is
 * defined (the build found the CUDA toolkit's headers).
 * Must never: be included beside kernels/optim.h (the names below rename its declarations).
 */
#ifndef L2L_OPTIM_EMULATED_H
#define L2L_OPTIM_EMULATED_H

#define k_grad_add emu_k_grad_add
#define k_clip_scale emu_k_clip_scale
#define k_optim_update emu_k_optim_update
#define k_optim_update_compact emu_k_optim_update_compact
#include "kernels/optim.h"

#endif /* L2L_OPTIM_EMULATED_H */
