/* SPDX-License-Identifier: MIT */
/* plan.c — the planner's public face: l2l_plan_new and the plan it returns.
 *
 * Purpose: check a request, build the chain (the layers, the relay settings that set
 * memory and time), get the rates (the caller's, or this machine's), search, and keep
 * what the search chose with its predictions; say, when no plan fits, the smallest budget
 * that would and what needs it.
 * Must never: change the layers it plans for (timing uses twins).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define PLAN_MAGIC 0x6c32706cu   /* "l2pl" */


/* What a plan was made for, layer by layer: everything that sets a layer's memory and
   time (its config without the seed of its initial weights, its records' sizes, whether
   it is frozen), and the relay settings that set the step's. A relay given the plan is
   checked against it (plan_check_model): a plan for another model is refused, naming the
   first difference. */
struct plan_layer_key {
  l2l_layer_config config;
  char name[32];
  int nparams;
  int64_t numel[L2L_MAX_PARAMS];
  bool frozen;
};
struct plan_settings_key {
  int param_slots, accumulate;
  l2l_dtype precision, grad_precision;
  bool updates_deferred;
  l2l_placement placement;
};

struct l2l_plan {
  uint32_t magic;
  l2l_plan_summary summary;
  l2l_plan_layer *layers;
  struct plan_layer_key *keys;
  struct plan_settings_key settings;
};

static bool plan_live(const l2l_plan *p) { return p != NULL && p->magic == PLAN_MAGIC; }

static struct plan_layer_key layer_key(const l2l_layer *layer, bool frozen) {
  struct plan_layer_key k;
  memset(&k, 0, sizeof k);   /* padding too: keys are compared whole */
  l2l_layer_get_config(&k.config, layer);
  k.config.init_seed = 0;
  snprintf(k.name, sizeof k.name, "%s", l2l_layer_name(layer));
  k.nparams = l2l_layer_param_count(layer);
  for (int r = 0; r < k.nparams && r < L2L_MAX_PARAMS; r++)
    k.numel[r] = l2l_tensor_numel(param_value(l2l_layer_param(layer, r)));
  k.frozen = frozen;
  return k;
}

static struct plan_settings_key settings_key(const l2l_relay_config *config) {
  struct plan_settings_key k;
  memset(&k, 0, sizeof k);
  k.param_slots = config->param_slots ? config->param_slots : 2;
  k.accumulate = config->accumulate;
  k.precision = config->precision;
  k.grad_precision = config->grad_precision;
  k.updates_deferred = config->clip_global_norm > 0 || config->loss_scale > 0;
  k.placement = config->placement;
  return k;
}

/* The chain of a step of `layers` under the relay's config (micro_batch left to the
   caller): what a plan searches over and what the relay's budget check replays. */
static struct plan_chain chain_of(struct plan_layer *layers, int L, const l2l_relay_config *config,
                                  int64_t batch, int64_t seq, bool token_types, bool key_mask) {
  l2l_layer_config c0;
  l2l_layer_get_config(&c0, layers[0].layer);
  struct plan_settings_key set = settings_key(config);
  return (struct plan_chain){
      .L = L, .layers = layers, .batch = batch, .seq = seq, .dim = c0.dim,
      .param_slots = set.param_slots, .precision = set.precision,
      .grad_precision = set.grad_precision, .token_types = token_types, .key_mask = key_mask,
      .updates_deferred = set.updates_deferred, .accumulate = set.accumulate};
}

l2l_status plan_step_peak(uint64_t *peak, struct plan_layer *layers, int L,
                          const l2l_relay_config *config, int64_t batch, int64_t seq,
                          int64_t micro_batch, bool token_types, bool key_mask,
                          bool training, bool any_weights) {
  struct plan_chain chain = chain_of(layers, L, config, batch, seq, token_types, key_mask);
  chain.micro_batch = micro_batch;
  chain.any_weights = any_weights;
  chain.evaluation = !training;
  return plan_peak(peak, &chain);
}

