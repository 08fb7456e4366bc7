/* Drives an NCCL profiler plugin the way NCCL does, without a GPU (docs/nccl.md).
 *
 *   nccl_harness ring  PLUGIN.so NRANKS NCHANNELS BYTES ITERS API PROTO CHUNK
 *   nccl_harness tree  PLUGIN.so NRANKS NCHANNELS BYTES ITERS API PROTO CHUNK [RANKS_PER_NODE]
 *   nccl_harness run --algo ring|tree PLUGIN.so NRANKS ...   (the same two)
 *   nccl_harness bench PLUGIN.so API NSTEPS
 *
 * ring: NRANKS processes (fork; each rank's DPRO_HOST is node<r>), each a rank with a main thread and a proxy progress thread, run
 * ITERS ring all-reduces of BYTES over NCHANNELS channels.  The proxy thread is a reduced copy of
 * the control flow of NCCL's network transport (src/transport/net.cc sendProxyProgress /
 * recvProxyProgress): per channel a send sub (peer = ring next) and a recv sub (peer = ring prev),
 * steps posted / transmitted / received / done with at most NCCL_STEPS=8 in flight, and the
 * profiler calls at the same places with the same arguments (step numbers, transfer sizes,
 * activation-mask checks, event order).  The bytes really move over one socketpair per channel
 * and ring edge; the GPU is emulated by data dependencies only: a send step of ring step k>0 is
 * ready once the recv of the same slice at step k-1 reached the "GPU", and a received slice is
 * consumed once it has been forwarded (or at the last ring step).  Data layout as NCCL's ring
 * all-reduce: loops of NCHANNELS*NRANKS*CHUNK bytes, 2(N-1) ring steps per loop, CHUNK split into
 * 2 slices (one network transfer each) with the Simple protocol, 1 with LL/LL128.  The collective
 * event is started by the main thread before the proxy ops are posted and stopped once they are
 * (NCCL stops it at enqueue), proxy ops start when appended on the proxy thread.
 * Then the parent checks every rank's file (event counts, no drops).  Exit 0 = all good.
 *
 * tree: the same ranks and proxy thread for NCCL's tree all-reduce (ncclPatternTreeUpDown) on
 * NRANKS/RANKS_PER_NODE emulated nodes (default 1 rank per node; each rank's DPRO_HOST is
 * node<r/RANKS_PER_NODE>): channel c uses tree 0 of NCCL's double binary tree over the nodes when
 * 2c < NCHANNELS, else tree 1 (mirrored for an even number of nodes, shifted by one for odd),
 * positions as ncclGetBtree; the ranks of a node form a chain below its first rank, which carries
 * the links between nodes (pattern TREE).  Per channel the
 * proxy ops are appended in ncclProxySaveOp's order: recv from each child, send to the parent,
 * send to each child, recv from the parent; each has one network step per chunk (Simple, LL and
 * LL128 alike: NCCL's tree uses chunkSteps = sliceSteps = 1), a channel's share of the message
 * cut into nLoops = ceil(BYTES / (NCHANNELS*CHUNK)) chunks.  GPU emulation: a send to the parent
 * of chunk k is ready once every child's chunk k arrived (leaves: at once); the root's sends to
 * its children once every child's chunk k arrived; another rank's sends to its children once the
 * parent's chunk k arrived; a received chunk is consumed once the sends it feeds are posted.  The
 * collective event says algo "TREE".
 *
 * bench: one rank, one proxy op, NSTEPS send steps of 5 calls each (start, 3 states, stop),
 * timed against a table of empty functions; prints ns per call and the finalize cost per event.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "dpro_nccl_abi.h"

#define NCCL_STEPS 8
#define COMM_ID 0x5eed0000d9a0c0deull

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("nccl_harness: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[nccl log %d %s:%d] ", level, file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ------------------------------------------------------------------ the plugin, any version */

struct plugin {
  int api;
  void *ctx;
  int mask;
  const dpro_profiler_v5 *v5; /* v5 and v6 */
  const dpro_profiler_v4 *v4;
};

static void plugin_open(struct plugin *p, const char *path, int api) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) die("dlopen %s: %s", path, dlerror());
  char sym[32];
  snprintf(sym, sizeof(sym), "ncclProfiler_v%d", api);
  void *t = dlsym(lib, sym);
  if (t == NULL) die("%s has no symbol %s", path, sym);
  memset(p, 0, sizeof(*p));
  p->api = api;
  if (api >= 5) p->v5 = t;
  else p->v4 = t;
}

static int plugin_init(struct plugin *p, const char *name, int nnodes, int nranks, int rank) {
  if (p->v5) return p->v5->init(&p->ctx, COMM_ID, &p->mask, name, nnodes, nranks, rank, logger);
  return p->v4->init(&p->ctx, &p->mask, name, COMM_ID, nnodes, nranks, rank, logger);
}

/* One descriptor filled as NCCL fills it (zeroed, then type/parent/rank and the member). */
struct descr { int type; void *parent; int rank; struct dpro_d_coll coll; struct dpro_d_proxy_op op; int step; };

