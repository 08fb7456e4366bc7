/* dpro-kit's own declarations of the NCCL profiler-plugin ABI (versions 4, 5 and 6).
 *
 * Written from NCCL's documentation of the interface (plugins/profiler/README.md, formerly
 * ext-profiler/README.md, in github.com/NVIDIA/nccl): the versioned function table
 * `ncclProfiler_v<N>` a plugin exports, the event descriptor each startEvent receives, the
 * event-state ids and the state arguments.  Only the layout matters to NCCL (it calls through
 * the table and passes pointers to descriptors it fills), so the names here are dpro-kit's.
 *
 *   API  NCCL       differences that matter here
 *   v4   2.27       descriptor `type` is uint8_t; init(ctx, mask, commName, commHash, ...)
 *   v5   2.28       descriptor `type` is uint64_t; API events (group/coll/p2p API, kernel
 *                   launch) added; init(ctx, commId, mask, commName, ...); coll/p2p gain a
 *                   trailing parentGroup pointer
 *   v6   2.29       v5 plus copy-engine collective events (ceColl/ceSync/ceBatch descriptors);
 *                   same state arguments as v5
 *
 * See docs/nccl.md.  This header is shared by the plugin and the harness that drives it.
 */
#ifndef DPRO_NCCL_ABI_H
#define DPRO_NCCL_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ncclResult_t: an int-sized enum; the plugin returns 0 (success) except from init. */
typedef int dpro_nccl_result;
enum { DPRO_NCCL_OK = 0, DPRO_NCCL_SYSTEM_ERROR = 2, DPRO_NCCL_INVALID_USAGE = 5 };

/* NCCL's logger: (level, subsystem flags, file, line, printf format, ...). */
typedef void (*dpro_nccl_logger)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);
enum { DPRO_NCCL_LOG_WARN = 2, DPRO_NCCL_LOG_INFO = 3 };
#define DPRO_NCCL_LOG_SUBSYS_INIT 1UL

/* Event types (bit values; the activation mask init returns is an OR of them). */
enum {
  DPRO_EV_GROUP = 1 << 0,
  DPRO_EV_COLL = 1 << 1,
  DPRO_EV_P2P = 1 << 2,
  DPRO_EV_PROXY_OP = 1 << 3,
  DPRO_EV_PROXY_STEP = 1 << 4,
  DPRO_EV_PROXY_CTRL = 1 << 5,
  DPRO_EV_KERNEL_CH = 1 << 6,
  DPRO_EV_NET_PLUGIN = 1 << 7,
  DPRO_EV_GROUP_API = 1 << 8,    /* v5+ */
  DPRO_EV_COLL_API = 1 << 9,     /* v5+ */
  DPRO_EV_P2P_API = 1 << 10,     /* v5+ */
  DPRO_EV_KERNEL_LAUNCH = 1 << 11, /* v5+ */
  DPRO_EV_CE_COLL = 1 << 12,     /* v6 */
  DPRO_EV_CE_SYNC = 1 << 13,     /* v6 */
  DPRO_EV_CE_BATCH = 1 << 14,    /* v6 */
};

/* Event states passed to recordEventState (an int-sized enum in NCCL). */
enum {
  DPRO_ST_PROXY_OP_IN_PROGRESS = 19, /* proxy op picked up by the progress thread (v4+) */
  DPRO_ST_SEND_GPU_WAIT = 8,         /* send step: buffer posted, waiting for the GPU to fill it */
  DPRO_ST_SEND_PEER_WAIT = 20,       /* send step: data ready, waiting for the receiver's credit (v4+) */
  DPRO_ST_SEND_WAIT = 9,             /* send step: isend posted, waiting for the network */
  DPRO_ST_RECV_WAIT = 10,            /* recv step: irecv posted, waiting for the network */
  DPRO_ST_RECV_FLUSH_WAIT = 11,      /* recv step: data arrived, waiting for the flush to the GPU */
  DPRO_ST_RECV_GPU_WAIT = 12,        /* recv step: data handed to the GPU, waiting for it to consume */
  DPRO_ST_KERNEL_CH_STOP = 22,
};