l2l_status plan_step_place(struct plan_layer *layers, int L, const l2l_relay_config *config,
                           int64_t batch, int64_t seq, int64_t micro_batch, bool token_types,
                           bool key_mask, uint64_t budget, const uint32_t *allowed,
                           uint64_t *bytes) {
  struct plan_chain chain = chain_of(layers, L, config, batch, seq, token_types, key_mask);
  chain.micro_batch = micro_batch;
  return plan_place(&chain, config, budget, allowed, INT32_MAX, NULL, bytes);
}

static void describe_key(char *out, size_t len, const struct plan_layer_key *k) {
  const l2l_layer_config *c = &k->config;
  snprintf(out, len, "%s%s (dim %lld, heads %lld, mlp %lld, vocab %lld, max_seq %lld, %d records, "
           "dropout %g, memory %d)", k->frozen ? "frozen " : "", k->name, (long long)c->dim,
           (long long)c->heads, (long long)c->mlp, (long long)c->vocab, (long long)c->max_seq,
           k->nparams, c->dropout, (int)c->memory);
}

l2l_status plan_check_model(const l2l_plan *plan, l2l_layer *const *layers, const bool *frozen,
                            int nlayers, const l2l_relay_config *config) {
  if (!plan_live(plan)) return core_fail(L2L_ERR_INVALID, "plan is not a live plan");
  if (plan->summary.nlayers != nlayers)
    return core_fail(L2L_ERR_INVALID, "the plan is for %d layers, the relay has %d",
                     plan->summary.nlayers, nlayers);
  for (int k = 0; k < nlayers; k++) {
    struct plan_layer_key here = layer_key(layers[k], frozen[k]);
    if (memcmp(&here, &plan->keys[k], sizeof here) != 0) {
      char a[320], b[256];
      describe_key(a, sizeof a, &here);
      describe_key(b, sizeof b, &plan->keys[k]);
      if (strcmp(a, b) == 0) snprintf(a, sizeof a, "another config of %.255s", b);
      return error_note_layer(core_fail(L2L_ERR_INVALID, "the plan was made for another model: " NAMED_LAYER
                                        " is %s here, %s in the plan", k, a, b), k);
    }
  }
  struct plan_settings_key s = settings_key(config), p = plan->settings;
  if (memcmp(&s, &p, sizeof s) != 0)
    return core_fail(L2L_ERR_INVALID, "the plan was made for other relay settings: param_slots %d, "
                     "accumulate %d, precision %s, grad_precision %s, updates %s, placement %s; the "
                     "relay has %d, %d, %s, %s, %s, %s", p.param_slots, p.accumulate,
                     l2l_dtype_name(p.precision), l2l_dtype_name(p.grad_precision),
                     p.updates_deferred ? "deferred" : "eager",
                     options_choice_name("placement", (int)p.placement),
                     s.param_slots, s.accumulate, l2l_dtype_name(s.precision),
                     l2l_dtype_name(s.grad_precision), s.updates_deferred ? "deferred" : "eager",
                     options_choice_name("placement", (int)s.placement));
  return L2L_OK;
}

/* The chain's policy in words: how many layers (past the input layer) keep, swap or
   recompute, and where a recomputed layer's input boundary waits. */
static void policy_words(char *text, size_t room, const struct plan_chain *c) {
  static const char *const words[5] = {"kept", "swapped", "recomputed with the boundary on the device",
                                       "recomputed with the boundary on the host",
                                       "recomputed with the boundary rebuilt"};
  int count[5] = {0}, kinds = 0, len = 0;
  if (room > 0) text[0] = '\0';
  for (int k = 1; k < c->L; k++) {
    const struct plan_layer *pl = &c->layers[k];
    int m = pl->inner == L2L_INNER_KEEP ? 0 : pl->inner == L2L_INNER_SWAP ? 1
          : pl->stash == L2L_STASH_DEVICE ? 2 : pl->stash == L2L_STASH_HOST ? 3 : 4;
    kinds += count[m]++ == 0;
  }
  for (int m = 0, said = 0; m < 5 && len >= 0 && (size_t)len < room; m++) {
    if (count[m] == 0) continue;
    if (kinds == 1) len = snprintf(text, room, "every layer %s", words[m]);
    else len += snprintf(text + len, room - (size_t)len, "%s%d%s %s", said == 0 ? "" : said + 1 == kinds ?
                         " and " : ", ", count[m], said == 0 ? count[m] == 1 ? " layer" : " layers" : "",
                         words[m]);
    said++;
  }
}

