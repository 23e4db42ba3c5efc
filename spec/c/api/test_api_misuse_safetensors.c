/* SPDX-License-Identifier: MIT */
/* test_api_misuse_safetensors.c — safetensors files in C (l2l/safetensors.h) called with what
 * they must refuse, then used as a C program uses them: a file written, listed, read back
 * and converted, against values whose answers are known. test_api_misuse.c says what a
 * refusal must do and how; misuse.h holds the harness; what a file may hold wrongly is
 * spec/safetensors_spec.lua's and spec/hostile_files_spec.lua's. All test names start
 * with "misuse_".
 */
#include <stdio.h>
#include <string.h>

#include "misuse.h"

/* Writes path: "w" (2, 3) f32 of values whose bf16 and f16 roundings are known (ties,
   overflow, a subnormal), "h" (3) bf16 of 1, 2, -0.5, metadata {"k": "v"}. */
static bool write_sample(const char *path) {
  const float w[6] = {1.0f, 2.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 65520.0f, -0x1p-24f};   /* (2, 3) */
  const uint16_t h[3] = {0x3f80, 0x4000, 0xbf00};                                              /* (3) bf16 */
  l2l_safetensors_spec specs[2] = {{.name = "w", .dtype = L2L_F32, .ndim = 2, .shape = {2, 3}},
                                   {.name = "h", .dtype = L2L_BF16, .ndim = 1, .shape = {3}}};
  const char *meta[2] = {"k", "v"};
  l2l_safetensors_writer *wr = NULL;
  return CHECK_OK(l2l_safetensors_create(&wr, path, 1, specs, 2, meta, 1)) &&
         CHECK_OK(l2l_safetensors_put(wr, w, sizeof w)) && CHECK_OK(l2l_safetensors_put(wr, h, sizeof h)) &&
         CHECK_OK(l2l_safetensors_commit(wr));
}

/* Covers: l2l_safetensors_open, l2l_safetensors_close, l2l_safetensors_get_info,
   l2l_safetensors_get_entry, l2l_safetensors_find, l2l_safetensors_get_metadata,
   l2l_safetensors_read, l2l_safetensors_verify. */