/* Descriptor members (the union of the event descriptor), v5/v6 layout. */
struct dpro_d_group_api { bool graph_captured; int group_depth; };
struct dpro_d_coll_api { const char *func; size_t count; const char *datatype; int root; void *stream; bool graph_captured; };
struct dpro_d_p2p_api { const char *func; size_t count; const char *datatype; void *stream; bool graph_captured; };
struct dpro_d_kernel_launch { void *stream; };
struct dpro_d_coll {
  uint64_t seq;          /* sequence number of this collective (per function) in the communicator */
  const char *func;      /* "AllReduce", ... */
  const void *send_buff;
  void *recv_buff;
  size_t count;          /* elements */
  int root;
  const char *datatype;  /* "ncclFloat32", ... */
  uint8_t nchannels;
  uint8_t nwarps;
  const char *algo;      /* "Ring", "Tree", ... */
  const char *proto;     /* "Simple", "LL", "LL128" */
  void *parent_group;    /* v5+ only (absent in v4) */
};
struct dpro_d_p2p {
  const char *func; void *buff; const char *datatype; size_t count; int peer; uint8_t nchannels;
  void *parent_group;    /* v5+ only */
};
struct dpro_d_proxy_op {
  pid_t pid;             /* process that created the proxy op (PXN: may differ from ours) */
  uint8_t channel;
  int peer;              /* rank on the other end */
  int nsteps;            /* network transfers of this op */
  int chunk_size;
  int is_send;
};
struct dpro_d_proxy_step { int step; };
struct dpro_d_kernel_ch { uint8_t channel; uint64_t ptimer; };
struct dpro_d_net_plugin { int64_t id; void *data; };
struct dpro_d_ce_coll {  /* v6 */
  uint64_t seq; const char *func; const void *send_buff; void *recv_buff; size_t count; int root;
  const char *datatype; const char *sync_strategy; bool intra_batch_sync; uint32_t batch_size;
  uint32_t num_batches; uint32_t ce_seq; void *stream;
};
struct dpro_d_ce_sync { bool is_complete; int nranks; };
struct dpro_d_ce_batch { int num_ops; size_t total_bytes; bool use_intra_sync; };

/* v5 and v6 descriptor: 64-bit type, parent handle, rank, then the union.  v6 only adds members
 * to the union, so one struct with the v6 members serves both (NCCL fills what the type needs). */
typedef struct {
  uint64_t type;
  void *parent;          /* handle this plugin returned for the parent event, or NULL */
  int rank;
  union {
    struct dpro_d_group_api group_api;
    struct dpro_d_coll_api coll_api;
    struct dpro_d_p2p_api p2p_api;
    struct dpro_d_kernel_launch kernel_launch;
    struct dpro_d_coll coll;
    struct dpro_d_p2p p2p;
    struct dpro_d_proxy_op proxy_op;
    struct dpro_d_proxy_step proxy_step;
    struct dpro_d_kernel_ch kernel_ch;
    struct dpro_d_net_plugin net_plugin;
    struct dpro_d_ce_coll ce_coll;
    struct dpro_d_ce_sync ce_sync;
    struct dpro_d_ce_batch ce_batch;
  };
} dpro_descr_v5;

/* v4 descriptor: 8-bit type; the members used here have the v5 layout (coll/p2p lack the
 * trailing parent_group, which is never read from a v4 descriptor). */
typedef struct {
  uint8_t type;
  void *parent;
  int rank;
  union {
    struct dpro_d_coll coll;
    struct dpro_d_p2p p2p;
    struct dpro_d_proxy_op proxy_op;
    struct dpro_d_proxy_step proxy_step;
    struct dpro_d_kernel_ch kernel_ch;
    struct dpro_d_net_plugin net_plugin;
  };
} dpro_descr_v4;

/* State arguments (same union in v4, v5, v6). */
typedef union {
  struct { size_t trans_size; } proxy_step;
  struct { int appended_proxy_ops; } proxy_ctrl;
  struct { void *data; } net_plugin;
  struct { uint64_t ptimer; } kernel_ch;
} dpro_state_args;

/* The function tables NCCL looks up by symbol name ncclProfiler_v6 / _v5 / _v4. */
typedef struct {
  const char *name;
  dpro_nccl_result (*init)(void **context, uint64_t comm_id, int *activation_mask, const char *comm_name,
                           int nnodes, int nranks, int rank, dpro_nccl_logger logfn);
  dpro_nccl_result (*start_event)(void *context, void **handle, dpro_descr_v5 *descr);
  dpro_nccl_result (*stop_event)(void *handle);
  dpro_nccl_result (*record_event_state)(void *handle, int state, dpro_state_args *args);
  dpro_nccl_result (*finalize)(void *context);
} dpro_profiler_v5;   /* also the v6 table: same signatures, v6 descriptors */

typedef struct {
  const char *name;
  dpro_nccl_result (*init)(void **context, int *activation_mask, const char *comm_name, uint64_t comm_hash,
                           int nnodes, int nranks, int rank, dpro_nccl_logger logfn);
  dpro_nccl_result (*start_event)(void *context, void **handle, dpro_descr_v4 *descr);
  dpro_nccl_result (*stop_event)(void *handle);
  dpro_nccl_result (*record_event_state)(void *handle, int state, dpro_state_args *args);
  dpro_nccl_result (*finalize)(void *context);
} dpro_profiler_v4;

#endif
