/* SPDX-License-Identifier: MIT */
/* relay.c — the relay object: its config, creation and freeing, the model as a list the
 * script changes between steps (insert, remove, replace, freeze, per-boundary and
 * per-layer policies), stats and events, and the restores of a checkpoint.
 *
 * Purpose: every change of the model checks first and changes nothing when refused; the
 * EPS keeps every record's state across changes (records shared by an old and a new
 * layer keep theirs).
 * Must never: change the model while a step's updates run (each change waits for them).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan/plan.h"
#include "relay.h"

void l2l_relay_config_default(l2l_relay_config *out) {
  if (out == NULL) return;
  options_default(out);   /* the table's (core/options.def) */
  /* a GPU runs 16-bit products at many times its fp32 rate; a CPU gains nothing */
  if (!backend_device_is_host()) out->precision = L2L_BF16;
}

/* The refusal `status`, its detail naming `field`. */
#define REFUSED(status, field) error_note_field((status), #field)

/* The table's checks of each field (core/options.def), then the rules across fields. */
static l2l_status check_config(const l2l_relay_config *c) {
  const char *f = "l2l_relay_config_check";
  if (c == NULL) return core_fail_in(f, L2L_ERR_INVALID, "config is NULL");
  /* (ranges with a hole, which a row's bounds cannot say) */
  if (isfinite(c->loss_scale) && c->loss_scale != 0 &&
      !(c->loss_scale >= MIN_LOSS_SCALE && c->loss_scale <= MAX_LOSS_SCALE))
    return REFUSED(core_fail_in(f, L2L_ERR_INVALID, NAMED_CONFIG(loss_scale) " must be 0 (off) or 2^-64 to "
                                "2^100, got %g", c->loss_scale), loss_scale);
  if (c->param_slots != 0 && (c->param_slots < 2 || c->param_slots > MAX_PARAM_SLOTS))
    return REFUSED(core_fail_in(f, L2L_ERR_INVALID, NAMED_CONFIG(param_slots) " must be 0 (two) or 2 to %d, "
                                "got %d", MAX_PARAM_SLOTS, c->param_slots), param_slots);
  TRY(options_check(L2L_OPTION_RELAY, c, c->optimizer.kind, f, "config->"));
  TRY(optimizer_check(&c->optimizer));
  TRY(schedule_check(&c->schedule));
  if (c->master == L2L_BF16 && c->precision != L2L_BF16)
    return REFUSED(core_fail_in(f, L2L_ERR_INVALID, NAMED_CONFIG(master) " bf16 needs precision bf16 (the bf16 "
                                "masters are what the device reads), got precision %s",
                                l2l_dtype_name(c->precision)), master);
  if (c->grad_precision == L2L_F16 && c->loss_scale == 0)
    return REFUSED(core_fail_in(f, L2L_ERR_INVALID, NAMED_CONFIG(grad_precision) " f16 needs loss_scale > 0 (f16 "
                                "gradients flush below 6e-8 and turn inf above 65504: loss scaling keeps "
                                "them in range and skips a step that overflows)"), grad_precision);
  return L2L_OK;
}

/* The policy of boundary `index` (the input of that layer) by the config's default. */
static l2l_stash_policy default_stash(const l2l_relay_config *c, int index) {
  if (c->stash != L2L_STASH_RECOMPUTE) return c->stash;
  return index % c->recompute_every == 0 ? L2L_STASH_DEVICE : L2L_STASH_RECOMPUTE;
}

static l2l_status check_layer(const l2l_relay *run, const l2l_layer *layer, int replacing) {
  if (l2l_layer_param_count(layer) < 0) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  for (int i = 0; i < run->count; i++)
    if (run->layers[i].layer == layer && i != replacing)
      return FAIL(L2L_ERR_INVALID, "the layer is already in the relay (position %d)", i);
  const void *owner = layer_owner(layer);
  if (owner != NULL && owner != run)
    return FAIL(L2L_ERR_STATE, "the layer is in another relay (remove it there first)");
  l2l_layer_config c, other;
  l2l_layer_get_config(&c, layer);
  for (int i = 0; i < run->count; i++) {
    if (i == replacing) continue;
    l2l_layer_get_config(&other, run->layers[i].layer);
    if (other.dim != c.dim)
      return FAIL(L2L_ERR_INVALID, "the layer has dim %lld but the relay's layers have dim %lld",
                  (long long)c.dim, (long long)other.dim);
    break;
  }
  for (int r = 0; r < l2l_layer_param_count(layer); r++) {
    const l2l_param *p = l2l_layer_param(layer, r);
    const l2l_tensor *v = param_value(p);
    /* (a record the relay holds already, a tied table, may be pinned: eps_master_pool) */
    if (l2l_tensor_pool(v) != L2L_POOL_HOST && eps_find(&run->eps, p) == NULL)
      return FAIL(L2L_ERR_INVALID, "the layer's parameter '%s' is in pool '%s': a relay's layers "
                  "keep their parameters in the host pool (the EPS)",
                  l2l_param_name(l2l_layer_param(layer, r)),
                  l2l_pool_name((l2l_pool_kind)l2l_tensor_pool(v)));
  }
  return L2L_OK;
}