static void *plugin_start(struct plugin *p, const struct descr *d) {
  void *h = NULL;
  if (p->v5) {
    dpro_descr_v5 e;
    memset(&e, 0, sizeof(e));
    e.type = (uint64_t)d->type;
    e.parent = d->parent;
    e.rank = d->rank;
    if (d->type == DPRO_EV_COLL) e.coll = d->coll;
    else if (d->type == DPRO_EV_PROXY_OP) e.proxy_op = d->op;
    else e.proxy_step.step = d->step;
    p->v5->start_event(p->ctx, &h, &e);
  } else {
    dpro_descr_v4 e;
    memset(&e, 0, sizeof(e));
    e.type = (uint8_t)d->type;
    e.parent = d->parent;
    e.rank = d->rank;
    if (d->type == DPRO_EV_COLL) { e.coll = d->coll; e.coll.parent_group = NULL; }
    else if (d->type == DPRO_EV_PROXY_OP) e.proxy_op = d->op;
    else e.proxy_step.step = d->step;
    p->v4->start_event(p->ctx, &h, &e);
  }
  return h;
}

static void plugin_stop(struct plugin *p, void *h) {
  if (p->v5) p->v5->stop_event(h);
  else p->v4->stop_event(h);
}

static void plugin_state(struct plugin *p, void *h, int state, size_t size) {
  dpro_state_args a;
  memset(&a, 0, sizeof(a));
  a.proxy_step.trans_size = size;
  if (p->v5) p->v5->record_event_state(h, state, &a);
  else p->v4->record_event_state(h, state, &a);
}

static void plugin_finalize(struct plugin *p) {
  if (p->v5) p->v5->finalize(p->ctx);
  else p->v4->finalize(p->ctx);
}

/* ------------------------------------------------------------------ the ring all-reduce layout */

struct layout {
  int n, nch, spc;           /* ranks, channels, slices (network transfers) per chunk */
  size_t bytes, chunk;       /* message, NCCL chunk size */
  int nloops;
  int steps_per_loop;        /* network steps per loop per channel: 2(N-1)*spc */
};

static void layout_init(struct layout *L, int n, int nch, size_t bytes, size_t chunk, int spc) {
  L->n = n;
  L->nch = nch;
  L->spc = spc;
  L->bytes = bytes;
  L->chunk = chunk;
  size_t loop = (size_t)nch * n * chunk;
  L->nloops = (int)((bytes + loop - 1) / loop);
  if (L->nloops < 1) L->nloops = 1;
  L->steps_per_loop = 2 * (n - 1) * spc;
}

/* The chunk a ring position sends at ring step k (dpro_kit.graph.topology.ring_allreduce). */
static int chunk_sent(int n, int pos, int k) {
  return k < n - 1 ? ((pos - k) % n + n) % n : ((pos + 1 - (k - n + 1)) % n + n) % n;
}

/* Bytes of one network step: channel ch, network step p of the sender at ring position pos.
 * NCCL's runRing: per loop realChunk = min(chunk, ceil(remaining / (nch*n))) (16-byte aligned),
 * channel ch covers nch*n chunks from gridOffset + ch*n*realChunk; slices split a chunk. */
static size_t step_bytes(const struct layout *L, int ch, int pos, int p) {
  int loop = p / L->steps_per_loop, q = p % L->steps_per_loop;
  int k = q / L->spc, slice = q % L->spc;
  size_t grid = (size_t)loop * L->nch * L->n * L->chunk;
  size_t rem = L->bytes - grid;
  size_t per = (rem + (size_t)L->nch * L->n - 1) / ((size_t)L->nch * L->n);
  per = (per + 15) / 16 * 16;
  size_t real = per < L->chunk ? per : L->chunk;
  size_t off = grid + (size_t)ch * L->n * real + (size_t)chunk_sent(L->n, pos, k) * real;
  size_t slice_sz = (real + L->spc - 1) / L->spc;
  size_t s0 = off + (size_t)slice * slice_sz, s1 = s0 + slice_sz;
  size_t end = off + real;
  if (s1 > end) s1 = end;
  if (s1 > L->bytes) s1 = L->bytes;
  return s0 < s1 ? s1 - s0 : 0;
}

/* ------------------------------------------------------------------ one rank */

struct sub {
  int channel, peer, nsteps, fd;
  int posted, transmitted, received, done;   /* as NCCL's ncclProxySubArgs */
  size_t trans_size;                          /* sub->transSize: last size set by the transport */
  size_t io_off;                              /* bytes of the current transfer moved so far */
  int inflight;                               /* send: index of the step being written, -1 none */
  int is_send, up;                            /* tree: direction; link to the parent (1) or a child (0) */
  void *op_handle;
  void *step_handle[NCCL_STEPS];
};

struct rank_state {
  struct plugin *pl;
  struct layout L;
  int rank, pos;
  struct sub send[64], recv[64];
  int tree;                                   /* 0 ring, 1 tree */
  struct sub tsub[64][2 * 3 + 2];             /* tree: per channel, in ncclProxySaveOp's order */
  int ntsub[64], tparent[64], tnkids[64];
  void *coll_handle;
  char *buf;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int posted_iter, finished_iter;
};

