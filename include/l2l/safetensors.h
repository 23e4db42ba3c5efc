/* SPDX-License-Identifier: MIT */
/* l2l/safetensors.h — a part of the public header l2l.h: safetensors files, read and
 * written.
 *
 * Purpose: one seam of the C API, the one reader and writer of the format in l2l: the
 * relay's checkpoints (l2l_relay_save, l2l_relay_load), the front end's l2l.safetensors,
 * l2l.load_weights and l2l.import_gpt2 all go through it. A program includes l2l.h, never
 * a part: a part uses the types the header and the parts before it declare, and l2l.h's
 * conventions hold for it. Its FFI block is read after theirs (scripts/public_header.lua).
 * Must never: be included but by l2l.h.
 */
#ifndef L2L_H
#error "include l2l.h, not its parts"
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- safetensors files
   The format (as Hugging Face defines it): an unsigned 64-bit little-endian header length
   N, N bytes of JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
   ..., "__metadata__": {"key": "string value"}}, then the raw little-endian data, offsets
   counted from its start. l2l writes the dtypes it has (F32, F16, BF16, I32, U8) with 1
   to 4 dimensions, none of them empty; it opens a file of any of the format's dtypes (BOOL,
   U8 to U64, I8 to I64, F8_E4M3, F8_E5M2, F8_E8M0, F16, BF16, F32, F64, the packed F4,
   F6_E2M3, F6_E3M2 and the complex C64, as of safetensors 0.7) with 0 to 4 dimensions,
   empty ones among them, and reads what it can hold (l2l_safetensors_read); headers of at most L2L_SAFETENSORS_MAX_HEADER bytes
   (the format allows 100 MiB; real ones are far smaller: GPT-2 1.5B's is under 100 KB).
   Opening checks the whole header against the file's size before any data is read (valid
   UTF-8 JSON, dtypes, ranks, element counts matching byte ranges, ranges inside the file
   with no overlap or hole, a regular file only: a FIFO or a folder is refused without
   waiting); a damaged or foreign file is L2L_ERR_INVALID and one that cannot be opened or
   read L2L_ERR_IO, the message naming the file and what is wrong.
   Checksums: l2l's writer puts the XXH3-64 of each tensor's bytes under the metadata key
   "l2l_xxh3" (a JSON object: name -> 16 hex digits); a read checks the bytes against it
   (a file without it, another tool's, still reads). Writing goes to a temporary beside the
   file, made new (O_EXCL | O_NOFOLLOW), synced and renamed over it: a crash at any moment
   leaves the old file or the new one whole. */
enum { L2L_SAFETENSORS_MAX_HEADER = 16 << 20 };

typedef struct l2l_safetensors l2l_safetensors;   /* a file opened for reading */

typedef struct l2l_safetensors_info {
  int tensors;           /* entries, indexed 0 .. tensors - 1 in the data's order */
  int metadata;          /* metadata pairs, indexed 0 .. metadata - 1 */
  uint64_t data_start;   /* the data's first byte in the file: 8 + the header's length */
  uint64_t data_bytes;   /* the data's length: the file's size - data_start */
} l2l_safetensors_info;

typedef struct l2l_safetensors_entry {
  const char *name;      /* valid until the file is closed */
  l2l_dtype dtype;       /* what a read gives unless asked for another: the stored dtype
                            where l2l has it, else f32 for the format's other floats, u8 for
                            BOOL, i32 for its other integers; (l2l_dtype)-1, no dtype
                            (l2l_dtype_size 0), for the packed floats (F4, F6_E2M3,
                            F6_E3M2) and C64, which l2l does not read */
  const char *stored_dtype;      /* the format's name for it as the file holds it: "F32",
                                    "I64", "BOOL", ... (a static string) */
  int ndim;              /* 0 (one element) to L2L_MAX_DIMS */
  int64_t shape[L2L_MAX_DIMS];   /* shape[0 .. ndim); a size of 0 makes an empty tensor
                                    (numel 0): listed, read as nothing (dst may
                                    then be NULL) */
  int64_t numel;
  uint64_t offset, bytes;        /* its byte range within the data */
  int summed;            /* 1: the file holds its checksum */
} l2l_safetensors_entry;

/* Opens and checks path (see above). */
L2L_API l2l_status l2l_safetensors_open(l2l_safetensors **out, const char *path);
L2L_API void l2l_safetensors_close(l2l_safetensors *file);   /* NULL is fine */
L2L_API l2l_status l2l_safetensors_get_info(l2l_safetensors_info *out, const l2l_safetensors *file);
/* Entry `index` in the data's order (0 <= index < info.tensors). */
L2L_API l2l_status l2l_safetensors_get_entry(l2l_safetensors_entry *out, const l2l_safetensors *file,
                                             int index);
/* The entry called `name`; L2L_ERR_INVALID naming it where the file has none. */
L2L_API l2l_status l2l_safetensors_find(l2l_safetensors_entry *out, const l2l_safetensors *file,
                                        const char *name);
/* Metadata pair `index` (0 <= index < info.metadata): its key and its value, valid until
   the file is closed. */
L2L_API l2l_status l2l_safetensors_get_metadata(const char **key, const char **value,
                                                const l2l_safetensors *file, int index);
/* Tensor `name`'s bytes, checked against its checksum, into dst (numel elements of
   dtype: numel must be the entry's). Where dtype is the one stored the bytes are copied as
   they are. Else: the format's floats read into f32, f16 or bf16, rounded once to nearest
   even (widening is exact; an F64 is rounded once, not through f32 twice); its integers
   (BOOL, I8 to I64, U8 to U64) into i32 or u8, exactly: a value the dtype does not hold,
   or a BOOL neither 0 nor 1, is L2L_ERR_INVALID naming the element (l2l_last_error_detail),
   dst untouched. Floats and integers do not read into each other; the packed floats (F4,
   F6_*) and C64 do not read at all (L2L_ERR_UNSUPPORTED). Arguments are checked before dst is
   touched; a tensor read as stored whose bytes fail their checksum (or a failed read) may
   leave dst partly written (read the file's checksums first with l2l_safetensors_verify to
   change nothing on damage); a converted one leaves dst untouched. */
L2L_API l2l_status l2l_safetensors_read(void *dst, l2l_dtype dtype, int64_t numel,
                                        const l2l_safetensors *file, const char *name);
/* Every tensor that has a checksum against it, read in pieces (none held whole): an error
   naming the first damaged one. */
L2L_API l2l_status l2l_safetensors_verify(const l2l_safetensors *file);

/* A tensor of a file to write: its name (a non-empty UTF-8 string other than
   "__metadata__", unique in the file), dtype and shape (1 to 4 sizes, each >= 1). */
typedef struct l2l_safetensors_spec {
  const char *name;
  l2l_dtype dtype;
  int ndim;
  int64_t shape[L2L_MAX_DIMS];
} l2l_safetensors_spec;
typedef struct l2l_safetensors_writer l2l_safetensors_writer;

/* Starts writing path: the header (entries[0 .. count) in that order, the metadata pairs
   metadata[2i] (key), metadata[2i + 1] (value) for i < pairs, UTF-8 strings; a pair under
   "l2l_xxh3" is replaced by the checksums) goes out first, then each tensor's bytes by
   l2l_safetensors_put in entries' order. replace: 1 lets the file replace one at path, 0
   refuses one there (L2L_ERR_STATE), also one that appears while it is written. */
L2L_API l2l_status l2l_safetensors_create(l2l_safetensors_writer **out, const char *path, int replace,
                                          const l2l_safetensors_spec *entries, int count,
                                          const char *const *metadata, int pairs);
/* The next tensor's bytes: exactly its numel times its dtype's size. */
L2L_API l2l_status l2l_safetensors_put(l2l_safetensors_writer *writer, const void *data, uint64_t bytes);
/* Puts the file in place once every tensor is written, and frees the writer whatever
   happens (on a failure nothing is left: neither the temporary nor a partial file). */
L2L_API l2l_status l2l_safetensors_commit(l2l_safetensors_writer *writer);
/* Frees the writer and removes what it wrote; the file at path stays as it was. NULL is
   fine. */
L2L_API void l2l_safetensors_abandon(l2l_safetensors_writer *writer);

/* L2L_FFI_END */
