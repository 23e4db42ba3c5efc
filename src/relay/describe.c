/* SPDX-License-Identifier: MIT */
/* describe.c — a checkpoint's description: the JSON document a checkpoint keeps beside its
 * tensors (under the safetensors metadata key "l2l"), written from a relay and checked
 * against one.
 *
 * The document, as lua/l2l/checkpoint.lua writes and reads it (version 1):
 *   {"format": "l2l-checkpoint", "version": 1, "l2l": <library version>,
 *    "layers": [{"kind":, "options": {constructor options}, "rng_id":, "frozen":, "inner":,
 *                "stash": (the policy of the boundary entering it, from the second layer
 *                on), "custom": <a custom kind's name>}, ...],
 *    "records": [{"name": "<layer from 1>.<param>", "updates":, "state": <arrays saved>,
 *                 "grad": <true mid-accumulation>}, ...],
 *    "relay": {every option of the relay but the model, "optimizer": {...},
 *              "schedule": {...}},
 *    "progress": {"steps":, "updates":, "loss_scale": {"scale": <hex float>, "good":,
 *                 "skipped":}}, "extra": <the caller's>}
 * A number may be written as {"__f64": "<17 digits>"} (the Lua writer's form for one its
 * JSON library would round); both forms are read.
 * Purpose: the C side of that document. The tables below name each option as the front
 * end does (lua/l2l/relay_options.lua, layers.lua's `saved`, optim.lua) and say which
 * change the numbers a run computes: those a load requires of the relay it loads into (the
 * optimizer's settings but its state's precision, the schedule, clipping, accumulation,
 * the seed, loss scaling, the device's and the gradients' precision, the non-finite
 * policy, every layer's constructor options); the others (micro-batch, budgets, threads,
 * slots, spill, dist, masters' precision, default policies) are the machine's or change
 * speed and memory only, and stay the relay's. The relay options are one more list of
 * them until the option table of issue 48 exists; it is meant to come from there then.
 * Must never: write a value a reader would take otherwise (f32 settings go out as the
 * doubles they are, counts only up to 2^53 - 1), or accept one it cannot hold exactly.
 */
#include <jansson.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "relay.h"

/* ---------------------------------------------------------------- fields and their names */

struct names {
  int n;
  const char *name[3];
  int value[3];
};
static const struct names MEMORY = {2, {"standard", "frugal"}, {L2L_MEMORY_STANDARD, L2L_MEMORY_FRUGAL}};
/* the layer kinds as the front end names them (l2l_layer_kind's order) */
static const char *const KIND_NAMES[] = {"embedding", "block", "lm_head", "classifier", "custom"};

_Static_assert(sizeof(l2l_stash_policy) == sizeof(int) && sizeof(l2l_dtype) == sizeof(int) &&
               sizeof(l2l_memory_mode) == sizeof(int) && sizeof(l2l_optimizer_kind) == sizeof(int),
               "enum fields are read as ints");

enum field_type { F_INT, F_I64, F_U64, F_F32, F_BOOL, F_ENUM, F_PATH };

/* One setting: its name in the document, its C field (an offset in the struct the table
   is of), the kinds it applies to (a bit per kind number; ALL: every one), and whether it
   changes the numbers a run computes (a load requires it of the relay). */
struct field {
  const char *name;
  enum field_type type;
  size_t offset;
  const struct names *names;
  unsigned kinds;
  bool numbers;
};

#define ALL 0xffu
#define BIT(k) (1u << (k))

/* The relay's options as the document holds them: the option table's rows
   (core/options.def), the relay's under their names, the optimizer's and the schedule's
   under their C fields' ("kind", "lr", ...), each written for the kinds its row says
   (SGD's, Adam's, a decaying schedule's), and compared on load when the ranks must agree
   on it and a load may not be given another (it changes the numbers). */
enum { MAX_OPTION_FIELDS = 48 };
struct option_fields {
  int n;
  struct field field[MAX_OPTION_FIELDS];
  struct names names[MAX_OPTION_FIELDS];
};