TEST(misuse_safetensors_read) {
  char dir[256], path[512], missing[512];
  if (!check_temp_dir(dir, sizeof dir, "l2l-misuse-st")) return;
  snprintf(path, sizeof path, "%s/a.safetensors", dir);
  snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
  if (!write_sample(path)) {
    check_remove_dir(dir);
    return;
  }
  l2l_safetensors *out = SENTINEL(l2l_safetensors);
  REFUSES(l2l_safetensors_open(NULL, path), L2L_ERR_INVALID, "out");
  REFUSES(l2l_safetensors_open(&out, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_safetensors_open(&out, ""), L2L_ERR_INVALID, "path");
  REFUSES(l2l_safetensors_open(&out, missing), L2L_ERR_IO, "none.safetensors");
  REFUSES(l2l_safetensors_open(&out, dir), L2L_ERR_IO, "directory");
  CHECK(out == SENTINEL(l2l_safetensors), "*out written by a refused open");
  l2l_safetensors *f = NULL;
  if (!CHECK_OK(l2l_safetensors_open(&f, path))) {
    check_remove_dir(dir);
    return;
  }
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 2);
  l2l_safetensors *not_files[] = {NULL, JUNK(l2l_safetensors), AS(l2l_safetensors, t)};
  l2l_safetensors_info info = {.tensors = -7};
  l2l_safetensors_entry entry = {.ndim = -7};
  const char *key = "unset", *value = "unset";
  float dst[6] = {9, 9, 9, 9, 9, 9};   /* (6) f32 */
  for (size_t i = 0; i < sizeof not_files / sizeof not_files[0]; i++) {
    REFUSES(l2l_safetensors_get_info(&info, not_files[i]), L2L_ERR_INVALID, "file");
    REFUSES(l2l_safetensors_get_entry(&entry, not_files[i], 0), L2L_ERR_INVALID, "file");
    REFUSES(l2l_safetensors_find(&entry, not_files[i], "w"), L2L_ERR_INVALID, "file");
    REFUSES(l2l_safetensors_get_metadata(&key, &value, not_files[i], 0), L2L_ERR_INVALID, "file");
    REFUSES(l2l_safetensors_read(dst, L2L_F32, 6, not_files[i], "w"), L2L_ERR_INVALID, "file");
    REFUSES(l2l_safetensors_verify(not_files[i]), L2L_ERR_INVALID, "file");
    l2l_safetensors_close(not_files[i]);   /* ignored */
  }
  REFUSES(l2l_safetensors_get_info(NULL, f), L2L_ERR_INVALID, "out");
  REFUSES(l2l_safetensors_get_entry(NULL, f, 0), L2L_ERR_INVALID, "out");
  const int bad_index[] = {-1, 2, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++) {
    REFUSES(l2l_safetensors_get_entry(&entry, f, bad_index[i]), L2L_ERR_INVALID, "index");
    REFUSES(l2l_safetensors_get_metadata(&key, &value, f, bad_index[i]), L2L_ERR_INVALID, "index");
  }
  REFUSES(l2l_safetensors_find(NULL, f, "w"), L2L_ERR_INVALID, "out");
  REFUSES(l2l_safetensors_find(&entry, f, NULL), L2L_ERR_INVALID, "name");
  REFUSES(l2l_safetensors_find(&entry, f, "x"), L2L_ERR_INVALID, "no tensor 'x'");
  REFUSES(l2l_safetensors_get_metadata(NULL, &value, f, 0), L2L_ERR_INVALID, "key");
  REFUSES(l2l_safetensors_get_metadata(&key, NULL, f, 0), L2L_ERR_INVALID, "value");
  CHECK(info.tensors == -7 && entry.ndim == -7 && strcmp(key, "unset") == 0 && strcmp(value, "unset") == 0,
        "a refused query wrote its outputs");
  REFUSES(l2l_safetensors_read(NULL, L2L_F32, 6, f, "w"), L2L_ERR_INVALID, "dst");
  REFUSES(l2l_safetensors_read(dst, (l2l_dtype)99, 6, f, "w"), L2L_ERR_INVALID, "dtype");
  REFUSES(l2l_safetensors_read(dst, (l2l_dtype)-1, 6, f, "w"), L2L_ERR_INVALID, "dtype");
  REFUSES(l2l_safetensors_read(dst, L2L_F32, 6, f, NULL), L2L_ERR_INVALID, "name");
  REFUSES(l2l_safetensors_read(dst, L2L_F32, 6, f, "x"), L2L_ERR_INVALID, "no tensor 'x'");
  const int64_t bad_numel[] = {0, -1, 5, 7, INT64_MAX, INT64_MIN};
  for (size_t i = 0; i < sizeof bad_numel / sizeof bad_numel[0]; i++)
    REFUSES(l2l_safetensors_read(dst, L2L_F32, bad_numel[i], f, "w"), L2L_ERR_INVALID, "numel");
  REFUSES(l2l_safetensors_read(dst, L2L_I32, 6, f, "w"), L2L_ERR_INVALID, "reads into f32, f16 or bf16, not");
  REFUSES(l2l_safetensors_read(dst, L2L_U8, 3, f, "h"), L2L_ERR_INVALID, "reads into f32, f16 or bf16, not");
  CHECK(dst[0] == 9 && dst[5] == 9, "a refused read wrote dst");

  /* good calls: the lists, the values as written, converted with known answers */
  CHECK_OK(l2l_safetensors_get_info(&info, f));
  /* the pairs: k and the checksums, l2l_xxh3 */
  CHECK(info.tensors == 2 && info.metadata == 2 && info.data_bytes == 30 && info.data_start % 8 == 0,
        "info: %d tensors, %d pairs, %llu data bytes at %llu", info.tensors, info.metadata,
        (unsigned long long)info.data_bytes, (unsigned long long)info.data_start);
  CHECK_OK(l2l_safetensors_get_entry(&entry, f, 1));
  CHECK(strcmp(entry.name, "h") == 0 && entry.dtype == L2L_BF16 && entry.ndim == 1 && entry.shape[0] == 3 &&
        entry.offset == 24 && entry.bytes == 6 && entry.summed == 1, "entry 1: '%s' at %llu", entry.name,
        (unsigned long long)entry.offset);
  int found = 0;
  for (int i = 0; i < 2; i++) {
    CHECK_OK(l2l_safetensors_get_metadata(&key, &value, f, i));
    found += strcmp(key, "k") == 0 && strcmp(value, "v") == 0;
    found += 2 * (strcmp(key, "l2l_xxh3") == 0 && strlen(value) > 40);
  }
  CHECK(found == 3, "metadata: k = v and the checksums, found %d", found);
  CHECK_OK(l2l_safetensors_verify(f));
  uint16_t half[6];   /* (6) bf16, then f16 */
  CHECK_OK(l2l_safetensors_read(half, L2L_BF16, 6, f, "w"));
  /* 1, 2; ties to even: 1 + 2^-8 -> 1, 1 + 3 2^-8 -> 1 + 2^-6; 65520 -> 65536; -2^-24 exact */
  const uint16_t want_bf16[6] = {0x3f80, 0x4000, 0x3f80, 0x3f82, 0x4780, 0xb380};
  CHECK(memcmp(half, want_bf16, sizeof half) == 0, "w as bf16: %04x %04x %04x %04x %04x %04x", half[0], half[1],
        half[2], half[3], half[4], half[5]);
  CHECK_OK(l2l_safetensors_read(half, L2L_F16, 6, f, "w"));
  /* 1, 2, 1 + 2^-8 -> 0x3c01 (1 + 2^-10 steps: 1 + 2^-8 exact), 1 + 3 2^-8 exact, 65520 ->
     infinity (the tie above 65504), -2^-24: the least subnormal */
  const uint16_t want_f16[6] = {0x3c00, 0x4000, 0x3c04, 0x3c0c, 0x7c00, 0x8001};
  CHECK(memcmp(half, want_f16, sizeof half) == 0, "w as f16: %04x %04x %04x %04x %04x %04x", half[0], half[1],
        half[2], half[3], half[4], half[5]);
  CHECK_OK(l2l_safetensors_read(dst, L2L_F32, 3, f, "h"));
  CHECK(dst[0] == 1.0f && dst[1] == 2.0f && dst[2] == -0.5f, "h as f32: %g %g %g", dst[0], dst[1], dst[2]);
  l2l_safetensors_close(f);
  l2l_safetensors_close(NULL);
  FREE(t);
  check_remove_dir(dir);
}