/* A budget under the least peak of the search's start policies (plan_least_peak, the chain
   left at its policy) is refused naming it, and what needs it: the slots of the largest layer, and the
   rest (`budget` is the step's: the request's less the `records` placed on the device),
   and the leanest policy's need beside it where that is more (`leanest`; 0: not said).
   L2L_OK when that peak fits. */
static l2l_status under_least(struct plan_chain *c, uint64_t budget, uint64_t records,
                              uint64_t leanest) {
  uint64_t least = 0;
  l2l_status status = plan_least_peak(&least, c);
  plan_memo_free(c);
  if (status != L2L_OK || least <= budget) return status;
  char want[32], have[32], slots_text[32], records_text[160] = "", policy[256], lean_text[160] = "";
  if (leanest > least) {
    char b[32];
    snprintf(lean_text, sizeof lean_text, " (L2L's default, every layer recomputed with the "
             "boundary on the host, needs %s)", core_human_bytes(b, 32, leanest + records));
  }
  if (records > 0) {
    char b[32];
    snprintf(records_text, sizeof records_text, "; and %s for the records placed on the device "
             "(placement host keeps them in host memory)", core_human_bytes(b, 32, records));
  }
  policy_words(policy, sizeof policy, c);
  budget += records;
  uint64_t needed = least + records;
  struct order sc;
  TRY(plan_schedule(&sc, c));
  uint64_t slots = order_slots_bytes(&sc, c->param_slots, c->precision, c->grad_precision),
           bytes;
  int largest = order_largest_layer(&sc, ORDER_SLOT_VALUES, c->precision, c->grad_precision,
                                    &bytes);
  order_free(&sc);
  l2l_status refused = error_note_needed(core_fail_in("l2l_plan_new", L2L_ERR_BUDGET,
              "no plan fits a device budget of %llu bytes (%s): the smallest needs %llu bytes (%s), "
              "in micro-batches of 1 sample with %s%s; of them %s are the %d parameter slots and 2 "
              "gradient slots sized by " NAMED_LAYER " (%s)%s",
              (unsigned long long)budget, core_human_bytes(have, 32, budget),
              (unsigned long long)needed, core_human_bytes(want, 32, needed), policy, lean_text,
              core_human_bytes(slots_text, 32, slots), c->param_slots, largest,
              l2l_layer_name(c->layers[largest].layer), records_text), needed);
  return error_note_layer(refused, largest);
}