static unsigned row_kinds(const l2l_option *o) {
  if (o->flags & L2L_OPTION_SGD) return BIT(L2L_OPTIMIZER_SGD);
  if (o->flags & L2L_OPTION_ADAM) return BIT(L2L_OPTIMIZER_ADAMW) | BIT(L2L_OPTIMIZER_LAMB);
  if (o->flags & L2L_OPTION_DECAY) return BIT(L2L_SCHEDULE_COSINE) | BIT(L2L_SCHEDULE_LINEAR);
  return ALL;
}

/* A row's choices as the document names them (at most 3: every choice row has as many). */
static struct names row_names(const l2l_option *o) {
  struct names out = {.n = o->nchoices < 3 ? o->nchoices : 3};
  for (int k = 0; k < out.n; k++) out.name[k] = o->choice_names[k], out.value[k] = o->choice_values[k];
  return out;
}

static void option_fields(struct option_fields *out, l2l_option_group group) {
  static const enum field_type TYPES[] = {
      [L2L_OPTION_INT] = F_INT, [L2L_OPTION_INT64] = F_I64, [L2L_OPTION_UINT64] = F_U64,
      [L2L_OPTION_FLOAT] = F_F32, [L2L_OPTION_CHOICE] = F_ENUM, [L2L_OPTION_BOOL] = F_BOOL,
      [L2L_OPTION_PATH] = F_PATH};
  out->n = 0;
  for (int i = 0; i < options_count && out->n < MAX_OPTION_FIELDS; i++) {
    const l2l_option *o = &options_rows[i];
    if (o->group != group) continue;
    struct names *names = &out->names[out->n];
    *names = row_names(o);
    out->field[out->n++] = (struct field){
        group == L2L_OPTION_RELAY ? o->name : o->field, TYPES[o->type], o->offset,
        o->type == L2L_OPTION_CHOICE ? names : NULL, row_kinds(o),
        (o->flags & L2L_OPTION_AGREE) && o->keep != L2L_KEEP_LOAD};
  }
}

/* The names of a choice row's choices ("optimizer", "schedule", "stash", "inner"). */
static struct names choice_names(const char *row) {
  for (int i = 0; i < options_count; i++)
    if (strcmp(options_rows[i].name, row) == 0) return row_names(&options_rows[i]);
  return (struct names){0};
}

/* A built-in layer's constructor options that rebuild it (layers.lua's `saved`). */
#define EMB BIT(L2L_LAYER_EMBEDDING)
#define BLK BIT(L2L_LAYER_BLOCK)
#define HEAD BIT(L2L_LAYER_LM_HEAD)
#define CLS BIT(L2L_LAYER_CLASSIFIER)
#define L(name, type, field, names, kinds) \
  {name, type, offsetof(l2l_layer_config, field), names, kinds, true}
static const struct field LAYER_FIELDS[] = {
    L("vocab", F_I64, vocab, NULL, EMB | HEAD),
    L("dim", F_I64, dim, NULL, EMB | BLK | HEAD | CLS),
    L("max_seq", F_I64, max_seq, NULL, EMB),
    L("type_vocab", F_I64, type_vocab, NULL, EMB),
    L("heads", F_I64, heads, NULL, BLK),
    L("mlp", F_I64, mlp, NULL, BLK),
    L("causal", F_BOOL, causal, NULL, BLK),
    L("post_ln", F_BOOL, post_ln, NULL, BLK),
    L("bias", F_BOOL, bias, NULL, BLK),
    L("final_ln", F_BOOL, final_ln, NULL, HEAD),
    L("dropout", F_F32, dropout, NULL, EMB | BLK),
    L("attn_dropout", F_F32, attn_dropout, NULL, BLK),
    L("eps", F_F32, eps, NULL, BLK | HEAD),
    L("memory", F_ENUM, memory, &MEMORY, BLK | HEAD),
    L("classes", F_I64, classes, NULL, CLS),
};
#undef L

#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* ---------------------------------------------------------------- numbers */

bool relay_json_number(const json_t *v, double *out) {
  if (json_is_integer(v)) *out = (double)json_integer_value(v);
  else if (json_is_real(v)) *out = json_real_value(v);
  else if (json_is_object(v) && json_object_size(v) == 1) {   /* {"__f64": "<17 digits>"} */
    const char *s = json_string_value(json_object_get(v, "__f64"));
    char *end = NULL;
    if (s == NULL || *s == '\0') return false;
    *out = strtod(s, &end);
    return *end == '\0';
  } else {
    return false;
  }
  return true;
}

