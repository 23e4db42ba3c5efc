/* SPDX-License-Identifier: MIT */
/* registry.c — the layer kinds l2l knows, and what every kind's config shares.
 *
 * Purpose: the one table from a kind's number to its operations (kind.h), so that no other
 * file dispatches on a kind with a switch: adding a kind is its file and its line here.
 * The checks every config gets (dim, init_std, dropout) come before the kind's own.
 * Must never: hold a kind's own logic.
 */
#include <stdarg.h>
#include <stdio.h>

#include "kind.h"

/* One line per kind: its number in l2l.h, and its operations (defined in its own file). */
#define LAYER_KINDS(X)                         \
  X(L2L_LAYER_EMBEDDING, layers_embedding_kind)   \
  X(L2L_LAYER_BLOCK, layers_block_kind)           \
  X(L2L_LAYER_LM_HEAD, layers_lm_head_kind)       \
  X(L2L_LAYER_CLASSIFIER, layers_classifier_kind) \
  X(L2L_LAYER_CUSTOM, layers_custom_kind)

#define DECLARE(number, ops) extern const struct layer_kind_ops ops;
LAYER_KINDS(DECLARE)
#define ENTRY(number, ops) [number] = &ops,
static const struct layer_kind_ops *const kinds[] = {LAYER_KINDS(ENTRY)};

const struct layer_kind_ops *kind_ops(l2l_layer_kind kind) {
  if ((int)kind < 0 || (size_t)kind >= sizeof kinds / sizeof kinds[0]) return NULL;
  return kinds[kind];
}

l2l_status layers_config_fail(const l2l_layer_config *c, const char *fmt, ...) {
  char message[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return core_fail_in("l2l_layer_new", L2L_ERR_INVALID, "%s: %s", kind_ops(c->kind)->name, message);
}

l2l_status layer_check_config(const l2l_layer_config *c) {
  if (c == NULL) return core_fail_in("l2l_layer_new", L2L_ERR_INVALID, "config is NULL");
  const struct layer_kind_ops *kind = kind_ops(c->kind);
  if (kind == NULL)
    return core_fail_in("l2l_layer_new", L2L_ERR_INVALID, "no layer kind with number %d", c->kind);
  CONFIG_SIZE(dim);
  CONFIG_NEED(isfinite(c->init_std) && c->init_std > 0, "init_std must be finite and > 0, got %g",
              c->init_std);
  CONFIG_NEED(isfinite(c->dropout) && c->dropout >= 0 && c->dropout < 1,
              "dropout must be in [0, 1), got %g", c->dropout);
  return kind->check_config(c);
}

const char *l2l_layer_name(const l2l_layer *layer) {
  if (!layer_live(layer)) return NULL;
  if (layer->custom) return layer->custom->name;
  return layer_kind_of(layer)->name;
}

enum layer_role layer_role(const l2l_layer *layer) {
  return layer_kind_of(layer)->role;
}
