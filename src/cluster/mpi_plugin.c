/* SPDX-License-Identifier: MIT */
/* mpi_plugin.c — libl2l-mpi.so: the one file that includes mpi.h (see cluster.h).
 *
 * Purpose: MPI's calls over plain handles, so libl2l can open MPI with dlopen only when a
 * program asks for it. Communicators and requests live in small tables here; a handle is
 * an index. Errors return to the caller (MPI_ERRORS_RETURN) so the communication thread
 * can say what failed before it ends the job.
 * Must never: be called from more than one thread (the communication thread is the only
 * caller: MPI_THREAD_FUNNELED), or link anything of libl2l.
 */
#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "cluster.h"

/* Requests in flight: a record has at most one at a time, a step's control one more. */
enum { MAX_COMMS = 256, MAX_REQUESTS = 1 << 16 };

static MPI_Comm comms[MAX_COMMS];
static int ncomms;
static MPI_Request requests[MAX_REQUESTS];
static int free_requests[MAX_REQUESTS], nfree = -1;
static char library_line[256];
static int initialized;   /* MPI is up (by this plugin or before it): finalize may follow */
static struct mpi_plugin table;

/* A free request slot, or -1 (every slot in flight). */
static int request_take(void) {
  if (nfree < 0) {   /* first use */
    for (int i = 0; i < MAX_REQUESTS; i++) free_requests[i] = MAX_REQUESTS - 1 - i;
    nfree = MAX_REQUESTS;
  }
  return nfree > 0 ? free_requests[--nfree] : -1;
}

static void request_give(int req) { free_requests[nfree++] = req; }

/* The tail of every posting call: a slot for the request, MPI's call, the slot back on
   an error. */
#define POST(req, call)                       \
  do {                                        \
    int slot = request_take();                \
    if (slot < 0) return MPI_ERR_NO_MEM;      \
    int rc = (call);                          \
    if (rc != MPI_SUCCESS) {                  \
      request_give(slot);                     \
      return rc;                              \
    }                                         \
    *(req) = slot;                            \
    return MPI_SUCCESS;                       \
  } while (0)

static int plugin_init(int *rank, int *size) {
  int up = 0, rc;
  MPI_Initialized(&up);
  if (!up) {
    int provided = 0;
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return rc;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  initialized = 1;
  comms[0] = MPI_COMM_WORLD;
  ncomms = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  size_t n = strcspn(version, "\n,");
  if (n >= sizeof library_line) n = sizeof library_line - 1;
  memcpy(library_line, version, n);
  library_line[n] = '\0';
  table.library = library_line;
  return MPI_SUCCESS;
}

static int plugin_finalize(void) {
  int done = 0;
  MPI_Finalized(&done);
  return done || !initialized ? MPI_SUCCESS : MPI_Finalize();
}

static void plugin_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

/* The first free slot (a freed communicator's, else a new one). */
static int plugin_comm_dup(int *comm) {
  int slot = 1;
  while (slot < ncomms && comms[slot] != MPI_COMM_NULL) slot++;
  if (slot == MAX_COMMS) return MPI_ERR_NO_MEM;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comms[slot]);
  if (rc != MPI_SUCCESS) {
    comms[slot] = MPI_COMM_NULL;
    return rc;
  }
  MPI_Comm_set_errhandler(comms[slot], MPI_ERRORS_RETURN);
  if (slot == ncomms) ncomms++;
  *comm = slot;
  return MPI_SUCCESS;
}

static void plugin_comm_free(int comm) {
  if (comm > 0 && comm < ncomms && comms[comm] != MPI_COMM_NULL) MPI_Comm_free(&comms[comm]);
}

static int plugin_reduce_scatter(const float *send, float *recv, const int *counts, int comm,
                                 int *req) {
  POST(req, MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, comms[comm],
                                &requests[slot]));
}

static int plugin_allgatherv(void *buf, int bytes, const int *counts, const int *displs,
                             int comm, int *req) {
  MPI_Datatype type = bytes == 4 ? MPI_FLOAT : bytes == 2 ? MPI_UINT16_T : MPI_BYTE;
  POST(req, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, type,
                            comms[comm], &requests[slot]));
}

static int plugin_allreduce_sum(double *buf, int n, int comm, int *req) {
  POST(req, MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, comms[comm],
                           &requests[slot]));
}

static int plugin_allgather_i64(const int64_t *send, int n, int64_t *recv, int comm, int *req) {
  POST(req, MPI_Iallgather(send, n, MPI_INT64_T, recv, n, MPI_INT64_T, comms[comm],
                           &requests[slot]));
}

static int plugin_barrier(int comm, int *req) {
  POST(req, MPI_Ibarrier(comms[comm], &requests[slot]));
}

static int plugin_test(int req, int *done) {
  int rc = MPI_Test(&requests[req], done, MPI_STATUS_IGNORE);
  if (rc == MPI_SUCCESS && *done) request_give(req);
  return rc;
}

static void plugin_error_string(int code, char *text, int len) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) n = 0;
  s[n < MPI_MAX_ERROR_STRING ? n : MPI_MAX_ERROR_STRING - 1] = '\0';
  strncpy(text, n ? s : "unknown MPI error", (size_t)len - 1);
  text[len - 1] = '\0';
}

static struct mpi_plugin table = {
    .version = L2L_MPI_PLUGIN_VERSION, .init = plugin_init, .finalize = plugin_finalize,
    .abort = plugin_abort, .comm_dup = plugin_comm_dup, .comm_free = plugin_comm_free,
    .reduce_scatter = plugin_reduce_scatter, .allgatherv = plugin_allgatherv,
    .allreduce_sum = plugin_allreduce_sum, .allgather_i64 = plugin_allgather_i64,
    .barrier = plugin_barrier, .test = plugin_test, .error_string = plugin_error_string,
    .library = ""};

const struct mpi_plugin *mpi_plugin(void) { return &table; }
