-- Generated from include/l2l.h and its parts by scripts/gen_cdef.lua: do not edit.
return [==[
typedef enum l2l_status {
  L2L_OK = 0,
  L2L_ERR_INVALID = 1,
  L2L_ERR_NOMEM = 2,
  L2L_ERR_BUDGET = 3,
  L2L_ERR_STATE = 4,
  L2L_ERR_UNSUPPORTED = 5,
  L2L_ERR_BACKEND = 6,
  L2L_ERR_IO = 7
} l2l_status;

enum { L2L_MAX_DIMS = 4, L2L_ALIGN = 64, L2L_MAX_PARAMS = 12, L2L_PARAM_NAME_MAX = 24 };

const char *l2l_last_error(void);
void l2l_clear_error(void);

typedef struct l2l_error_span {
  int at;
  int bytes;
} l2l_error_span;
typedef struct l2l_error_detail {
  int layer;
  uint64_t needed_bytes;
  char field[48];
  int64_t micro_batch;
  int text;
  int element_dims;
  int64_t element[L2L_MAX_DIMS];
  l2l_error_span layer_named;
  l2l_error_span micro_batch_named;
  l2l_error_span field_named;
  l2l_error_span element_named;
} l2l_error_detail;
l2l_status l2l_last_error_detail(l2l_error_detail *out);
const char *l2l_status_name(l2l_status status);
const char *l2l_version(void);

l2l_status l2l_set_threads(int threads);
int l2l_get_threads(void);

typedef enum l2l_pool_kind {
  L2L_POOL_HOST = 0,
  L2L_POOL_PINNED = 1,
  L2L_POOL_DEVICE = 2
} l2l_pool_kind;

typedef struct l2l_pool_stats {
  uint64_t current;
  uint64_t peak;
  uint64_t budget;
  uint64_t allocs;
  uint64_t frees;
  uint64_t refused;
  uint64_t reserved;
  uint64_t system_allocs;
  uint64_t cap;
  uint64_t fallback;
  uint64_t fallback_allocs;
  uint64_t backend;
} l2l_pool_stats;

l2l_status l2l_pool_get_stats(l2l_pool_stats *out, l2l_pool_kind pool);

l2l_status l2l_spill_get_stats(l2l_pool_stats *out);

l2l_status l2l_pool_set_budget(l2l_pool_kind pool, uint64_t bytes);
l2l_status l2l_pool_reset_peak(l2l_pool_kind pool);

l2l_status l2l_pinned_set_cap(uint64_t bytes);
const char *l2l_pool_name(l2l_pool_kind pool);

const char *l2l_device_backend(void);

l2l_status l2l_device_use(const char *backend);

int l2l_cuda_available(char *why, size_t len);

typedef struct l2l_cuda_info {
  char name[256];
  int major, minor;
  int multiprocessors;
  uint64_t total_bytes, free_bytes;
  int runtime_version, driver_version;
  int cudnn_version;
} l2l_cuda_info;
l2l_status l2l_cuda_get_info(l2l_cuda_info *out);

int l2l_cudnn_available(char *about, size_t len);

l2l_status l2l_cuda_set_tf32(int enable);

l2l_status l2l_device_synchronize(void);

l2l_status l2l_device_release_cache(void);

typedef struct l2l_profile_row {
  char kind[8];
  char op[32];
  char shape[96];
  int64_t calls;
  double seconds;
  double host_seconds;
  double flops, bytes;
  char bound[8];
  double roofline;
} l2l_profile_row;

typedef struct l2l_profile_summary {
  char backend[16];
  int64_t steps;
  int64_t rows;
  double step_seconds;
  double op_seconds;
  double idle_copy_seconds, idle_update_seconds, idle_comm_seconds, idle_sync_seconds,
      idle_launch_seconds;

  double idle_copy_params_seconds, idle_copy_acts_in_seconds, idle_copy_acts_out_seconds,
      idle_copy_grads_seconds;
  int64_t ops;
  int64_t lane_ops;
  int64_t syncs;
  int64_t launches;
  int64_t dropped;
  double copy_rate;
  double link_rate;
  double gemm_rate_f32, gemm_rate_16;
  char probe[128];
} l2l_profile_summary;

l2l_status l2l_profile_start(int skip_steps);

l2l_status l2l_profile_stop(void);
l2l_status l2l_profile_get_summary(l2l_profile_summary *out);

l2l_status l2l_profile_rows(l2l_profile_row *out, int64_t first, int64_t count);

l2l_status l2l_profile_write(const char *path, int overwrite);

l2l_status l2l_profile_table(char *out, size_t size, int width);

typedef enum l2l_dtype {
  L2L_F32 = 0,
  L2L_F16 = 1,
  L2L_BF16 = 2,
  L2L_I32 = 3,
  L2L_U8 = 4
} l2l_dtype;

typedef struct l2l_tensor l2l_tensor;

size_t l2l_dtype_size(l2l_dtype dtype);
const char *l2l_dtype_name(l2l_dtype dtype);

l2l_status l2l_tensor_new(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype, int ndim,
                          const int64_t *shape);

void l2l_tensor_free(l2l_tensor *t);

l2l_status l2l_tensor_view_rows(l2l_tensor **out, const l2l_tensor *t, int64_t first,
                                int64_t count);

l2l_status l2l_tensor_reshape(l2l_tensor **out, const l2l_tensor *t, int ndim,
                              const int64_t *shape);

int l2l_tensor_ndim(const l2l_tensor *t);
int64_t l2l_tensor_dim(const l2l_tensor *t, int axis);
int64_t l2l_tensor_numel(const l2l_tensor *t);
int l2l_tensor_dtype(const l2l_tensor *t);
int l2l_tensor_pool(const l2l_tensor *t);
void *l2l_tensor_data(const l2l_tensor *t);
int64_t l2l_tensor_offset(const l2l_tensor *t);
int l2l_tensor_storage_refs(const l2l_tensor *t);

l2l_status l2l_tensor_copy(l2l_tensor *dst, const l2l_tensor *src);

l2l_status l2l_tensor_cast(l2l_tensor *dst, const l2l_tensor *src);

l2l_status l2l_tensor_fill(l2l_tensor *t, double value);

l2l_status l2l_philox4x32(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2);

l2l_status l2l_tensor_uniform(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                              double lo, double hi);
l2l_status l2l_tensor_normal(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                             double mean, double std);

uint16_t l2l_f32_to_bf16(float x);
float l2l_bf16_to_f32(uint16_t x);
uint16_t l2l_f32_to_f16(float x);
float l2l_f16_to_f32(uint16_t x);

l2l_status l2l_gemm(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b, int trans_a,
                    int trans_b, float alpha, float beta);

l2l_status l2l_gemm_batched(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b,
                            int trans_a, int trans_b, float alpha, float beta);

l2l_status l2l_bias_add(l2l_tensor *y, const l2l_tensor *bias);

l2l_status l2l_bias_backward(l2l_tensor *dbias, const l2l_tensor *dy);

l2l_status l2l_add(l2l_tensor *out, const l2l_tensor *a, const l2l_tensor *b);

l2l_status l2l_gelu_forward(l2l_tensor *y, const l2l_tensor *x);
l2l_status l2l_gelu_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *x);

l2l_status l2l_layernorm_forward(l2l_tensor *y, l2l_tensor *mean, l2l_tensor *rstd,
                                 const l2l_tensor *x, const l2l_tensor *weight,
                                 const l2l_tensor *bias, float eps);

l2l_status l2l_layernorm_backward(l2l_tensor *dx, l2l_tensor *dweight, l2l_tensor *dbias,
                                  const l2l_tensor *dy, const l2l_tensor *x,
                                  const l2l_tensor *weight, const l2l_tensor *mean,
                                  const l2l_tensor *rstd);

l2l_status l2l_softmax_forward(l2l_tensor *y, const l2l_tensor *x, const l2l_tensor *key_mask,
                               int causal, float scale);

l2l_status l2l_softmax_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *y,
                                float scale);