bool relay_json_whole(const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
  if (json_is_integer(v)) {
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi) return false;
    *out = (int64_t)i;
    return true;
  }
  double d;   /* lo, hi within 2^53: exact as doubles */
  if (!relay_json_number(v, &d) || !(d >= (double)lo && d <= (double)hi) || d != floor(d)) return false;
  *out = (int64_t)d;
  return true;
}

static const char *name_of(const struct names *names, int value) {
  for (int i = 0; i < names->n; i++)
    if (names->value[i] == value) return names->name[i];
  return NULL;
}

static bool enum_read(const struct names *names, const json_t *v, int *out) {
  for (int k = 0; json_is_string(v) && k < names->n; k++)
    if (strcmp(json_string_value(v), names->name[k]) == 0) {
      *out = names->value[k];
      return true;
    }
  return false;
}

/* ---------------------------------------------------------------- a field read and written */

static l2l_status field_write(json_t *obj, const struct field *f, const void *base) {
  const char *p = (const char *)base + f->offset;
  json_t *v = NULL;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  switch (f->type) {
    case F_INT: v = json_integer(*(const int *)p); break;
    case F_BOOL: v = json_boolean(*(const int *)p); break;
    case F_F32: v = json_real((double)*(const float *)p); break;
    case F_ENUM: {
      const char *name = name_of(f->names, *(const int *)p);
      if (name == NULL) return core_fail(L2L_ERR_INVALID, "%s is %d, which has no name", f->name, *(const int *)p);
      v = json_string(name);
      break;
    }
    case F_PATH:
      if (*(const char *const *)p == NULL) return L2L_OK;   /* none: the key is left out */
      v = json_string(*(const char *const *)p);
      if (v == NULL) return core_fail(L2L_ERR_INVALID, "%s is not UTF-8: a checkpoint cannot keep it", f->name);
      break;
    case F_I64:
      memcpy(&i64, p, sizeof i64);
      if (i64 < 0 || i64 > COUNT_MAX) goto too_large;
      v = json_integer(i64);
      break;
    case F_U64:
      memcpy(&u64, p, sizeof u64);
      if (u64 > (uint64_t)COUNT_MAX) goto too_large;
      v = json_integer((json_int_t)u64);
      break;
  }
  if (v == NULL || json_object_set_new(obj, f->name, v) != 0)
    return core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description");
  return L2L_OK;
too_large:
  return core_fail(L2L_ERR_INVALID, "%s is over 2^53 - 1, the largest integer a checkpoint's JSON "
                   "holds exactly (and the front end reads)", f->name);
}

/* v, the file's value of f, into base's field (its type and range checked). */
static l2l_status field_read(void *base, const struct field *f, const json_t *v, const char *where) {
  char *p = (char *)base + f->offset;
  int64_t i = 0;
  double d = 0;
  switch (f->type) {
    case F_INT:
      if (!relay_json_whole(v, 0, INT_MAX, &i)) break;
      *(int *)p = (int)i;
      return L2L_OK;
    case F_I64:
    case F_U64:
      if (!relay_json_whole(v, 0, COUNT_MAX, &i)) break;
      if (f->type == F_I64) memcpy(p, &i, sizeof i);
      else memcpy(p, &(uint64_t){(uint64_t)i}, sizeof(uint64_t));
      return L2L_OK;
    case F_F32:
      if (!relay_json_number(v, &d) || !isfinite((float)d)) break;
      *(float *)p = (float)d;
      return L2L_OK;
    case F_BOOL:
      if (!json_is_boolean(v)) break;
      *(int *)p = json_is_true(v);
      return L2L_OK;
    case F_ENUM:
      if (!enum_read(f->names, v, (int *)p)) break;
      return L2L_OK;
    case F_PATH:
      return L2L_OK;   /* the machine's: never compared, never taken */
  }
  return core_fail(L2L_ERR_INVALID, "%s: '%s' is not a value it takes", where, f->name);
}

