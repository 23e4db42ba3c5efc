/* relay.c — STUB while the relay is being written: every call refuses. */
#include "internal.h"

#define STUB(...) return FAIL(L2L_ERR_UNSUPPORTED, "not written yet")
void l2l_relay_config_default(l2l_relay_config *out) { (void)out; }
l2l_status l2l_relay_new(l2l_relay **out, l2l_layer *const *layers, int nlayers,
                         const l2l_relay_config *config) { (void)out; (void)layers; (void)nlayers; (void)config; STUB(); }
void l2l_relay_free(l2l_relay *run) { (void)run; }
int l2l_relay_layer_count(const l2l_relay *run) { (void)run; return -1; }
l2l_layer *l2l_relay_layer(const l2l_relay *run, int index) { (void)run; (void)index; return NULL; }
l2l_status l2l_relay_insert(l2l_relay *run, int index, l2l_layer *layer) { (void)run; (void)index; (void)layer; STUB(); }
l2l_status l2l_relay_remove(l2l_relay *run, int index) { (void)run; (void)index; STUB(); }
l2l_status l2l_relay_replace(l2l_relay *run, int index, l2l_layer *layer) { (void)run; (void)index; (void)layer; STUB(); }
l2l_status l2l_relay_set_frozen(l2l_relay *run, int index, int frozen) { (void)run; (void)index; (void)frozen; STUB(); }
int l2l_relay_frozen(const l2l_relay *run, int index) { (void)run; (void)index; return -1; }
l2l_status l2l_relay_set_stash(l2l_relay *run, int boundary, l2l_stash_policy policy) { (void)run; (void)boundary; (void)policy; STUB(); }
l2l_status l2l_relay_set_inner(l2l_relay *run, int index, l2l_inner_policy policy) { (void)run; (void)index; (void)policy; STUB(); }
l2l_status l2l_relay_set_micro_batch(l2l_relay *run, int64_t micro_batch) { (void)run; (void)micro_batch; STUB(); }
l2l_status l2l_relay_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch) { (void)loss; (void)run; (void)batch; STUB(); }
l2l_status l2l_relay_evaluate(double *loss, l2l_relay *run, const l2l_relay_batch *batch) { (void)loss; (void)run; (void)batch; STUB(); }
l2l_status l2l_relay_sync(l2l_relay *run) { (void)run; STUB(); }
l2l_status l2l_relay_get_stats(l2l_relay_stats *out, const l2l_relay *run) { (void)out; (void)run; STUB(); }
l2l_status l2l_relay_events(l2l_relay_event *out, const l2l_relay *run, int64_t first, int64_t count) { (void)out; (void)run; (void)first; (void)count; STUB(); }
l2l_status l2l_relay_param_state(l2l_tensor **out, l2l_relay *run, const l2l_param *param, int which) { (void)out; (void)run; (void)param; (void)which; STUB(); }