l2l_status l2l_embedding_forward(l2l_tensor *out, const l2l_tensor *ids, const l2l_tensor *table);

l2l_status l2l_embedding_backward(l2l_tensor *dtable, const l2l_tensor *dout,
                                  const l2l_tensor *ids);

l2l_status l2l_cross_entropy_forward(l2l_tensor *losses, const l2l_tensor *logits,
                                     const l2l_tensor *targets, int32_t ignore_index);

l2l_status l2l_cross_entropy_backward(l2l_tensor *dlogits, const l2l_tensor *logits,
                                      const l2l_tensor *targets, int32_t ignore_index,
                                      float scale);

l2l_status l2l_dropout_forward(l2l_tensor *y, l2l_tensor *mask, const l2l_tensor *x, float p,
                               uint64_t seed, uint64_t stream, int64_t first);
l2l_status l2l_dropout_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *mask,
                                float p);

l2l_status l2l_sum(double *out, const l2l_tensor *x);
l2l_status l2l_max_abs(double *out, const l2l_tensor *x);
l2l_status l2l_norm2(double *out, const l2l_tensor *x);

typedef struct l2l_adamw_config { float lr, beta1, beta2, eps, weight_decay; } l2l_adamw_config;
l2l_status l2l_adamw_update(l2l_tensor *param, l2l_tensor *m, l2l_tensor *v,
                            const l2l_tensor *grad, const l2l_adamw_config *config, int64_t step);

