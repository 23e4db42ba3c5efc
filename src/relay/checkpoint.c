/* SPDX-License-Identifier: MIT */
/* checkpoint.c — a relay's training state saved to one file and loaded back into a relay
 * over the same model: l2l_relay_save, l2l_relay_load, l2l_checkpoint_description (l2l.h,
 * "checkpoints"; the file is the front end's, lua/l2l/checkpoint.lua's: a safetensors file
 * of the records' tensors and a JSON description, describe.c).
 *
 * Purpose: a C program saves, loads and resumes to the bit as a Lua script does, each
 * reading the other's files. Why here, in the relay: a checkpoint is the relay's state
 * (records, update counts, progress, loss scale, policies) and the save and the load run
 * as one call on the relay, entered once (no step can slip between a save's records), so
 * they use the relay's own restores (relay.c) and the EPS's records; the file's format is
 * the core's (src/core/safetensors*.c), below every part, and the arrows stay downward. No
 * part above the relay was needed: the front end calls these through l2l.h.
 * A save holds one record's optimizer state in memory at a time (eps_state_whole: from
 * the spill file, or gathered from the ranks' shards) and checks each state array as a
 * restore would before writing it. A load checks the whole file first (the description
 * against the relay, every record's entries, every checksum, every state array) and reads
 * the data a second time to restore it, one record at a time.
 * Must never: change the relay when a load is refused; write a file a load would refuse;
 * leave a temporary behind or replace a file it was not told it may.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "relay.h"

#define FORMAT "l2l-checkpoint"
#define VERSION 1

/* A parameter record as the file names it: its first layer (from 0) and place there. */
struct record {
  l2l_param *param;
  struct eps_record *rec;
  int layer, place;
  char name[48];
  int64_t updates;
  int state;                 /* optimizer state arrays in the file */
  bool grad;                 /* a gradient in the file (mid-accumulation) */
  const struct safetensors_entry *value, *arrays[2], *grad_entry;   /* a load's */
};

struct records {
  struct record *r;
  int n;
  bool *tied;                /* per layer: a head whose projection is an earlier record */
};

static void records_free(struct records *rs) {
  free(rs->r);
  free(rs->tied);
}

/* The relay's records in the file's order: layer by layer, a record shared with an earlier
   layer (the tied embedding) once, under its first (layers_records). */
static l2l_status records_list(struct records *rs, l2l_relay *run) {
  const l2l_layer **list = calloc((size_t)run->count + 1, sizeof *list);
  rs->tied = calloc((size_t)run->count + 1, sizeof *rs->tied);
  rs->n = 0, rs->r = NULL;
  if (list == NULL || rs->tied == NULL) {
    free(list);
    return core_fail(L2L_ERR_NOMEM, "no memory for a list of records");
  }
  for (int i = 0; i < run->count; i++) list[i] = run->layers[i].layer;
  struct layers_record *recs = NULL;
  int n = 0;
  l2l_status status = layers_records(&recs, &n, list, NULL, run->count);
  free(list);
  TRY(status);
  rs->r = calloc((size_t)n + 1, sizeof *rs->r);
  if (rs->r == NULL) {
    free(recs);
    return core_fail(L2L_ERR_NOMEM, "no memory for a list of records");
  }
  for (int i = 0; i < n && status == L2L_OK; i++) {
    struct record *r = &rs->r[rs->n++];
    *r = (struct record){.param = recs[i].param, .rec = eps_find(&run->eps, recs[i].param),
                         .layer = recs[i].layer, .place = recs[i].place};
    snprintf(r->name, sizeof r->name, "%d.%s", r->layer + 1, l2l_param_name(r->param));
    if (r->rec == NULL) status = core_fail(L2L_ERR_STATE, "record %s is not in the relay's EPS", r->name);
  }
  /* a layer holding a record an earlier layer holds first: fewer records of its own */
  for (int k = 0, i = 0; k < run->count; k++) {
    int own = 0;
    while (i < n && recs[i].layer == k) own++, i++;
    rs->tied[k] = own < l2l_layer_param_count(run->layers[k].layer);
  }
  free(recs);
  return status;
}

/* The same, for a message that does not name the file yet. */
static l2l_status in_file(const char *path, l2l_status status) {
  if (status == L2L_OK) return status;
  return error_wrap(status, "%s: ", path);   /* (what the message names still named) */
}