static l2l_status check_request(l2l_layer *const *layers, int nlayers, const l2l_relay_config *config,
                                const l2l_plan_request *q) {
  if (layers == NULL) return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "layers is NULL");
  if (config == NULL) return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "config is NULL");
  if (q == NULL) return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "request is NULL");
  if (nlayers < 2 || nlayers > 1 << 20)
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "nlayers must be 2 to 2^20 (an input layer, a head), got %d", nlayers);
  for (int k = 0; k < nlayers; k++)   /* live first: a role is read from the layer */
    if (l2l_layer_param_count(layers[k]) < 0)
      return error_note_layer(core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "" L2L_NAMED_LAYER "layers[%d]"
                                           L2L_NAMED_END " is not a live layer", k), k);
  for (int k = 0; k < nlayers; k++)
    if (layer_role(layers[k]) == L2L_ROLE_HEAD && k != nlayers - 1)
      return error_note_layer(core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "" NAMED_LAYER " is a head but not the "
                                           "last", k), k);
  if (layer_role(layers[0]) != L2L_ROLE_INPUT)
    return error_note_layer(core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "" NAMED_LAYER " must be an input layer", 0), 0);
  if (layer_role(layers[nlayers - 1]) != L2L_ROLE_HEAD) return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "the last layer must be a head");
  l2l_layer_config input;
  l2l_layer_get_config(&input, layers[0]);
  if (input.kind == L2L_LAYER_EMBEDDING && q->seq > input.max_seq)
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "seq %lld is above the embedding's max_seq %lld",
                    (long long)q->seq, (long long)input.max_seq);
  if (q->batch < 1 || q->batch > (INT64_C(1) << 24) || q->seq < 1 || q->seq > (INT64_C(1) << 24))
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "batch and seq must be 1 to 2^24, got %lld and %lld",
                (long long)q->batch, (long long)q->seq);
  if (q->device_budget == 0) return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "device_budget must be > 0");
  if ((q->token_types != 0 && q->token_types != 1) || (q->key_mask != 0 && q->key_mask != 1))
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "token_types and key_mask must be 0 or 1");
  if (config->param_slots != 0 && (config->param_slots < 2 || config->param_slots > 4096))
    return error_note_field(core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "" NAMED_CONFIG(param_slots) " must be 0 or 2 "
                                         "to 4096, got %d", config->param_slots), "param_slots");
  if (config->accumulate < 1)
    return error_note_field(core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "" NAMED_CONFIG(accumulate) " must be >= 1"),
                            "accumulate");
  const l2l_plan_rates *r = q->rates;
  if (r && !(r->flops >= 0 && r->h2d > 0 && r->d2h > 0 && r->optimizer > 0 && r->visit >= 0 &&
             r->flops < 1e30 && r->h2d < 1e30 && r->d2h < 1e30 && r->optimizer < 1e30 && r->visit < 1e6))
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "rates must be finite, h2d, d2h and optimizer > 0, flops and visit >= 0");
  if (r && ((r->timed != 0 && r->timed != 1) || (r->shared != 0 && r->shared != 1)))
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "rates->timed and rates->shared must be 0 or 1");
  if (r && !r->timed && !(r->flops > 0)) return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "rates that time no layer need flops > 0");
  if (r && !(r->disk_read >= 0 && r->disk_write >= 0 && r->disk_read < 1e30 && r->disk_write < 1e30))
    return core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "rates->disk_read and disk_write must be finite and >= 0 (0: measured)");
  if (config->spill_dir != NULL && config->spill_dir[0] == '\0')
    return error_note_field(core_fail_in("l2l_plan_new", L2L_ERR_INVALID, "" NAMED_CONFIG(spill_dir) " is empty (NULL: "
                                         "no spill file)"), "spill_dir");
  return L2L_OK;
}

/* What one placement of the records gives: the search's plan and the host's share. */
struct placed_plan {
  struct plan_result r;
  struct plan_host host;
  double step_seconds;   /* r.seconds, or the disk's share of a step when that is more */
};

/* The disk reads and writes under compute: a step takes at least its share. */
static double disk_seconds(const struct plan_host *host, const l2l_plan_rates *rates, int accumulate) {
  if (host->disk_bytes == 0) return 0;
  return ((double)host->disk_bytes / rates->disk_read + (double)host->disk_bytes / rates->disk_write) /
         (double)accumulate;
}

/* The plan of the chain with its records placed: every one (placement device), none
   (host), or (auto) the groups of at most `most` layers that the budget holds beside the
   leanest step, the largest first (*groups: how many); the step's policies searched in
   what the records leave. The machine's rates are measured the first time a placement
   gets that far (*rates_ready). Refused, naming the smallest budget that works for these
   records (under_least), when no policy fits. */
