/* SPDX-License-Identifier: MIT */
/* test_relay_dynamic.c — dynamic architecture: insert, remove, replace, clone, freeze and
 * skip between steps leave every other record's weights and optimizer state untouched, bit
 * for bit, and the relay still trains like plain training of the changed model; a layer
 * freed while the relay held it. test_relay.c says how the relay's tests test (the plain
 * executor, plain.c, as the reference); relay_rig.h holds the tolerances and helpers. All
 * test names start with "relay_".
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "relay_rig.h"

/* ---------------------------------------------------------------- dynamic architecture */

/* The relay's model and the plain executor's mirror of it, changed alike. */
struct pair {
  struct model rm;       /* the relay's layers (the relay borrows them) */
  l2l_relay *r;
  struct plain p;
  struct data batches[2];
  int64_t micro;         /* the relay's micro-batch, which the plain executor splits by */
};

/* Makes the plain executor's weights and optimizer states the relay's, record by record
   (update counts stay the plain executor's own), so that each phase of a long test
   starts both from one state. */
static void plain_take_relay_state(struct plain *p, l2l_relay *r, const struct model *rm) {
  CHECK_OK(l2l_relay_sync(r));
  for (int l = 0; l < rm->n && l < p->model.n; l++)
    for (int j = 0; j < l2l_layer_param_count(rm->layer[l]); j++) {
      l2l_param *rp = l2l_layer_param(rm->layer[l], j), *pp = l2l_layer_param(p->model.layer[l], j);
      l2l_tensor *pv = l2l_param_value(pp);
      memcpy(l2l_tensor_data(pv), l2l_tensor_data(l2l_param_value(rp)), tensor_bytes(pv));
      struct prec *pr = plain_rec(p, pp);
      for (int w = 0; w < 2; w++) {
        l2l_tensor *st = NULL, *mine = w == 0 ? pr->m : pr->v;
        CHECK_OK(l2l_relay_param_state(&st, r, rp, w));
        if (st)
          memcpy(l2l_tensor_data(mine), l2l_tensor_data(st), tensor_bytes(mine));
        else
          memset(l2l_tensor_data(mine), 0, tensor_bytes(mine));
      }
    }
}

/* `steps` steps on both: losses must agree and stay finite, and then every weight and
   optimizer state; the plain executor then takes the relay's state for the next phase. */
static bool pair_steps(struct pair *x, int steps, const uint8_t *skip, const char *what) {
  bool ok = true;
  for (int k = 0; k < steps; k++) {
    const struct data *d = &x->batches[k % 2];
    double loss;
    if (!relay_step(&loss, x->r, d, skip)) return false;
    double want = plain_step(&x->p, d, x->micro, skip);
    ok &= CHECK(isfinite(loss) && rel_close(loss, want, TOL_LOSS),
                "%s: loss %.9g, plain training %.9g", what, loss, want);
  }
  ok &= compare_to_plain(x->r, &x->rm, &x->p, what);
  plain_take_relay_state(&x->p, x->r, &x->rm);
  return ok;
}

/* The relay's layer list must be rm's. */
static bool pair_layers_agree(struct pair *x, const char *what) {
  bool ok = CHECK(l2l_relay_layer_count(x->r) == x->rm.n, "%s: %d layers in the relay, %d "
                  "expected", what, l2l_relay_layer_count(x->r), x->rm.n);
  for (int l = 0; ok && l < x->rm.n; l++)
    ok &= CHECK(l2l_relay_layer(x->r, l) == x->rm.layer[l], "%s: layer %d is not the one "
                "expected", what, l);
  return ok;
}

/* Checks what a change must leave alone: every record of `s` other than those of the
   layer `fresh` (-1: none) bit for bit, and `fresh`'s records without optimizer state. */