static l2l_status no_memory(void) { return core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description"); }

/* The shape and dtype a record's state array is written in: the parameter's shape in f32
   or bf16, or 8 bits' u8 vector of codes and scales. */
static l2l_status state_form(struct safetensors_spec *e, l2l_state_precision state, const l2l_tensor *value) {
  int64_t n = l2l_tensor_numel(value);
  if (state == L2L_STATE_8BIT) {
    uint64_t bytes = 0;
    TRY(l2l_state_array_bytes(&bytes, L2L_STATE_8BIT, n));
    e->dtype = L2L_U8, e->ndim = 1, e->shape[0] = (int64_t)bytes;
    return L2L_OK;
  }
  e->dtype = state == L2L_STATE_BF16 ? L2L_BF16 : L2L_F32;
  e->ndim = l2l_tensor_ndim(value);
  for (int d = 0; d < e->ndim; d++) e->shape[d] = l2l_tensor_dim(value, d);
  return L2L_OK;
}

/* ================================================================ saving */

struct save {
  l2l_relay *run;
  const char *path;
  struct records rs;
  bool mid;                  /* part way through an accumulation: gradients go too */
  int arrays;                /* state arrays a record keeps after its first update */
  struct safetensors_spec *specs;
  char (*names)[64];
  int nspecs;
  int64_t gathers;           /* state arrays asked for so far (with ranks, each a gather) */
};

static l2l_status parse_given(json_t **out, const char *text, const char *what, bool array) {
  json_error_t err;
  *out = json_loads(text, JSON_REJECT_DUPLICATES, &err);
  if (*out == NULL) return core_fail(L2L_ERR_INVALID, "options->%s is not JSON: %s", what, err.text);
  if (array ? !json_is_array(*out) : !json_is_object(*out)) {
    json_decref(*out);
    *out = NULL;
    return core_fail(L2L_ERR_INVALID, "options->%s must be a JSON %s", what, array ? "array" : "object");
  }
  return L2L_OK;
}

/* The layers' descriptions: the caller's (checked as a load would check them) or the
   relay's own, with the relay's rng ids, flags and policies. */
static l2l_status describe_layers(json_t *desc, const struct save *s, const char *given) {
  json_t *layers = NULL;
  if (given != NULL) {
    TRY(parse_given(&layers, given, "layers", true));
    if (json_array_size(layers) != (size_t)s->run->count) {
      json_decref(layers);
      return core_fail(L2L_ERR_INVALID, "options->layers describes %zu layers, the relay has %d",
                       json_array_size(layers), s->run->count);
    }
  } else if ((layers = json_array()) == NULL) {
    return no_memory();
  }
  if (json_object_set_new(desc, "layers", layers) != 0) return no_memory();
  for (int i = 0; i < s->run->count; i++) {
    json_t *d = json_array_get(layers, (size_t)i);
    struct layer_saved ignored;
    if (given != NULL) {
      TRY(relay_check_layer(s->run, i, d, &ignored, "options->layers"));
    } else {
      TRY(relay_describe_layer(&d, s->run, i, s->rs.tied[i]));
      if (json_array_append_new(layers, d) != 0) return no_memory();
    }
    TRY(relay_describe_layer_state(d, s->run, i));
  }
  return L2L_OK;
}

static l2l_status describe_rest(json_t *desc, const struct save *s, const l2l_save_options *o) {
  const l2l_relay *run = s->run;
  json_t *records = json_array(), *relay = NULL, *extra = NULL;
  if (records == NULL || json_object_set_new(desc, "records", records) != 0) return no_memory();
  for (int k = 0; k < s->rs.n; k++) {
    const struct record *r = &s->rs.r[k];
    if (json_array_append_new(records, json_pack("{s:s, s:I, s:i, s:b}", "name", r->name, "updates",
                                                 (json_int_t)r->updates, "state", r->state, "grad",
                                                 (int)s->mid)) != 0)
      return no_memory();
  }
  if (o->relay != NULL) {
    TRY(parse_given(&relay, o->relay, "relay", false));
    l2l_status status = relay_check_options(run, relay, "options->relay");
    if (status != L2L_OK) {
      json_decref(relay);
      return status;
    }
  } else {
    TRY(relay_describe_options(&relay, run));
  }
  if (json_object_set_new(desc, "relay", relay) != 0) return no_memory();
  json_t *progress = json_pack("{s:I, s:I}", "steps", (json_int_t)run->steps, "updates", (json_int_t)run->updates);
  if (progress == NULL || json_object_set_new(desc, "progress", progress) != 0) return no_memory();
  if (run->config.loss_scale > 0) {
    /* the scale as a hex float, which comes back to the bit wherever it is read */
    char scale[64];
    snprintf(scale, sizeof scale, "%a", run->scale);
    json_t *ls = json_pack("{s:s, s:I, s:I}", "scale", scale, "good", (json_int_t)run->scale_good,
                           "skipped", (json_int_t)run->skipped);
    if (ls == NULL || json_object_set_new(progress, "loss_scale", ls) != 0) return no_memory();
  }
  if (o->extra != NULL) {
    json_error_t err;
    extra = json_loads(o->extra, JSON_REJECT_DUPLICATES, &err);
    if (extra == NULL) return core_fail(L2L_ERR_INVALID, "options->extra is not JSON: %s", err.text);
    if (json_object_set_new(desc, "extra", extra) != 0) return no_memory();
  }
  return L2L_OK;
}

/* The description as JSON text (the caller frees it). */
static l2l_status describe(char **out, const struct save *s, const l2l_save_options *o) {
  json_t *desc = json_pack("{s:s, s:i, s:s}", "format", FORMAT, "version", VERSION, "l2l", l2l_version());
  if (desc == NULL) return no_memory();
  l2l_status status = describe_layers(desc, s, o->layers);
  if (status == L2L_OK) status = describe_rest(desc, s, o);
  if (status == L2L_OK && (*out = json_dumps(desc, JSON_COMPACT)) == NULL) status = no_memory();
  json_decref(desc);
  return status;
}

/* Every tensor the file holds, in order: per record its master, its state arrays, its
   gradient mid-accumulation. */
static l2l_status save_specs(struct save *s) {
  s->specs = calloc((size_t)s->rs.n * 4 + 1, sizeof *s->specs);
  s->names = calloc((size_t)s->rs.n * 4 + 1, sizeof *s->names);
  if (s->specs == NULL || s->names == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's list");
  for (int k = 0; k < s->rs.n; k++) {
    struct record *r = &s->rs.r[k];
    r->updates = eps_updates(r->rec);
    r->state = r->updates > 0 ? s->arrays : 0;
    const l2l_tensor *value = param_value(r->param);
    for (int e = -1; e < r->state + (s->mid ? 1 : 0); e++) {
      struct safetensors_spec *spec = &s->specs[s->nspecs];
      const char *suffix = e < 0 ? "" : e < r->state ? (e == 0 ? ".m" : ".v") : ".grad";
      snprintf(s->names[s->nspecs], sizeof *s->names, "%s%s", r->name, suffix);
      spec->name = s->names[s->nspecs++];
      if (e >= 0 && e < r->state) {
        TRY(state_form(spec, s->run->config.optimizer.state, value));
        continue;
      }
      spec->dtype = e < 0 ? (l2l_dtype)l2l_tensor_dtype(value) : L2L_F32;
      spec->ndim = l2l_tensor_ndim(value);
      for (int d = 0; d < spec->ndim; d++) spec->shape[d] = l2l_tensor_dim(value, d);
    }
  }
  return L2L_OK;
}

static l2l_status put_tensor(struct safetensors_writer *w, const l2l_tensor *t) {
  l2l_tensor *host = NULL;   /* a record on the device (placement device): read through a copy */
  if (l2l_tensor_pool(t) == L2L_POOL_DEVICE) {
    TRY(relay_tensor_like(&host, L2L_POOL_HOST, t));
    l2l_status status = l2l_tensor_copy(host, t);
    if (status != L2L_OK) {
      l2l_tensor_free(host);
      return status;
    }
  }
  const l2l_tensor *from = host ? host : t;
  l2l_status status = safetensors_put(w, l2l_tensor_data(from), (uint64_t)l2l_tensor_numel(from) *
                                                                  l2l_dtype_size(l2l_tensor_dtype(from)));
  l2l_tensor_free(host);
  return status;
}

/* Record k's state array a, read (from memory, the spill file or the ranks' shards). */
static l2l_status state_of(const l2l_tensor **out, struct save *s, int k, int a) {
  const struct record *r = &s->rs.r[k];
  l2l_tensor *t = NULL;
  l2l_status status = eps_state_whole(&t, &s->run->eps, r->rec, a);
  s->gathers++;
  if (status != L2L_OK) return status;
  if (t == NULL) return core_fail(L2L_ERR_STATE, "record %s has no optimizer state %s", r->name, a ? "v" : "m");
  *out = t;
  return L2L_OK;
}

/* Record k's state array a, checked as a restore checks it, then written. */
static l2l_status put_state(struct safetensors_writer *w, struct save *s, int k, int a) {
  const struct record *r = &s->rs.r[k];
  const l2l_tensor *t = NULL;
  TRY(state_of(&t, s, k, a));
  int64_t n = l2l_tensor_numel(param_value(r->param));
  if (l2l_state_array_check(t, &s->run->config.optimizer, a, n) != L2L_OK) {
    const char *why = l2l_last_error(), *prefix = "l2l_state_array_check: array ";
    if (strncmp(why, prefix, strlen(prefix)) == 0) why += strlen(prefix);
    char copy[768];
    snprintf(copy, sizeof copy, "%s", why);
    return core_fail(L2L_ERR_INVALID, "the optimizer state of record %s (%s) %s; a checkpoint "
                     "holding it would not load, so %s is left as it was", r->name, a ? "v" : "m",
                     copy, s->path);
  }
  return put_tensor(w, t);
}

/* The records' tensors into the file, one record at a time. */
static l2l_status put_records(struct safetensors_writer *w, struct save *s) {
  for (int k = 0; k < s->rs.n; k++) {
    const struct record *r = &s->rs.r[k];
    TRY(put_tensor(w, param_value(r->param)));
    for (int a = 0; a < r->state; a++) TRY(put_state(w, s, k, a));
    if (s->mid) TRY(put_tensor(w, param_grad(r->param)));
  }
  return L2L_OK;
}

/* With ranks, every rank asks for each record's state in the same order (a gather each):
   the ones the write did not reach (it failed, or this rank does not write), dropped. */
static l2l_status gather_rest(struct save *s, bool writer_failed) {
  l2l_status status = L2L_OK;
  int64_t done = s->gathers, at = 0;
  for (int k = 0; k < s->rs.n; k++)
    for (int a = 0; a < s->rs.r[k].state; a++) {
      if (at++ < done) continue;
      const l2l_tensor *t = NULL;
      l2l_status st = state_of(&t, s, k, a);
      if (status == L2L_OK && !writer_failed) status = st;
    }
  return status;
}

static l2l_status save_file(struct save *s, const l2l_save_options *o) {
  char *desc = NULL;
  TRY(records_list(&s->rs, s->run));
  TRY(save_specs(s));
  TRY(describe(&desc, s, o));
  int rank = 0;
  bool ranks = s->run->config.dist == L2L_DIST_MPI;
  l2l_status status = ranks ? l2l_dist_rank(&rank) : L2L_OK;
  if (status == L2L_OK && rank == 0) {
    const char *meta[4] = {"l2l", desc, "format", FORMAT};
    struct safetensors_writer *w = NULL;
    status = safetensors_create(&w, s->path, o->replace == 1, s->specs, s->nspecs, meta, 2);
    if (status == L2L_OK) status = put_records(w, s);
    if (status == L2L_OK) status = safetensors_commit(w);
    else safetensors_abandon(w);
  }
  free(desc);
  if (ranks) {
    char why[1024];
    snprintf(why, sizeof why, "%s", l2l_last_error());
    l2l_status gathered = gather_rest(s, status != L2L_OK);
    l2l_status met = l2l_dist_barrier();   /* every rank returns once the file is in place */
    if (status == L2L_OK) status = gathered != L2L_OK ? gathered : met;
    else core_fail(status, "%s", why);
  }
  return status;
}

l2l_status l2l_relay_save(l2l_relay *run, const char *path, const l2l_save_options *options) {
  RELAY_ENTER(run);
  if (path == NULL || path[0] == '\0') return FAIL(L2L_ERR_INVALID, "path must be a non-empty string");
  l2l_save_options o = options ? *options : (l2l_save_options){0};
  if (o.replace != 0 && o.replace != 1)
    return FAIL(L2L_ERR_INVALID, "options->replace must be 0 or 1, got %d", o.replace);
  if (run->count == 0) return FAIL(L2L_ERR_STATE, "the relay has no layers: there is no model to save");
  /* a model no step could run (mid-change: an embedding not first, a head not last) is
     not written: no load of it could train */
  TRY_AS(relay_check_model(run));
  TRY_AS(relay_sync_now(run));
  struct save s = {.run = run, .path = path, .mid = run->steps % run->config.accumulate != 0};
  if (run->config.dist == L2L_DIST_MPI && s.mid)
    return FAIL(L2L_ERR_STATE, "with dist = mpi, save between accumulations (step %lld is inside "
                "one of %d steps: each rank holds a part of the gradient)", (long long)run->steps,
                run->config.accumulate);
  l2l_status status = l2l_optimizer_state_arrays(&s.arrays, &run->config.optimizer);
  if (status == L2L_OK) status = save_file(&s, &o);
  records_free(&s.rs);
  free(s.specs);
  free(s.names);
  return error_as(__func__, status);
}

/* ================================================================ loading */

struct load {
  l2l_relay *run;
  const char *path;
  struct safetensors_file *file;
  json_t *desc;
  struct records rs;
  struct layer_saved *saved;   /* per layer: its rng id, flag and policies in the file */
  int arrays;                  /* state arrays the relay's optimizer keeps */
  int64_t steps, updates;
  bool mid;                    /* the file's run is part way through an accumulation */
  bool scaled;                 /* the file holds a loss scale's state: */
  double scale;
  int64_t good, skipped;
};

/* A refusal naming the file. */
#define REFUSE(ld, ...) in_file((ld)->path, core_fail(L2L_ERR_INVALID, __VA_ARGS__))

/* The file's description, decoded and its parts' types checked. */
static l2l_status description_of(json_t **out, const struct safetensors_file *f) {
  const char *text = safetensors_metadata(f, "l2l");
  if (text == NULL)
    return core_fail(L2L_ERR_INVALID, "%s is a safetensors file but not an l2l checkpoint (no l2l metadata)", f->path);
  json_t *d = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
  const char *format = json_string_value(json_object_get(d, "format"));
  int64_t version = 0;
  l2l_status status = L2L_OK;
  if (format == NULL || strcmp(format, FORMAT) != 0)
    status = core_fail(L2L_ERR_INVALID, "%s: the l2l metadata is damaged", f->path);
  else if (!relay_json_whole(json_object_get(d, "version"), 0, COUNT_MAX, &version) || version != VERSION)
    status = core_fail(L2L_ERR_INVALID, "%s: checkpoint version %lld, this l2l reads version %d", f->path,
                       (long long)version, VERSION);
  else if (json_array_size(json_object_get(d, "layers")) == 0 || !json_is_array(json_object_get(d, "records")) ||
           !json_is_object(json_object_get(d, "relay")) || !json_is_object(json_object_get(d, "progress")))
    status = core_fail(L2L_ERR_INVALID, "%s: the l2l metadata is incomplete", f->path);
  if (status != L2L_OK) {
    json_decref(d);
    return status;
  }
  *out = d;
  return L2L_OK;
}

/* The file's steps, updates and loss scale: counts a relay takes. */
static l2l_status check_progress(struct load *ld) {
  const json_t *p = json_object_get(ld->desc, "progress"), *ls = json_object_get(p, "loss_scale");
  if (!relay_json_whole(json_object_get(p, "steps"), 0, COUNT_MAX, &ld->steps) ||
      !relay_json_whole(json_object_get(p, "updates"), 0, ld->steps, &ld->updates))
    return REFUSE(ld, "progress: steps and updates must be integers with 0 <= updates <= steps <= 2^53 - 1");
  ld->mid = ld->steps % ld->run->config.accumulate != 0;
  if (ls == NULL) return L2L_OK;
  const char *text = json_string_value(json_object_get(ls, "scale"));
  char *end = NULL;
  ld->scaled = true;
  if (text != NULL) ld->scale = strtod(text, &end);   /* the hex float a save writes */
  if (!(text ? *text != '\0' && *end == '\0' : relay_json_number(json_object_get(ls, "scale"), &ld->scale)) ||
      !(ld->scale >= MIN_LOSS_SCALE && ld->scale <= MAX_LOSS_SCALE))
    return REFUSE(ld, "progress: loss_scale: the scale must be a number from 2^-64 to 2^100");
  if (!relay_json_whole(json_object_get(ls, "good"), 0, ld->run->config.loss_scale_window - 1, &ld->good) ||
      !relay_json_whole(json_object_get(ls, "skipped"), 0, COUNT_MAX, &ld->skipped))
    return REFUSE(ld, "progress: loss_scale: need 0 <= good < the relay's loss_scale_window (%d) and "
                  "0 <= skipped <= 2^53 - 1", ld->run->config.loss_scale_window);
  if (ld->run->config.loss_scale == 0)
    return error_note_field(REFUSE(ld, "progress: the file's run scaled its loss, the relay does not ("
                                   L2L_NAMED_FIELD "config->loss_scale" L2L_NAMED_END " is 0)"),
                                "loss_scale");
  return L2L_OK;
}

/* The file's entry `name` for record r: present, of a dtype in `dtypes` (a bit per
   dtype) and `numel` elements (with the record's shape where `shaped`). */
static l2l_status entry_for(const struct safetensors_entry **out, const struct load *ld,
                            const struct record *r, const char *name, unsigned dtypes, int64_t numel,
                            bool shaped, const char *what) {
  const struct safetensors_entry *e = safetensors_find(ld->file, name);
  if (e == NULL) return REFUSE(ld, "record %s: the file has no tensor '%s' (%s)", r->name, name, what);
  const l2l_tensor *value = param_value(r->param);
  bool same = e->numel == numel && (!shaped || e->ndim == l2l_tensor_ndim(value));
  for (int d = 0; same && shaped && d < e->ndim; d++) same = e->shape[d] == l2l_tensor_dim(value, d);
  if (e->dtype == SAFETENSORS_NO_DTYPE || !(dtypes & (1u << e->dtype)) || !same) {
    char have[96] = "", want[96] = "";
    for (int d = 0; d < e->ndim; d++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? "," : "", (long long)e->shape[d]);
    for (int d = 0; d < l2l_tensor_ndim(value); d++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", (long long)l2l_tensor_dim(value, d));
    return REFUSE(ld, "record %s: '%s' (%s) is %s (%s) but the relay's parameter is (%s)%s", r->name, name,
                  what, e->dtype == SAFETENSORS_NO_DTYPE ? e->stored->name : l2l_dtype_name(e->dtype), have,
                  want, shaped ? "" : " (as many elements as it takes)");
  }
  *out = e;
  return L2L_OK;
}

/* Record k of the file against the relay's record k: its name, counts and entries. */
static l2l_status check_record(struct load *ld, int k, const json_t *saved) {
  struct record *r = &ld->rs.r[k];
  const char *name = json_string_value(json_object_get(saved, "name"));
  if (name == NULL || strcmp(name, r->name) != 0)
    return REFUSE(ld, "record %d is '%s' in the file, %s in the relay", k, name ? name : "(none)", r->name);
  int64_t state = 0;
  const json_t *grad = json_object_get(saved, "grad");
  if (!relay_json_whole(json_object_get(saved, "updates"), 0, COUNT_MAX, &r->updates) ||
      (json_object_get(saved, "state") && !relay_json_whole(json_object_get(saved, "state"), 0, 2, &state)) ||
      (grad != NULL && !json_is_boolean(grad)))
    return REFUSE(ld, "record %s: updates must be an integer from 0 to 2^53 - 1, state 0 to 2 and "
                  "grad true or false", r->name);
  r->state = (int)state;
  r->grad = json_is_true(grad);
  int want = r->updates > 0 ? ld->arrays : 0;
  if (r->state != want)
    return REFUSE(ld, "record %s has %d optimizer state arrays after %lld updates; the relay's "
                  "optimizer keeps %d", r->name, r->state, (long long)r->updates, want);
  if (r->grad && !ld->mid)
    return REFUSE(ld, "record %s carries a gradient, but step %lld ends an accumulation of %d: a save "
                  "writes none there (a damaged or forged file)", r->name, (long long)ld->steps,
                  ld->run->config.accumulate);
  int64_t n = l2l_tensor_numel(param_value(r->param));
  uint64_t bytes8 = 0;
  TRY(l2l_state_array_bytes(&bytes8, L2L_STATE_8BIT, n));
  unsigned masters = 1u << L2L_F32 | 1u << L2L_BF16;
  TRY(entry_for(&r->value, ld, r, r->name, masters, n, true, "its weights"));
  for (int a = 0; a < r->state; a++) {
    char entry[64];
    snprintf(entry, sizeof entry, "%s.%s", r->name, a ? "v" : "m");
    const struct safetensors_entry *e = safetensors_find(ld->file, entry);
    bool eight = e != NULL && e->dtype == L2L_U8;   /* in any precision: converted */
    TRY(entry_for(&r->arrays[a], ld, r, entry, eight ? 1u << L2L_U8 : masters, eight ? (int64_t)bytes8 : n,
                  false, "its optimizer state"));
  }
  if (r->grad) {
    char entry[64];
    snprintf(entry, sizeof entry, "%s.grad", r->name);
    TRY(entry_for(&r->grad_entry, ld, r, entry, 1u << L2L_F32, n, false, "its gradient"));
  }
  return L2L_OK;
}

/* The description against the relay: layers, options, progress, records. */
static l2l_status check_description(struct load *ld) {
  l2l_relay *run = ld->run;
  const json_t *layers = json_object_get(ld->desc, "layers"), *records = json_object_get(ld->desc, "records");
  if (json_array_size(layers) != (size_t)run->count)
    return REFUSE(ld, "the file describes %zu layers, the relay has %d", json_array_size(layers), run->count);
  ld->saved = calloc((size_t)run->count, sizeof *ld->saved);
  if (ld->saved == NULL) return core_fail(L2L_ERR_NOMEM, "no memory to load %s", ld->path);
  for (int i = 0; i < run->count; i++)
    TRY(in_file(ld->path, relay_check_layer(run, i, json_array_get(layers, (size_t)i), &ld->saved[i], "the file")));
  TRY(in_file(ld->path, relay_check_options(run, json_object_get(ld->desc, "relay"), "the file")));
  TRY(check_progress(ld));
  TRY(l2l_optimizer_state_arrays(&ld->arrays, &run->config.optimizer));
  TRY(records_list(&ld->rs, run));
  if (json_array_size(records) != (size_t)ld->rs.n)
    return REFUSE(ld, "the file describes %zu parameter records, the relay's model has %d", json_array_size(records),
                  ld->rs.n);
  for (int k = 0; k < ld->rs.n; k++) TRY(check_record(ld, k, json_array_get(records, (size_t)k)));
  return L2L_OK;
}

/* Every byte the load will take, read once and checked: the checksums, and each state
   array as l2l_relay_restore_param checks it (finite; a second moment >= 0). */
static l2l_status check_data(struct load *ld) {
  for (int k = 0; k < ld->rs.n; k++) {
    const struct record *r = &ld->rs.r[k];
    TRY(safetensors_check(ld->file, r->value));
    for (int a = 0; a < r->state; a++) {
      l2l_tensor *t = NULL;
      TRY(safetensors_read_tensor(&t, ld->file, r->arrays[a]));
      int64_t n = l2l_tensor_numel(param_value(r->param));
      l2l_status status = l2l_state_array_check(t, &ld->run->config.optimizer, a, n);
      l2l_tensor_free(t);
      if (status != L2L_OK) {
        const char *why = l2l_last_error(), *prefix = "l2l_state_array_check: array ";
        if (strncmp(why, prefix, strlen(prefix)) == 0) why += strlen(prefix);
        char copy[768];
        snprintf(copy, sizeof copy, "%s", why);
        return REFUSE(ld, "record %s: its optimizer state '%s' %s", r->name, r->arrays[a]->name, copy);
      }
    }
    if (r->grad) TRY(safetensors_check(ld->file, r->grad_entry));
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- restoring */

/* An entry of the file into `into`: read in place, or (a tensor on the device, or of
   another dtype: f32 and bf16 either way, to nearest even or exactly) read and converted. */
static l2l_status restore_tensor(struct load *ld, const struct safetensors_entry *entry,
                                 l2l_tensor *into) {
  if (entry->dtype == (l2l_dtype)l2l_tensor_dtype(into) && l2l_tensor_pool(into) != L2L_POOL_DEVICE)
    return safetensors_read(ld->file, entry, l2l_tensor_data(into));
  l2l_tensor *t = NULL, *cast = NULL;
  TRY(safetensors_read_tensor(&t, ld->file, entry));
  l2l_status status = relay_tensor_like(&cast, L2L_POOL_HOST, into);
  if (status == L2L_OK) status = l2l_tensor_cast(cast, t);   /* (on the host), then across */
  if (status == L2L_OK) status = l2l_tensor_copy(into, cast);
  l2l_tensor_free(t);
  l2l_tensor_free(cast);
  return status;
}

static l2l_status restore_record(struct load *ld, const struct record *r, bool grads) {
  eps_record_written(&ld->run->eps, r->rec);   /* (its staging copy, its accumulator) */
  TRY(restore_tensor(ld, r->value, param_value(r->param)));
  l2l_tensor *st[2] = {NULL, NULL};
  l2l_status status = L2L_OK;
  for (int a = 0; a < r->state && status == L2L_OK; a++) status = safetensors_read_tensor(&st[a], ld->file, r->arrays[a]);
  if (status == L2L_OK) status = relay_restore_param(ld->run, "l2l_relay_load", r->param, r->updates, st[0], st[1]);
  l2l_tensor_free(st[0]);
  l2l_tensor_free(st[1]);
  if (status == L2L_OK && r->grad && grads)
    status = restore_tensor(ld, r->grad_entry, param_grad(r->param));
  return status;
}

/* Everything the file holds into the relay, all of it checked already. */
static l2l_status restore(struct load *ld) {
  l2l_relay *run = ld->run;
  for (int i = 0; i < run->count; i++) {
    const struct layer_saved *s = &ld->saved[i];
    if (s->rng_id >= 0) TRY(l2l_layer_set_rng_id(run->layers[i].layer, (uint32_t)s->rng_id));
    if (s->frozen >= 0) run->layers[i].frozen = s->frozen;
    if (s->inner >= 0) run->layers[i].inner = (l2l_inner_policy)s->inner;
    if (i >= 1 && s->stash >= 0) run->layers[i].stash = (l2l_stash_policy)s->stash;
  }
  /* each record's stochastic rounding draws from its first layer's rng id, as a relay
     made over the loaded layers keys them (relay.c, eps_records) */
  for (int k = 0; k < ld->rs.n; k++) {
    const struct record *r = &ld->rs.r[k];
    eps_set_stream(r->rec, (uint64_t)l2l_layer_rng_id(run->layers[r->layer].layer) << 8 | (uint64_t)r->place);
  }
  /* the relay's own partial gradients go (the file's take their place); with ranks the
     file's go to rank 0 alone, as the ranks' sum is what counts */
  if (run->steps % run->config.accumulate != 0)
    for (int k = 0; k < ld->rs.n; k++) {
      eps_record_written(&run->eps, ld->rs.r[k].rec);
      eps_drop_gradient(&run->eps, ld->rs.r[k].rec);
    }
  int rank = 0;
  if (run->config.dist == L2L_DIST_MPI) TRY(l2l_dist_rank(&rank));
  for (int k = 0; k < ld->rs.n; k++) TRY(restore_record(ld, &ld->rs.r[k], rank == 0));
  TRY(relay_restore_progress(run, "l2l_relay_load", ld->steps, ld->updates));
  if (ld->scaled) TRY(relay_restore_loss_scale(run, "l2l_relay_load", ld->scale, ld->good, ld->skipped));
  return L2L_OK;
}

l2l_status l2l_relay_load(l2l_relay *run, const char *path) {
  RELAY_ENTER(run);
  if (path == NULL || path[0] == '\0') return FAIL(L2L_ERR_INVALID, "path must be a non-empty string");
  struct load ld = {.run = run, .path = path};
  l2l_status status = relay_sync_now(run);
  if (status == L2L_OK) status = safetensors_open(&ld.file, path);
  if (status == L2L_OK) status = description_of(&ld.desc, ld.file);
  if (status == L2L_OK) status = check_description(&ld);
  if (status == L2L_OK) status = check_data(&ld);
  if (status == L2L_OK && (status = restore(&ld)) != L2L_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", l2l_last_error());
    core_fail(status, "%s (past the checks: the relay is partly loaded; load it again, or free it)", why);
  }
  safetensors_close(ld.file);
  json_decref(ld.desc);
  records_free(&ld.rs);
  free(ld.saved);
  return error_as(__func__, status);
}

l2l_status l2l_checkpoint_description(char *out, size_t capacity, size_t *length, const char *path) {
  if (length == NULL) return FAIL(L2L_ERR_INVALID, "length is NULL");
  if (path == NULL || path[0] == '\0') return FAIL(L2L_ERR_INVALID, "path must be a non-empty string");
  struct safetensors_file *f = NULL;
  json_t *desc = NULL;
  l2l_status status = safetensors_open(&f, path);
  if (status == L2L_OK) status = description_of(&desc, f);
  if (status == L2L_OK) {
    const char *text = safetensors_metadata(f, "l2l");
    size_t n = strlen(text);
    if (out != NULL && capacity < n + 1)
      status = core_fail(L2L_ERR_INVALID, "capacity %zu is too small: the description of %s is %zu bytes "
                         "and a NUL", capacity, path, n);
    else if (out != NULL)
      memcpy(out, text, n + 1);
    *length = n;   /* (also when out was short: what it takes) */
  }
  json_decref(desc);
  safetensors_close(f);
  return error_as(__func__, status);
}
