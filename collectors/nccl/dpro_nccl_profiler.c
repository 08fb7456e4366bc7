/* dpro-kit's NCCL profiler plugin: per-chunk network SEND/RECV timestamps without a forked NCCL.
 *
 * Build: `make -C collectors/nccl` -> build/libnccl-profiler-dpro.so.  Use:
 *     NCCL_PROFILER_PLUGIN=/path/to/libnccl-profiler-dpro.so DPRO_NCCL_TRACE=<dir> <job>
 * Exports ncclProfiler_v6, ncclProfiler_v5 and ncclProfiler_v4 (NCCL 2.29, 2.28, 2.27; NCCL takes
 * the newest it knows).  Records, per communicator and rank, collective events (enqueue), proxy-op
 * events (one per channel, peer and direction) and proxy-step events (one per network transfer)
 * with their state transitions and transfer sizes, and writes them at finalize to
 * <dir>/nccl-<commId>-r<rank>.<pid>.jsonl (temp file + rename).  Format: docs/nccl.md.
 *
 * Cost on NCCL's threads: a clock read and a few stores per call; events live in a per-communicator
 * pool of fixed-size records (blocks allocated on demand, a lock only when a block is added); all
 * formatting happens in finalize.  Errors never reach NCCL (every call returns success) except
 * from init, which NCCL answers by disabling the plugin.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpro_nccl_abi.h"

#define FORMAT_VERSION 1
#define BLOCK_SHIFT 12                 /* 4096 events per block */
#define BLOCK_EVENTS (1u << BLOCK_SHIFT)
#define MAX_BLOCKS 4096                /* hard cap: 16M events per communicator */
#define MAX_STATES 4                   /* NCCL records at most 3 states per step, 1 per op */
#define NAME_LEN 16                    /* longest NCCL name: "ReduceScatter", "ncclBfloat16" */

enum { K_COLL = 1, K_OP = 2, K_STEP = 3 };

struct state_rec { uint64_t t; uint32_t size; int32_t state; };   /* NCCL transfer sizes are ints */

struct event {
  struct ctx *ctx;
  uint32_t id;
  uint8_t kind;
  uint8_t nstates;
  uint8_t stopped;
  int32_t parent;                      /* id of the parent event in this context, -1 if none */
  uint64_t t0, t1;
  union {
    struct { uint64_t seq; size_t count; char func[NAME_LEN], dtype[NAME_LEN], algo[NAME_LEN], proto[NAME_LEN];
             int root; int nchannels; } coll;
    struct { int channel, peer, nsteps, chunk_size, is_send; int pid; } op;
    struct { int step; } step;
  } u;
  struct state_rec states[MAX_STATES];
};
_Static_assert(sizeof(struct event) <= 192, "keep events small: the pool is touched on NCCL's proxy thread");

struct ctx {
  _Atomic uint32_t next;               /* next event id */
  _Atomic uint64_t dropped;            /* events refused once MAX_BLOCKS were in use */
  pthread_mutex_t grow;
  struct event *_Atomic blocks[MAX_BLOCKS];
  uint32_t max_events;
  int api, rank, nranks, nnodes;
  uint64_t comm_id;
  char comm_name[128];
  char dir[4096];
  uint64_t rt0, mono0;                 /* CLOCK_REALTIME / CLOCK_MONOTONIC read together at init */
  dpro_nccl_logger log;
};

static inline uint64_t now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct event *alloc_event(struct ctx *c) {
  uint32_t id = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
  if (id >= c->max_events) {
    atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
    return NULL;
  }
  uint32_t b = id >> BLOCK_SHIFT;
  struct event *blk = atomic_load_explicit(&c->blocks[b], memory_order_acquire);
  if (blk == NULL) {
    pthread_mutex_lock(&c->grow);
    blk = atomic_load_explicit(&c->blocks[b], memory_order_acquire);
    if (blk == NULL) {
      blk = calloc(BLOCK_EVENTS, sizeof(struct event));
      if (blk != NULL) atomic_store_explicit(&c->blocks[b], blk, memory_order_release);
    }
    pthread_mutex_unlock(&c->grow);
    if (blk == NULL) {
      atomic_fetch_add_explicit(&c->dropped, 1, memory_order_relaxed);
      return NULL;
    }
  }
  struct event *e = &blk[id & (BLOCK_EVENTS - 1)];
  e->ctx = c;
  e->id = id;
  e->parent = -1;
  return e;
}