typedef enum l2l_layer_kind {
  L2L_LAYER_EMBEDDING = 0,
  L2L_LAYER_BLOCK = 1,
  L2L_LAYER_LM_HEAD = 2,
  L2L_LAYER_CLASSIFIER = 3,
  L2L_LAYER_CUSTOM = 4
} l2l_layer_kind;

typedef enum l2l_memory_mode {
  L2L_MEMORY_STANDARD = 0,
  L2L_MEMORY_FRUGAL = 1
} l2l_memory_mode;

typedef struct l2l_layer_config {
  l2l_layer_kind kind;
  int64_t dim;
  int64_t heads;
  int64_t mlp;
  int64_t vocab;
  int64_t max_seq;
  int64_t type_vocab;
  int64_t classes;
  int causal;
  int post_ln;
  int bias;
  int final_ln;
  float dropout;
  float attn_dropout;
  float eps;
  l2l_memory_mode memory;
  float init_std;
  float resid_std;
  uint64_t init_seed;
} l2l_layer_config;

typedef struct l2l_param l2l_param;
typedef struct l2l_layer l2l_layer;

typedef struct l2l_saved l2l_saved;

typedef struct l2l_layer_batch {
  const l2l_tensor *tokens;
  const l2l_tensor *token_types;
  const l2l_tensor *targets;
  const l2l_tensor *key_mask;
  int64_t first_sample;
  uint64_t seed;
  uint64_t step;
  int training;
  float loss_scale;
} l2l_layer_batch;

typedef struct l2l_layer_memory {
  uint64_t params;
  uint64_t saved;
  uint64_t input_kept;
  uint64_t output_kept;
  uint64_t work_forward;
  uint64_t work_backward;
  uint64_t peak;
} l2l_layer_memory;

l2l_status l2l_layer_new(l2l_layer **out, const l2l_layer_config *config, l2l_pool_kind pool);

typedef struct l2l_param_info { char name[L2L_PARAM_NAME_MAX]; int ndim; int64_t shape[L2L_MAX_DIMS]; int decays; } l2l_param_info;
l2l_status l2l_layer_config_params(l2l_param_info *out, int capacity, int *count,
                                   const l2l_layer_config *config);

void l2l_layer_free(l2l_layer *layer);

l2l_status l2l_layer_clone(l2l_layer **out, const l2l_layer *layer);

l2l_status l2l_layer_tie(l2l_layer *head, l2l_layer *embedding);
l2l_status l2l_layer_get_config(l2l_layer_config *out, const l2l_layer *layer);

l2l_status l2l_layer_set_memory(l2l_layer *layer, l2l_memory_mode memory);

uint32_t l2l_layer_rng_id(const l2l_layer *layer);
l2l_status l2l_layer_set_rng_id(l2l_layer *layer, uint32_t rng_id);

int l2l_layer_param_count(const l2l_layer *layer);
l2l_param *l2l_layer_param(const l2l_layer *layer, int index);
int64_t l2l_layer_nparams(const l2l_layer *layer);
l2l_status l2l_layer_zero_grad(l2l_layer *layer);
l2l_status l2l_layer_memory_use(l2l_layer_memory *out, const l2l_layer *layer,
                                int64_t micro_batch, int64_t seq);

const char *l2l_param_name(const l2l_param *param);

l2l_tensor *l2l_param_value(const l2l_param *param);

int64_t l2l_param_numel(const l2l_param *param);

