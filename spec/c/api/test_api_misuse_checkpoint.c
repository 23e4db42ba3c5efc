/* SPDX-License-Identifier: MIT */
/* test_api_misuse_checkpoint.c — a relay's checkpoint in C called with what it must refuse:
 * l2l_relay_save, l2l_relay_load, l2l_checkpoint_description. test_api_misuse.c says what a
 * refusal must do and how; misuse.h holds the harness; what a file may hold wrongly is
 * spec/c/relay/test_checkpoint.c's. All test names start with "misuse_".
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"

/* Covers: l2l_relay_save, l2l_relay_load, l2l_checkpoint_description (what a file may
   hold wrongly is spec/c/relay/test_checkpoint.c's; here the arguments). */
TEST(misuse_checkpoints) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  char dir[256], path[512], missing[512], junk_file[512];
  if (!rig_new(&rig, &c) || !check_temp_dir(dir, sizeof dir, "l2l-misuse")) {
    rig_free(&rig);
    return;
  }
  l2l_relay *r = rig.r;
  snprintf(path, sizeof path, "%s/run.safetensors", dir);
  snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
  snprintf(junk_file, sizeof junk_file, "%s/junk.safetensors", dir);
  FILE *f = fopen(junk_file, "wb");
  if (f) fputs("hello", f), fclose(f);
  CHECK_OK(l2l_relay_save(r, path, NULL));
  watch_model(&rig.m);
  l2l_relay *not_runs[] = {NULL, JUNK(l2l_relay), AS(l2l_relay, rig.m.layer[0])};
  for (size_t i = 0; i < sizeof not_runs / sizeof not_runs[0]; i++) {
    REFUSES(l2l_relay_save(not_runs[i], missing, NULL), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_load(not_runs[i], path), L2L_ERR_INVALID, "run");
  }
  REFUSES(l2l_relay_save(r, NULL, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_relay_save(r, "", NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_relay_load(r, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_relay_load(r, ""), L2L_ERR_INVALID, "path");
  /* options: replace 0 or 1; JSON of the kinds they take */
  const int bad_replace[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_replace / sizeof bad_replace[0]; i++)
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.replace = bad_replace[i]}), L2L_ERR_INVALID, "replace");
  const char *bad_json[] = {"{", "3", "\"text\"", "{\"a\": 1, \"a\": 2}", "\xff"};
  for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.extra = bad_json[i]}), L2L_ERR_INVALID, "extra");
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.layers = bad_json[i]}), L2L_ERR_INVALID, "layers");
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.relay = bad_json[i]}), L2L_ERR_INVALID, "relay");
  }
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.layers = "{}"}), L2L_ERR_INVALID, "array");
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.layers = "[]"}), L2L_ERR_INVALID, "0 layers");
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.relay = "[]"}), L2L_ERR_INVALID, "object");
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.relay = "{}"}), L2L_ERR_INVALID, "'seed' is 0 in options->relay");
  /* a file there already, without leave to replace it; a folder, nothing, junk to load */
  REFUSES(l2l_relay_save(r, path, &(l2l_save_options){.replace = 0}), L2L_ERR_STATE, "exists already");
  REFUSES(l2l_relay_save(r, dir, NULL), L2L_ERR_INVALID, "is a directory: nothing was written");
  REFUSES(l2l_relay_save(r, dir, &(l2l_save_options){.replace = 1}), L2L_ERR_INVALID, "is a directory");
  REFUSES(l2l_relay_load(r, missing), L2L_ERR_IO, "none.safetensors");
  REFUSES(l2l_relay_load(r, dir), L2L_ERR_IO, "directory");
  REFUSES(l2l_relay_load(r, junk_file), L2L_ERR_INVALID, "too short");
  CHECK(check_dir_entries(dir) == 2, "refused saves left %d entries in %s", check_dir_entries(dir), dir);
  /* the description: out and capacity, length, path */
  char small[8] = "unset";
  size_t length = 99;
  REFUSES(l2l_checkpoint_description(small, sizeof small, NULL, path), L2L_ERR_INVALID, "length");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, ""), L2L_ERR_INVALID, "path");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, missing), L2L_ERR_IO, "none.safetensors");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, junk_file), L2L_ERR_INVALID, "too short");
  CHECK(length == 99 && strcmp(small, "unset") == 0, "a refused description wrote its outputs");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, path), L2L_ERR_INVALID, "capacity");
  size_t takes = length;   /* (a short out: nothing written there, *length what it takes) */
  CHECK(strcmp(small, "unset") == 0, "a short out was written: '%.8s'", small);
  /* good calls still work: the description's length, and the relay's own file loaded back */
  CHECK_OK(l2l_checkpoint_description(NULL, 0, &length, path));
  CHECK(length > sizeof small && takes == length, "a description of %zu bytes (%zu said when out was short)",
        length, takes);
  unwatch();
  CHECK_OK(l2l_relay_load(r, path));
  check_remove_dir(dir);
  rig_free(&rig);
}