static bool field_equal(const struct field *f, const void *a, const void *b) {
  const char *p = (const char *)a + f->offset, *q = (const char *)b + f->offset;
  switch (f->type) {
    case F_F32: return *(const float *)p == *(const float *)q;
    case F_I64:
    case F_U64: return memcmp(p, q, 8) == 0;
    case F_PATH: return true;
    default: return *(const int *)p == *(const int *)q;
  }
}

static void field_text(char *out, size_t len, const struct field *f, const void *base) {
  const char *p = (const char *)base + f->offset;
  int64_t i64;
  switch (f->type) {
    case F_F32: snprintf(out, len, "%.9g", (double)*(const float *)p); break;
    case F_I64:
    case F_U64: memcpy(&i64, p, 8), snprintf(out, len, "%lld", (long long)i64); break;
    case F_BOOL: snprintf(out, len, "%s", *(const int *)p ? "true" : "false"); break;
    case F_ENUM: {
      const char *name = name_of(f->names, *(const int *)p);
      if (name != NULL) snprintf(out, len, "\"%s\"", name);
      else snprintf(out, len, "%d", *(const int *)p);
      break;
    }
    case F_PATH: snprintf(out, len, "(a path)"); break;
    default: snprintf(out, len, "%d", *(const int *)p); break;
  }
}

/* obj's fields of `kind` into base (missing ones stay as they are unless required); then
   the ones that change the numbers compared with `have`: the first difference named. */
static l2l_status fields_check(const struct field *fields, int n, unsigned kind, const json_t *obj,
                               void *want, const void *have, bool required, const char *where,
                               const char *why, const char *source) {
  for (int k = 0; k < n; k++) {
    const struct field *f = &fields[k];
    if (!(f->kinds & BIT(kind))) continue;
    const json_t *v = json_object_get(obj, f->name);
    if (v == NULL && required && f->numbers)
      return core_fail(L2L_ERR_INVALID, "%s: no '%s'", where, f->name);
    if (v != NULL) TRY(field_read(want, f, v, where));
  }
  for (int k = 0; k < n; k++) {
    const struct field *f = &fields[k];
    if (!(f->kinds & BIT(kind)) || !f->numbers || field_equal(f, want, have)) continue;
    char saved[64], here[64];
    field_text(saved, sizeof saved, f, want);
    field_text(here, sizeof here, f, have);
    return core_fail(L2L_ERR_INVALID, "%s: '%s' is %s in %s, %s in the relay: %s", where, f->name,
                     saved, source, here, why);
  }
  return L2L_OK;
}

static l2l_status fields_write(json_t *obj, const struct field *fields, int n, unsigned kind,
                               const void *base) {
  for (int k = 0; k < n; k++)
    if (fields[k].kinds & BIT(kind)) TRY(field_write(obj, &fields[k], base));
  return L2L_OK;
}

/* ---------------------------------------------------------------- the relay's options */

#define NUMBERS "it changes the numbers, so a relay loading the file must have the same"

static json_t *object_in(json_t *parent, const char *key) {
  json_t *obj = json_object();
  if (obj != NULL && json_object_set_new(parent, key, obj) != 0) return NULL;
  return obj;
}

l2l_status relay_describe_options(json_t **out, const l2l_relay *run) {
  json_t *relay = json_object(), *optimizer = relay ? object_in(relay, "optimizer") : NULL;
  json_t *schedule = relay ? object_in(relay, "schedule") : NULL;
  l2l_status status = optimizer && schedule ? L2L_OK
                                            : core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description");
  const l2l_relay_config *c = &run->config;
  struct option_fields f;
  option_fields(&f, L2L_OPTION_RELAY);
  if (status == L2L_OK) status = fields_write(relay, f.field, f.n, 0, c);
  option_fields(&f, L2L_OPTION_OPTIMIZER);
  if (status == L2L_OK) status = fields_write(optimizer, f.field, f.n, c->optimizer.kind, &c->optimizer);
  option_fields(&f, L2L_OPTION_SCHEDULE);
  if (status == L2L_OK) status = fields_write(schedule, f.field, f.n, c->schedule.kind, &c->schedule);
  if (status != L2L_OK) {
    json_decref(relay);
    return status;
  }
  *out = relay;
  return L2L_OK;
}