int l2l_param_shape(const l2l_param *param, int64_t *dims);

l2l_status l2l_param_write(l2l_param *param, const l2l_tensor *src);

l2l_tensor *l2l_param_grad(const l2l_param *param);
int l2l_param_users(const l2l_param *param);

int l2l_param_decays(const l2l_param *param);

l2l_status l2l_layer_forward(l2l_saved **saved, l2l_layer *layer, l2l_tensor *y,
                             const l2l_tensor *x, const l2l_layer_batch *batch);

l2l_status l2l_layer_backward(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                              l2l_saved *saved, const l2l_layer_batch *batch);
void l2l_saved_free(l2l_saved *saved);
uint64_t l2l_saved_bytes(const l2l_saved *saved);

typedef int (*l2l_custom_forward_fn)(void *user, l2l_layer *layer, l2l_tensor *y,
                                     const l2l_tensor *x, const l2l_layer_batch *batch);
typedef int (*l2l_custom_backward_fn)(void *user, l2l_layer *layer, l2l_tensor *dx,
                                      const l2l_tensor *dy, const l2l_tensor *x,
                                      const l2l_layer_batch *batch);
typedef struct l2l_custom_param {
  const char *name;
  int ndim;
  int64_t shape[4];
  float init_std;
  float init_value;
  int decays;
} l2l_custom_param;

l2l_status l2l_layer_new_custom(l2l_layer **out, const char *name, int64_t dim,
                                const l2l_custom_param *params, int nparams,
                                l2l_custom_forward_fn forward, l2l_custom_backward_fn backward,
                                void *user, uint64_t init_seed, l2l_pool_kind pool);

const char *l2l_layer_name(const l2l_layer *layer);

typedef enum l2l_optimizer_kind {
  L2L_OPTIMIZER_SGD = 0,
  L2L_OPTIMIZER_ADAMW = 1,
  L2L_OPTIMIZER_LAMB = 2
} l2l_optimizer_kind;

enum { L2L_STATE_BLOCK = 2048 };
typedef enum l2l_state_precision {
  L2L_STATE_F32 = 0,
  L2L_STATE_BF16 = 1,
  L2L_STATE_8BIT = 2
} l2l_state_precision;

typedef struct l2l_optimizer_config {
  l2l_optimizer_kind kind;
  float lr;
  float momentum;
  int nesterov;
  float beta1, beta2;
  float eps;
  float weight_decay;
  int decay_all;
  l2l_state_precision state;
} l2l_optimizer_config;

l2l_status l2l_optimizer_state_arrays(int *out, const l2l_optimizer_config *config);

l2l_status l2l_state_array_bytes(uint64_t *out, l2l_state_precision state, int64_t n);

l2l_status l2l_state_array_check(const l2l_tensor *array,
                                 const l2l_optimizer_config *optimizer, int which,
                                 int64_t n);

typedef enum l2l_schedule_kind {
  L2L_SCHEDULE_CONSTANT = 0,
  L2L_SCHEDULE_COSINE = 1,
  L2L_SCHEDULE_LINEAR = 2
} l2l_schedule_kind;

typedef struct l2l_schedule_config {
  l2l_schedule_kind kind;
  int64_t warmup;
  int64_t total;
  float final_ratio;
} l2l_schedule_config;

l2l_status l2l_schedule_lr(double *out, const l2l_schedule_config *schedule, double base_lr,
                           int64_t t);

typedef struct l2l_relay l2l_relay;

typedef enum l2l_stash_policy {
  L2L_STASH_DEVICE = 0,
  L2L_STASH_HOST = 1,
  L2L_STASH_RECOMPUTE = 2
} l2l_stash_policy;

typedef enum l2l_inner_policy {
  L2L_INNER_RECOMPUTE = 0,
  L2L_INNER_KEEP = 1,
  L2L_INNER_SWAP = 2
} l2l_inner_policy;

typedef enum l2l_dist_mode { L2L_DIST_NONE = 0, L2L_DIST_MPI = 1 } l2l_dist_mode;

typedef enum l2l_placement {
  L2L_PLACE_HOST = 0,
  L2L_PLACE_DEVICE = 1,
  L2L_PLACE_AUTO = 2
} l2l_placement;