static int want_op(struct plugin *p) { return p->mask & (DPRO_EV_PROXY_OP | DPRO_EV_PROXY_STEP | DPRO_EV_NET_PLUGIN); }
static int want_step(struct plugin *p) { return p->mask & (DPRO_EV_PROXY_STEP | DPRO_EV_NET_PLUGIN); }

static void step_start(struct rank_state *R, struct sub *s, int step) {
  if (want_step(R->pl)) {
    struct descr d = {.type = DPRO_EV_PROXY_STEP, .parent = s->op_handle, .rank = R->rank, .step = step};
    s->step_handle[step % NCCL_STEPS] = plugin_start(R->pl, &d);
  }
}
static void step_state(struct rank_state *R, struct sub *s, int step, int state) {
  if (s->op_handle && s->step_handle[step % NCCL_STEPS]) plugin_state(R->pl, s->step_handle[step % NCCL_STEPS], state, s->trans_size);
}
static void step_stop(struct rank_state *R, struct sub *s, int step) {
  if (s->step_handle[step % NCCL_STEPS]) {
    plugin_stop(R->pl, s->step_handle[step % NCCL_STEPS]);
    s->step_handle[step % NCCL_STEPS] = NULL;
  }
}

/* Sender side data ready ("the GPU filled the buffer"): ring step 0 of a loop reads the input;
 * later steps forward the slice received at the previous step. */
static int send_ready(const struct rank_state *R, int ch, int p) {
  int q = p % R->L.steps_per_loop;
  if (q < R->L.spc) return 1;
  return R->recv[ch].transmitted > p - R->L.spc;
}

/* Receiver side consumed ("the GPU read the slice"): once forwarded, or at the last ring step. */
static int recv_consumed(const struct rank_state *R, int ch, int p) {
  int q = p % R->L.steps_per_loop;
  if (q >= R->L.steps_per_loop - R->L.spc) return 1;
  return R->send[ch].transmitted > p + R->L.spc;
}

/* ------------------------------------------------------------------ the tree all-reduce */

/* NCCL's binary tree of n positions (ncclGetBtree's rule, dpro_kit.graph.topology.btree): the
 * parent and up to two children of position p. */
static void btree(int n, int p, int *up, int kids[2], int *nkids) {
  *nkids = 0;
  if (p == 0) {
    *up = -1;
    if (n > 1) { int top = 1; while (top * 2 < n) top *= 2; kids[(*nkids)++] = top; }
    return;
  }
  int b = p & -p;
  *up = (p & ~b) | (b << 1);
  if (*up >= n) *up = p & ~b;
  int half = b >> 1;
  if (half) {
    kids[(*nkids)++] = p - half;
    while (half && p + half >= n) half >>= 1;
    if (half) kids[(*nkids)++] = p + half;
  }
}

/* Tree t (0 or 1) of the double binary tree over n nodes: node <-> position. */
static int tree_pos(int n, int t, int node) { return t == 0 ? node : n % 2 == 0 ? n - 1 - node : (node - 1 + n) % n; }
static int tree_node(int n, int t, int pos) { return t == 0 ? pos : n % 2 == 0 ? n - 1 - pos : (pos + 1) % n; }
static int tree_of_channel(int nch, int c) { return 2 * c < nch ? 0 : 1; }
static int g_ppn = 1;   /* ranks per node: rank r on node r / g_ppn */

/* Parent rank (-1 root) and child ranks (NCCL's down[] order) of `rank` on channel c: the nodes
 * (n / g_ppn of them) in the channel's binary tree, the ranks of a node a chain r0 -> r1 -> ...
 * whose head r0 carries the links between nodes (pattern TREE: ncclTopoPreset, connectTrees). */
static void tree_links(int n, int nch, int c, int rank, int *up, int kids[3], int *nkids) {
  int t = tree_of_channel(nch, c), nn = n / g_ppn, node = rank / g_ppn, j = rank % g_ppn, u, nk = 0, down[2];
  *nkids = 0;
  if (j + 1 < g_ppn) kids[(*nkids)++] = rank + 1;
  if (j > 0) { *up = rank - 1; return; }
  btree(nn, tree_pos(nn, t, node), &u, down, &nk);
  *up = u < 0 ? -1 : tree_node(nn, t, u) * g_ppn;
  for (int i = 0; i < nk; i++) kids[(*nkids)++] = tree_node(nn, t, down[i]) * g_ppn;
}

/* Bytes of chunk (network step) p of channel ch: the channel's contiguous share (ceil(BYTES /
 * NCHANNELS), 16-byte aligned) in nloops chunks of ceil(share / nloops) (16-byte aligned). */
static size_t tree_step_bytes(const struct layout *L, int ch, int p) {
  size_t share = (L->bytes + L->nch - 1) / L->nch;
  share = (share + 15) / 16 * 16;
  size_t c0 = (size_t)ch * share, c1 = c0 + share;
  if (c1 > L->bytes) c1 = L->bytes;
  if (c0 >= c1) return 0;
  size_t per = (c1 - c0 + L->nloops - 1) / L->nloops;
  per = (per + 15) / 16 * 16;
  size_t s0 = c0 + (size_t)p * per, s1 = s0 + per;
  if (s1 > c1) s1 = c1;
  return s0 < s1 ? s1 - s0 : 0;
}

