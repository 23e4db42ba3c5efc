/* SPDX-License-Identifier: MIT */
/* test_records.c — layers_records (src/layers/records.c), the one listing of a model's
 * parameter records, against a listing written here the plain way (each layer's
 * parameters in order, a record kept when no layer before holds it, its users and
 * trainability counted over all layers).
 *
 * Purpose: the planner's host bytes and master bytes and the checkpoint's record list all
 * read their records from layers_records: a record twice, out of order or at the wrong
 * first user would count bytes twice or name a tensor wrongly. Random GPTs (tied or not),
 * layers repeated in the list (a clone shares nothing; the same layer twice shares all),
 * random frozen flags.
 * Must never: compare with numbers written here.
 */
#include <stdlib.h>

#include "check.h"
#include "layers/layers.h"
#include "reference.h"

TEST(records_are_each_record_once_at_its_first_user_in_layer_order) {
  for (int trial = 0; trial < 20; trial++) {
    struct shape g = gpt_shape();
    g.blocks = (int)check_rand_int(1, 4);
    g.tie = (int)check_rand_int(0, 1);
    struct model m;
    model_new(&m, &g);
    /* the list: the model's layers, with one of them again at a random place */
    const l2l_layer *list[MAX_LAYERS + 1];
    int n = 0;
    int again = (int)check_rand_int(0, m.n - 1), at = (int)check_rand_int(0, m.n);
    for (int k = 0; k <= m.n; k++) {
      if (k == at) list[n++] = m.layer[again];
      if (k < m.n) list[n++] = m.layer[k];
    }
    bool frozen[MAX_LAYERS + 1];
    for (int k = 0; k < n; k++) frozen[k] = check_rand_int(0, 3) == 0;
    struct layers_record *got = NULL;
    int count = -1;
    if (!CHECK_OK(layers_records(&got, &count, list, frozen, n))) {
      model_free(&m);
      continue;
    }
    /* the plain listing */
    int want = 0;
    for (int k = 0; k < n; k++)
      for (int r = 0; r < l2l_layer_param_count(list[k]); r++) {
        l2l_param *p = l2l_layer_param(list[k], r);
        bool seen = false;
        for (int j = 0; j < k && !seen; j++)
          for (int q = 0; q < l2l_layer_param_count(list[j]); q++) seen |= l2l_layer_param(list[j], q) == p;
        if (seen) continue;
        int users = 0;
        bool trained = false;
        for (int j = 0; j < n; j++)
          for (int q = 0; q < l2l_layer_param_count(list[j]); q++)
            if (l2l_layer_param(list[j], q) == p) users++, trained |= !frozen[j];
        if (want < count)
          CHECK(got[want].param == p && got[want].layer == k && got[want].place == r &&
                    got[want].users == users && got[want].trained == trained,
                "trial %d (tie %d, layer %d again at %d): record %d is layer %d's %d with %d users, "
                "trained %d; got layer %d's %d, %d users, trained %d", trial, g.tie, again, at, want,
                k, r, users, trained, got[want].layer, got[want].place, got[want].users,
                got[want].trained);
        want++;
      }
    CHECK(count == want, "trial %d: %d records, the plain listing has %d", trial, count, want);
    free(got);
    model_free(&m);
  }
}