static l2l_status plan_placed(struct placed_plan *out, struct plan_chain *chain,
                              const l2l_relay_config *config, const l2l_plan_request *request,
                              l2l_plan_rates *rates, bool *rates_ready, int most, int *groups) {
  struct plan_layer *pl = chain->layers;
  struct plan_result *r = &out->r;
  *r = (struct plan_result){.layer_seconds = r->layer_seconds};
  out->host = (struct plan_host){0};
  l2l_status status = L2L_OK;
  uint64_t placed = 0;
  for (int k = 0; k < chain->L; k++)
    pl[k].on_device = config->placement == L2L_PLACE_DEVICE ? UINT32_MAX : 0;
  if (config->placement == L2L_PLACE_AUTO) {
    status = plan_leanest_peak(&placed, chain);
    if (status == L2L_OK)
      status = plan_place(chain, config, request->device_budget, NULL, most, groups, &placed);
  }
  /* the host's share, and the records placed on the device: the step has the rest */
  struct plan_host *host = &out->host;
  if (status == L2L_OK) status = plan_host(host, pl, chain->L, config);
  uint64_t budget = request->device_budget > host->device_bytes ? request->device_budget - host->device_bytes : 0;
  /* A budget under the least peak of the search's start policies has no plan the search
     would find: refused before anything is timed (timing a layer takes device memory that
     budget does not have; records that fill the request leave the step none, refused so
     too). The leanest policy's peak (one replay) first: only a budget under it replays the
     other start policies. */
  uint64_t leanest = 0;
  if (status == L2L_OK) status = plan_leanest_peak(&leanest, chain);
  plan_memo_free(chain);
  if (status == L2L_OK && leanest > budget) status = under_least(chain, budget, host->device_bytes, leanest);
  /* this machine's rates (measured once, on the device: now that a plan can fit) */
  if (status == L2L_OK && request->rates == NULL && !*rates_ready) {
    status = plan_machine_rates(rates, false);
    if (rates->visit < 0) rates->visit = 0;   /* not measured yet: l2l_relay_calibrate_plan does */
  }
  /* the host: a budget no plan of the device can help */
  if (status == L2L_OK && config->host_budget > 0 && host->smallest_budget > config->host_budget) {
    char want[32], have[32];
    status = core_fail_in("l2l_plan_new", L2L_ERR_BUDGET, "no plan fits a host budget of %llu bytes (%s): the "
                      "EPS needs %llu (%s)%s", (unsigned long long)config->host_budget,
                      core_human_bytes(have, 32, config->host_budget),
                      (unsigned long long)host->smallest_budget, core_human_bytes(want, 32, host->smallest_budget),
                      config->spill_dir ? "" : ": a spill directory (" NAMED_CONFIG(spill_dir) ") keeps the optimizer state on disk");
    if (config->spill_dir == NULL) error_note_field(status, "spill_dir");
  }
  if (status == L2L_OK && !*rates_ready && config->spill_dir && !(rates->disk_read > 0 && rates->disk_write > 0))
    status = plan_disk_rates(&rates->disk_read, &rates->disk_write, config->spill_dir);
  if (status == L2L_OK) *rates_ready = true;
  if (status == L2L_OK) status = plan_search(r, chain, rates, budget);
  /* (the least start policy fits, so micro-batch 1 has a plan: only timing a layer there,
     which takes device memory, can have been refused) */
  if (status == L2L_OK && !r->found)
    status = core_fail_in("l2l_plan_new", L2L_ERR_BUDGET, "no plan fits a device budget of %llu bytes: %s",
                          (unsigned long long)request->device_budget, rates->timed ?
                          "timing the layers took device memory it does not have" :
                          "the search found none though its leanest policies fit (a bug)");
  if (status == L2L_OK) {
    double disk = disk_seconds(host, rates, config->accumulate);
    out->step_seconds = r->seconds > disk ? r->seconds : disk;
  }
  return status;
}

/* Placement auto with the policies: `best` (placed in `c`) puts the records of `groups`
   layers on the device, as many as fit beside the leanest step. Fewer leave the step room
   to keep what it would recompute or swap, at the price of their copies and host updates:
   the records of 0 up to groups - 1 layers (every count up to 8 of them, else 8 spread
   evenly) are planned too, and the fastest predicted step is kept in best and c (a tie
   to the more on the device). A count no policy fits is passed over. */