/* A tree send of chunk p is ready: to the parent (or, at the root, to a child) once every child's
 * chunk p was handed to the GPU; elsewhere, to a child once the parent's chunk p was. */
static int tree_send_ready(const struct rank_state *R, const struct sub *s, int p) {
  int ch = s->channel;
  for (int k = 0; k < R->ntsub[ch]; k++) {
    const struct sub *o = &R->tsub[ch][k];
    if (o->is_send) continue;
    int feeds = (s->up || R->tparent[ch] < 0) ? !o->up : o->up;
    if (feeds && o->transmitted <= p) return 0;
  }
  return 1;
}

/* A received tree chunk p is consumed once the sends it feeds posted chunk p (a leaf's broadcast
 * chunk at once). */
static int tree_recv_consumed(const struct rank_state *R, const struct sub *s, int p) {
  int ch = s->channel;
  for (int k = 0; k < R->ntsub[ch]; k++) {
    const struct sub *o = &R->tsub[ch][k];
    if (!o->is_send) continue;
    int fed = s->up ? !o->up : (R->tparent[ch] < 0 ? 1 : o->up);
    if (fed && o->transmitted <= p) return 0;
  }
  return 1;
}

static int send_progress(struct rank_state *R, struct sub *s) {
  int busy = 0;
  if (s->done == s->nsteps) return 0;
  if (s->posted < s->nsteps && s->posted < s->done + NCCL_STEPS) {
    int p = s->posted;
    step_start(R, s, p);
    s->posted++;
    step_state(R, s, p, DPRO_ST_SEND_GPU_WAIT);
    return 1;
  }
  if (s->inflight < 0 && s->transmitted < s->posted &&
      (R->tree ? tree_send_ready(R, s, s->transmitted) : send_ready(R, s->channel, s->transmitted))) {
    int p = s->transmitted;
    step_state(R, s, p, DPRO_ST_SEND_PEER_WAIT);   /* stale trans_size, as NCCL */
    s->trans_size = R->tree ? tree_step_bytes(&R->L, s->channel, p) : step_bytes(&R->L, s->channel, R->pos, p);
    s->inflight = p;
    s->io_off = 0;
    s->transmitted++;
    step_state(R, s, p, DPRO_ST_SEND_WAIT);
    busy = 1;
  }
  if (s->inflight >= 0) {                          /* the network's progress on the isend */
    size_t want = s->trans_size - s->io_off;
    if (want > 0) {
      ssize_t w = write(s->fd, R->buf, want);
      if (w > 0) { s->io_off += (size_t)w; busy = 1; }
      else if (w < 0 && errno != EAGAIN && errno != EINTR) die("rank %d write: %s", R->rank, strerror(errno));
    }
    if (s->io_off == s->trans_size) {              /* test() says done */
      int p = s->done;
      s->done++;
      s->inflight = -1;
      step_stop(R, s, p);
      busy = 1;
    }
  }
  return busy;
}

static int recv_progress(struct rank_state *R, struct sub *s) {
  int busy = 0;
  if (s->done == s->nsteps) return 0;
  if (s->posted < s->nsteps && s->posted < s->done + NCCL_STEPS) {
    int p = s->posted;
    step_start(R, s, p);
    s->posted++;
    step_state(R, s, p, DPRO_ST_RECV_WAIT);        /* irecv posted; stale trans_size */
    busy = 1;
  }
  if (s->received < s->posted) {                   /* test() on the oldest irecv */
    int p = s->received;
    size_t want = R->tree ? tree_step_bytes(&R->L, s->channel, p)
                          : step_bytes(&R->L, s->channel, (R->pos - 1 + R->L.n) % R->L.n, p);
    if (s->io_off < want) {
      ssize_t r = read(s->fd, R->buf, want - s->io_off);
      if (r > 0) { s->io_off += (size_t)r; busy = 1; }
      else if (r == 0) die("rank %d: peer closed", R->rank);
      else if (errno != EAGAIN && errno != EINTR) die("rank %d read: %s", R->rank, strerror(errno));
    }
    if (s->io_off == want) {
      s->trans_size = want;
      s->io_off = 0;
      s->received++;
      step_state(R, s, p, DPRO_ST_RECV_FLUSH_WAIT);
      busy = 1;
    }
  }
  if (s->transmitted < s->received) {              /* flush done (no GDR): hand to the GPU */
    int p = s->transmitted;
    s->transmitted++;
    step_state(R, s, p, DPRO_ST_RECV_GPU_WAIT);
    busy = 1;
  }
  if (s->done < s->transmitted &&
      (R->tree ? tree_recv_consumed(R, s, s->done) : recv_consumed(R, s->channel, s->done))) {
    int p = s->done;
    s->done++;
    step_stop(R, s, p);
    busy = 1;
  }
  return busy;
}

