"""Fine-grained communication topologies (dPRO §4.1, "communication topology").

Each builder expands one :class:`~dpro_kit.trace.Collective` into ops between
the tensor's In and Out virtual ops on every participating node:

* producer ops (``SEND``) run on a **network link device**, so transfers that
  share a link queue behind each other;
* consumer ops (``RECV``) run on the receiver's ``comm`` stream;
* a SEND and its RECV carry the same **transaction id** (:func:`txn_id`).  The
  Middleman is the map from transaction id to measured duration: when a
  communication-library patch recorded per-chunk events with these ids, their
  durations are used; otherwise the comm cost model gives them.

A builder is registered, with the rest of its scheme, in
:data:`dpro_kit.graph.schemes.SCHEMES`.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import networkx as nx

from ..costmodel import CommModel
from ..trace import Collective, Manifest, OpKind
from .model import add_op, compute_device, op_key


def txn_id(tensor: str, phase: str, step: int, chunk: int, src: str, dst: str) -> str:
    """Transaction id of one transfer; collectors/patches must produce the same string."""
    return f"{tensor}:{phase}:{step}:{chunk}:{src}->{dst}"


class Links:
    """Which link device a transfer from node *src* to node *dst* occupies.

    Default: one device per ordered pair of hosts (``link:hA->hB``), so all
    transfers from one machine to another queue on one link; two nodes on the
    same host get a private pair link.  Bandwidth-sharing models replace this.

    ``manifest.extra["link_model"] == "interface"`` (the MXNet collector writes it): a
    parameter-server job is a star, every host has one
    network interface whose upload and download are each one rate (a tbf per direction
    on the emulated cluster), and the servers' interfaces carry every worker's traffic.
    So a worker<->server transfer between two hosts queues on the server host's interface
    (``link:<host>:download`` for pushes, ``link:<host>:upload`` for pulls) when there are
    at least as many workers as servers, else on the worker host's.  dPRO §4.1 (links
    as devices with queues); TicTac §2 (the PS's link is the shared resource).
    """

    def __init__(self, manifest: Manifest) -> None:
        self.host = {n: i.host for n, i in manifest.nodes.items()}
        per_nic = isinstance(manifest.extra, dict) and manifest.extra.get("link_model") == "interface"
        self.servers = {n for n, i in manifest.nodes.items() if i.role == "server"} if per_nic else set()
        workers = len(manifest.nodes) - len(self.servers)
        self.server_side = workers >= len(self.servers)

    def device(self, src: str, dst: str) -> str:
        hs, hd = self.host[src], self.host[dst]
        if hs == hd:
            return f"link:{src}->{dst}"
        if (src in self.servers) != (dst in self.servers):
            if src in self.servers:   # a pull
                return f"link:{hs}:upload" if self.server_side else f"link:{hd}:download"
            return f"link:{hd}:download" if self.server_side else f"link:{hs}:upload"
        return f"link:{hs}->{hd}"


@dataclass
class CommContext:
    graph: nx.DiGraph
    manifest: Manifest
    model: CommModel
    links: Links
    measured: dict[str, float] = field(default_factory=dict)

    def in_out(self, coll: Collective, node: str) -> tuple[str, str]:
        """Add (once) the In/Out virtual ops of ``coll`` on ``node`` and join them to the local DFG."""
        g = self.graph
        kin, kout = op_key(node, f"In {coll.tensor}"), op_key(node, f"Out {coll.tensor}")
        if kin not in g:
            add_op(g, kin, node=node, kind=OpKind.VIRTUAL.value, name=f"In {coll.tensor}", tensor=coll.tensor,
                   bytes=coll.bytes, priority=coll.priority)
            add_op(g, kout, node=node, kind=OpKind.VIRTUAL.value, name=f"Out {coll.tensor}", tensor=coll.tensor,
                   bytes=coll.bytes, priority=coll.priority)
            g.add_edges_from((op_key(node, p), kin) for p in coll.inputs.get(node, []))
            g.add_edges_from((kout, op_key(node, c)) for c in coll.outputs.get(node, []))
        return kin, kout

    def transfer(self, coll: Collective, *, phase: str, step: int, chunk: int, src: str, dst: str,
                 nbytes: int) -> tuple[str, str]:
        """Add a SEND (on the link) and its RECV (on ``dst``); return their keys."""
        g = self.graph
        txn = txn_id(coll.tensor, phase, step, chunk, src, dst)
        link = self.links.device(src, dst)
        send_m, recv_m = self.measured.get(f"SEND {txn}"), self.measured.get(f"RECV {txn}")
        ks = op_key(src, f"SEND {txn}")
        kr = op_key(dst, f"RECV {txn}")
        common = dict(tensor=coll.tensor, bytes=int(nbytes), txn=txn, phase=phase, step=step, chunk=chunk,
                      priority=coll.priority)
        add_op(g, ks, node=src, device=link, kind=OpKind.SEND.value, name=f"SEND {coll.tensor}", peer=dst,
               dur=send_m if send_m is not None else self.model.transfer_us(nbytes, link),
               source="trace:txn" if send_m is not None else "model", **common)
        add_op(g, kr, node=dst, device=compute_device(dst, "comm"), kind=OpKind.RECV.value,
               name=f"RECV {coll.tensor}", peer=src, dur=recv_m if recv_m is not None else 0.0,
               source="trace:txn" if recv_m is not None else "model", **common)
        g.add_edge(ks, kr)
        return ks, kr


def split_bytes(total: int, parts: int) -> list[int]:
    """Split ``total`` bytes into ``parts`` chunks that differ by at most one byte."""
    base, rem = divmod(int(total), parts)
    return [base + (1 if i < rem else 0) for i in range(parts)]


def ring_allreduce(ctx: CommContext, coll: Collective) -> None:
    """Ring AllReduce: 2(N-1) steps; in step s rank r sends one chunk (size/N) to rank r+1.

    Reduce-scatter steps s = 0..N-2 send chunk (r-s) mod N; all-gather steps
    s = N-1..2N-3 send chunk (r+1-(s-N+1)) mod N.  SEND(r, 0) waits for In(r);
    SEND(r, s) waits for RECV(r, s-1) - the chunk it forwards - and for
    SEND(r, s-1): a rank sends its steps in order, and through that chain no
    step leaves a rank before its own gradients are in (a reduce-scatter step
    adds them to the chunk it forwards).  Without the chain, data from early
    ranks flowed through a late rank before it had computed, and those early
    transfers then queued on its link ahead of the real ones (a 3-rank job
    with one rank per core and two sharing a core was predicted 15 % slow).
    Out(r) waits for all of r's RECVs and its last SEND.

    Parameters
    ----------
    ctx : CommContext
        The graph under construction (links, measured transfers, op naming).
    coll : dpro_kit.trace.Collective
        The tensor (bucket) to synchronise; ``participants`` in ring order.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.1 (global DFG: communication topology of ring AllReduce) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    ring_pass(ctx, coll)


def ring_pass(ctx: CommContext, coll: Collective, phases: tuple[str, ...] = ("reduce_scatter", "all_gather")) -> None:
    """The ring's steps for ``phases``: both (an AllReduce, :func:`ring_allreduce`), or one of them alone
    (a reduce-scatter or an all-gather collective, as the strategy compiler of :mod:`dpro_kit.simulate`
    emits them).

    Phase ``reduce_scatter``: ``N-1`` steps, in its ``k``-th rank ``i`` sends chunk ``(i-k) mod N`` to
    rank ``i+1``; ``all_gather``: ``N-1`` steps sending chunk ``(i+1-k) mod N``.  Steps are numbered
    ``0, 1, ...`` over the phases given (so an AllReduce's all-gather steps are ``N-1 .. 2N-3``) and
    depend on each other as :func:`ring_allreduce` describes.

    Parameters
    ----------
    ctx : CommContext
        The graph under construction.
    coll : dpro_kit.trace.Collective
        The collective; ``participants`` in ring order.
    phases : tuple of str
        ``("reduce_scatter", "all_gather")`` (default), ``("reduce_scatter",)`` or ``("all_gather",)``.
    """
    ranks = coll.participants
    n = len(ranks)
    io = {r: ctx.in_out(coll, r) for r in ranks}
    if n == 1:
        ctx.graph.add_edge(*io[ranks[0]])
        return
    chunks = split_bytes(coll.bytes, n)
    prev_recv: dict[int, str] = {}
    last_send: dict[int, str] = {}
    steps = [(phase, k) for phase in phases for k in range(n - 1)]
    for s, (phase, k) in enumerate(steps):
        cur_recv: dict[int, str] = {}
        for i, r in enumerate(ranks):
            c = (i - k) % n if phase == "reduce_scatter" else (i + 1 - k) % n
            j = (i + 1) % n
            ks, kr = ctx.transfer(coll, phase=phase, step=s, chunk=c, src=r, dst=ranks[j], nbytes=chunks[c])
            if s == 0:
                ctx.graph.add_edge(io[r][0], ks)
            else:
                ctx.graph.add_edge(prev_recv[i], ks)
                ctx.graph.add_edge(last_send[i], ks)
            ctx.graph.add_edge(kr, io[ranks[j]][1])
            cur_recv[j] = kr
            last_send[i] = ks
        prev_recv = cur_recv
    for i, r in enumerate(ranks):
        ctx.graph.add_edge(last_send[i], io[r][1])


def btree(n: int, p: int) -> tuple[int, list[int]]:
    """Parent and children of position ``p`` in NCCL's binary tree of ``n`` positions (root 0).

    Let ``b`` be the lowest set bit of ``p`` (``p > 0``).  The parent is ``p`` with bit ``b``
    cleared and bit ``2b`` set, or only ``b`` cleared when that is ``>= n``.  The children are
    ``p - b/2`` and the largest ``p + b/2**k < n`` (``k >= 1``), none when ``b == 1``.  The root
    ``0`` has one child, the largest power of two below ``n``.  The tree is a binary search tree
    of the positions (in-order = 0, 1, ..., n-1), depth ``ceil(log2 n)``.  NCCL's
    ``ncclGetBtree`` (``src/graph/trees.cc``) computes the same tree; docs/nccl.md.

    Returns
    -------
    tuple
        ``(parent, children)``: parent ``-1`` for the root; children in NCCL's order (``down[0]``
        = the lower position first).
    """
    if not 0 <= p < n:
        raise ValueError(f"position {p} outside a tree of {n}")
    if p == 0:
        if n == 1:
            return -1, []
        top = 1
        while top * 2 < n:
            top *= 2
        return -1, [top]
    b = p & -p
    up = (p & ~b) | (b << 1)
    if up >= n:
        up = p & ~b
    kids = []
    half = b >> 1
    if half:
        kids.append(p - half)
        while half and p + half >= n:
            half >>= 1
        if half:
            kids.append(p + half)
    return up, kids


def _groups(ranks: list[str], host_of: dict[str, str] | None) -> list[list[str]]:
    """``ranks`` grouped by host in order of first appearance (one group per rank without hosts)."""
    if not host_of:
        return [[r] for r in ranks]
    groups: dict[str, list[str]] = {}
    for r in ranks:
        groups.setdefault(host_of.get(r, r), []).append(r)
    return list(groups.values())


def nccl_tree(participants: list[str], host_of: dict[str, str] | None = None
              ) -> tuple[dict[str, str | None], dict[str, list[str]]]:
    """Parent (None: root) and children of every participant in NCCL's tree, in tree order.

    The participants are grouped by host (order of first appearance; without ``host_of``, or with
    one rank per host, every rank is its own group).  Group ``q`` sits at position ``q`` of
    :func:`btree` over the groups; within a group the ranks form a chain in participant order,
    ``g[0] -> g[1] -> ...``, and the group's first rank (its head) carries the links between
    nodes: its parent is the head of the parent group, its children the chain's next rank
    followed by the heads of the child groups.  That is NCCL's tree with the ``TREE`` pattern (all
    network traffic of a node through one GPU; ``ncclTopoPreset``, ``connectTrees``).
    """
    groups = _groups(participants, host_of)
    parent: dict[str, str | None] = {}
    kids: dict[str, list[str]] = {}
    for q, g in enumerate(groups):
        up, down = btree(len(groups), q)
        for j, r in enumerate(g):
            parent[r] = (groups[up][0] if up >= 0 else None) if j == 0 else g[j - 1]
            kids[r] = g[j + 1:j + 2]
        kids[g[0]] = kids[g[0]] + [groups[d][0] for d in down]
    return parent, kids


def double_tree_orders(ranks: list[str], host_of: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The two tree orders of NCCL's double binary tree over ``ranks``.

    The ranks are grouped by host (:func:`nccl_tree`; one group per rank without ``host_of``).
    Tree 0 puts group ``i`` at position ``i``; tree 1 mirrors it (group ``i`` at position
    ``n-1-i``) when the number of groups ``n`` is even, and shifts it by one (group ``i`` at
    position ``i-1 mod n``) when ``n`` is odd, so that no node is an inner node of both trees
    (``ncclGetDtree``); the chain within a node is the same in both.  Returned as participant
    lists in tree order: the ``participants`` of a :func:`tree_allreduce` collective on the tree's
    channels.
    """
    groups = _groups(list(ranks), host_of)
    n = len(groups)
    t1 = list(reversed(groups)) if n % 2 == 0 else groups[1:] + groups[:1]
    return [r for g in groups for r in g], [r for g in t1 for r in g]


def tree_order(parent: dict[str, str | None], host_of: dict[str, str] | None = None) -> list[str] | None:
    """Participants in tree order whose :func:`nccl_tree` is the tree ``parent`` describes, or None.

    ``parent[node]`` is the node's parent (None for the root); ``host_of`` the node's host (NCCL's
    node).  Any labelling that gives every node the same parent will do (subtrees of the same
    shape are interchangeable).  None when the tree has another shape: a host whose ranks are not
    one chain entered at its head, links between hosts not between heads, or a tree of hosts that
    is not NCCL's binary tree.
    """
    if host_of and len({host_of.get(k, k) for k in parent}) < len(parent):
        return _tree_order_by_host(parent, {k: host_of.get(k, k) for k in parent})
    return _btree_labelling(parent)


def _tree_order_by_host(parent: dict[str, str | None], host: dict[str, str]) -> list[str] | None:
    members: dict[str, list[str]] = {}
    for k in parent:
        members.setdefault(host[k], []).append(k)
    chains: dict[str, list[str]] = {}
    hparent: dict[str, str | None] = {}
    for h, ms in members.items():
        heads = [k for k in ms if parent[k] is None or host.get(parent[k]) != h]
        if len(heads) != 1:
            return None
        chain = [heads[0]]
        while True:
            nxt = [k for k in ms if parent[k] == chain[-1]]
            if len(nxt) > 1 or len(chain) > len(ms):
                return None
            if not nxt:
                break
            chain.append(nxt[0])
        if len(chain) != len(ms):
            return None
        chains[h] = chain
        up = parent[heads[0]]
        hparent[h] = None if up is None else host[up]
    horder = _btree_labelling(hparent)
    if horder is None:
        return None
    order = [k for h in horder for k in chains[h]]
    return order if nccl_tree(order, host)[0] == parent else None


def _btree_labelling(parent: dict[str, str | None]) -> list[str] | None:
    n = len(parent)
    roots = [k for k, v in parent.items() if v is None]
    if n == 0 or len(roots) != 1 or any(v is not None and v not in parent for v in parent.values()):
        return None
    kids: dict[str, list[str]] = {k: [] for k in parent}
    for k, v in parent.items():
        if v is not None:
            kids[v].append(k)
    pos_kids = {p: btree(n, p)[1] for p in range(n)}

    def shape(children, root, seen):
        if root in seen:
            raise ValueError("cycle")
        seen.add(root)
        return tuple(sorted(shape(children, c, seen) for c in children[root]))

    try:
        seen: set = set()
        sn = {k: shape(kids, k, set()) for k in parent}
        shape(kids, roots[0], seen)
        if len(seen) != n:
            return None
    except (ValueError, RecursionError):
        return None
    sp = {p: shape(pos_kids, p, set()) for p in range(n)}
    order: list[str | None] = [None] * n

    def assign(p: int, node: str) -> bool:
        if sp[p] != sn[node] or len(pos_kids[p]) != len(kids[node]):
            return False
        order[p] = node
        free = list(kids[node])
        for q in pos_kids[p]:
            match = next((c for c in free if sn[c] == sp[q]), None)
            if match is None or not assign(q, match):
                return False
            free.remove(match)
        return True

    return [str(x) for x in order] if assign(0, roots[0]) else None


def tree_allreduce(ctx: CommContext, coll: Collective) -> None:
    """One chunk of NCCL's tree AllReduce: reduced up a binary tree, then broadcast down it.

    ``coll.participants`` are in tree order: with one rank per host ``participants[p]`` sits at
    position ``p`` of :func:`btree` (root ``participants[0]``); with several, the hosts do, each
    host's ranks a chain below its first one (:func:`nccl_tree`).  Reduce phase: every non-root rank sends the whole
    chunk (``coll.bytes``) to its parent once its own input is in (In) and it has received the
    chunk from each of its children (phase ``reduce``, step 0).  Broadcast phase: the root, once
    it has all its children's chunks, sends the result to each child; every other rank forwards
    what it receives from its parent to each of its children (phase ``broadcast``, step 1).
    Out(r) waits for r's broadcast RECV (the root: its reduce RECVs) and for all of r's SENDs.
    Transaction ids :func:`txn_id` ``(tensor, phase, step, 0, src, dst)``.

    NCCL runs one such pass per chunk of each channel's share, pipelined (chunk k+1 goes up while
    chunk k comes down); the reader (``dpro_kit/readers/nccl.py``) makes every (channel, chunk)
    one collective, so the pipelining comes from the link devices, which keep each direction's
    transfers in order.  Channels alternate between the two trees of
    :func:`double_tree_orders` (docs/nccl.md).

    Parameters
    ----------
    ctx : CommContext
        The graph under construction.
    coll : dpro_kit.trace.Collective
        One chunk; ``participants`` in tree order.

    References
    ----------
    .. [1] Sanders, Speck, Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and
           scan", Parallel Computing 35(12), 2009 (the double binary tree).
    .. [2] NVIDIA, "Massively Scale Your Deep Learning Training with NCCL 2.4" (2019 blog post:
           double binary trees in NCCL), and NCCL's ``src/graph/trees.cc``,
           ``src/device/all_reduce.h`` (``runTreeSplit``), ``src/proxy.cc`` (``ncclProxySaveOp``).
    """
    ranks = coll.participants
    io = {r: ctx.in_out(coll, r) for r in ranks}
    if len(ranks) == 1:
        ctx.graph.add_edge(*io[ranks[0]])
        return
    g = ctx.graph
    parent, kids = nccl_tree(list(ranks), ctx.links.host)
    root = next(r for r in ranks if parent[r] is None)
    up_recv: dict[str, list[str]] = {r: [] for r in ranks}
    up_send: dict[str, str] = {}
    for r in ranks:
        q = parent[r]
        if q is None:
            continue
        ks, kr = ctx.transfer(coll, phase="reduce", step=0, chunk=0, src=r, dst=q, nbytes=coll.bytes)
        g.add_edge(io[r][0], ks)
        g.add_edge(ks, io[r][1])
        up_send[r] = ks
        up_recv[q].append(kr)
    for r, ks in up_send.items():
        for kr in up_recv[r]:
            g.add_edge(kr, ks)
    down_recv: dict[str, str] = {}
    todo = [root]                     # parents before children: breadth-first from the root
    while todo:
        p = todo.pop(0)
        for c in kids[p]:
            ks, kr = ctx.transfer(coll, phase="broadcast", step=1, chunk=0, src=p, dst=c, nbytes=coll.bytes)
            if p == root:
                g.add_edge(io[root][0], ks)
                g.add_edges_from((k, ks) for k in up_recv[root])
            else:
                g.add_edge(down_recv[p], ks)
            g.add_edge(ks, io[p][1])
            g.add_edge(kr, io[c][1])
            down_recv[c] = kr
            todo.append(c)


def ps_push_pull(ctx: CommContext, coll: Collective) -> None:
    """Parameter server: per partition p on server s, every worker PUSHes, s aggregates, then PULLs.

    worker In -> SEND push (link w->s) -> RECV on s -> AGG on s (after all
    workers' pushes of p) -> SEND pull (link s->w) -> RECV on w -> worker Out.

    Parameters
    ----------
    ctx : CommContext
        The graph under construction.
    coll : dpro_kit.trace.Collective
        The tensor; ``partitions`` (``{"bytes", "server"}``) as traced, else one partition on
        the server :func:`dpro_kit.graph.schemes.ps_server_of` picks.

    References
    ----------
    .. [1] Hu et al., "dPRO: A Generic Performance Diagnosis and Optimization Toolkit for Expediting
           Distributed DNN Training", MLSys 2022, §4.1 (global DFG: parameter-server push/pull) (``/work/shared/seeds/000_c1a77e7f0e0abdd5.txt``).
    """
    servers = ctx.manifest.servers()
    if not servers:
        from ..errors import GraphError
        raise GraphError(f"tensor {coll.tensor!r} uses push_pull but the manifest lists no server node")
    parts = coll.partitions or [{"bytes": coll.bytes,
                                 "server": servers[zlib.crc32(coll.tensor.encode()) % len(servers)]}]
    workers = coll.participants
    io = {w: ctx.in_out(coll, w) for w in workers}
    for p, part in enumerate(parts):
        server, nbytes = str(part["server"]), int(part["bytes"])
        agg_op = f"AGG {coll.tensor} p{p}"
        kagg = op_key(server, agg_op)
        agg_m = ctx.measured.get(f"AGG {agg_op}")
        add_op(ctx.graph, kagg, node=server, device=compute_device(server, "compute"), kind=OpKind.AGG.value,
               name=f"AGG {coll.tensor}", tensor=coll.tensor, bytes=nbytes, phase="aggregate", chunk=p,
               dur=agg_m if agg_m is not None else 0.0, source="trace" if agg_m is not None else "model",
               priority=coll.priority)
        for w in workers:
            ks, kr = ctx.transfer(coll, phase="push", step=0, chunk=p, src=w, dst=server, nbytes=nbytes)
            ctx.graph.add_edge(io[w][0], ks)
            ctx.graph.add_edge(kr, kagg)
        for w in workers:
            ks, kr = ctx.transfer(coll, phase="pull", step=1, chunk=p, src=server, dst=w, nbytes=nbytes)
            ctx.graph.add_edge(kagg, ks)
            ctx.graph.add_edge(kr, io[w][1])


def ps_async_push_pull(ctx: CommContext, coll: Collective) -> None:
    """Asynchronous parameter server (MXNet ``dist_async``): per partition and worker, push -> update -> pull.

    worker In -> SEND push (link) -> RECV on the server -> AGG (the server applies this
    worker's gradient alone, phase ``update``; the server's compute queue is shared by all
    workers) -> SEND pull -> RECV on the worker -> worker Out. No worker waits for another's
    push, so the synchronous iteration rule (each node's next iteration after its own last
    ops) gives asynchronous iterations: the workers are coupled only through the links and the
    server's queue.

    Parameters
    ----------
    ctx : CommContext
        The graph under construction.
    coll : dpro_kit.trace.Collective
        The tensor; ``partitions`` as for :func:`ps_push_pull`.

    References
    ----------
    .. [1] Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012 (asynchronous SGD on a
           parameter server); seed ``/work/shared/seeds/004_a5ba4320ea17d3b0.txt``.
    """
    servers = ctx.manifest.servers()
    if not servers:
        from ..errors import GraphError
        raise GraphError(f"tensor {coll.tensor!r} uses push_pull but the manifest lists no server node")
    parts = coll.partitions or [{"bytes": coll.bytes,
                                 "server": servers[zlib.crc32(coll.tensor.encode()) % len(servers)]}]
    for w in coll.participants:
        kin, kout = ctx.in_out(coll, w)
        for p, part in enumerate(parts):
            server, nbytes = str(part["server"]), int(part["bytes"])
            agg_op = f"AGG {coll.tensor} p{p} {w}"
            kagg = op_key(server, agg_op)
            agg_m = ctx.measured.get(f"AGG {agg_op}")   # the server's handler span (patches/ps-lite)
            add_op(ctx.graph, kagg, node=server, device=compute_device(server, "compute"), kind=OpKind.AGG.value,
                   name=f"AGG {coll.tensor}", tensor=coll.tensor, bytes=nbytes, phase="update", chunk=p,
                   peer=w, dur=agg_m if agg_m is not None else 0.0, source="trace" if agg_m is not None else "model",
                   priority=coll.priority)
            ks, kr = ctx.transfer(coll, phase="push", step=0, chunk=p, src=w, dst=server, nbytes=nbytes)
            ctx.graph.add_edge(kin, ks)
            ctx.graph.add_edge(kr, kagg)
            ks, kr = ctx.transfer(coll, phase="pull", step=1, chunk=p, src=server, dst=w, nbytes=nbytes)
            ctx.graph.add_edge(kagg, ks)
            ctx.graph.add_edge(kr, kout)


def ps_step_push_pull(ctx: CommContext, coll: Collective) -> None:
    """Asynchronous PS with a step barrier (TensorFlow ParameterServerStrategy): one collective per step.

    ``coll`` stands for every variable a worker's step reads and updates; each partition is one
    variable on its server. Per worker: In -> SEND push of every variable (link) -> RECV on its
    server -> AGG (this worker's update alone, phase ``update``) -> ``Updated <tensor>`` (a
    zero-time op on the worker: TF ends a step only when every update is done, through the
    cross-device control edges of the partitioned function) -> SEND pull of every variable (the
    next step's reads, issued once the step was dispatched again) -> RECV on the worker -> Out.
    Unlike :func:`ps_async_push_pull` no variable's read overlaps another's update.

    Parameters
    ----------
    ctx : CommContext
        The graph under construction.
    coll : dpro_kit.trace.Collective
        The step's variables; ``partitions`` (``{"bytes", "server", "variable"}``) as traced.

    References
    ----------
    .. [1] Li, Yan, Paolieri, Golubchik, "Throughput Prediction of Asynchronous SGD in TensorFlow",
           ICPE 2020, §2 (a worker's step: read every variable, compute, send every gradient; the
           PS applies each worker's update alone) (``/work/shared/seeds/004_a5ba4320ea17d3b0.txt``).
    """
    servers = ctx.manifest.servers()
    if not servers:
        from ..errors import GraphError
        raise GraphError(f"tensor {coll.tensor!r} uses push_pull but the manifest lists no server node")
    parts = coll.partitions or [{"bytes": coll.bytes,
                                 "server": servers[zlib.crc32(coll.tensor.encode()) % len(servers)]}]
    g = ctx.graph
    for w in coll.participants:
        kin, kout = ctx.in_out(coll, w)
        kdone = op_key(w, f"Updated {coll.tensor}")
        add_op(g, kdone, node=w, kind=OpKind.VIRTUAL.value, name=f"Updated {coll.tensor}", tensor=coll.tensor,
               bytes=coll.bytes, priority=coll.priority)
        for p, part in enumerate(parts):
            server, nbytes = str(part["server"]), int(part["bytes"])
            agg_op = f"AGG {coll.tensor} p{p} {w}"
            kagg = op_key(server, agg_op)
            agg_m = ctx.measured.get(f"AGG {agg_op}")
            add_op(g, kagg, node=server, device=compute_device(server, "compute"), kind=OpKind.AGG.value,
                   name=f"AGG {part.get('variable', coll.tensor)}", tensor=coll.tensor, bytes=nbytes,
                   phase="update", chunk=p, peer=w, dur=agg_m if agg_m is not None else 0.0,
                   source="trace" if agg_m is not None else "model", priority=coll.priority)
            ks, kr = ctx.transfer(coll, phase="push", step=0, chunk=p, src=w, dst=server, nbytes=nbytes)
            g.add_edge(kin, ks)
            g.add_edge(kr, kagg)
            g.add_edge(kagg, kdone)
        for p, part in enumerate(parts):
            server, nbytes = str(part["server"]), int(part["bytes"])
            ks, kr = ctx.transfer(coll, phase="pull", step=1, chunk=p, src=server, dst=w, nbytes=nbytes)
            g.add_edge(kdone, ks)
            g.add_edge(kr, kout)


__all__ = ["CommContext", "Links", "btree", "double_tree_orders", "nccl_tree", "ps_async_push_pull", "ps_push_pull",
           "ps_step_push_pull", "ring_allreduce", "split_bytes", "tree_allreduce", "tree_order", "txn_id"]