typedef struct l2l_relay_config {
  int64_t micro_batch;
  l2l_stash_policy stash;
  int recompute_every;
  l2l_inner_policy inner;
  l2l_optimizer_config optimizer;
  l2l_schedule_config schedule;
  float clip_global_norm;
  float clip_layer_norm;
  int accumulate;
  int optimizer_threads;
  uint64_t seed;
  int param_slots;
  float loss_scale;
  int loss_scale_window;
  l2l_dtype precision;
  l2l_dtype grad_precision;
  l2l_dist_mode dist;
  int nonfinite_error;
  uint64_t device_budget;
  uint64_t host_budget;
  const char *spill_dir;
  l2l_dtype master;
  l2l_placement placement;
} l2l_relay_config;

void l2l_relay_config_default(l2l_relay_config *out);

typedef struct l2l_relay_batch {
  const l2l_tensor *tokens;
  const l2l_tensor *targets;
  const l2l_tensor *token_types;
  const l2l_tensor *key_mask;
  const uint8_t *skip;
} l2l_relay_batch;

typedef enum l2l_relay_phase {
  L2L_PHASE_FORWARD = 0,
  L2L_PHASE_BACKWARD = 1,
  L2L_PHASE_REBUILD = 2,
  L2L_PHASE_PARAMS_IN = 3,
  L2L_PHASE_GRADS_OUT = 4,
  L2L_PHASE_STASH_OUT = 5,
  L2L_PHASE_STASH_IN = 6,
  L2L_PHASE_SWAP_OUT = 7,
  L2L_PHASE_SWAP_IN = 8,
  L2L_PHASE_UPDATE = 9,
  L2L_PHASE_WAIT_COPY = 10,
  L2L_PHASE_WAIT_UPDATE = 11,
  L2L_PHASE_REDUCE_SCATTER = 12,
  L2L_PHASE_ALL_GATHER = 13
} l2l_relay_phase;

typedef struct l2l_relay_event {
  int32_t layer;
  int32_t micro_batch;
  int32_t phase;
  int32_t thread;
  double start, end;
} l2l_relay_event;

typedef struct l2l_relay_stats {
  int64_t steps;
  int64_t updates;
  double loss;
  double lr;
  double grad_norm;
  int updates_deferred;
  uint64_t device_peak;
  uint64_t device_current;
  uint64_t host_eps_bytes;
  uint64_t host_stash_peak;
  uint64_t h2d_bytes, d2h_bytes;
  double step_seconds;
  double compute_seconds;
  double wait_copy_seconds;
  double exposed_copy_seconds;
  double wait_update_seconds;
  double optimizer_seconds;
  double h2d_seconds, d2h_seconds;
  int64_t events;
  double loss_scale;
  int64_t loss_scale_good;
  int64_t skipped_updates;
  int overflow;
  int64_t skipped_records;
  int dist_ranks;
  uint64_t dist_sent_bytes;
  uint64_t dist_received_bytes;
  uint64_t spill_read_bytes;
  uint64_t spill_written_bytes;
  int64_t spill_late_reads;
  int64_t spill_grad_waits;
  uint64_t spill_file_bytes;
  double exposed_comm_seconds;
  uint64_t host_pass_bytes;
  uint64_t device_records_bytes;
  uint64_t device_start;
} l2l_relay_stats;

l2l_status l2l_relay_new(l2l_relay **out, l2l_layer *const *layers, int nlayers,
                         const l2l_relay_config *config);

l2l_status l2l_relay_config_check(const l2l_relay_config *config);

typedef enum l2l_option_group {
  L2L_OPTION_RELAY = 0,
  L2L_OPTION_OPTIMIZER = 1,
  L2L_OPTION_SCHEDULE = 2
} l2l_option_group;
typedef enum l2l_option_type {
  L2L_OPTION_INT = 0,
  L2L_OPTION_INT64 = 1,
  L2L_OPTION_UINT64 = 2,
  L2L_OPTION_FLOAT = 3,
  L2L_OPTION_CHOICE = 4,
  L2L_OPTION_BOOL = 5,
  L2L_OPTION_PATH = 6
} l2l_option_type;

typedef enum l2l_option_keep { L2L_KEEP_RUN = 0, L2L_KEEP_LOAD = 1, L2L_KEEP_OWN = 2 } l2l_option_keep;
enum {
  L2L_OPTION_AGREE = 1,
  L2L_OPTION_STEP = 2,
  L2L_OPTION_OPEN_LOW = 4,
  L2L_OPTION_OPEN_HIGH = 8,
  L2L_OPTION_SGD = 16,
  L2L_OPTION_ADAM = 32,
  L2L_OPTION_DECAY = 64,
  L2L_OPTION_PLAN = 128
};