static void op_start(struct rank_state *R, struct sub *s, int is_send) {
  s->posted = s->transmitted = s->received = s->done = 0;
  s->io_off = 0;
  s->inflight = -1;
  s->op_handle = NULL;
  memset(s->step_handle, 0, sizeof(s->step_handle));
  if (want_op(R->pl)) {
    struct descr d = {.type = DPRO_EV_PROXY_OP, .parent = R->coll_handle, .rank = R->rank};
    d.op.pid = getpid();
    d.op.channel = (uint8_t)s->channel;
    d.op.peer = s->peer;
    d.op.nsteps = s->nsteps;
    d.op.chunk_size = (int)(R->L.chunk / R->L.spc * R->L.spc);
    d.op.is_send = is_send;
    s->op_handle = plugin_start(R->pl, &d);
  }
}

/* One tree all-reduce on the proxy thread: ops appended per channel in ncclProxySaveOp's order,
 * InProgress on every sub, progress until all are done, then the ops stop. */
static void tree_iteration(struct rank_state *R) {
  int nch = R->L.nch;
  for (int c = 0; c < nch; c++)
    for (int k = 0; k < R->ntsub[c]; k++) op_start(R, &R->tsub[c][k], R->tsub[c][k].is_send);
  for (int c = 0; c < nch; c++)
    for (int k = 0; k < R->ntsub[c]; k++)
      if (R->tsub[c][k].op_handle) plugin_state(R->pl, R->tsub[c][k].op_handle, DPRO_ST_PROXY_OP_IN_PROGRESS, 0);
  for (;;) {
    int busy = 0, left = 0;
    for (int c = 0; c < nch; c++)
      for (int k = 0; k < R->ntsub[c]; k++) {
        struct sub *t = &R->tsub[c][k];
        busy |= t->is_send ? send_progress(R, t) : recv_progress(R, t);
        left += t->done < t->nsteps;
      }
    if (!left) break;
    if (!busy) sched_yield();
  }
  for (int c = 0; c < nch; c++)
    for (int k = 0; k < R->ntsub[c]; k++)
      if (R->tsub[c][k].op_handle) plugin_stop(R->pl, R->tsub[c][k].op_handle);
}

static void *proxy_thread(void *arg) {
  struct rank_state *R = arg;
  for (int it = 0;; it++) {
    pthread_mutex_lock(&R->mu);
    while (R->posted_iter <= it && R->posted_iter >= 0) pthread_cond_wait(&R->cv, &R->mu);
    int stop = R->posted_iter < 0;
    pthread_mutex_unlock(&R->mu);
    if (stop) return NULL;
    int nch = R->L.nch;
    if (R->tree) {
      tree_iteration(R);
      pthread_mutex_lock(&R->mu);
      R->finished_iter = it + 1;
      pthread_cond_broadcast(&R->cv);
      pthread_mutex_unlock(&R->mu);
      continue;
    }
    /* ProxyAppend, per channel: the recv op, then the send op (ncclProxySaveOp for a ring) */
    for (int c = 0; c < nch; c++) {
      op_start(R, &R->recv[c], 0);
      op_start(R, &R->send[c], 1);
    }
    /* ncclProxyOpReady -> Progress: every sub records InProgress first */
    for (int c = 0; c < nch; c++) if (R->recv[c].op_handle) plugin_state(R->pl, R->recv[c].op_handle, DPRO_ST_PROXY_OP_IN_PROGRESS, 0);
    for (int c = 0; c < nch; c++) if (R->send[c].op_handle) plugin_state(R->pl, R->send[c].op_handle, DPRO_ST_PROXY_OP_IN_PROGRESS, 0);
    for (;;) {
      int busy = 0, left = 0;
      for (int c = 0; c < nch; c++) busy |= recv_progress(R, &R->recv[c]);
      for (int c = 0; c < nch; c++) busy |= send_progress(R, &R->send[c]);
      for (int c = 0; c < nch; c++) left += (R->recv[c].done < R->recv[c].nsteps) + (R->send[c].done < R->send[c].nsteps);
      if (!left) break;
      if (!busy) sched_yield();
    }
    /* args->done == nsubs: the ops stop */
    for (int c = 0; c < nch; c++) { if (R->recv[c].op_handle) plugin_stop(R->pl, R->recv[c].op_handle); }
    for (int c = 0; c < nch; c++) { if (R->send[c].op_handle) plugin_stop(R->pl, R->send[c].op_handle); }
    pthread_mutex_lock(&R->mu);
    R->finished_iter = it + 1;
    pthread_cond_broadcast(&R->cv);
    pthread_mutex_unlock(&R->mu);
  }
}

static int g_fd[64][64][2];   /* [channel][ring edge r -> r+1][0 = send end, 1 = recv end] */
static int g_tfd[64][64][2][2]; /* tree: [channel][child rank][0 = up to the parent, 1 = down][send end, recv end] */

/* NCCL's own spellings of the protocol (ncclProtoStr), as NCCL 2.28.9 passes them on a real GPU;
 * the algorithm likewise ("RING", "TREE": ncclAlgoStr). */
static const char *nccl_proto(const char *proto) {
  if (strcasecmp(proto, "LL128") == 0) return "LL128";
  if (strcasecmp(proto, "LL") == 0) return "LL";
  return "SIMPLE";
}