static l2l_status place_with_policies(struct placed_plan *best, struct plan_chain *c,
                                      const l2l_relay_config *config,
                                      const l2l_plan_request *request, l2l_plan_rates *rates,
                                      bool *rates_ready, int groups) {
  const int L = c->L;
  struct plan_layer *kept = malloc((size_t)L * sizeof *kept);
  double *trial_seconds = calloc((size_t)L, sizeof *trial_seconds);
  if (kept == NULL || trial_seconds == NULL) {
    free(kept), free(trial_seconds);
    return FAIL(L2L_ERR_NOMEM, "no memory to place %d layers' records", L);
  }
  memcpy(kept, c->layers, (size_t)L * sizeof *kept);
  int64_t kept_micro_batch = c->micro_batch;
  l2l_status status = L2L_OK;
  const int tries = groups <= 8 ? groups : 8;
  for (int i = 0; i < tries && status == L2L_OK; i++) {
    int most = (int)((int64_t)i * groups / tries);
    struct placed_plan trial = {.r = {.layer_seconds = trial_seconds}};
    status = plan_placed(&trial, c, config, request, rates, rates_ready, most, NULL);
    if (status == L2L_ERR_BUDGET) {   /* (no policy fits beside these records) */
      l2l_clear_error();
      status = L2L_OK;
      continue;
    }
    if (status != L2L_OK || trial.step_seconds >= best->step_seconds * (1 - 1e-9)) continue;
    memcpy(kept, c->layers, (size_t)L * sizeof *kept);
    kept_micro_batch = c->micro_batch;
    memcpy(best->r.layer_seconds, trial_seconds, (size_t)L * sizeof *trial_seconds);
    trial.r.layer_seconds = best->r.layer_seconds;
    *best = trial;
  }
  memcpy(c->layers, kept, (size_t)L * sizeof *kept);
  c->micro_batch = kept_micro_batch;
  free(kept), free(trial_seconds);
  return status;
}