enum { L2L_OPTION_KINDS = 3 };
typedef struct l2l_option {
  const char *name;
  const char *field;
  l2l_option_group group;
  l2l_option_type type;
  size_t offset;
  double min, max;
  int flags;
  l2l_option_keep keep;
  int nchoices;
  const char *const *choice_names;
  const int *choice_values;
  const char *help;
  double kind_default[L2L_OPTION_KINDS];
} l2l_option;

int l2l_relay_option_count(void);
l2l_status l2l_relay_option(const l2l_option **out, int index);

void l2l_relay_free(l2l_relay *run);

int l2l_relay_layer_count(const l2l_relay *run);
l2l_layer *l2l_relay_layer(const l2l_relay *run, int index);

l2l_relay *l2l_layer_relay(const l2l_layer *layer);

l2l_status l2l_relay_insert(l2l_relay *run, int index, l2l_layer *layer);
l2l_status l2l_relay_remove(l2l_relay *run, int index);
l2l_status l2l_relay_replace(l2l_relay *run, int index, l2l_layer *layer);

l2l_status l2l_relay_set_frozen(l2l_relay *run, int index, int frozen);
int l2l_relay_frozen(const l2l_relay *run, int index);

l2l_status l2l_relay_set_stash(l2l_relay *run, int boundary, l2l_stash_policy policy);
l2l_status l2l_relay_set_inner(l2l_relay *run, int index, l2l_inner_policy policy);
l2l_status l2l_relay_set_micro_batch(l2l_relay *run, int64_t micro_batch);

l2l_status l2l_relay_set_device_budget(l2l_relay *run, uint64_t bytes);

l2l_status l2l_relay_set_host_budget(l2l_relay *run, uint64_t bytes);

int l2l_relay_stash(const l2l_relay *run, int boundary);
int l2l_relay_inner(const l2l_relay *run, int index);

l2l_status l2l_relay_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch);

l2l_status l2l_relay_evaluate(double *loss, l2l_relay *run, const l2l_relay_batch *batch);

l2l_status l2l_relay_step_peak(uint64_t *peak, const l2l_relay *run, int64_t batch, int64_t seq,
                               int token_types, int key_mask);

l2l_status l2l_relay_sync(l2l_relay *run);

l2l_status l2l_relay_get_stats(l2l_relay_stats *out, const l2l_relay *run);

l2l_status l2l_relay_events(l2l_relay_event *out, const l2l_relay *run, int64_t first,
                            int64_t count);

l2l_status l2l_relay_param_state(l2l_tensor **out, l2l_relay *run, const l2l_param *param,
                                 int which);

l2l_status l2l_relay_param_updates(int64_t *out, l2l_relay *run, const l2l_param *param);
l2l_status l2l_relay_restore_param(l2l_relay *run, const l2l_param *param, int64_t updates,
                                   const l2l_tensor *first, const l2l_tensor *second);
l2l_status l2l_relay_restore_progress(l2l_relay *run, int64_t steps, int64_t updates);
l2l_status l2l_relay_restore_loss_scale(l2l_relay *run, double scale, int64_t good,
                                        int64_t skipped);

typedef struct l2l_save_options {
  int replace;
  const char *extra;
  const char *layers;
  const char *relay;
} l2l_save_options;
l2l_status l2l_relay_save(l2l_relay *run, const char *path, const l2l_save_options *options);

l2l_status l2l_relay_load(l2l_relay *run, const char *path);

l2l_status l2l_checkpoint_description(char *out, size_t capacity, size_t *length,
                                      const char *path);

typedef struct l2l_plan_rates l2l_plan_rates;

l2l_status l2l_relay_calibrate_plan(l2l_plan_rates *out, int remeasure);

l2l_status l2l_plan_calibrate(l2l_plan_rates *out, int remeasure);

l2l_status l2l_dist_init(void);

l2l_status l2l_dist_rank(int *out);
l2l_status l2l_dist_size(int *out);

l2l_status l2l_dist_barrier(void);

l2l_status l2l_dist_sum(double *values, int n);