static int run_rank(const char *plugin, int api, int rank, const struct layout *L, int iters, const char *proto,
                    int tree) {
  struct plugin pl;
  plugin_open(&pl, plugin, api);
  char host[32];                                    /* one emulated node per RANKS_PER_NODE ranks */
  snprintf(host, sizeof(host), "node%d", rank / g_ppn);
  setenv("DPRO_HOST", host, 1);
  if (plugin_init(&pl, "dpro-harness", L->n / g_ppn, L->n, rank) != DPRO_NCCL_OK) die("rank %d: plugin init failed", rank);
  int need = DPRO_EV_COLL | DPRO_EV_PROXY_OP | DPRO_EV_PROXY_STEP;
  if ((pl.mask & need) != need) die("rank %d: activation mask 0x%x lacks coll/proxy op/proxy step", rank, pl.mask);
  static struct rank_state R;
  memset(&R, 0, sizeof(R));
  R.pl = &pl;
  R.L = *L;
  R.rank = rank;
  R.pos = rank;                                     /* ring order = rank order */
  R.buf = calloc(1, L->chunk + 64);
  pthread_mutex_init(&R.mu, NULL);
  pthread_cond_init(&R.cv, NULL);
  int n = L->n, nsteps = L->nloops * L->steps_per_loop;
  for (int c = 0; c < L->nch; c++) {
    R.send[c] = (struct sub){.channel = c, .peer = (rank + 1) % n, .nsteps = nsteps, .fd = g_fd[c][rank][0]};
    R.recv[c] = (struct sub){.channel = c, .peer = (rank - 1 + n) % n, .nsteps = nsteps,
                             .fd = g_fd[c][(rank - 1 + n) % n][1]};
  }
  R.tree = tree;
  for (int c = 0; tree && c < L->nch; c++) {
    /* ncclProxySaveOp, ncclPatternTreeUpDown: recv from each child, send to the parent, send to each
     * child, recv from the parent; one network step per chunk */
    int up, kids[3], nk, k = 0;
    tree_links(n, L->nch, c, rank, &up, kids, &nk);
    R.tparent[c] = up;
    R.tnkids[c] = nk;
    for (int i = 0; i < nk; i++)
      R.tsub[c][k++] = (struct sub){.channel = c, .peer = kids[i], .nsteps = L->nloops, .is_send = 0, .up = 0,
                                    .fd = g_tfd[c][kids[i]][0][1]};
    if (up >= 0)
      R.tsub[c][k++] = (struct sub){.channel = c, .peer = up, .nsteps = L->nloops, .is_send = 1, .up = 1,
                                    .fd = g_tfd[c][rank][0][0]};
    for (int i = 0; i < nk; i++)
      R.tsub[c][k++] = (struct sub){.channel = c, .peer = kids[i], .nsteps = L->nloops, .is_send = 1, .up = 0,
                                    .fd = g_tfd[c][kids[i]][1][0]};
    if (up >= 0)
      R.tsub[c][k++] = (struct sub){.channel = c, .peer = up, .nsteps = L->nloops, .is_send = 0, .up = 1,
                                    .fd = g_tfd[c][rank][1][1]};
    R.ntsub[c] = k;
  }
  pthread_t th;
  pthread_create(&th, NULL, proxy_thread, &R);
  for (int it = 0; it < iters; it++) {
    /* ncclAllReduce -> ncclProfilerStartTaskEvents (collective event) */
    struct descr d = {.type = DPRO_EV_COLL, .parent = NULL, .rank = rank};
    d.coll = (struct dpro_d_coll){.seq = (uint64_t)it, .func = "AllReduce", .send_buff = R.buf, .recv_buff = R.buf,
                                  .count = L->bytes / 4, .root = 0, .datatype = "ncclFloat32",
                                  .nchannels = (uint8_t)L->nch, .nwarps = 8, .algo = tree ? "TREE" : "RING", .proto = nccl_proto(proto)};
    R.coll_handle = (pl.mask & DPRO_EV_COLL) ? plugin_start(&pl, &d) : NULL;
    pthread_mutex_lock(&R.mu);                      /* ncclProxyPost: ops handed to the proxy */
    R.posted_iter = it + 1;
    pthread_cond_broadcast(&R.cv);
    pthread_mutex_unlock(&R.mu);
    /* kernel launched -> ncclProfilerStopTaskEvents: the collective event stops at enqueue.  The
     * proxy thread may already have appended the ops (it holds the parent handle until then). */
    usleep(50);
    if (R.coll_handle) plugin_stop(&pl, R.coll_handle);
    pthread_mutex_lock(&R.mu);                      /* cudaStreamSynchronize */
    while (R.finished_iter < it + 1) pthread_cond_wait(&R.cv, &R.mu);
    pthread_mutex_unlock(&R.mu);
  }
  pthread_mutex_lock(&R.mu);
  R.posted_iter = -1;
  pthread_cond_broadcast(&R.cv);
  pthread_mutex_unlock(&R.mu);
  pthread_join(th, NULL);
  plugin_finalize(&pl);                            /* ncclCommDestroy */
  return 0;
}