l2l_status l2l_plan_new(l2l_plan **out, l2l_layer *const *layers, int nlayers,
                        const l2l_relay_config *config, const l2l_plan_request *request) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY_AS(check_request(layers, nlayers, config, request));
  l2l_plan_rates rates;
  if (request->rates) rates = *request->rates;
  struct plan_layer *pl = calloc((size_t)nlayers, sizeof *pl);
  double *seconds = calloc((size_t)nlayers, sizeof *seconds);
  l2l_plan *plan = calloc(1, sizeof *plan);
  l2l_plan_layer *result = calloc((size_t)nlayers, sizeof *result);
  struct plan_layer_key *keys = calloc((size_t)nlayers, sizeof *keys);
  int *placed_order = calloc((size_t)nlayers, sizeof *placed_order);
  if (pl == NULL || seconds == NULL || plan == NULL || result == NULL || keys == NULL ||
      placed_order == NULL) {
    free(pl), free(seconds), free(plan), free(result), free(keys), free(placed_order);
    return FAIL(L2L_ERR_NOMEM, "no memory to plan %d layers", nlayers);
  }
  for (int k = 0; k < nlayers; k++)
    pl[k] = (struct plan_layer){.layer = layers[k], .role = layer_role(layers[k]),
                                .frozen = request->frozen && request->frozen[k]};
  struct plan_chain chain = chain_of(pl, nlayers, config, request->batch, request->seq,
                                     request->token_types, request->key_mask);
  chain.placed_order = placed_order, chain.placed_count = -1;   /* (for place_with_policies) */
  /* the records on the device: every one (placement device), or (auto) first those the
     budget holds beside the leanest step, then fewer where the step is faster for it */
  struct placed_plan best = {.r = {.layer_seconds = seconds}};
  bool rates_ready = false;
  int groups = 0;
  l2l_status status = plan_placed(&best, &chain, config, request, &rates, &rates_ready, INT32_MAX,
                                  &groups);
  if (status == L2L_OK && config->placement == L2L_PLACE_AUTO && groups > 0)
    status = place_with_policies(&best, &chain, config, request, &rates, &rates_ready, groups);
  const struct plan_result r = best.r;
  const struct plan_host host = best.host;
  if (status == L2L_OK) {
    for (int k = 0; k < nlayers; k++) {
      l2l_layer_memory m;
      layer_memory_in(&m, layers[k], r.micro_batch, request->seq, config->precision, true);
      int64_t nmb = (request->batch + r.micro_batch - 1) / r.micro_batch;
      bool kept = pl[k].inner == L2L_INNER_KEEP && pl[k].role != L2L_ROLE_HEAD;
      result[k] = (l2l_plan_layer){.inner = pl[k].inner, .stash = pl[k].stash,
                                   .kept_bytes = kept ? m.saved * (uint64_t)nmb : 0,
                                   .seconds = seconds[k], .on_device = pl[k].on_device != 0};
    }
    /* weight streaming hides under compute past this many tokens per visit: a visit's
       compute grows with its tokens, its parameter copy does not (the first body
       layer's rates, at the chosen micro-batch) */
    double streaming = 0;
    struct plan_layer_costs *costs = calloc((size_t)nlayers, sizeof *costs);
    if (costs && nlayers > 2 && plan_layer_costs(costs, &chain, &rates) == L2L_OK) {
      double per_token = (costs[1].fwd[0] + costs[1].bwd[0]) / (double)(r.micro_batch * request->seq);
      if (per_token > 0) streaming = (double)costs[1].param_bytes / rates.h2d / per_token;
    }
    free(costs);
    double disk = disk_seconds(&host, &rates, config->accumulate);
    plan->magic = PLAN_MAGIC;
    plan->summary = (l2l_plan_summary){.nlayers = nlayers, .micro_batch = r.micro_batch,
                                       .step_seconds = r.seconds > disk ? r.seconds : disk,
                                       .device_peak = r.peak,
                                       .h2d_bytes = (uint64_t)r.channels.h2d,
                                       .d2h_bytes = (uint64_t)r.channels.d2h,
                                       .streaming_tokens = streaming,
                                       .host_eps_bytes = host.eps_bytes,
                                       .device_records_bytes = host.device_bytes,
                                       .host_budget_smallest = host.smallest_budget,
                                       .disk_bytes = host.disk_bytes, .disk_seconds = disk,
                                       .compute_seconds = r.channels.compute,
                                       .h2d_seconds = rates.h2d > 0 ? r.channels.h2d / rates.h2d : 0,
                                       .d2h_seconds = rates.d2h > 0 ? r.channels.d2h / rates.d2h : 0,
                                       .update_seconds = r.channels.updates};
    plan->layers = result;
    for (int k = 0; k < nlayers; k++) keys[k] = layer_key(layers[k], pl[k].frozen);
    plan->keys = keys;
    plan->settings = settings_key(config);   /* the relay settings the plan depends on */
    *out = plan;
  } else {
    free(plan), free(result), free(keys);
  }
  free(pl), free(seconds), free(placed_order);
  return error_as(__func__, status);
}

l2l_status l2l_plan_get(l2l_plan_summary *out, const l2l_plan *plan) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!plan_live(plan)) return FAIL(L2L_ERR_INVALID, "plan is not a live plan");
  *out = plan->summary;
  return L2L_OK;
}

l2l_status l2l_plan_get_layer(l2l_plan_layer *out, const l2l_plan *plan, int index) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!plan_live(plan)) return FAIL(L2L_ERR_INVALID, "plan is not a live plan");
  if (index < 0 || index >= plan->summary.nlayers)
    return FAIL(L2L_ERR_INVALID, "index %d is not a layer of the plan (0 to %d)", index,
                plan->summary.nlayers - 1);
  *out = plan->layers[index];
  return L2L_OK;
}

void l2l_plan_free(l2l_plan *plan) {
  if (!plan_live(plan)) return;
  plan->magic = 0;
  free(plan->layers);
  free(plan->keys);
  free(plan);
}