static void check_after_change(struct pair *x, const struct snapshot *s, int fresh,
                               const char *what) {
  pair_layers_agree(x, what);
  check_unchanged(x->r, s, what);
  if (fresh < 0) return;
  l2l_layer *layer = x->rm.layer[fresh];
  for (int j = 0; j < l2l_layer_param_count(layer); j++)
    for (int w = 0; w < 2; w++) {
      l2l_tensor *st = (l2l_tensor *)1;
      CHECK_OK(l2l_relay_param_state(&st, x->r, l2l_layer_param(layer, j), w));
      CHECK(st == NULL, "%s: new layer %d's record %s has optimizer state %d before its "
            "first update", what, fresh, l2l_param_name(l2l_layer_param(layer, j)), w);
    }
}

TEST(relay_dynamic_architecture) {
  /* Between steps: insert a block, remove one, replace one, clone one (l2l_layer_clone +
     insert), each mirrored in the plain executor. After each change every record the
     change does not touch is bit for bit what it was (values and both AdamW moments), a
     new layer's records have no optimizer state until their first update, and two more
     steps match plain training of the changed model (losses, then all weights and
     states). Policies are mixed so that boundaries and layers of every policy move with
     the list. */
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct pair x;
  memset(&x, 0, sizeof x);
  make_batches(x.batches, 2, &g, 5, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  cfg.recompute_every = 2;
  model_clone(&x.rm, &init);
  plain_init(&x.p, &init, &cfg);
  x.micro = cfg.micro_batch;
  x.r = relay_new(&x.rm, &cfg);
  if (x.r == NULL) goto done;
  mixed_policies(x.r);
  if (!pair_steps(&x, 2, NULL, "before any change")) goto done;

  struct snapshot s;
  /* insert a new block at 2 */
  {
    snapshot_take(&s, x.r, 0, x.rm.n);
    l2l_layer *b = model_block_new(&g, 0);
    if (CHECK_OK(l2l_relay_insert(x.r, 2, b))) {
      model_insert(&x.rm, 2, b);
      model_insert(&x.p.model, 2, clone_same_rng(b));
      check_after_change(&x, &s, 2, "insert");
    } else {
      l2l_layer_free(b);
    }
    snapshot_free(&s);
    pair_steps(&x, 2, NULL, "after insert");
    snapshot_take(&s, x.r, 2, 3);
    CHECK(s.r[0].state[0] != NULL, "the inserted block has no optimizer state after steps");
    snapshot_free(&s);
  }
  /* remove block 1 */
  {
    snapshot_take(&s, x.r, 0, x.rm.n);
    if (CHECK_OK(l2l_relay_remove(x.r, 1))) {
      l2l_layer *gone = model_take(&x.rm, 1);
      plain_remove(&x.p, 1);
      check_after_change(&x, &s, -1, "remove");
      l2l_layer_free(gone);
    }
    snapshot_free(&s);
    pair_steps(&x, 2, NULL, "after remove");
  }
  /* replace block 2 with a new one */
  {
    snapshot_take(&s, x.r, 0, x.rm.n);
    l2l_layer *b = model_block_new(&g, 1);
    if (CHECK_OK(l2l_relay_replace(x.r, 2, b))) {
      l2l_layer *gone = model_take(&x.rm, 2);
      model_insert(&x.rm, 2, b);
      plain_remove(&x.p, 2);
      model_insert(&x.p.model, 2, clone_same_rng(b));
      /* the old block's records are compared too: its values must stay as they were */
      check_after_change(&x, &s, 2, "replace");
      l2l_layer_free(gone);
    } else {
      l2l_layer_free(b);
    }
    snapshot_free(&s);
    pair_steps(&x, 2, NULL, "after replace");
  }
  /* clone block 1 to position 2 */
  {
    CHECK_OK(l2l_relay_sync(x.r));
    snapshot_take(&s, x.r, 0, x.rm.n);
    l2l_layer *c = NULL;
    if (CHECK_OK(l2l_layer_clone(&c, x.rm.layer[1])) && CHECK_OK(l2l_relay_insert(x.r, 2, c))) {
      model_insert(&x.rm, 2, c);
      /* the plain side clones its own block 1 (equal to the relay's within tolerance) */
      l2l_layer *pc = clone_same_rng(x.p.model.layer[1]);
      CHECK_OK(l2l_layer_set_rng_id(pc, l2l_layer_rng_id(c)));
      model_insert(&x.p.model, 2, pc);
      check_after_change(&x, &s, 2, "clone");
      for (int j = 0; j < l2l_layer_param_count(c); j++) {
        l2l_tensor *a = l2l_param_value(l2l_layer_param(c, j));
        l2l_tensor *o = l2l_param_value(l2l_layer_param(x.rm.layer[1], j));
        CHECK(memcmp(l2l_tensor_data(a), l2l_tensor_data(o), tensor_bytes(a)) == 0,
              "clone: record %s differs from the original's", l2l_param_name(l2l_layer_param(c, j)));
        CHECK(l2l_layer_param(c, j) != l2l_layer_param(x.rm.layer[1], j), "clone shares a record");
      }
    } else {
      l2l_layer_free(c);
    }
    snapshot_free(&s);
    pair_steps(&x, 2, NULL, "after clone");
  }
done:
  l2l_relay_free(x.r);
  plain_free(&x.p);
  model_free(&x.rm);
  free_batches(x.batches, 2);
  model_free(&init);
}

TEST(relay_frees_a_layer_freed_while_it_held_it) {
  /* l2l_layer_free of a layer a relay holds: the layer works on (steps run it, the relay
     names it its own) until the relay lets it go (remove, or the relay's free), which
     frees it. The sanitizer run sees a use after free or a leak. */
  struct shape g = gpt_shape();
  struct model m;
  model_new(&m, &g);
  struct data d;
  data_new(&d, &g, 3, g.S, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  l2l_relay *r = relay_new(&m, &cfg);
  if (r == NULL) goto done;
  CHECK(l2l_layer_relay(NULL) == NULL, "NULL is in a relay");
  for (int k = 0; k < m.n; k++) CHECK(l2l_layer_relay(m.layer[k]) == r, "layer %d is not the relay's", k);
  double loss = NAN;
  relay_step(&loss, r, &d, NULL);
  l2l_layer *gone = model_take(&m, 1);   /* block 0 */
  l2l_layer_free(gone);
  CHECK(l2l_layer_relay(gone) == r, "a layer freed while held left the relay");
  CHECK(relay_step(&loss, r, &d, NULL) && isfinite(loss), "a step with a freed layer held: %g", loss);
  CHECK_OK(l2l_relay_remove(r, 1));      /* frees it */
  CHECK(relay_step(&loss, r, &d, NULL) && isfinite(loss), "a step after its removal: %g", loss);
  l2l_layer *held = model_take(&m, 1);   /* block 1: freed with the relay */
  l2l_layer_free(held);
  CHECK(relay_step(&loss, r, &d, NULL) && isfinite(loss), "a step with a freed layer held: %g", loss);
done:
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
}

TEST(relay_freeze_and_skip) {
  /* freeze: a frozen block's weights and optimizer state stay bit for bit through steps
     while every other record trains, and gradients still pass through it (the result is
     plain training with that layer's gradient dropped); unfrozen, it trains again.
     skip (batch.skip, LayerDrop): the skipped block acts as the identity and stays bit
     for bit; the others train; the result is plain training without that block. */
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct pair x;
  memset(&x, 0, sizeof x);
  make_batches(x.batches, 2, &g, 5, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 3;
  model_clone(&x.rm, &init);
  plain_init(&x.p, &init, &cfg);
  x.micro = cfg.micro_batch;
  x.r = relay_new(&x.rm, &cfg);
  if (x.r == NULL || !pair_steps(&x, 1, NULL, "before freezing")) goto done;
  struct snapshot frozen, others;
  CHECK(l2l_relay_frozen(x.r, 2) == 0, "block 2 frozen from the start");
  if (CHECK_OK(l2l_relay_set_frozen(x.r, 2, 1))) {
    x.p.model.frozen[2] = 1;
    CHECK(l2l_relay_frozen(x.r, 2) == 1, "frozen(2) = %d after freezing", l2l_relay_frozen(x.r, 2));
    snapshot_take(&frozen, x.r, 2, 3);
    snapshot_take(&others, x.r, 0, 2);
    pair_steps(&x, 2, NULL, "frozen block 2");
    check_unchanged(x.r, &frozen, "frozen block 2 after two steps");
    check_all_changed(x.r, &others, "layers before a frozen block");
    snapshot_free(&frozen);
    snapshot_free(&others);
    CHECK_OK(l2l_relay_set_frozen(x.r, 2, 0));
    x.p.model.frozen[2] = 0;
    snapshot_take(&frozen, x.r, 2, 3);
    pair_steps(&x, 1, NULL, "unfrozen block 2");
    check_all_changed(x.r, &frozen, "block 2 after unfreezing");
    snapshot_free(&frozen);
  }
  uint8_t skip[MAX_LAYERS] = {0};
  skip[1] = 1;
  snapshot_take(&frozen, x.r, 1, 2);
  snapshot_take(&others, x.r, 2, x.rm.n);
  pair_steps(&x, 2, skip, "block 1 skipped");
  check_unchanged(x.r, &frozen, "skipped block 1");
  check_all_changed(x.r, &others, "layers after a skipped block");
  snapshot_free(&frozen);
  snapshot_free(&others);
done:
  l2l_relay_free(x.r);
  plain_free(&x.p);
  model_free(&x.rm);
  free_batches(x.batches, 2);
  model_free(&init);
}

/* ---------------------------------------------------------------- the EPS's records */

/* The plain listing of a list's records (each layer's parameters in order, a record kept
   when no layer before holds it), into want[] (at most cap); their count. */
static int plain_listing(l2l_param **want, int cap, l2l_layer *const *list, int n) {
  int count = 0;
  for (int k = 0; k < n; k++)
    for (int r = 0; r < l2l_layer_param_count(list[k]); r++) {
      l2l_param *p = l2l_layer_param(list[k], r);
      bool seen = false;
      for (int i = 0; i < count && !seen; i++) seen = want[i] == p;
      if (!seen && count < cap) want[count++] = p;
    }
  return count;
}

TEST(relay_eps_records_are_the_models_listing_through_changes) {
  /* The EPS's records are the model's one listing (layers_records, as the planner and the
     checkpoint have them) after every change between steps: each record once at its first
     user, in layer order, a record kept by the change with its update count (its state),
     a new one with none. Random GPTs (tied or not), random inserts of clones, of new heads
     tied to the embedding (a record with one more user), removals (the embedding of a tied
     model: its table then listed at the head) and replacements, against the listing
     written here. */
  enum { MAX_EPS = 256 };
  for (int trial = 0; trial < 4; trial++) {
    struct shape g = gpt_shape();
    g.blocks = (int)check_rand_int(1, 3);
    g.tie = (int)check_rand_int(0, 1);
    struct model m;
    model_new(&m, &g);
    l2l_layer *emb = m.layer[0], *head = m.layer[m.n - 1], *gone[16];
    int ngone = 0;
    struct data batches[1];
    make_batches(batches, 1, &g, 3, 0, 1.0);
    l2l_relay_config cfg = adamw_config();
    l2l_relay *r = relay_new(&m, &cfg);
    double loss;
    if (r == NULL || !relay_step(&loss, r, &batches[0], NULL)) goto next;
    for (int change = 0; change < 6 && m.n < MAX_LAYERS - 1; change++) {
      CHECK_OK(l2l_relay_sync(r));
      l2l_param *before[MAX_EPS];
      int64_t updates[MAX_EPS];
      int nbefore = r->eps.count < MAX_EPS ? r->eps.count : MAX_EPS;
      for (int i = 0; i < nbefore; i++) {
        before[i] = eps_param(r->eps.records[i]);
        updates[i] = eps_updates(r->eps.records[i]);
      }
      int op = (int)check_rand_int(0, 3), at = (int)check_rand_int(0, m.n - 1);
      const char *what = "?";
      /* a layer whose record a later one holds (the embedding of a tied head) may not leave:
         the record would be that layer's own while it says it is tied (relay.c) */
      bool held_later = false;   /* (and by no earlier layer, whose name it keeps) */
      for (int q = 0; q < l2l_layer_param_count(m.layer[at]); q++) {
        bool later = false, earlier = false;
        for (int j = 0; j < m.n; j++)
          for (int u = 0; j != at && u < l2l_layer_param_count(m.layer[j]); u++)
            if (l2l_layer_param(m.layer[j], u) == l2l_layer_param(m.layer[at], q)) {
              later |= j > at;
              earlier |= j < at;
            }
        held_later |= later && !earlier;
      }
      if (held_later && ((op == 1 && m.n > 1) || op == 3)) {   /* refused, nothing changed */
        what = op == 1 ? "a refused remove" : "a refused replace";
        l2l_layer *c = clone_same_rng(m.layer[at]);
        l2l_status st = op == 1 ? l2l_relay_remove(r, at) : l2l_relay_replace(r, at, c);
        CHECK(st == L2L_ERR_STATE && strstr(l2l_last_error(), "tied to it") != NULL,
              "trial %d, change %d: %s of layer %d: status %d, \"%s\"", trial, change, what, at, st,
              l2l_last_error());
        l2l_layer_free(c);
      } else if (op == 1 && m.n > 1) {   /* remove */
        what = "remove";
        if (!CHECK_OK(l2l_relay_remove(r, at))) break;
        l2l_layer *out = model_take(&m, at);
        if (out == emb) emb = NULL;
        gone[ngone++] = out;
      } else if (op == 2 && emb != NULL) {   /* a new head tied to the embedding */
        what = "insert a tied head";
        l2l_layer *h = clone_same_rng(head);
        CHECK_OK(l2l_layer_tie(h, emb));
        if (!CHECK_OK(l2l_relay_insert(r, m.n, h))) {
          l2l_layer_free(h);
          break;
        }
        model_insert(&m, m.n, h);
      } else if (op == 3) {   /* replace with a clone of another */
        what = "replace";
        l2l_layer *c = clone_same_rng(m.layer[check_rand_int(0, m.n - 1)]);
        if (!CHECK_OK(l2l_relay_replace(r, at, c))) {
          l2l_layer_free(c);
          break;
        }
        l2l_layer *out = model_take(&m, at);
        if (out == emb) emb = NULL;
        gone[ngone++] = out;
        model_insert(&m, at, c);
      } else {   /* insert a clone */
        what = "insert";
        l2l_layer *c = clone_same_rng(m.layer[at]);
        at = (int)check_rand_int(0, m.n);
        if (!CHECK_OK(l2l_relay_insert(r, at, c))) {
          l2l_layer_free(c);
          break;
        }
        model_insert(&m, at, c);
      }
      l2l_param *want[MAX_EPS];
      int n = plain_listing(want, MAX_EPS, m.layer, m.n);
      bool ok = CHECK(r->eps.count == n, "trial %d (tie %d), change %d (%s at %d): the EPS holds "
                      "%d records, the model lists %d", trial, g.tie, change, what, at,
                      r->eps.count, n);
      for (int i = 0; ok && i < n; i++) {
        int64_t was = 0;
        for (int j = 0; j < nbefore; j++)
          if (before[j] == want[i]) was = updates[j];
        ok &= CHECK(eps_param(r->eps.records[i]) == want[i] &&
                        eps_updates(r->eps.records[i]) == was,
                    "trial %d (tie %d), change %d (%s at %d): the EPS's record %d is %s with %lld "
                    "updates, the listing's is %s with %lld", trial, g.tie, change, what, at, i,
                    l2l_param_name(eps_param(r->eps.records[i])),
                    (long long)eps_updates(r->eps.records[i]), l2l_param_name(want[i]),
                    (long long)was);
      }
      if (!ok || ngone == 16) break;
    }
  next:
    l2l_relay_free(r);
    model_free(&m);
    for (int i = 0; i < ngone; i++) l2l_layer_free(gone[i]);
    free_batches(batches, 1);
  }
}