l2l_status l2l_dist_set_timeout(double seconds);

l2l_status l2l_dist_finalize(void);

void l2l_dist_abort(const char *message);

struct l2l_plan_rates {
  double flops;
  double h2d, d2h;
  double optimizer;
  double visit;
  int timed;
  int shared;
  double disk_read, disk_write;
};

typedef struct l2l_plan_request {
  int64_t batch, seq;
  uint64_t device_budget;
  int token_types, key_mask;
  const uint8_t *frozen;
  const l2l_plan_rates *rates;
} l2l_plan_request;

typedef struct l2l_plan l2l_plan;
typedef struct l2l_plan_summary {
  int nlayers;
  int64_t micro_batch;
  double step_seconds;
  uint64_t device_peak;
  uint64_t device_records_bytes;
  uint64_t h2d_bytes, d2h_bytes;
  double streaming_tokens;

  uint64_t host_eps_bytes;
  uint64_t host_budget_smallest;
  uint64_t disk_bytes;
  double disk_seconds;

  double compute_seconds;
  double h2d_seconds, d2h_seconds;
  double update_seconds;
} l2l_plan_summary;
typedef struct l2l_plan_layer {
  l2l_inner_policy inner;
  l2l_stash_policy stash;
  uint64_t kept_bytes;
  double seconds;
  int on_device;
} l2l_plan_layer;

l2l_status l2l_plan_new(l2l_plan **out, l2l_layer *const *layers, int nlayers,
                        const l2l_relay_config *config, const l2l_plan_request *request);
l2l_status l2l_plan_get(l2l_plan_summary *out, const l2l_plan *plan);
l2l_status l2l_plan_get_layer(l2l_plan_layer *out, const l2l_plan *plan, int index);
void l2l_plan_free(l2l_plan *plan);

l2l_status l2l_relay_apply_plan(l2l_relay *run, const l2l_plan *plan);

l2l_status l2l_relay_plan_auto(const l2l_plan **out, l2l_relay *run, int64_t batch, int64_t seq,
                               int token_types, int key_mask);

enum { L2L_SAFETENSORS_MAX_HEADER = 16 << 20 };

typedef struct l2l_safetensors l2l_safetensors;

typedef struct l2l_safetensors_info {
  int tensors;
  int metadata;
  uint64_t data_start;
  uint64_t data_bytes;
} l2l_safetensors_info;

typedef struct l2l_safetensors_entry {
  const char *name;
  l2l_dtype dtype;
  const char *stored_dtype;
  int ndim;
  int64_t shape[L2L_MAX_DIMS];
  int64_t numel;
  uint64_t offset, bytes;
  int summed;
} l2l_safetensors_entry;

l2l_status l2l_safetensors_open(l2l_safetensors **out, const char *path);
void l2l_safetensors_close(l2l_safetensors *file);
l2l_status l2l_safetensors_get_info(l2l_safetensors_info *out, const l2l_safetensors *file);

l2l_status l2l_safetensors_get_entry(l2l_safetensors_entry *out, const l2l_safetensors *file,
                                     int index);

l2l_status l2l_safetensors_find(l2l_safetensors_entry *out, const l2l_safetensors *file,
                                const char *name);

l2l_status l2l_safetensors_get_metadata(const char **key, const char **value,
                                        const l2l_safetensors *file, int index);

l2l_status l2l_safetensors_read(void *dst, l2l_dtype dtype, int64_t numel,
                                const l2l_safetensors *file, const char *name);

l2l_status l2l_safetensors_verify(const l2l_safetensors *file);

typedef struct l2l_safetensors_spec {
  const char *name;
  l2l_dtype dtype;
  int ndim;
  int64_t shape[L2L_MAX_DIMS];
} l2l_safetensors_spec;
typedef struct l2l_safetensors_writer l2l_safetensors_writer;

l2l_status l2l_safetensors_create(l2l_safetensors_writer **out, const char *path, int replace,
                                  const l2l_safetensors_spec *entries, int count,
                                  const char *const *metadata, int pairs);

l2l_status l2l_safetensors_put(l2l_safetensors_writer *writer, const void *data, uint64_t bytes);

l2l_status l2l_safetensors_commit(l2l_safetensors_writer *writer);

void l2l_safetensors_abandon(l2l_safetensors_writer *writer);
]==]