/* Another tool's file, laid out here byte by byte: "ids" (2, 3) I64 with one value past
   int32 at [1][2], "mask" (2) BOOL, "q" (4) F4, "none" (0, 3) F32, "x" (1) F64. */
static bool write_foreign(const char *path) {
  const char header[] = "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2,3],\"data_offsets\":[0,48]},"
                        "\"mask\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[48,50]},"
                        "\"q\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[50,52]},"
                        "\"none\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[52,52]},"
                        "\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[52,60]}}";
  const int64_t ids[6] = {0, -5, 7, INT32_MIN, INT32_MAX, (int64_t)1 << 40};   /* (2, 3) */
  const uint8_t mask[2] = {1, 0}, q[2] = {0x12, 0x34};
  const double x = 1.0 + 0x1p-8 + 0x1p-40;   /* past bf16's tie by less than an f32 unit: rounds up */
  uint64_t n = sizeof header - 1;
  FILE *f = fopen(path, "wb");
  if (f == NULL) return CHECK(false, "cannot write %s", path);
  bool ok = fwrite(&n, 8, 1, f) == 1 && fwrite(header, n, 1, f) == 1 && fwrite(ids, sizeof ids, 1, f) == 1 &&
            fwrite(mask, 2, 1, f) == 1 && fwrite(q, 2, 1, f) == 1 && fwrite(&x, 8, 1, f) == 1;
  return CHECK(fclose(f) == 0 && ok, "cannot write %s", path);
}

/* Covers: l2l_safetensors_find, l2l_safetensors_read on the format's dtypes l2l has no
   tensor of (a C program reading a Hugging Face file). */