static l2l_status grow(l2l_relay *run) {
  if (run->count < run->cap) return L2L_OK;
  int cap = run->cap ? 2 * run->cap : 16;
  struct relay_layer *layers = realloc(run->layers, (size_t)cap * sizeof *layers);
  if (layers == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for the relay's layer list");
  run->layers = layers;
  run->cap = cap;
  return L2L_OK;
}

/* How the EPS holds p's record under the relay's precision and master (the layers' rule). */
static struct layers_record_dtypes held(const l2l_relay *run, const l2l_param *p) {
  return layers_record_dtypes(p, run->config.precision, run->config.master);
}

/* Whether p's record lives on the device while its layer is in the relay: value (in its
   master's dtype) and grad (f32) device tensors. */
static bool on_device(const l2l_relay *run) { return run->config.placement == L2L_PLACE_DEVICE; }

/* p's value and grad where the relay keeps them (pool, value dtype); a failure puts back
   what moved. */
static l2l_status param_home(l2l_param *p, l2l_pool_kind pool, l2l_dtype dtype, bool grad) {
  l2l_pool_kind was = (l2l_pool_kind)l2l_tensor_pool(param_value(p));
  l2l_dtype was_dtype = (l2l_dtype)l2l_tensor_dtype(param_value(p));
  TRY(param_rehome(p, pool, dtype));
  l2l_status status = grad ? param_rehome_grad(p, pool) : L2L_OK;
  if (status != L2L_OK) (void)param_rehome(p, was, was_dtype);
  return status;
}

/* A layer's parameters leaving the relay's pinned or bf16 masters or its device: f32 host
   values (and grads) again, once no record of the EPS holds them (a tied one may stay with
   another layer). A failure (no memory) leaves a value where it was: still its value,
   refused by the next relay's check. */
static void masters_home(l2l_relay *run, l2l_layer *layer, bool freeing) {
  for (int r = 0; r < l2l_layer_param_count(layer); r++) {
    l2l_param *p = l2l_layer_param(layer, r);
    const l2l_tensor *v = param_value(p);
    bool away = l2l_tensor_pool(v) != L2L_POOL_HOST || l2l_tensor_dtype(v) != L2L_F32;
    if (away && (freeing || eps_find(&run->eps, p) == NULL)) {
      param_set_guard_copy(p, NULL);   /* (the EPS's, gone with its record) */
      (void)param_home(p, L2L_POOL_HOST, L2L_F32, true);
    }
  }
}

/* The EPS's records become those of list[0 .. n) (the relay's layers as a change leaves
   them), as layers_records lists a model's records: each once, at its first user, layer
   by layer (the planner's and the checkpoint's rule). A joining value moves where the EPS
   keeps it (eps_master_pool: with master bf16 the low-precision parameters' values become
   bf16 in the pinned pool; on a GPU small f32 ones go there too, the device reading them);
   a failure puts every joining one back and changes nothing (*failed_layer: the layer of
   list whose record failed, -1 when none). A new record's stream for stochastic rounding:
   its first user's rng id and its place in that layer. */
static l2l_status eps_records(l2l_relay *run, l2l_layer *const *list, int n, int *failed_layer) {
  struct layers_record *recs = NULL;
  int count = 0, failed = -1;
  *failed_layer = -1;
  TRY(layers_records(&recs, &count, (const l2l_layer *const *)list, NULL, n));
  struct eps_record_source *sources = calloc((size_t)(count > 0 ? count : 1), sizeof *sources);
  l2l_status status = sources ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory for a list of %d records", count);
  int at = 0;
  for (; at < count && status == L2L_OK; at++) {
    l2l_param *p = recs[at].param;
    /* A joining record's value where the EPS keeps it (eps_master_pool; a bf16 master
       rounded on the host, as with the records there, then copied); a record the EPS
       holds already stays where it is (its master is the EPS's: auto may have moved it
       either way) */
    bool joining = eps_find(&run->eps, p) == NULL;
    struct layers_record_dtypes d = held(run, p);
    l2l_pool_kind home = eps_master_pool(&run->eps, d.master, d.staging != L2L_F32,
                                         l2l_tensor_numel(param_value(p)));
    bool via_host = d.master == L2L_BF16 || !on_device(run);   /* (an f32 one goes straight) */
    if (joining && home != L2L_POOL_HOST && via_host) status = param_rehome(p, home, d.master);
    if (status == L2L_OK && joining && on_device(run))
      status = param_home(p, L2L_POOL_DEVICE, d.master, true);
    if (status != L2L_OK) failed = at;
    /* the f32 values that left the host pool: no step makes them again, so their pages
       go back as they free (a 7 B model's would be 28 GB kept beside its bf16 masters) */
    if (joining && (home != L2L_POOL_HOST || on_device(run))) pool_trim(L2L_POOL_HOST);
    sources[at] = (struct eps_record_source){
        .param = p, .name = l2l_param_name(p), .master = param_value(p),
        .grad = param_grad(p), .decays = l2l_param_decays(p) == 1, .device = on_device(run),
        .staging = d.staging, .users = recs[at].users,
        .stream = (uint64_t)l2l_layer_rng_id(list[recs[at].layer]) << 8 | (uint64_t)recs[at].place};
  }
  if (status == L2L_OK) status = eps_set_records(&run->eps, sources, count, &failed);
  if (failed >= 0) *failed_layer = recs[failed].layer;
  for (int i = 0; status != L2L_OK && i < at; i++)   /* the joining masters home again */
    if ((l2l_tensor_pool(param_value(recs[i].param)) != L2L_POOL_HOST || on_device(run)) &&
        eps_find(&run->eps, recs[i].param) == NULL)
      (void)param_home(recs[i].param, L2L_POOL_HOST, L2L_F32, on_device(run));
  free(sources);
  free(recs);
  return status;
}

l2l_status relay_move_records(l2l_relay *run, const struct plan_layer *layers, int L) {
  int cap = 0, n = 0;
  for (int k = 0; k < L; k++) cap += l2l_layer_param_count(layers[k].layer);
  struct move { l2l_param *param; struct eps_record *rec; struct eps_move m; } *moves =
      calloc((size_t)(cap > 0 ? cap : 1), sizeof *moves);
  if (moves == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to move %d records", cap);
  for (int k = 0; k < L; k++)
    for (int r = 0; r < l2l_layer_param_count(layers[k].layer); r++) {
      l2l_param *p = l2l_layer_param(layers[k].layer, r);
      struct eps_record *rec = eps_find(&run->eps, p);
      bool to = layers[k].on_device >> r & 1, seen = false;
      for (int i = 0; i < n; i++) seen |= moves[i].param == p;   /* (a tied record: once) */
      if (seen || rec == NULL || eps_on_device(rec) == to) continue;
      moves[n++] = (struct move){.param = p, .rec = rec};
    }
  /* the last step's updates may still run (and read ahead, or write a spill file): every
     one settled before a record moves */
  if (n > 0) eps_sync(&run->eps);
  l2l_status status = L2L_OK;
  for (int i = 0; status == L2L_OK && i < n; i++)
    status = eps_move_prepare(&moves[i].m, moves[i].rec, !eps_on_device(moves[i].rec));
  for (int i = 0; i < n; i++) {   /* every one prepared (or zero), or none moves */
    if (status != L2L_OK) {
      eps_move_drop(&moves[i].m);
      continue;
    }
    l2l_tensor *value = NULL, *grad = NULL;
    eps_move_commit(&moves[i].m, moves[i].rec, &value, &grad);
    param_adopt(moves[i].param, value, grad);
    param_set_guard_copy(moves[i].param, eps_guard_copy(moves[i].rec));
  }
  free(moves);
  if (n > 0) pool_trim(L2L_POOL_HOST);   /* (the host masters of records moved away) */
  if (status == L2L_OK && n > 0) (void)eps_device_words(&run->eps);   /* (else at eps_prepare) */
  return status;
}

/* A change of the relay's list: `layer` inserted at index, the layer there removed
   (layer NULL), or replaced by `layer`. */
enum change { CHANGE_INSERT, CHANGE_REMOVE, CHANGE_REPLACE };

/* The EPS's records as the change will leave the list (eps_records), before it is made. */
static l2l_status records_for(l2l_relay *run, enum change change, int index, l2l_layer *layer) {
  int n = run->count + (change == CHANGE_INSERT) - (change == CHANGE_REMOVE), at = 0, failed;
  l2l_layer **list = calloc((size_t)n + 1, sizeof *list);
  if (list == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a list of %d layers", n);
  for (int k = 0; k <= run->count; k++) {
    if (k == index && change != CHANGE_REMOVE) list[at++] = layer;
    if (k < run->count && !(k == index && change != CHANGE_INSERT)) list[at++] = run->layers[k].layer;
  }
  l2l_status status = eps_records(run, list, n, &failed);
  free(list);
  return status;
}

static l2l_status insert_at(l2l_relay *run, int index, l2l_layer *layer) {
  TRY(grow(run));
  TRY(records_for(run, CHANGE_INSERT, index, layer));
  layer_set_owner(layer, run);
  memmove(&run->layers[index + 1], &run->layers[index],
          (size_t)(run->count - index) * sizeof *run->layers);
  run->layers[index] = (struct relay_layer){.layer = layer, .frozen = false,
                                            .stash = default_stash(&run->config, index),
                                            .inner = run->config.inner};
  run->count++;
  return L2L_OK;
}

/* A new relay's layers, each checked (against those before it), then their records join
   the EPS at once (one listing: a layer at a time would list the model L times). */
static l2l_status first_layers(l2l_relay *run, l2l_layer *const *layers, int nlayers) {
  l2l_status status = L2L_OK;
  int failed = -1;
  for (int i = 0; i < nlayers && status == L2L_OK; i++) {
    status = check_layer(run, layers[i], -1);
    if (status == L2L_OK) status = grow(run);
    if (status == L2L_OK)
      run->layers[run->count++] = (struct relay_layer){.layer = layers[i], .frozen = false,
                                                       .stash = default_stash(&run->config, i),
                                                       .inner = run->config.inner};
    else failed = i;
  }
  if (status == L2L_OK) {
    l2l_layer **list = calloc((size_t)nlayers + 1, sizeof *list);
    for (int i = 0; list && i < nlayers; i++) list[i] = layers[i];
    status = list ? eps_records(run, list, nlayers, &failed)
                  : FAIL(L2L_ERR_NOMEM, "no memory for a list of %d layers", nlayers);
    free(list);
  }
  if (status != L2L_OK) {
    run->count = 0;   /* none is the relay's */
    if (failed < 0) return status;
    return error_note_layer(
        error_wrap(status, L2L_NAMED_LAYER "layers[%d]" L2L_NAMED_END ": ", failed), failed);
  }
  for (int i = 0; i < nlayers; i++) layer_set_owner(layers[i], run);
  return L2L_OK;
}

/* The optimizer's workers when the config says 0: one per CPU the process may run on,
   less, where the device is not host memory, the relay's own busy threads (the compute
   thread that queues the kernels, the copy lanes each way, and with ranks the
   communication thread), at least one: updates that took every core would delay the
   compute thread's launches and leave a GPU waiting. On the CPU backend the step's
   arithmetic and the updates share the cores in turn, so there it takes them all. */
static int default_workers(const l2l_relay_config *config) {
  int cpus = core_cpus();
  if (relay_device_is_host()) return cpus;
  int busy = THREAD_D2H + 1 + (config->dist == L2L_DIST_MPI ? 1 : 0);
  return cpus - busy >= 1 ? cpus - busy : 1;
}

l2l_status l2l_relay_new(l2l_relay **out, l2l_layer *const *layers, int nlayers,
                         const l2l_relay_config *config) {
  cpu_runtime_init();
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY_AS(check_config(config));
  if (nlayers < 0) return FAIL(L2L_ERR_INVALID, "nlayers must be >= 0, got %d", nlayers);
  if (nlayers > 0 && layers == NULL)
    return FAIL(L2L_ERR_INVALID, "layers is NULL, but nlayers is %d (a list of that many is needed)", nlayers);
  l2l_relay *run = calloc(1, sizeof *run);
  if (run == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a relay");
  run->config = *config;
  run->config.spill_dir = NULL;   /* the copy below, once the EPS has its file */
  if (run->config.param_slots == 0) run->config.param_slots = 2;
  if (run->config.loss_scale_window == 0) run->config.loss_scale_window = 2000;
  run->scale = run->config.loss_scale;
  run->stats.loss_scale = run->scale;
  pthread_mutex_init(&run->lock, NULL);
  timeline_init(&run->timeline);
  run->stats.grad_norm = -1;
  int threads = config->optimizer_threads > 0 ? config->optimizer_threads : default_workers(config);
  bool eps_up = false, h2d_up = false, d2h_up = false;
  l2l_status status = config->dist == L2L_DIST_MPI ? dist_start() : L2L_OK;
  if (status == L2L_OK && config->spill_dir != NULL) {
    run->spill_dir = strdup(config->spill_dir);
    if (run->spill_dir == NULL) status = FAIL(L2L_ERR_NOMEM, "no memory for config->spill_dir");
  }
  /* (the communication thread's lane follows the optimizer workers': 3 ..) */
  struct eps_settings eps = {
      .optimizer = &config->optimizer, .precision = config->precision, .threads = threads,
      .seed = config->seed, .timeline = &run->timeline,
      .dist_lane = config->dist == L2L_DIST_MPI ? THREAD_D2H + 1 + threads : -1,
      .host_budget = config->host_budget, .spill_dir = run->spill_dir,
      .pinned_masters = !relay_device_is_host()};
  if (status == L2L_OK) status = eps_init(&run->eps, &eps);
  eps_up = status == L2L_OK;
  run->config.spill_dir = run->spill_dir;
  run->stats.dist_ranks = config->dist == L2L_DIST_MPI && status == L2L_OK ? dist_size_now() : 1;
  if (status == L2L_OK) status = queue_start(&run->h2d, 1, THREAD_H2D, "host-to-device copy");
  h2d_up = status == L2L_OK;
  if (status == L2L_OK) status = queue_start(&run->d2h, 1, THREAD_D2H, "device-to-host copy");
  d2h_up = status == L2L_OK;
  run->magic = RELAY_MAGIC;
  if (status == L2L_OK) status = first_layers(run, layers, nlayers);
  if (status != L2L_OK) {
    if (d2h_up && h2d_up && eps_up) {
      l2l_relay_free(run);
    } else {
      if (h2d_up) queue_stop(&run->h2d);
      if (eps_up) eps_free(&run->eps);
      free(run->spill_dir);
      free(run);
    }
    return error_as(__func__, status);
  }
  *out = run;
  return L2L_OK;
}

l2l_status l2l_relay_config_check(const l2l_relay_config *config) { return error_as(__func__, check_config(config)); }

int l2l_relay_option_count(void) { return options_count; }

l2l_status l2l_relay_option(const l2l_option **out, int index) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (index < 0 || index >= options_count)
    return FAIL(L2L_ERR_INVALID, "index must be 0 to %d, got %d", options_count - 1, index);
  *out = &options_rows[index];
  return L2L_OK;
}

l2l_status relay_enter(const l2l_relay *run, const char *func) {
  if (!relay_ok(run)) return core_fail_in(func, L2L_ERR_INVALID, "run is not a live relay");
  l2l_relay *r = (l2l_relay *)run;
  const char *running = NULL;
  if (!atomic_compare_exchange_strong(&r->in_call, &running, func))
    return core_fail_in(func, L2L_ERR_STATE,
                        "%s is running on this relay: a relay takes one call at a time (a "
                        "callback of its own layers, or another thread, must wait until it "
                        "returns)", running);
  return L2L_OK;
}

void relay_leave(const l2l_relay *run) { atomic_store(&((l2l_relay *)run)->in_call, NULL); }

/* A relay in a call is not freed: the call would go on in freed memory. The refusal is
   in l2l_last_error (this function returns nothing, like every free of the API). */
void l2l_relay_free(l2l_relay *run) {
  if (relay_enter(run, __func__) != L2L_OK) return;
  queue_stop(&run->h2d);
  queue_stop(&run->d2h);
  eps_free(&run->eps);
  l2l_plan_free(run->auto_plan);
  for (int i = 0; i < run->count; i++) {
    masters_home(run, run->layers[i].layer, true);
    layer_set_owner(run->layers[i].layer, NULL);
  }
  pthread_mutex_destroy(&run->lock);
  timeline_free(&run->timeline);
  free(run->layers);
  free(run->spill_dir);
  run->magic = 0;
  free(run);
}

/* The queries answer -1 (NULL) for a relay in another call, as for one that is not a
   relay: l2l_last_error says which. */
int l2l_relay_layer_count(const l2l_relay *run) {
  if (relay_enter(run, __func__) != L2L_OK) return -1;
  int count = run->count;
  relay_leave(run);
  return count;
}

l2l_layer *l2l_relay_layer(const l2l_relay *run, int index) {
  if (relay_enter(run, __func__) != L2L_OK) return NULL;
  l2l_layer *layer = index >= 0 && index < run->count ? run->layers[index].layer : NULL;
  relay_leave(run);
  return layer;
}

/* Whether `layer` holds parameter p (NULL holds nothing). */
static bool holds(const l2l_layer *layer, const l2l_param *p) {
  for (int q = 0; layer != NULL && q < l2l_layer_param_count(layer); q++)
    if (l2l_layer_param(layer, q) == p) return true;
  return false;
}

/* The first layer other than `index` that holds parameter p (with `trainable`, a layer
   not frozen), or -1. */
static int holder_of(const l2l_relay *run, const l2l_param *p, int index, bool trainable) {
  for (int j = 0; j < run->count; j++)
    if (j != index && !(trainable && run->layers[j].frozen) && holds(run->layers[j].layer, p))
      return j;
  return -1;
}

/* Layer `index` is about to leave (`incoming`, if not NULL, taking its place): refused
   where a later layer holds one of its records, no earlier one does and the newcomer does
   not (a head tied to this embedding's table). The record would be that layer's own,
   named after it (a checkpoint names a record by its first holder), while the layer says
   it is tied: a save no load could read. */
static l2l_status check_leaving(const l2l_relay *run, int index, const l2l_layer *incoming) {
  const l2l_layer *layer = run->layers[index].layer;
  for (int r = 0; r < l2l_layer_param_count(layer); r++) {
    const l2l_param *p = l2l_layer_param(layer, r);
    int j = holder_of(run, p, index, false);   /* (an earlier holder stays first: the name stays) */
    if (j > index && !holds(incoming, p))
      return error_note_layer(FAIL(L2L_ERR_STATE, "the layer's parameter '%s' is also " NAMED_LAYER
                                   "'s (%s, tied to it): remove or replace that layer first",
                                   l2l_param_name(p), j, l2l_layer_name(run->layers[j].layer)), j);
  }
  return L2L_OK;
}

#define CHECK_INDEX(index, lo, hi, what)                                                   \
  do {                                                                                     \
    if ((index) < (lo) || (index) > (hi))                                                  \
      return FAIL(L2L_ERR_INVALID, what " must be %d to %d, got %d", (lo), (hi), (index)); \
  } while (0)

l2l_status l2l_relay_insert(l2l_relay *run, int index, l2l_layer *layer) {
  RELAY_ENTER(run);
  CHECK_INDEX(index, 0, run->count, "index");
  TRY_AS(check_layer(run, layer, -1));
  eps_sync(&run->eps);
  return error_as(__func__, insert_at(run, index, layer));
}

l2l_status l2l_relay_remove(l2l_relay *run, int index) {
  RELAY_ENTER(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  TRY_AS(check_leaving(run, index, NULL));
  eps_sync(&run->eps);
  TRY_AS(records_for(run, CHANGE_REMOVE, index, NULL));
  masters_home(run, run->layers[index].layer, false);
  layer_set_owner(run->layers[index].layer, NULL);
  memmove(&run->layers[index], &run->layers[index + 1],
          (size_t)(run->count - index - 1) * sizeof *run->layers);
  run->count--;
  return L2L_OK;
}

l2l_status l2l_relay_replace(l2l_relay *run, int index, l2l_layer *layer) {
  RELAY_ENTER(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  TRY_AS(check_layer(run, layer, index));
  TRY_AS(check_leaving(run, index, layer));
  eps_sync(&run->eps);
  /* Records the new layer shares with the old one (or another) keep their state. */
  struct relay_layer old = run->layers[index];
  TRY_AS(records_for(run, CHANGE_REPLACE, index, layer));
  masters_home(run, old.layer, false);
  layer_set_owner(old.layer, NULL);
  layer_set_owner(layer, run);
  run->layers[index].layer = layer;
  run->layers[index].frozen = false;
  run->layers[index].planned = PLANNED_NONE;
  return L2L_OK;
}

l2l_status l2l_relay_set_frozen(l2l_relay *run, int index, int frozen) {
  RELAY_ENTER(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  if (frozen != 0 && frozen != 1) return FAIL(L2L_ERR_INVALID, "frozen must be 0 or 1, got %d", frozen);
  /* Frozen part way through an accumulation, the layer is not updated by it: the gradient
     its records collected so far is dropped (as an accumulation's end clears what it did
     not use), but a record a trainable layer also holds (a tied table) keeps its sum. So
     every accumulator is zero where an accumulation ends, and a checkpoint there, which
     keeps no gradient, resumes the run that went on. */
  if (frozen && !run->layers[index].frozen && run->steps % run->config.accumulate != 0) {
    eps_sync(&run->eps);
    const l2l_layer *layer = run->layers[index].layer;
    for (int r = 0; r < l2l_layer_param_count(layer); r++) {
      l2l_param *p = l2l_layer_param(layer, r);
      struct eps_record *rec = eps_find(&run->eps, p);
      if (rec != NULL && holder_of(run, p, index, true) < 0) eps_drop_gradient(&run->eps, rec);
    }
  }
  run->layers[index].frozen = frozen;
  return L2L_OK;
}

int l2l_relay_frozen(const l2l_relay *run, int index) {
  if (relay_enter(run, __func__) != L2L_OK) return -1;
  int frozen = index >= 0 && index < run->count ? run->layers[index].frozen : -1;
  relay_leave(run);
  return frozen;
}

l2l_status l2l_relay_set_stash(l2l_relay *run, int boundary, l2l_stash_policy policy) {
  RELAY_ENTER(run);
  if (run->count < 2) return FAIL(L2L_ERR_INVALID, "the relay has no boundary (fewer than 2 layers)");
  CHECK_INDEX(boundary, 1, run->count - 1, "boundary");
  if (policy < L2L_STASH_DEVICE || policy > L2L_STASH_RECOMPUTE)
    return FAIL(L2L_ERR_INVALID, "policy must be device (0), host (1) or recompute (2), got %d", policy);
  run->layers[boundary].stash = policy;
  return L2L_OK;
}

l2l_status l2l_relay_set_inner(l2l_relay *run, int index, l2l_inner_policy policy) {
  RELAY_ENTER(run);
  CHECK_INDEX(index, 0, run->count - 1, "index");
  if (policy < L2L_INNER_RECOMPUTE || policy > L2L_INNER_SWAP)
    return FAIL(L2L_ERR_INVALID, "policy must be recompute (0), keep (1) or swap (2), got %d", policy);
  run->layers[index].inner = policy;
  return L2L_OK;
}

int l2l_relay_stash(const l2l_relay *run, int boundary) {
  if (relay_enter(run, __func__) != L2L_OK) return -1;
  int policy = boundary >= 1 && boundary < run->count ? (int)run->layers[boundary].stash : -1;
  relay_leave(run);
  return policy;
}

int l2l_relay_inner(const l2l_relay *run, int index) {
  if (relay_enter(run, __func__) != L2L_OK) return -1;
  int policy = index >= 0 && index < run->count ? (int)run->layers[index].inner : -1;
  relay_leave(run);
  return policy;
}

l2l_status l2l_relay_set_micro_batch(l2l_relay *run, int64_t micro_batch) {
  RELAY_ENTER(run);
  if (micro_batch < 1)
    return FAIL(L2L_ERR_INVALID, "micro_batch must be >= 1, got %lld", (long long)micro_batch);
  run->config.micro_batch = micro_batch;
  return L2L_OK;
}

l2l_status l2l_relay_set_device_budget(l2l_relay *run, uint64_t bytes) {
  RELAY_ENTER(run);
  run->config.device_budget = bytes;
  return L2L_OK;
}

l2l_status l2l_relay_set_host_budget(l2l_relay *run, uint64_t bytes) {
  RELAY_ENTER(run);
  run->config.host_budget = bytes;
  eps_set_host_budget(&run->eps, bytes);
  return L2L_OK;
}

l2l_status l2l_relay_apply_plan(l2l_relay *run, const l2l_plan *plan) {
  RELAY_ENTER(run);
  return error_as(__func__, relay_apply_plan(run, plan));
}

l2l_status relay_check_plan(const l2l_relay *run, const l2l_plan *plan) {
  int n = run->count;
  l2l_layer **list = calloc((size_t)n + 1, sizeof *list);
  bool *frozen = calloc((size_t)n + 1, sizeof *frozen);
  if (list == NULL || frozen == NULL) {
    free(list), free(frozen);
    return FAIL(L2L_ERR_NOMEM, "no memory for a plan of %d layers", n);
  }
  for (int k = 0; k < n; k++) list[k] = run->layers[k].layer, frozen[k] = run->layers[k].frozen;
  l2l_status status = plan_check_model(plan, list, frozen, n, &run->config);
  free(list), free(frozen);
  return status;
}

l2l_status relay_apply_plan(l2l_relay *run, const l2l_plan *plan) {
  l2l_plan_summary summary;
  TRY(l2l_plan_get(&summary, plan));
  int n = run->count;
  /* read it all, and check it was made for this model, before changing anything */
  l2l_plan_layer *layers = calloc((size_t)n + 1, sizeof *layers);
  if (layers == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a plan of %d layers", n);
  l2l_status status = relay_check_plan(run, plan);
  if (status != L2L_OK) {
    free(layers);
    return status;
  }
  for (int k = 0; k < n; k++) l2l_plan_get_layer(&layers[k], plan, k);
  run->config.micro_batch = summary.micro_batch;
  const bool placing = run->config.placement == L2L_PLACE_AUTO;
  for (int k = 0; k < n; k++) {   /* a plan's policies are valid ones (l2l_plan_new) */
    run->layers[k].inner = layers[k].inner;
    if (k >= 1) run->layers[k].stash = layers[k].stash;
    run->layers[k].planned = !placing ? PLANNED_NONE : layers[k].on_device ? PLANNED_DEVICE
                                                                           : PLANNED_HOME;
  }
  free(layers);
  return L2L_OK;
}

l2l_status relay_sync_now(l2l_relay *run) {
  queue_drain(&run->d2h);
  eps_sync(&run->eps);
  TRY(relay_check_async(run));
  return eps_io_status(&run->eps);
}

l2l_status l2l_relay_sync(l2l_relay *run) {
  RELAY_ENTER(run);
  return error_as(__func__, relay_sync_now(run));
}

l2l_status l2l_relay_get_stats(l2l_relay_stats *out, const l2l_relay *run) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  RELAY_ENTER(run);
  l2l_relay *r = (l2l_relay *)run;
  eps_sync(&r->eps);   /* optimizer time is complete only when the updates are */
  *out = run->stats;
  out->host_eps_bytes = eps_host_bytes(&run->eps);
  pthread_mutex_lock(&r->timeline.lock);
  out->events = run->timeline.count;
  out->optimizer_seconds = run->timeline.phase_seconds[L2L_PHASE_UPDATE];
  out->h2d_seconds = run->timeline.thread_seconds[THREAD_H2D];
  out->d2h_seconds = run->timeline.thread_seconds[THREAD_D2H];
  pthread_mutex_unlock(&r->timeline.lock);
  out->dist_sent_bytes = out->dist_received_bytes = eps_dist_bytes(&run->eps);
  struct eps_spill_counts spill;
  eps_spill_counts(&r->eps, &spill);
  out->spill_read_bytes = spill.read - run->spill_at.read;
  out->spill_written_bytes = spill.written - run->spill_at.written;
  out->spill_late_reads = spill.late - run->spill_at.late;
  out->spill_grad_waits = spill.grad_waits - run->spill_at.grad_waits;
  out->spill_file_bytes = spill.file;
  out->host_pass_bytes = eps_pass_bytes(&run->eps) - run->pass_bytes_at;
  out->device_records_bytes = eps_device_bytes(&run->eps);
  return L2L_OK;
}

l2l_status l2l_relay_events(l2l_relay_event *out, const l2l_relay *run, int64_t first,
                            int64_t count) {
  RELAY_ENTER(run);
  if (out == NULL && count != 0) return FAIL(L2L_ERR_INVALID, "out is NULL");
  l2l_relay *r = (l2l_relay *)run;
  pthread_mutex_lock(&r->timeline.lock);
  int64_t n = run->timeline.count;
  bool ok = first >= 0 && count >= 0 && first <= n && count <= n - first;
  if (ok && count > 0) memcpy(out, run->timeline.events + first, (size_t)count * sizeof *out);
  pthread_mutex_unlock(&r->timeline.lock);
  if (first < 0) return FAIL(L2L_ERR_INVALID, "first must be >= 0, got %lld", (long long)first);
  if (!ok)
    return FAIL(L2L_ERR_INVALID, "first %lld + count %lld goes past the %lld events of the last step",
                (long long)first, (long long)count, (long long)n);
  return L2L_OK;
}

l2l_status l2l_relay_param_state(l2l_tensor **out, l2l_relay *run, const l2l_param *param,
                                 int which) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  RELAY_ENTER(run);
  if (which != 0 && which != 1) return FAIL(L2L_ERR_INVALID, "which must be 0 or 1, got %d", which);
  TRY_AS(relay_sync_now(run));
  struct eps_record *rec = eps_find(&run->eps, param);
  if (rec == NULL) return FAIL(L2L_ERR_INVALID, "param is not a record of this relay's layers");
  return error_as(__func__, eps_state_whole(out, &run->eps, rec, which));
}

/* ---------------------------------------------------------------- checkpoints */

l2l_status l2l_relay_param_updates(int64_t *out, l2l_relay *run, const l2l_param *param) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  RELAY_ENTER(run);
  TRY_AS(relay_sync_now(run));
  struct eps_record *rec = eps_find(&run->eps, param);
  if (rec == NULL) return FAIL(L2L_ERR_INVALID, "param is not a record of this relay's layers");
  *out = eps_updates(rec);
  return L2L_OK;
}

/* Every check comes before the first change, so a refused restore leaves the record as
   it was; the new state is allocated whole before the old one is freed. */
l2l_status l2l_relay_restore_param(l2l_relay *run, const l2l_param *param, int64_t updates,
                                   const l2l_tensor *first, const l2l_tensor *second) {
  RELAY_ENTER(run);
  return relay_restore_param(run, __func__, param, updates, first, second);
}

l2l_status relay_restore_param(l2l_relay *run, const char *func, const l2l_param *param,
                               int64_t updates, const l2l_tensor *first, const l2l_tensor *second) {
  if (updates < 0 || updates > COUNT_MAX)
    return core_fail_in(func, L2L_ERR_INVALID, "updates must be 0 to 2^53 - 1 (the largest count "
                        "a checkpoint holds), got %lld", (long long)updates);
  TRY_AS(relay_sync_now(run));
  struct eps_record *rec = eps_find(&run->eps, param);
  if (rec == NULL) return core_fail_in(func, L2L_ERR_INVALID, "param is not a record of this relay's layers");
  return eps_restore(func, &run->eps, rec, updates, first, second);
}

l2l_status l2l_relay_restore_loss_scale(l2l_relay *run, double scale, int64_t good,
                                        int64_t skipped) {
  RELAY_ENTER(run);
  return relay_restore_loss_scale(run, __func__, scale, good, skipped);
}

l2l_status relay_restore_loss_scale(l2l_relay *run, const char *func, double scale, int64_t good,
                                    int64_t skipped) {
  if (run->config.loss_scale == 0)
    return REFUSED(core_fail_in(func, L2L_ERR_STATE, "the relay does not scale its loss (" NAMED_CONFIG(loss_scale)
                                " is 0)"), loss_scale);
  if (!(scale >= MIN_LOSS_SCALE && scale <= MAX_LOSS_SCALE))
    return core_fail_in(func, L2L_ERR_INVALID, "scale must be 2^-64 to 2^100, got %g", scale);
  if (good < 0 || good >= run->config.loss_scale_window || skipped < 0 || skipped > COUNT_MAX)
    return core_fail_in(func, L2L_ERR_INVALID, "need 0 <= good < loss_scale_window (%d) and skipped "
                        "0 to 2^53 - 1 (the largest count a checkpoint holds), got good %lld, "
                        "skipped %lld", run->config.loss_scale_window, (long long)good,
                        (long long)skipped);
  TRY_AS(relay_sync_now(run));
  run->scale = scale;
  run->scale_good = good;
  run->skipped = skipped;
  run->stats.loss_scale = scale;
  run->stats.loss_scale_good = good;
  run->stats.skipped_updates = skipped;
  return L2L_OK;
}

l2l_status l2l_relay_restore_progress(l2l_relay *run, int64_t steps, int64_t updates) {
  RELAY_ENTER(run);
  return relay_restore_progress(run, __func__, steps, updates);
}

l2l_status relay_restore_progress(l2l_relay *run, const char *func, int64_t steps, int64_t updates) {
  if (steps < 0 || steps > COUNT_MAX || updates < 0 || updates > steps)
    return core_fail_in(func, L2L_ERR_INVALID,
                        "need 0 <= updates <= steps <= 2^53 - 1 (the largest count a checkpoint "
                        "holds), got steps %lld, updates %lld", (long long)steps, (long long)updates);
  TRY_AS(relay_sync_now(run));
  run->steps = steps;
  run->updates = updates;
  run->stats.steps = steps;
  run->stats.updates = updates;
  return L2L_OK;
}
