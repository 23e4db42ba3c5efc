/* SPDX-License-Identifier: MIT */
/* test_relay_spill.c — the relay with its optimizer state in a spill file: the same bits as
 * in memory, faults of the file's I/O named with nothing lost, and a file overwritten
 * behind the relay's back refused with nothing changed. test_relay.c says how the relay's
 * tests test (the plain executor, plain.c, as the reference); relay_rig.h holds the
 * tolerances and helpers. All test names start with "relay_".
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

TEST(relay_with_the_state_spilled_is_the_same_to_the_bit) {
  char dir[256];
  if (!check_temp_dir(dir, sizeof dir, "l2l-state-spill")) return;
  const l2l_optimizer_config optimizers[3] = {
      {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-5f,
       .weight_decay = 0.1f},
      {.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = 0.5f},
      {.kind = L2L_OPTIMIZER_LAMB, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-5f,
       .weight_decay = 0.01f}};
  for (int o = 0; o < 3; o++) {
    struct shape g = gpt_shape();
    g.dropout = 0;
    g.tie = (int)check_rand_int(0, 1);   /* tied: the token table one record of two users */
    struct model init, mem, disk;
    model_new(&init, &g);
    model_clone(&mem, &init);
    model_clone(&disk, &init);
    struct data d;
    data_new(&d, &g, check_rand_int(2, 5), g.S, 0, 1.0);
    l2l_relay_config cfg = adamw_config();
    cfg.optimizer = optimizers[o];
    cfg.micro_batch = check_rand_int(1, 3);
    l2l_relay *a = relay_new(&mem, &cfg), *b = relay_new(&disk, &cfg);
    int spill_after = (int)check_rand_int(0, 1);   /* before the first step, or after it */
    /* tight: the host budget the smallest that works, so that updates wait for room one
       record at a time (a step refused for it changes nothing, and is taken again) */
    bool tight = check_rand_int(0, 1) == 1, ok = a && b;
    printf("  optimizer %d: the spilled relay's host budget %s, %s head\n", o,
           tight ? "the smallest that works" : "none", g.tie ? "a tied" : "an untied");
    for (int step = 0; ok && step < 4; step++) {
      if (step == spill_after) ok &= CHECK_OK(l2l_relay_sync(b)) && CHECK_OK(eps_spill_state(&b->eps, dir));
      double la, lb;
      ok &= relay_step(&la, a, &d, NULL);
      l2l_relay_batch bb = relay_batch(&d, NULL);
      unsigned long long smallest = 0;
      if (ok && tight && CHECK_OK(l2l_relay_set_host_budget(b, 1)) &&
          CHECK_FAILS(l2l_relay_step(&lb, b, &bb), L2L_ERR_BUDGET, "host budget") &&
          CHECK(strstr(l2l_last_error(), "is below the ") != NULL &&
                    sscanf(strstr(l2l_last_error(), "is below the "), "is below the %llu", &smallest) == 1,
                "no smallest budget in: %s", l2l_last_error())) {
        l2l_error_detail detail;   /* (the number a program reads: the message's) */
        ok &= CHECK_OK(l2l_last_error_detail(&detail)) &&
              CHECK(detail.needed_bytes == smallest, "needed_bytes %llu, the message says %llu",
                    (unsigned long long)detail.needed_bytes, smallest);
        ok &= CHECK_OK(l2l_relay_set_host_budget(b, smallest));
      }
      ok &= relay_step(&lb, b, &d, NULL);
      if (ok) ok &= CHECK(la == lb, "optimizer %d, step %d: loss %.17g in memory, %.17g spilled", o,
                          step, la, lb);
    }
    if (ok && CHECK_OK(l2l_relay_sync(a)) && CHECK_OK(l2l_relay_sync(b))) {
      CHECK_OK(eps_io_status(&b->eps));
      CHECK(check_dir_entries(dir) == 1, "optimizer %d: %d files in %s, want the spill file", o,
            check_dir_entries(dir), dir);
      CHECK(relay_stats(b).host_eps_bytes < relay_stats(a).host_eps_bytes,
            "optimizer %d: host bytes %llu spilled, %llu in memory", o,
            (unsigned long long)relay_stats(b).host_eps_bytes,
            (unsigned long long)relay_stats(a).host_eps_bytes);
      for (int k = 0; k < mem.n; k++)
        for (int i = 0; i < l2l_layer_param_count(mem.layer[k]); i++) {
          l2l_param *pa = l2l_layer_param(mem.layer[k], i), *pb = l2l_layer_param(disk.layer[k], i);
          const l2l_tensor *x = l2l_param_value(pa), *y = l2l_param_value(pb);
          CHECK(memcmp(l2l_tensor_data(x), l2l_tensor_data(y), tensor_bytes(x)) == 0,
                "optimizer %d: layer %d record %d: the weights differ", o, k, i);
          for (int w = 0; w < 2; w++) {
            l2l_tensor *sa = NULL, *sb = NULL;
            CHECK_OK(l2l_relay_param_state(&sa, a, pa, w));
            CHECK_OK(l2l_relay_param_state(&sb, b, pb, w));
            CHECK((sa == NULL) == (sb == NULL) &&
                      (sa == NULL || memcmp(l2l_tensor_data(sa), l2l_tensor_data(sb), tensor_bytes(sa)) == 0),
                  "optimizer %d: layer %d record %d: state %d differs", o, k, i, w);
          }
        }
    }
    l2l_relay_free(a);
    l2l_relay_free(b);
    CHECK(check_dir_entries(dir) == 0, "optimizer %d: the spill file outlived its relay", o);
    data_free(&d);
    model_free(&mem);
    model_free(&disk);
    model_free(&init);
  }
  check_remove_dir(dir);
}