/* The kind of `obj` (the optimizer's or the schedule's) as its number. */
static l2l_status kind_of(int *out, const json_t *obj, const struct names *kinds, const char *where) {
  if (!json_is_object(obj)) return core_fail(L2L_ERR_INVALID, "%s: not an object", where);
  if (!enum_read(kinds, json_object_get(obj, "kind"), out))
    return core_fail(L2L_ERR_INVALID, "%s: no kind l2l has", where);
  return L2L_OK;
}

l2l_status relay_check_options(const l2l_relay *run, const json_t *relay, const char *source) {
  if (!json_is_object(relay)) return core_fail(L2L_ERR_INVALID, "relay: not an object");
  /* what a relay made from the file would hold: the defaults, then the file's values
     (a key an older file lacks takes the default, as the front end's load gives it) */
  l2l_relay_config want;
  l2l_relay_config_default(&want);
  want.param_slots = 2, want.spill_dir = NULL;
  struct option_fields f;
  option_fields(&f, L2L_OPTION_RELAY);
  TRY(fields_check(f.field, f.n, 0, relay, &want, &run->config, false, "relay", NUMBERS, source));
  const json_t *o = json_object_get(relay, "optimizer"), *s = json_object_get(relay, "schedule");
  int kind = 0;
  struct names kinds = choice_names("optimizer");
  TRY(kind_of(&kind, o, &kinds, "relay: optimizer"));
  want.optimizer = run->config.optimizer;
  want.optimizer.kind = (l2l_optimizer_kind)kind;
  option_fields(&f, L2L_OPTION_OPTIMIZER);
  TRY(fields_check(f.field, f.n, (unsigned)kind, o, &want.optimizer, &run->config.optimizer, true,
                   "relay: optimizer", NUMBERS, source));
  kinds = choice_names("schedule");
  TRY(kind_of(&kind, s, &kinds, "relay: schedule"));
  want.schedule = run->config.schedule;
  want.schedule.kind = (l2l_schedule_kind)kind;
  option_fields(&f, L2L_OPTION_SCHEDULE);
  return fields_check(f.field, f.n, (unsigned)kind, s, &want.schedule, &run->config.schedule, true,
                      "relay: schedule", NUMBERS, source);
}

/* ---------------------------------------------------------------- layers */

/* The description of layer i that the relay knows: its kind and constructor options (a
   custom layer: its kind's name, options of its own the caller keeps), and tie for a head
   whose projection is an earlier layer's record. */
l2l_status relay_describe_layer(json_t **out, const l2l_relay *run, int i, bool tied) {
  const l2l_layer *layer = run->layers[i].layer;
  l2l_layer_config c;
  TRY(l2l_layer_get_config(&c, layer));
  json_t *d = json_object(), *options = d ? object_in(d, "options") : NULL;
  l2l_status status = options ? L2L_OK : core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description");
  if (status == L2L_OK && json_object_set_new(d, "kind", json_string(KIND_NAMES[c.kind])) != 0)
    status = core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description");
  if (status == L2L_OK && c.kind == L2L_LAYER_CUSTOM) {
    json_t *name = json_string(l2l_layer_name(layer));
    if (name == NULL || json_object_set_new(d, "custom", name) != 0)
      status = error_note_layer(core_fail(L2L_ERR_INVALID, NAMED_LAYER ": its kind's name is not UTF-8", i), i);
  } else if (status == L2L_OK) {
    status = fields_write(options, LAYER_FIELDS, COUNT(LAYER_FIELDS), c.kind, &c);
    if (status == L2L_OK && tied && json_object_set_new(options, "tie", json_true()) != 0)
      status = core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description");
  }
  if (status != L2L_OK) {
    json_decref(d);
    return status;
  }
  *out = d;
  return L2L_OK;
}

/* What the relay holds of layer i beyond its description: its rng id (its dropout draws),
   frozen flag and policies, set on d (a description the caller may have written). */