static void copy_name(char *dst, const char *src) {
  if (src == NULL) src = "";
  size_t n = strnlen(src, NAME_LEN - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* The parent's id, when the parent is an event of this context (a handle this plugin returned). */
static int32_t parent_id(struct ctx *c, void *parent) {
  struct event *p = parent;
  return (p != NULL && p->ctx == c) ? (int32_t)p->id : -1;
}

/* ---------------------------------------------------------------------------------- init */

static int mkdir_p(const char *dir) {
  char p[4096];
  snprintf(p, sizeof(p), "%s", dir);
  for (char *q = p + 1; *q; q++) {
    if (*q != '/') continue;
    *q = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
    *q = '/';
  }
  return (mkdir(p, 0777) != 0 && errno != EEXIST) ? -1 : 0;
}

static dpro_nccl_result init_common(void **context, int api, uint64_t comm_id, int *mask, const char *comm_name,
                                    int nnodes, int nranks, int rank, dpro_nccl_logger logfn) {
  *context = NULL;
  const char *dir = getenv("DPRO_NCCL_TRACE");
  if (dir == NULL || dir[0] == '\0') {
    if (logfn) logfn(DPRO_NCCL_LOG_INFO, DPRO_NCCL_LOG_SUBSYS_INIT, __FILE__, __LINE__,
                     "dpro NCCL profiler: DPRO_NCCL_TRACE not set; plugin disabled");
    *mask = 0;
    return DPRO_NCCL_INVALID_USAGE;
  }
  if (strlen(dir) >= sizeof(((struct ctx *)0)->dir) - 64) return DPRO_NCCL_INVALID_USAGE;
  if (mkdir_p(dir) != 0) {
    if (logfn) logfn(DPRO_NCCL_LOG_WARN, DPRO_NCCL_LOG_SUBSYS_INIT, __FILE__, __LINE__,
                     "dpro NCCL profiler: cannot create DPRO_NCCL_TRACE=%s: %s; plugin disabled", dir, strerror(errno));
    return DPRO_NCCL_SYSTEM_ERROR;
  }
  struct ctx *c = calloc(1, sizeof(*c));
  if (c == NULL) return DPRO_NCCL_SYSTEM_ERROR;
  pthread_mutex_init(&c->grow, NULL);
  c->api = api;
  c->comm_id = comm_id;
  c->rank = rank;
  c->nranks = nranks;
  c->nnodes = nnodes;
  c->log = logfn;
  snprintf(c->dir, sizeof(c->dir), "%s", dir);
  snprintf(c->comm_name, sizeof(c->comm_name), "%s", comm_name ? comm_name : "");
  const char *cap = getenv("DPRO_NCCL_MAX_EVENTS");
  long long m = cap ? atoll(cap) : 0;
  c->max_events = (m > 0 && m < (long long)MAX_BLOCKS * BLOCK_EVENTS) ? (uint32_t)m : MAX_BLOCKS * BLOCK_EVENTS;
  c->rt0 = now_ns(CLOCK_REALTIME);
  c->mono0 = now_ns(CLOCK_MONOTONIC);
  *mask = DPRO_EV_COLL | DPRO_EV_PROXY_OP | DPRO_EV_PROXY_STEP;
  *context = c;
  return DPRO_NCCL_OK;
}

static dpro_nccl_result init_v5(void **context, uint64_t comm_id, int *mask, const char *comm_name, int nnodes,
                                int nranks, int rank, dpro_nccl_logger logfn) {
  return init_common(context, 5, comm_id, mask, comm_name, nnodes, nranks, rank, logfn);
}

static dpro_nccl_result init_v6(void **context, uint64_t comm_id, int *mask, const char *comm_name, int nnodes,
                                int nranks, int rank, dpro_nccl_logger logfn) {
  return init_common(context, 6, comm_id, mask, comm_name, nnodes, nranks, rank, logfn);
}

static dpro_nccl_result init_v4(void **context, int *mask, const char *comm_name, uint64_t comm_hash, int nnodes,
                                int nranks, int rank, dpro_nccl_logger logfn) {
  return init_common(context, 4, comm_hash, mask, comm_name, nnodes, nranks, rank, logfn);
}

/* ---------------------------------------------------------------------------------- events */

static void start_coll(struct ctx *c, void **handle, void *parent, const struct dpro_d_coll *d) {
  struct event *e = alloc_event(c);
  if (e == NULL) return;
  e->kind = K_COLL;
  e->parent = parent_id(c, parent);
  e->u.coll.seq = d->seq;
  e->u.coll.count = d->count;
  e->u.coll.root = d->root;
  e->u.coll.nchannels = d->nchannels;
  copy_name(e->u.coll.func, d->func);
  copy_name(e->u.coll.dtype, d->datatype);
  copy_name(e->u.coll.algo, d->algo);
  copy_name(e->u.coll.proto, d->proto);
  e->t0 = now_ns(CLOCK_MONOTONIC);
  *handle = e;
}

static void start_op(struct ctx *c, void **handle, void *parent, const struct dpro_d_proxy_op *d) {
  struct event *e = alloc_event(c);
  if (e == NULL) return;
  e->kind = K_OP;
  /* PXN: a proxy op created by another process carries a parent pointer from that address space */
  e->parent = (d->pid == getpid()) ? parent_id(c, parent) : -1;
  e->u.op.channel = d->channel;
  e->u.op.peer = d->peer;
  e->u.op.nsteps = d->nsteps;
  e->u.op.chunk_size = d->chunk_size;
  e->u.op.is_send = d->is_send;
  e->u.op.pid = (int)d->pid;
  e->t0 = now_ns(CLOCK_MONOTONIC);
  *handle = e;
}

static void start_step(struct ctx *c, void **handle, void *parent, const struct dpro_d_proxy_step *d) {
  struct event *e = alloc_event(c);
  if (e == NULL) return;
  e->kind = K_STEP;
  e->parent = parent_id(c, parent);
  e->u.step.step = d->step;
  e->t0 = now_ns(CLOCK_MONOTONIC);
  *handle = e;
}

static dpro_nccl_result start_event_v5(void *context, void **handle, dpro_descr_v5 *d) {
  *handle = NULL;
  struct ctx *c = context;
  if (c == NULL || d == NULL) return DPRO_NCCL_OK;
  switch (d->type) {
    case DPRO_EV_COLL: start_coll(c, handle, d->parent, &d->coll); break;
    case DPRO_EV_PROXY_OP: start_op(c, handle, d->parent, &d->proxy_op); break;
    case DPRO_EV_PROXY_STEP: start_step(c, handle, d->parent, &d->proxy_step); break;
    default: break;                    /* not activated: NCCL should not send them; ignore */
  }
  return DPRO_NCCL_OK;
}

static dpro_nccl_result start_event_v4(void *context, void **handle, dpro_descr_v4 *d) {
  *handle = NULL;
  struct ctx *c = context;
  if (c == NULL || d == NULL) return DPRO_NCCL_OK;
  switch (d->type) {
    case DPRO_EV_COLL: {
      struct dpro_d_coll coll = d->coll;   /* v4 has no trailing parent_group; it is not read */
      start_coll(c, handle, d->parent, &coll);
      break;
    }
    case DPRO_EV_PROXY_OP: start_op(c, handle, d->parent, &d->proxy_op); break;
    case DPRO_EV_PROXY_STEP: start_step(c, handle, d->parent, &d->proxy_step); break;
    default: break;
  }
  return DPRO_NCCL_OK;
}

static dpro_nccl_result stop_event(void *handle) {
  struct event *e = handle;
  if (e == NULL) return DPRO_NCCL_OK;
  e->t1 = now_ns(CLOCK_MONOTONIC);
  e->stopped = 1;
  return DPRO_NCCL_OK;
}

static dpro_nccl_result record_event_state(void *handle, int state, dpro_state_args *args) {
  struct event *e = handle;
  if (e == NULL || e->stopped || e->nstates >= MAX_STATES) return DPRO_NCCL_OK;
  struct state_rec *s = &e->states[e->nstates];
  s->t = now_ns(CLOCK_MONOTONIC);
  s->state = state;
  size_t sz = (e->kind == K_STEP && args != NULL) ? args->proxy_step.trans_size : 0;
  s->size = sz > UINT32_MAX ? UINT32_MAX : (uint32_t)sz;
  e->nstates++;
  return DPRO_NCCL_OK;
}

/* ---------------------------------------------------------------------------------- output */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20 || ch >= 0x7f) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static void write_event(FILE *f, const struct event *e) {
  switch (e->kind) {
    case K_COLL:
      fprintf(f, "{\"ev\":\"coll\",\"id\":%u,\"parent\":%d,\"seq\":%" PRIu64 ",\"func\":", e->id, e->parent,
              e->u.coll.seq);
      json_str(f, e->u.coll.func);
      fprintf(f, ",\"count\":%zu,\"datatype\":", e->u.coll.count);
      json_str(f, e->u.coll.dtype);
      fputs(",\"algo\":", f);
      json_str(f, e->u.coll.algo);
      fputs(",\"proto\":", f);
      json_str(f, e->u.coll.proto);
      fprintf(f, ",\"root\":%d,\"nchannels\":%d", e->u.coll.root, e->u.coll.nchannels);
      break;
    case K_OP:
      fprintf(f, "{\"ev\":\"op\",\"id\":%u,\"parent\":%d,\"channel\":%d,\"peer\":%d,\"send\":%d,\"nsteps\":%d,"
              "\"chunk_size\":%d,\"pid\":%d", e->id, e->parent, e->u.op.channel, e->u.op.peer, e->u.op.is_send ? 1 : 0,
              e->u.op.nsteps, e->u.op.chunk_size, e->u.op.pid);
      break;
    default:
      fprintf(f, "{\"ev\":\"step\",\"id\":%u,\"parent\":%d,\"step\":%d", e->id, e->parent, e->u.step.step);
      break;
  }
  fprintf(f, ",\"t0\":%" PRIu64 ",\"t1\":", e->t0);
  if (e->stopped) fprintf(f, "%" PRIu64, e->t1);
  else fputs("null", f);
  fputs(",\"states\":[", f);
  for (int i = 0; i < e->nstates; i++)
    fprintf(f, "%s[%d,%" PRIu64 ",%" PRIu32 "]", i ? "," : "", e->states[i].state, e->states[i].t, e->states[i].size);
  fputs("]}\n", f);
}

static int write_file(struct ctx *c) {
  char host[256] = "";
  const char *dh = getenv("DPRO_HOST");           /* dpro profile --host (the other collectors' too) */
  if (dh != NULL && *dh) snprintf(host, sizeof(host), "%s", dh);
  else gethostname(host, sizeof(host) - 1);
  char path[4200], tmp[4300];
  snprintf(path, sizeof(path), "%s/nccl-%016" PRIx64 "-r%d.%d.jsonl", c->dir, c->comm_id, c->rank, (int)getpid());
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL) return -1;
  char *buf = malloc(1 << 16);          /* finalize may run on several threads (one per communicator) */
  if (buf != NULL) setvbuf(f, buf, _IOFBF, 1 << 16);
  uint32_t n = atomic_load(&c->next);
  if (n > c->max_events) n = c->max_events;
  uint32_t written = 0;
  fprintf(f, "{\"format\":\"dpro-nccl\",\"version\":%d,\"api\":%d,\"comm\":\"%016" PRIx64 "\",\"comm_name\":",
          FORMAT_VERSION, c->api, c->comm_id);
  json_str(f, c->comm_name);
  fputs(",\"host\":", f);
  json_str(f, host);
  fprintf(f, ",\"rank\":%d,\"nranks\":%d,\"nnodes\":%d,\"pid\":%d,\"clock\":{\"realtime_ns\":%" PRIu64
          ",\"monotonic_ns\":%" PRIu64 "}}\n", c->rank, c->nranks, c->nnodes, (int)getpid(), c->rt0, c->mono0);
  for (uint32_t id = 0; id < n; id++) {
    struct event *blk = atomic_load(&c->blocks[id >> BLOCK_SHIFT]);
    if (blk == NULL) continue;
    const struct event *e = &blk[id & (BLOCK_EVENTS - 1)];
    if (e->kind == 0) continue;          /* allocation failed for this id */
    write_event(f, e);
    written++;
  }
  fprintf(f, "{\"end\":true,\"events\":%u,\"dropped\":%" PRIu64 "}\n", written, atomic_load(&c->dropped));
  int bad = ferror(f);
  bad |= fclose(f) != 0;
  free(buf);
  if (bad) {
    unlink(tmp);
    return -1;
  }
  if (rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

static dpro_nccl_result finalize(void *context) {
  struct ctx *c = context;
  if (c == NULL) return DPRO_NCCL_OK;
  if (write_file(c) != 0 && c->log)
    c->log(DPRO_NCCL_LOG_WARN, DPRO_NCCL_LOG_SUBSYS_INIT, __FILE__, __LINE__,
           "dpro NCCL profiler: could not write the trace of rank %d under %s: %s", c->rank, c->dir, strerror(errno));
  for (int b = 0; b < MAX_BLOCKS; b++) free(atomic_load(&c->blocks[b]));
  pthread_mutex_destroy(&c->grow);
  free(c);
  return DPRO_NCCL_OK;
}

/* ---------------------------------------------------------------------------------- exports */

__attribute__((visibility("default"))) const dpro_profiler_v5 ncclProfiler_v6 = {
    "dpro", init_v6, start_event_v5, stop_event, record_event_state, finalize};
__attribute__((visibility("default"))) const dpro_profiler_v5 ncclProfiler_v5 = {
    "dpro", init_v5, start_event_v5, stop_event, record_event_state, finalize};
__attribute__((visibility("default"))) const dpro_profiler_v4 ncclProfiler_v4 = {
    "dpro", init_v4, start_event_v4, stop_event, record_event_state, finalize};