/* The spill file's faults through the relay (config.spill_dir): a disk with no room (a
   file size limit stands for it) keeps the state in memory and loses nothing — the same
   losses and weights to the bit as in memory — and the next call says so, naming the
   file; a file cut short by another program leaves the records it cannot read not
   updated (their weights as they were) and the next call names the file and a record. */
TEST(relay_spill_faults_are_named_and_lose_nothing) {
  char dir[256], file[600];
  if (!check_temp_dir(dir, sizeof dir, "l2l-relay-spill-faults")) return;
  struct shape g = gpt_shape();
  g.dropout = 0;
  struct model init, mem, disk;
  model_new(&init, &g);
  model_clone(&mem, &init);
  model_clone(&disk, &init);
  struct data d;
  data_new(&d, &g, check_rand_int(2, 4), g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config(), spilled = cfg;
  spilled.spill_dir = dir;
  l2l_relay *a = relay_new(&mem, &cfg), *b = NULL;

  /* no room: the limit set after the file is made, put back before anything else */
  struct rlimit old_limit;
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  bool limited = false;
  if (a && CHECK(getrlimit(RLIMIT_FSIZE, &old_limit) == 0, "getrlimit") && (b = relay_new(&disk, &spilled))) {
    struct rlimit lim = {4096, old_limit.rlim_max};
    limited = CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
  }
  double la, lb;
  if (limited && relay_step(&la, a, &d, NULL) && relay_step(&lb, b, &d, NULL)) {
    CHECK(la == lb, "loss %.17g in memory, %.17g with a full spill disk", la, lb);
    /* the updates could not write their state out (kept in memory): the next call says
       so, naming the file; the step after is refused before it changes anything, as long
       as the state cannot go out */
    if (CHECK_FAILS(l2l_relay_sync(b), L2L_ERR_IO, "no room"))
      CHECK(strstr(l2l_last_error(), dir) != NULL, "the message does not name the file: %s", l2l_last_error());
    l2l_relay_batch bb = relay_batch(&d, NULL);
    CHECK_FAILS(l2l_relay_step(&lb, b, &bb), L2L_ERR_IO, "free space on that disk");
  }
  /* room again: training goes on, the same to the bit as in memory */
  if (limited) setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  for (int step = 1; limited && step < 3; step++) {
    if (!relay_step(&la, a, &d, NULL) || !relay_step(&lb, b, &d, NULL)) break;
    CHECK(la == lb, "step %d: loss %.17g in memory, %.17g after the disk had room again", step, la, lb);
  }
  if (limited && CHECK_OK(l2l_relay_sync(a)) && CHECK_OK(l2l_relay_sync(b))) {
    for (int k = 0; k < mem.n; k++)
      for (int i = 0; i < l2l_layer_param_count(mem.layer[k]); i++) {
        const l2l_tensor *x = l2l_param_value(l2l_layer_param(mem.layer[k], i)),
                         *y = l2l_param_value(l2l_layer_param(disk.layer[k], i));
        CHECK(memcmp(l2l_tensor_data(x), l2l_tensor_data(y), tensor_bytes(x)) == 0,
              "layer %d record %d: a full spill disk lost an update", k, i);
      }
  }
  l2l_relay_free(b);
  b = NULL;

  /* a file cut short: the records whose state cannot be read are not updated */
  if (a && (b = relay_new(&disk, &spilled))) {
    bool ok = relay_step(&lb, b, &d, NULL) && relay_step(&lb, b, &d, NULL) && CHECK_OK(l2l_relay_sync(b));
    DIR *dd = ok ? opendir(dir) : NULL;
    file[0] = '\0';
    for (struct dirent *e; dd && (e = readdir(dd)) != NULL;)
      if (strncmp(e->d_name, "l2l-spill-", 10) == 0) snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
    if (dd) closedir(dd);
    if (ok && CHECK(file[0] && truncate(file, 0) == 0, "no spill file to cut short in %s", dir)) {
      const l2l_tensor *w = l2l_param_value(l2l_layer_param(disk.layer[1], 0));
      size_t bytes = tensor_bytes(w);
      void *before = malloc(bytes);
      if (before) memcpy(before, l2l_tensor_data(w), bytes);
      if (relay_step(&lb, b, &d, NULL) &&
          CHECK_FAILS(l2l_relay_sync(b), L2L_ERR_IO, "was not updated (its optimizer state could not be read)")) {
        CHECK(strstr(l2l_last_error(), file) != NULL, "the message does not name %s: %s", file, l2l_last_error());
        CHECK(before && memcmp(before, l2l_tensor_data(w), bytes) == 0,
              "a record whose state could not be read was updated");
      }
      free(before);
    }
  }
  l2l_relay_free(a);
  l2l_relay_free(b);
  CHECK(check_dir_entries(dir) == 0, "the spill file outlived its relay");
  data_free(&d);
  model_free(&mem);
  model_free(&disk);
  model_free(&init);
  check_remove_dir(dir);
}

/* The spill file's path in dir (the one file there named so), in `file`; false when none. */
static bool spill_file_in(const char *dir, char *file, size_t len) {
  DIR *dd = opendir(dir);
  file[0] = '\0';
  for (struct dirent *e; dd && (e = readdir(dd)) != NULL;)
    if (strncmp(e->d_name, "l2l-spill-", 10) == 0) snprintf(file, len, "%s/%s", dir, e->d_name);
  if (dd) closedir(dd);
  return file[0] != '\0';
}

/* Writes `bytes` over the whole of the file at path (its size kept): a fill byte when
   bytes is NULL. */
static bool overwrite_file(const char *path, const unsigned char *bytes, size_t size, int fill) {
  FILE *f = fopen(path, "r+b");
  if (f == NULL) return false;
  unsigned char block[4096];
  memset(block, fill, sizeof block);
  bool ok = true;
  for (size_t at = 0; ok && at < size; at += sizeof block) {
    size_t n = size - at < sizeof block ? size - at : sizeof block;
    ok = fwrite(bytes ? bytes + at : block, 1, n, f) == n;
  }
  return fclose(f) == 0 && ok;
}

/* A spill file another program wrote over between steps (issue 47, item 1): what is read
   back is checked against what was written, so zeros or 0xff bytes over the whole file
   are L2L_ERR_IO naming the file, a record and the offset — at a checkpoint's read of a
   record's state, and at the next call after the step whose updates would have read them
   — and that step changes nothing: every weight as it was, and with the file's bytes put
   back every record's state reads as it was and training goes on. (Before the checksums
   the step went on with 0 errors and a different loss, or NaN.) */
TEST(relay_spill_file_overwritten_is_refused_and_changes_nothing) {
  char dir[256], file[600];
  if (!check_temp_dir(dir, sizeof dir, "l2l-relay-spill-damage")) return;
  struct shape g = gpt_shape();
  struct model disk;
  model_new(&disk, &g);
  struct data d;
  data_new(&d, &g, check_rand_int(2, 4), g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.spill_dir = dir;
  l2l_relay *b = relay_new(&disk, &cfg);
  double loss;
  bool ok = b && relay_step(&loss, b, &d, NULL) && relay_step(&loss, b, &d, NULL) &&
            CHECK_OK(l2l_relay_sync(b)) && CHECK(spill_file_in(dir, file, sizeof file),
                                                 "no spill file in %s", dir);
  /* the file's bytes, each record's weights and state: what must not change */
  enum { WATCHED_RECORDS = 64 };
  l2l_param *param[WATCHED_RECORDS];
  void *weights[WATCHED_RECORDS] = {0}, *state[WATCHED_RECORDS][2] = {{0}};
  size_t wbytes[WATCHED_RECORDS] = {0}, sbytes[WATCHED_RECORDS][2] = {{0}};
  int records = 0;
  for (int k = 0; ok && k < disk.n; k++)
    for (int i = 0; i < l2l_layer_param_count(disk.layer[k]) && records < WATCHED_RECORDS; i++) {
      l2l_param *p = param[records] = l2l_layer_param(disk.layer[k], i);
      const l2l_tensor *w = l2l_param_value(p);
      wbytes[records] = tensor_bytes(w);
      weights[records] = malloc(wbytes[records]);
      if (weights[records]) memcpy(weights[records], l2l_tensor_data(w), wbytes[records]);
      for (int a = 0; a < 2; a++) {
        l2l_tensor *s = NULL;
        ok &= CHECK_OK(l2l_relay_param_state(&s, b, p, a)) && CHECK(s != NULL, "%s: no state", l2l_param_name(p));
        sbytes[records][a] = s ? tensor_bytes(s) : 0;
        state[records][a] = s ? malloc(sbytes[records][a]) : NULL;
        if (state[records][a]) memcpy(state[records][a], l2l_tensor_data(s), sbytes[records][a]);
      }
      records++;
    }
  struct stat st;
  unsigned char *saved = NULL;
  FILE *f = ok && stat(file, &st) == 0 ? fopen(file, "rb") : NULL;
  if (f) {
    saved = malloc((size_t)st.st_size);
    ok &= CHECK(saved && fread(saved, 1, (size_t)st.st_size, f) == (size_t)st.st_size, "read %s", file);
    fclose(f);
  }
  ok &= CHECK(saved != NULL, "cannot read %s", file);
  int first_fill = (int)check_rand_int(0, 1);
  for (int t = 0; ok && t < 2; t++) {
    int fill = (t + first_fill) % 2 ? 0xff : 0x00;
    printf("  %d records; the spill file (%lld bytes) overwritten with 0x%02x\n", records,
           (long long)st.st_size, fill);
    ok &= CHECK(overwrite_file(file, NULL, (size_t)st.st_size, fill), "cannot overwrite %s", file);
    /* a checkpoint's read of a record's state: refused, naming the file, record, offset
       (not the last record read, nor one tied to it: its copy is kept until the next step,
       and not read again) */
    l2l_param *p = param[check_rand_int(0, records - 2)];
    while (l2l_param_value(p) == l2l_param_value(param[records - 1]))
      p = param[check_rand_int(0, records - 2)];
    l2l_tensor *s = NULL;
    unsigned long long at = ~0ull;
    if (CHECK_FAILS(l2l_relay_param_state(&s, b, p, (int)check_rand_int(0, 1)), L2L_ERR_IO,
                    "are not those written")) {
      const char *m = l2l_last_error(), *o = strstr(m, " at ");
      CHECK(strstr(m, file) && strstr(m, l2l_param_name(p)) && o && sscanf(o, " at %llu", &at) == 1 &&
                at % 4096 == 0 && at < (unsigned long long)st.st_size,
            "the message does not name the file %s, the record %s and an offset in the file: %s",
            file, l2l_param_name(p), m);
    }
    /* a step: its updates cannot take their state, the next call says so */
    if (relay_step(&loss, b, &d, NULL) &&
        CHECK_FAILS(l2l_relay_sync(b), L2L_ERR_IO, "was not updated (its optimizer state could not be read)")) {
      const char *m = l2l_last_error(), *o = strstr(m, " at ");
      printf("  refused: %s\n", m);
      bool named = false;   /* "l2l_relay_sync: <record> was not updated ..." */
      const char *after = strncmp(m, "l2l_relay_sync: ", 16) == 0 ? m + 16 : NULL;
      for (int r = 0; after && r < records; r++) named |= strstr(after, l2l_param_name(param[r])) == after;
      CHECK(named && strstr(m, file) && strstr(m, "are not those written") && o &&
                sscanf(o, " at %llu", &at) == 1 && at % 4096 == 0 && at < (unsigned long long)st.st_size,
            "the message does not name a record, the file %s and an offset in it: %s", file, m);
    }
    for (int r = 0; r < records; r++)
      CHECK(weights[r] && memcmp(weights[r], l2l_tensor_data(l2l_param_value(param[r])), wbytes[r]) == 0,
            "%s: updated from a damaged spill file (0x%02x)", l2l_param_name(param[r]), fill);
    /* the file put back: every record's state is as it was */
    ok &= CHECK(overwrite_file(file, saved, (size_t)st.st_size, 0), "cannot write %s back", file);
    for (int r = 0; ok && r < records; r++)
      for (int a = 0; a < 2; a++) {
        s = NULL;
        if (CHECK_OK(l2l_relay_param_state(&s, b, param[r], a)))
          CHECK(s && state[r][a] && tensor_bytes(s) == sbytes[r][a] &&
                    memcmp(state[r][a], l2l_tensor_data(s), sbytes[r][a]) == 0,
                "%s: state %d changed by a step over a damaged spill file (0x%02x)",
                l2l_param_name(param[r]), a, fill);
      }
  }
  /* and training goes on from there */
  if (ok && relay_step(&loss, b, &d, NULL) && CHECK_OK(l2l_relay_sync(b)))
    CHECK(isfinite(loss), "loss %g after the file was put back", loss);
  free(saved);
  for (int r = 0; r < records; r++) {
    free(weights[r]);
    free(state[r][0]);
    free(state[r][1]);
  }
  l2l_relay_free(b);
  CHECK(check_dir_entries(dir) == 0, "the spill file outlived its relay");
  data_free(&d);
  model_free(&disk);
  check_remove_dir(dir);
}