TEST(misuse_safetensors_foreign_dtypes) {
  char dir[256], path[512];
  if (!check_temp_dir(dir, sizeof dir, "l2l-misuse-st")) return;
  snprintf(path, sizeof path, "%s/foreign.safetensors", dir);
  l2l_safetensors *f = NULL;
  if (!write_foreign(path) || !CHECK_OK(l2l_safetensors_open(&f, path))) {
    check_remove_dir(dir);
    return;
  }
  l2l_safetensors_entry e;
  CHECK_OK(l2l_safetensors_find(&e, f, "ids"));
  CHECK(e.dtype == L2L_I32 && strcmp(e.stored_dtype, "I64") == 0 && e.numel == 6 && e.bytes == 48,
        "ids: dtype %d, stored %s", (int)e.dtype, e.stored_dtype);
  int32_t ids[6] = {9, 9, 9, 9, 9, 9};   /* (2, 3) */
  REFUSES(l2l_safetensors_read(ids, L2L_I32, 6, f, "ids"), L2L_ERR_INVALID, "'ids'[1][2] (I64) = 1099511627776, which i32 does not hold");
  l2l_error_detail d;
  CHECK_OK(l2l_last_error_detail(&d));   /* (the refusal's element) */
  CHECK(d.element_dims == 2 && d.element[0] == 1 && d.element[1] == 2, "the detail names %d dims: [%lld][%lld]",
        d.element_dims, (long long)d.element[0], (long long)d.element[1]);
  CHECK(ids[0] == 9 && ids[5] == 9, "a refused read wrote dst");
  REFUSES(l2l_safetensors_read(ids, L2L_F32, 6, f, "ids"), L2L_ERR_INVALID, "is I64, which reads into i32 or u8, not f32");
  uint8_t mask[2] = {9, 9};   /* (2) */
  CHECK_OK(l2l_safetensors_read(mask, L2L_U8, 2, f, "mask"));
  CHECK(mask[0] == 1 && mask[1] == 0, "mask: %d %d", mask[0], mask[1]);
  CHECK_OK(l2l_safetensors_find(&e, f, "q"));
  CHECK(l2l_dtype_size(e.dtype) == 0 && strcmp(e.stored_dtype, "F4") == 0 && e.bytes == 2, "q: stored %s", e.stored_dtype);
  float four[4] = {9, 9, 9, 9};   /* (4) */
  REFUSES(l2l_safetensors_read(four, L2L_F32, 4, f, "q"), L2L_ERR_UNSUPPORTED, "F4, which l2l does not read");
  CHECK_OK(l2l_safetensors_find(&e, f, "none"));
  CHECK(e.numel == 0 && e.ndim == 2 && e.shape[0] == 0 && e.shape[1] == 3, "none: numel %lld", (long long)e.numel);
  CHECK_OK(l2l_safetensors_read(four, L2L_F32, 0, f, "none"));
  CHECK(four[0] == 9, "an empty read wrote dst");
  uint16_t x;
  CHECK_OK(l2l_safetensors_read(&x, L2L_BF16, 1, f, "x"));
  CHECK(x == 0x3f81, "x as bf16: %04x (0x3f81: rounded once, up)", x);
  l2l_safetensors_close(f);
  check_remove_dir(dir);
}

/* Covers: l2l_safetensors_create, l2l_safetensors_put, l2l_safetensors_commit,
   l2l_safetensors_abandon. */