/* Count the records of each kind in every rank's file; 0 when all are as expected. */
static int check_output(const char *dir, const struct layout *L, int iters, int tree) {
  DIR *d = opendir(dir);
  if (d == NULL) { fprintf(stderr, "nccl_harness: cannot open %s\n", dir); return 1; }
  int files = 0, bad = 0;
  long want_steps = (long)iters * 2 * L->nch * L->nloops * L->steps_per_loop;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, "nccl-", 5) != 0) continue;
    size_t len = strlen(de->d_name);
    if (len < 6 || strcmp(de->d_name + len - 6, ".jsonl") != 0) continue;
    char path[8192];
    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) { bad++; continue; }
    long coll = 0, op = 0, step = 0, end = 0, dropped = -1, nostop = 0, rank = -1;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
      const char *rq = rank < 0 ? strstr(line, "\"rank\":") : NULL;
      if (rq) rank = atol(rq + 7);
      if (strstr(line, "\"ev\":\"coll\"")) coll++;
      else if (strstr(line, "\"ev\":\"op\"")) op++;
      else if (strstr(line, "\"ev\":\"step\"")) step++;
      else if (strstr(line, "\"end\":true")) { end++; const char *q = strstr(line, "\"dropped\":"); if (q) dropped = atol(q + 10); }
      if (strstr(line, "\"t1\":null")) nostop++;
    }
    fclose(f);
    files++;
    long want_ops = 2L * iters * L->nch;
    if (tree) {                                     /* per channel: 2 ops per child, 2 to the parent */
      want_ops = 0;
      for (int c = 0; c < L->nch && rank >= 0 && rank < L->n; c++) {
        int up, kids[3], nk;
        tree_links(L->n, L->nch, c, (int)rank, &up, kids, &nk);
        want_ops += (long)iters * (2 * nk + 2 * (up >= 0));
      }
      want_steps = want_ops * L->nloops;
    }
    if (coll != iters || op != want_ops || step != want_steps || end != 1 || dropped != 0 || nostop) {
      fprintf(stderr, "nccl_harness: %s: %ld coll, %ld op, %ld step records (want %d, %ld, %ld), end %ld, dropped %ld, "
              "%ld unstopped\n", path, coll, op, step, iters, want_ops, want_steps, end, dropped, nostop);
      bad++;
    }
  }
  closedir(d);
  if (files != L->n) { fprintf(stderr, "nccl_harness: %d rank files in %s, want %d\n", files, dir, L->n); bad++; }
  return bad;
}

/* argv[1] = "ring" or "tree" (argv shifted past "run --algo ALGO" by main) */
static int cmd_allreduce(int argc, char **argv) {
  int tree = strcmp(argv[1], "tree") == 0;
  if (argc != 10 && !(tree && argc == 11))
    die("usage: %s PLUGIN NRANKS NCHANNELS BYTES ITERS API PROTO CHUNK%s", argv[1], tree ? " [RANKS_PER_NODE]" : "");
  g_ppn = argc == 11 ? atoi(argv[10]) : 1;
  const char *plugin = argv[2];
  int n = atoi(argv[3]), nch = atoi(argv[4]);
  long long bytes_ll = atoll(argv[5]), chunk_ll = atoll(argv[9]);
  int iters = atoi(argv[6]), api = atoi(argv[7]);
  const char *proto = argv[8];
  const char *dir = getenv("DPRO_NCCL_TRACE");
  if (dir == NULL || !*dir) die("set DPRO_NCCL_TRACE to the output directory");
  if (n < 2 || n > 64 || nch < 1 || nch > 64 || bytes_ll < 1 || iters < 1 || chunk_ll < 64 || api < 4 || api > 6)
    die("bad arguments (2<=NRANKS<=64, 1<=NCHANNELS<=64, BYTES>=1, ITERS>=1, CHUNK>=64, API 4..6)");
  if (g_ppn < 1 || n % g_ppn != 0) die("bad RANKS_PER_NODE %d: it must divide NRANKS %d", g_ppn, n);
  int spc = strcasecmp(proto, "Simple") == 0 ? 2 : 1;  /* ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS */
  struct layout L;
  if (tree) spc = 1;                               /* tree: chunkSteps = sliceSteps = 1 (enqueue.cc) */
  layout_init(&L, n, nch, (size_t)bytes_ll, (size_t)chunk_ll, spc);
  if (tree) {                                       /* one network step per chunk of NCHANNELS*CHUNK bytes */
    size_t loop = (size_t)nch * (size_t)chunk_ll;
    L.nloops = (int)(((size_t)bytes_ll + loop - 1) / loop);
    L.steps_per_loop = 1;
  }
  for (int c = 0; c < nch; c++)
    for (int r = 0; r < n; r++) {
      int (*pairs[3])[2] = {&g_fd[c][r], &g_tfd[c][r][0], &g_tfd[c][r][1]};
      for (int k = tree ? 1 : 0; k < (tree ? 3 : 1); k++) {   /* ring: one edge; tree: up and down */
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, *pairs[k]) != 0) die("socketpair: %s", strerror(errno));
        fcntl((*pairs[k])[0], F_SETFL, O_NONBLOCK);
        fcntl((*pairs[k])[1], F_SETFL, O_NONBLOCK);
      }
    }
  pid_t pids[64];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) die("fork: %s", strerror(errno));
    if (pids[r] == 0) exit(run_rank(plugin, api, r, &L, iters, proto, tree));
  }
  for (int c = 0; c < nch; c++)
    for (int r = 0; r < n; r++)
      for (int k = 0; k < 2; k++) {
        if (!tree) close(g_fd[c][r][k]);
        if (tree) { close(g_tfd[c][r][0][k]); close(g_tfd[c][r][1][k]); }
      }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "nccl_harness: rank %d failed (status %d)\n", r, st); failed++; }
  }
  if (failed) return 1;
  if (check_output(dir, &L, iters, tree)) return 1;
  printf("ok algo=%s ranks=%d ranks_per_node=%d channels=%d bytes=%lld chunk=%lld loops=%d steps_per_op=%d iters=%d api=%d proto=%s\n", argv[1], n, g_ppn, nch,
         bytes_ll, chunk_ll, L.nloops, L.nloops * L.steps_per_loop, iters, api, proto);
  return 0;
}