l2l_status relay_describe_layer_state(json_t *d, const l2l_relay *run, int i) {
  const struct relay_layer *rl = &run->layers[i];
  int bad = json_object_set_new(d, "rng_id", json_integer(l2l_layer_rng_id(rl->layer)));
  bad |= json_object_set_new(d, "frozen", json_boolean(rl->frozen));
  const struct names inner = choice_names("inner"), stash = choice_names("stash");
  bad |= json_object_set_new(d, "inner", json_string(name_of(&inner, (int)rl->inner)));
  if (i >= 1) bad |= json_object_set_new(d, "stash", json_string(name_of(&stash, (int)rl->stash)));
  return bad ? core_fail(L2L_ERR_NOMEM, "no memory for a checkpoint's description") : L2L_OK;
}

/* d, the file's description of layer i, against the relay's layer: the same kind, the same
   constructor options (a custom kind: the same name), an rng id, flag and policies it
   takes. (Its records are checked by the caller.) */
static l2l_status check_layer_described(const l2l_relay *run, int i, const json_t *d, struct layer_saved *out,
                                        const char *source) {
  const l2l_layer *layer = run->layers[i].layer;
  l2l_layer_config have;
  TRY(l2l_layer_get_config(&have, layer));
  const char *kind = json_string_value(json_object_get(d, "kind"));
  const json_t *options = json_object_get(d, "options");
  if (!json_is_object(d) || kind == NULL)
    return core_fail(L2L_ERR_INVALID, NAMED_LAYER ": no description", i);
  if (strcmp(kind, KIND_NAMES[have.kind]) != 0)
    return core_fail(L2L_ERR_INVALID, NAMED_LAYER " is of kind '%s' in %s, '%s' in the relay", i, kind, source,
                     KIND_NAMES[have.kind]);
  char where[64];
  snprintf(where, sizeof where, NAMED_LAYER " (%s)", i, kind);
  if (have.kind == L2L_LAYER_CUSTOM) {
    const char *name = json_string_value(json_object_get(d, "custom"));
    if (name == NULL || strcmp(name, l2l_layer_name(layer)) != 0)
      return core_fail(L2L_ERR_INVALID, NAMED_LAYER " is of the custom kind '%s' in %s, '%s' in the relay",
                       i, name ? name : "(none)", source, l2l_layer_name(layer));
  } else {
    if (!json_is_object(options)) return core_fail(L2L_ERR_INVALID, NAMED_LAYER " (%s): no options", i, kind);
    l2l_layer_config want = have;
    TRY(fields_check(LAYER_FIELDS, COUNT(LAYER_FIELDS), have.kind, options, &want, &have, true, where,
                     "the relay must be made over the model the file holds", source));
  }
  *out = (struct layer_saved){.rng_id = -1, .frozen = -1, .inner = -1, .stash = -1};
  const json_t *v = json_object_get(d, "rng_id"), *frozen = json_object_get(d, "frozen");
  int64_t id = 0;
  if (v != NULL && !relay_json_whole(v, 0, (1 << 24) - 1, &id))
    return core_fail(L2L_ERR_INVALID, NAMED_LAYER ": rng_id must be an integer from 0 to 2^24 - 1", i);
  if (v != NULL) out->rng_id = (int)id;
  if (frozen != NULL && !json_is_boolean(frozen))
    return core_fail(L2L_ERR_INVALID, NAMED_LAYER ": frozen must be true or false", i);
  if (frozen != NULL) out->frozen = json_is_true(frozen);
  const struct names inner = choice_names("inner"), stash = choice_names("stash");
  const struct field policies[2] = {{"inner", F_ENUM, offsetof(struct layer_saved, inner), &inner, ALL, false},
                                    {"stash", F_ENUM, offsetof(struct layer_saved, stash), &stash, ALL, false}};
  for (int k = 0; k < (i >= 1 ? 2 : 1); k++) {
    v = json_object_get(d, policies[k].name);
    if (v != NULL) TRY(field_read(out, &policies[k], v, where));
  }
  return L2L_OK;
}

l2l_status relay_check_layer(const l2l_relay *run, int i, const json_t *d, struct layer_saved *out,
                             const char *source) {
  l2l_status status = check_layer_described(run, i, d, out, source);
  return status == L2L_OK ? status : error_note_layer(status, i);
}