TEST(misuse_safetensors_write) {
  char dir[256], path[512];
  if (!check_temp_dir(dir, sizeof dir, "l2l-misuse-stw")) return;
  snprintf(path, sizeof path, "%s/a.safetensors", dir);
  l2l_safetensors_spec spec = {.name = "w", .dtype = L2L_F32, .ndim = 1, .shape = {2}};
  const char *meta[2] = {"k", "v"}, *null_meta[2] = {"k", NULL};
  l2l_safetensors_writer *out = SENTINEL(l2l_safetensors_writer);
  REFUSES(l2l_safetensors_create(NULL, path, 1, &spec, 1, meta, 1), L2L_ERR_INVALID, "out");
  REFUSES(l2l_safetensors_create(&out, NULL, 1, &spec, 1, meta, 1), L2L_ERR_INVALID, "path");
  REFUSES(l2l_safetensors_create(&out, "", 1, &spec, 1, meta, 1), L2L_ERR_INVALID, "path");
  const int bad_replace[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_replace / sizeof bad_replace[0]; i++)
    REFUSES(l2l_safetensors_create(&out, path, bad_replace[i], &spec, 1, meta, 1), L2L_ERR_INVALID, "replace");
  REFUSES(l2l_safetensors_create(&out, path, 1, NULL, 1, meta, 1), L2L_ERR_INVALID, "entries");
  REFUSES(l2l_safetensors_create(&out, path, 1, &spec, -1, meta, 1), L2L_ERR_INVALID, "count");
  REFUSES(l2l_safetensors_create(&out, path, 1, &spec, 1, NULL, 1), L2L_ERR_INVALID, "metadata");
  REFUSES(l2l_safetensors_create(&out, path, 1, &spec, 1, meta, -1), L2L_ERR_INVALID, "pairs");
  REFUSES(l2l_safetensors_create(&out, path, 1, &spec, 1, null_meta, 1), L2L_ERR_INVALID, "metadata[1]");
  const char *bad_utf8[2] = {"k", "\xff"};
  REFUSES(l2l_safetensors_create(&out, path, 1, &spec, 1, bad_utf8, 1), L2L_ERR_INVALID, "UTF-8");
  l2l_safetensors_spec bad[] = {
      {.name = NULL, .dtype = L2L_F32, .ndim = 1, .shape = {2}},
      {.name = "", .dtype = L2L_F32, .ndim = 1, .shape = {2}},
      {.name = "__metadata__", .dtype = L2L_F32, .ndim = 1, .shape = {2}},
      {.name = "\xc0\xaf", .dtype = L2L_F32, .ndim = 1, .shape = {2}},
      {.name = "w", .dtype = (l2l_dtype)99, .ndim = 1, .shape = {2}},
      {.name = "w", .dtype = (l2l_dtype)-1, .ndim = 1, .shape = {2}},
      {.name = "w", .dtype = L2L_F32, .ndim = 0, .shape = {2}},
      {.name = "w", .dtype = L2L_F32, .ndim = 5, .shape = {2}},
      {.name = "w", .dtype = L2L_F32, .ndim = 1, .shape = {0}},
      {.name = "w", .dtype = L2L_F32, .ndim = 1, .shape = {-3}},
      {.name = "w", .dtype = L2L_F32, .ndim = 4, .shape = {INT64_MAX, 2, 2, 2}},
      {.name = "w", .dtype = L2L_F32, .ndim = 2, .shape = {1 << 25, 1 << 25}},
  };
  const char *why[] = {"name", "name", "__metadata__", "UTF-8", "dtype", "dtype", "shape", "shape", "shape[0]", "shape[0]",
                       "shape[0]", "shape[1]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_safetensors_create(&out, path, 1, &bad[i], 1, meta, 1), L2L_ERR_INVALID, why[i]);
  l2l_safetensors_spec twice[2] = {spec, spec};
  REFUSES(l2l_safetensors_create(&out, path, 1, twice, 2, meta, 1), L2L_ERR_INVALID, "appears twice");
  CHECK(out == SENTINEL(l2l_safetensors_writer), "*out written by a refused create");
  CHECK(check_dir_entries(dir) == 0, "refused creates left %d entries in %s", check_dir_entries(dir), dir);

  l2l_safetensors_writer *w = NULL;
  const float data[3] = {1, 2, 3};   /* (3) f32: one too many for "w" */
  if (!CHECK_OK(l2l_safetensors_create(&w, path, 0, &spec, 1, meta, 1))) {
    check_remove_dir(dir);
    return;
  }
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 2);
  l2l_safetensors_writer *not_writers[] = {NULL, JUNK(l2l_safetensors_writer), AS(l2l_safetensors_writer, t)};
  for (size_t i = 0; i < sizeof not_writers / sizeof not_writers[0]; i++) {
    REFUSES(l2l_safetensors_put(not_writers[i], data, 8), L2L_ERR_INVALID, "writer");
    REFUSES(l2l_safetensors_commit(not_writers[i]), L2L_ERR_INVALID, "writer");
    l2l_safetensors_abandon(not_writers[i]);   /* ignored */
  }
  REFUSES(l2l_safetensors_put(w, NULL, 8), L2L_ERR_INVALID, "data");
  REFUSES(l2l_safetensors_put(w, data, 12), L2L_ERR_INVALID, "12 bytes, its header says 8");
  CHECK_OK(l2l_safetensors_put(w, data, 8));
  REFUSES(l2l_safetensors_put(w, data, 8), L2L_ERR_STATE, "written already");
  CHECK_OK(l2l_safetensors_commit(w));
  REFUSES(l2l_safetensors_create(&w, path, 0, &spec, 1, meta, 1), L2L_ERR_STATE, "exists already");
  /* a commit short of tensors and an abandoned write leave nothing new, and the old file */
  if (CHECK_OK(l2l_safetensors_create(&w, path, 1, &spec, 1, NULL, 0)))
    REFUSES(l2l_safetensors_commit(w), L2L_ERR_STATE, "0 of the 1 tensors");
  if (CHECK_OK(l2l_safetensors_create(&w, path, 1, &spec, 1, NULL, 0))) {
    CHECK_OK(l2l_safetensors_put(w, data + 1, 8));
    l2l_safetensors_abandon(w);
  }
  l2l_safetensors_abandon(NULL);
  CHECK(check_dir_entries(dir) == 1, "%d entries in %s: a temporary left?", check_dir_entries(dir), dir);
  l2l_safetensors *f = NULL;
  float back[2] = {0, 0};   /* (2) f32 */
  if (CHECK_OK(l2l_safetensors_open(&f, path))) {
    CHECK_OK(l2l_safetensors_read(back, L2L_F32, 2, f, "w"));
    CHECK(back[0] == 1 && back[1] == 2, "the old file: %g %g", back[0], back[1]);
    l2l_safetensors_close(f);
  }
  FREE(t);
  check_remove_dir(dir);
}