/* ------------------------------------------------------------------ bench */

static dpro_nccl_result null_start(void *c, void **h, dpro_descr_v5 *d) { (void)c; (void)d; *h = (void *)1; return 0; }
static dpro_nccl_result null_stop(void *h) { (void)h; return 0; }
static dpro_nccl_result null_state(void *h, int s, dpro_state_args *a) { (void)h; (void)s; (void)a; return 0; }

/* NSTEPS send steps (start, 3 states, stop) through the plugin's table; ns per call. */
static double bench_calls(struct plugin *p, int nsteps) {
  struct descr d = {.type = DPRO_EV_PROXY_OP, .rank = 0};
  d.op.pid = getpid();
  d.op.nsteps = nsteps;
  d.op.is_send = 1;
  void *op = plugin_start(p, &d);
  uint64_t t0 = now_ns();
  for (int i = 0; i < nsteps; i++) {
    struct descr s = {.type = DPRO_EV_PROXY_STEP, .parent = op, .rank = 0, .step = i};
    void *h = plugin_start(p, &s);
    plugin_state(p, h, DPRO_ST_SEND_GPU_WAIT, 0);
    plugin_state(p, h, DPRO_ST_SEND_PEER_WAIT, 0);
    plugin_state(p, h, DPRO_ST_SEND_WAIT, 65536);
    plugin_stop(p, h);
  }
  uint64_t t1 = now_ns();
  plugin_stop(p, op);
  return (double)(t1 - t0) / (5.0 * nsteps);
}

static int cmd_bench(int argc, char **argv) {
  if (argc != 5) die("usage: bench PLUGIN API NSTEPS");
  int api = atoi(argv[3]), nsteps = atoi(argv[4]);
  if (api < 4 || api > 6 || nsteps < 1) die("bad arguments");
  if (getenv("DPRO_NCCL_TRACE") == NULL) die("set DPRO_NCCL_TRACE to a scratch directory");
  struct plugin pl;
  plugin_open(&pl, argv[2], api);
  if (plugin_init(&pl, "dpro-bench", 1, 1, 0) != DPRO_NCCL_OK) die("plugin init failed");
  double ns_plugin = bench_calls(&pl, nsteps);
  uint64_t f0 = now_ns();
  plugin_finalize(&pl);
  uint64_t f1 = now_ns();
  dpro_profiler_v5 null_table = {"null", NULL, null_start, null_stop, null_state, NULL};
  struct plugin np = {.api = 5, .ctx = NULL, .mask = ~0, .v5 = &null_table};
  double ns_null = bench_calls(&np, nsteps);
  uint64_t c0 = now_ns(), sink = 0;
  for (int i = 0; i < 5 * nsteps; i++) sink += now_ns();
  double ns_clock = (double)(now_ns() - c0) / (5.0 * nsteps);
  printf("bench api=%d steps=%d calls=%d plugin_ns_per_call=%.1f empty_table_ns_per_call=%.1f "
         "clock_gettime_ns=%.1f finalize_ns_per_event=%.1f%s\n", api, nsteps, 5 * nsteps, ns_plugin, ns_null, ns_clock,
         (double)(f1 - f0) / (nsteps + 1), sink == 1 ? " " : "");
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "run") == 0 && strcmp(argv[2], "--algo") == 0 &&
      (strcmp(argv[3], "ring") == 0 || strcmp(argv[3], "tree") == 0))
    return cmd_allreduce(argc - 2, argv + 2);
  if (argc >= 2 && (strcmp(argv[1], "ring") == 0 || strcmp(argv[1], "tree") == 0)) return cmd_allreduce(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "bench") == 0) return cmd_bench(argc, argv);
  die("usage: nccl_harness ring|tree PLUGIN NRANKS NCHANNELS BYTES ITERS API PROTO CHUNK [RANKS_PER_NODE (tree)] | "
      "run --algo ring|tree PLUGIN ... | bench PLUGIN API NSTEPS");
  return 2;
}
