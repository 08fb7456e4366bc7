"""Emulated multi-host cluster on one Linux machine (network namespaces + tc).

Why this exists
---------------
dPRO's replayer predicts iteration time from traces whose communication
operators depend on link bandwidth.  Checking those predictions (and running
realistic tests and benchmarks of the collectors) needs *real* collective
communication over a link with a known, limited rate -- but a CI box or a
laptop has one host.  :class:`EmulatedCluster` gives each "host" its own
network namespace with one Ethernet-like interface, joins them with a Linux
bridge, and shapes every host's link with ``tc ... tbf`` so that a
``torch.distributed`` gloo job (or anything else using TCP/IP) sees a
switched cluster with ``rate_mbit`` per-host links.

Topology (nothing is created in, or attached to, the root namespace)::

    <base>-h0 [eth0 10.213.0.1] ==veth== [h0]
    <base>-h1 [eth0 10.213.0.2] ==veth== [h1]   <base>-br : bridge br0
    ...                                         (h0, h1, ... are its ports)

* ``<base>`` is ``<prefix>-<pid>-<counter>`` so concurrent instances (in one
  process or many) never collide; :func:`cleanup_stale` can tell leftovers of
  dead processes from live clusters by the pid.
* The bridge lives in its own namespace ``<base>-br``, so the machine's real
  interfaces, routes and firewall are never touched, and deleting the
  namespaces removes every veth and the bridge with them (veth pairs die
  when either end's namespace goes away).
* Every veth pair is created directly across the two namespaces (``ip -n BR
  link add hI ... peer name eth0 netns HOST``), so the root namespace never
  sees even a transient interface and names cannot clash with other runs.
* The subnet (default ``10.213.0.0/24``) exists only inside these namespaces;
  two clusters may use the same subnet because their L2 domains are disjoint.

Shaping
-------
Each host link is limited in BOTH directions with a token bucket filter:
egress of the host-side ``eth0`` limits the host's *upload*, egress of the
bridge-side port ``hI`` limits its *download*.  A host-to-host flow therefore
passes the sender's upload shaper and then the receiver's download shaper,
like a full-duplex NIC on a non-blocking switch.  The parameters (see
:func:`tbf_params`) are::

    tc qdisc replace dev DEV root tbf rate {R}mbit burst {B} latency {L}ms

* ``burst`` B = max(64 KiB, R * 2 ms).  veth devices do TSO/GSO, so a single
  skb can be a ~64 KiB super-packet; tbf segments any skb larger than the
  bucket, which costs CPU on a small machine, so the bucket holds at least
  one full GSO packet.  Above ~260 Mbit/s the bucket grows to 2 ms of line
  rate so that hrtimer wake-up jitter (tens of microseconds when the 2 cores
  are busy) never starves the link.  The bucket only lets B bytes pass "for
  free" at the start of an idle period, i.e. it skews a transfer of S bytes
  by at most B/S (< 1 % for multi-MB transfers).
* ``latency`` L = 20 ms of queueing (tbf turns it into ``limit = R*L + B``
  bytes).  A queue much shorter than a bandwidth-delay product makes a single
  TCP flow lose packets and under-use the link; a long one only adds delay.
  The sender-side shaper may still drop a few packets (TCP Small Queues
  allow up to ``tcp_limit_output_bytes``, 4 MiB on recent kernels, per
  socket); those are local drops that TCP retransmits at once, and measured
  goodput stays within ~5 % of the rate.  The receiver-side shaper sees
  traffic the sender's shaper already paced to the same rate, so it queues
  only when several hosts send to one (fan-in) -- which is exactly the case
  it exists for.
* tbf counts whole frames (Ethernet header included), so TCP *goodput* with
  a 1500-byte MTU is about 1448/1514 = 95.6 % of ``rate_mbit``.

``rate_mbit=None`` leaves the links unshaped (veth speed, limited by CPU).

Second link (``second_rate_mbit``)
----------------------------------
DeFT (docs/deft.md, seed 002 §III-C) sends some buckets over a second, slower
network.  ``EmulatedCluster(hosts, rate, second_rate_mbit=R1)`` gives every host a
second veth pair (``eth1`` inside the host, port ``hI-1`` on a second bridge ``br1``
in the bridge namespace) on its own subnet (``second_subnet``, default
``10.214.0.0/24``), shaped like the first (:func:`tbf_params` of ``R1``, both
directions).  The two links share nothing but the machine's CPUs.  Each process on
host ``i`` gets ``DPRO_LINK1_IFNAME=eth1`` and ``DPRO_LINK1_ADDR=<its eth1 address>``
(:meth:`EmulatedCluster.host_env`): ``dpro_torch.deft.link_group`` binds a gloo
process group to that interface, so its traffic takes the second link.

Caveats: every "host" shares the machine's CPUs, so compute-heavy ranks
slow each other down and the emulation is only faithful while the link, not
the CPU, is the bottleneck (on 2 cores that holds comfortably up to a few
hundred Mbit/s; unshaped veth reaches many Gbit/s).  tbf models bandwidth
and queueing only -- no propagation delay, loss or jitter (netem would be
needed for that).

Requirements: root (namespaces and qdiscs need ``CAP_NET_ADMIN`` /
``CAP_SYS_ADMIN``), iproute2's ``ip`` with ``netns`` support and ``tc``.
Missing pieces raise :class:`~dpro_kit.errors.DproError` saying what to do.

To run a whole job on it -- one launcher per host, rank variables, one ``dpro profile`` per
host, a CPU budget per host -- use :func:`dpro_kit.jobs.run_job` (what the benches, the demo
and ``dpro cluster`` use); this module only builds and removes the hosts.

Example::

    with EmulatedCluster(hosts=2, rate_mbit=200) as c:
        procs = c.run_all([sys.executable, "train.py", "--rank", "{i}"])
        codes = [p.wait() for p in procs]
"""
from __future__ import annotations

import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dpro_collect.files import pid_alive as _pid_alive
from dpro_kit.cleanup import close_at_exit, closed, exit_on_sigterm
from dpro_kit.errors import DproError

__all__ = [
    "EmulatedCluster",
    "cleanup_stale",
    "list_namespaces",
    "tbf_params",
    "check_prerequisites",
    "DEFAULT_PREFIX",
    "DEFAULT_SUBNET",
    "HOST_IFACE",
    "SECOND_IFACE",
    "DEFAULT_SECOND_SUBNET",
]

#: Default name prefix of every namespace an :class:`EmulatedCluster` creates.
DEFAULT_PREFIX = "dpk"
#: Private subnet used inside the namespaces (never routed outside them).
DEFAULT_SUBNET = "10.213.0.0/24"
#: Name of the single interface inside each host namespace.  Namespaces are
#: isolated, so every host can use the same name; that keeps
#: ``GLOO_SOCKET_IFNAME`` identical on all ranks.
HOST_IFACE = "eth0"
#: The second interface of every host (``second_rate_mbit``) and its subnet.
SECOND_IFACE = "eth1"
DEFAULT_SECOND_SUBNET = "10.214.0.0/24"
_BRIDGE = "br0"
_BRIDGE1 = "br1"

_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()
_CMD_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
def tbf_params(rate_mbit: float) -> dict[str, Any]:
    """Return the tbf ``burst`` (bytes) and ``latency`` (ms) used for a rate.

    See the module docstring for why: the bucket holds at least one 64 KiB
    GSO super-packet (so tbf never has to segment) and at least 2 ms of line
    rate (so timer jitter never idles the link); 20 ms of queue keeps a single
    TCP flow from losing packets at the shaper.
    """
    if rate_mbit <= 0:
        raise DproError(f"rate_mbit must be > 0, got {rate_mbit}",
                        hint="pass rate_mbit=None for unlimited links")
    bytes_per_s = rate_mbit * 1e6 / 8
    burst = max(64 * 1024, int(bytes_per_s * 0.002))
    latency_ms = 20
    return {"rate_mbit": rate_mbit, "burst": burst, "latency_ms": latency_ms,
            "limit": int(bytes_per_s * latency_ms / 1000) + burst}


def _run_cmd(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ``ip``/``tc`` command, turning failures into :class:`DproError`."""
    try:
        cp = subprocess.run(list(argv), capture_output=True, text=True,
                            timeout=_CMD_TIMEOUT_S)
    except FileNotFoundError as exc:  # pragma: no cover - checked up front
        raise DproError(f"command not found: {argv[0]}",
                        hint="install iproute2 (ip, tc)") from exc
    except subprocess.TimeoutExpired as exc:
        raise DproError(f"`{' '.join(argv)}` did not finish in {_CMD_TIMEOUT_S:.0f} s") from exc
    if check and cp.returncode != 0:
        raise DproError(f"`{' '.join(argv)}` failed (exit {cp.returncode}): "
                        f"{cp.stderr.strip() or cp.stdout.strip()}",
                        hint="emulated clusters need root and a kernel with network "
                             "namespaces, veth, bridge and the tbf qdisc")
    return cp


def check_prerequisites() -> None:
    """Raise :class:`DproError` unless we are root and ``ip``/``tc`` exist.

    Checked before touching anything so that a user gets one actionable line
    instead of a half-built cluster.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise DproError("EmulatedCluster needs root (network namespaces, veth and "
                        "tc qdiscs require CAP_NET_ADMIN/CAP_SYS_ADMIN)",
                        hint="run as root, e.g. `sudo -E python ...`, or in a "
                             "privileged container")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise DproError(f"`{tool}` not found on PATH",
                            hint="install iproute2 (apt-get install iproute2)")


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    cp = _run_cmd(["ip", "netns", "list"], check=False)
    if cp.returncode != 0:
        return []
    # lines look like "name" or "name (id: 3)"
    return [ln.split()[0] for ln in cp.stdout.splitlines() if ln.strip()]


def _ns_regex(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d+)-(\d+)-(br|h\d+)$")


def _kill_ns_pids(ns: str) -> None:
    """Kill processes still running inside namespace ``ns`` (by pid).

    A namespace that still has processes survives ``ip netns del`` (it only
    loses its name), so leftovers of our own runs are ended first.
    """
    cp = _run_cmd(["ip", "netns", "pids", ns], check=False)
    pids = [int(p) for p in cp.stdout.split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            if pid == os.getpid():
                continue
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_pid_alive(p) for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if _pid_alive(p)]


def _delete_ns(ns: str) -> None:
    _kill_ns_pids(ns)
    _run_cmd(["ip", "netns", "del", ns], check=False)


def cleanup_stale(prefix: str = DEFAULT_PREFIX, *, force: bool = False) -> list[str]:
    """Delete namespaces left behind by killed runs; return their names.

    Only namespaces named ``<prefix>-<pid>-<n>-...`` whose creating process
    ``pid`` is gone are removed, so clusters of concurrent live runs are safe.
    ``force=True`` removes every namespace with the prefix regardless.
    Deleting a namespace also deletes the veths and the bridge inside it, so
    nothing else can be left over.
    """
    check_prerequisites()
    rx = _ns_regex(prefix)
    removed = []
    for ns in list_namespaces():
        m = rx.match(ns)
        if not m:
            continue
        if not force and _pid_alive(int(m.group(1))):
            continue
        _delete_ns(ns)
        removed.append(ns)
    return removed


# ---------------------------------------------------------------------------
# the cluster
# ---------------------------------------------------------------------------
class EmulatedCluster:
    """``hosts`` network namespaces on a shaped, bridged private subnet.

    Parameters
    ----------
    hosts:
        Number of emulated hosts (namespaces), 1..(usable IPs in ``subnet``).
    rate_mbit:
        Per-host link rate in Mbit/s, applied to upload and download, or
        ``None`` for unshaped links; a sequence gives each host its own rate
        (``None`` entries unshaped): one slow link, for straggler ground truth.
    prefix:
        Namespace name prefix (see :func:`cleanup_stale`).  Must be short and
        made of ``[A-Za-z0-9_]``.
    subnet:
        IPv4 network the hosts get addresses in; host ``i`` gets the
        ``i``-th usable address (``10.213.0.1`` for host 0 by default).
    second_rate_mbit:
        Give every host a second link (``eth1`` on a second bridge) at this rate
        (Mbit/s; a sequence: one per host; 0 or ``None`` entries unshaped).
        Default ``None``: no second link.
    second_subnet:
        The second link's IPv4 network (default ``10.214.0.0/24``); must not overlap ``subnet``.

    Use as a context manager (or call :meth:`close`): namespaces are removed
    on normal exit, on exceptions, and -- as a last resort -- at interpreter
    exit.  After ``kill -9`` use :func:`cleanup_stale`.
    """

    def __init__(self, hosts: int = 2, rate_mbit: "float | Sequence[float | None] | None" = None, *,
                 prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET,
                 second_rate_mbit: "float | Sequence[float | None] | None" = None,
                 second_subnet: str = DEFAULT_SECOND_SUBNET) -> None:
        check_prerequisites()
        if not isinstance(hosts, int) or hosts < 1:
            raise DproError(f"hosts must be a positive integer, got {hosts!r}")
        if not re.fullmatch(r"[A-Za-z0-9_]{1,16}", prefix):
            raise DproError(f"invalid prefix {prefix!r}",
                            hint="use 1-16 characters from [A-Za-z0-9_]")
        try:
            net = ipaddress.ip_network(subnet, strict=True)
        except ValueError as exc:
            raise DproError(f"invalid subnet {subnet!r}: {exc}",
                            hint="e.g. 10.213.0.0/24") from exc
        if not isinstance(net, ipaddress.IPv4Network):
            raise DproError(f"subnet {subnet} is not IPv4", hint="e.g. 10.213.0.0/24")
        if not net.is_private:
            raise DproError(f"subnet {subnet} is not a private range",
                            hint="use an RFC 1918 network such as 10.213.0.0/24")
        self._ips = [str(a) for a in itertools.islice(net.hosts(), hosts)]
        if len(self._ips) < hosts:
            raise DproError(f"subnet {subnet} has room for {len(self._ips)} hosts, "
                            f"{hosts} requested", hint="use a larger subnet")
        rates = list(rate_mbit) if isinstance(rate_mbit, (list, tuple)) else [rate_mbit] * hosts
        if len(rates) != hosts:
            raise DproError(f"rate_mbit has {len(rates)} rates for {hosts} hosts",
                            hint="give one rate per host, or a single rate for all")
        self.hosts = hosts
        self.rate_mbit = rate_mbit
        self.prefix = prefix
        self.subnet = net
        self.tbfs = [tbf_params(r) if r is not None else None for r in rates]
        self.tbf = self.tbfs[0] if len({str(t) for t in self.tbfs}) == 1 else None   # uniform links only
        self.second_rate_mbit = second_rate_mbit
        self.second_tbfs: list[dict[str, Any] | None] | None = None
        self._ips1: list[str] = []
        if second_rate_mbit is not None:
            r1 = list(second_rate_mbit) if isinstance(second_rate_mbit, (list, tuple)) else [second_rate_mbit] * hosts
            if len(r1) != hosts:
                raise DproError(f"second_rate_mbit has {len(r1)} rates for {hosts} hosts",
                                hint="give one rate per host, or a single rate for all")
            try:
                net1 = ipaddress.ip_network(second_subnet, strict=True)
            except ValueError as exc:
                raise DproError(f"invalid second_subnet {second_subnet!r}: {exc}",
                                hint="e.g. 10.214.0.0/24") from exc
            if not isinstance(net1, ipaddress.IPv4Network) or not net1.is_private or net1.overlaps(net):
                raise DproError(f"second_subnet {second_subnet} must be a private IPv4 network apart from {subnet}",
                                hint="e.g. 10.214.0.0/24")
            self._ips1 = [str(a) for a in itertools.islice(net1.hosts(), hosts)]
            if len(self._ips1) < hosts:
                raise DproError(f"second_subnet {second_subnet} has room for {len(self._ips1)} hosts, "
                                f"{hosts} requested", hint="use a larger subnet")
            self.second_subnet = net1
            self.second_tbfs = [tbf_params(r) if r else None for r in r1]
        with _COUNTER_LOCK:
            n = next(_COUNTER)
        self.name = f"{prefix}-{os.getpid()}-{n}"
        self.bridge_ns = f"{self.name}-br"
        self.host_ns = [f"{self.name}-h{i}" for i in range(hosts)]
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._closed = False
        close_at_exit(self)   # a `sys.exit` path that skipped close() (dpro_kit.cleanup)
        exit_on_sigterm()     # and a `kill` of the bench: both still delete the namespaces
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- construction -------------------------------------------------------
    def _build(self) -> None:
        ip, plen = _run_cmd, self.subnet.prefixlen
        for ns in [self.bridge_ns, *self.host_ns]:
            ip(["ip", "netns", "add", ns])
            self._created.append(ns)
            ip(["ip", "-n", ns, "link", "set", "lo", "up"])
        self._network(_BRIDGE, "", HOST_IFACE, self._ips, plen, self.tbfs)
        if self.second_tbfs is not None:
            self._network(_BRIDGE1, "-1", SECOND_IFACE, self._ips1, self.second_subnet.prefixlen, self.second_tbfs)
        self._wait_carrier()

    def _network(self, bridge: str, suffix: str, iface: str, ips: Sequence[str], plen: int,
                 tbfs: Sequence[dict[str, Any] | None]) -> None:
        """One bridge in the bridge namespace and a veth per host (``iface`` on the host, port
        ``h<i><suffix>`` on the bridge) with its address, each direction shaped by the host's tbf."""
        ip, br = _run_cmd, self.bridge_ns
        # STP off (the default): ports forward immediately, no 15 s delay.
        ip(["ip", "-n", br, "link", "add", bridge, "type", "bridge", "stp_state", "0"])
        ip(["ip", "-n", br, "link", "set", bridge, "up"])
        for i, hns in enumerate(self.host_ns):
            port = f"h{i}{suffix}"
            # Both ends are created directly in their target namespaces.
            ip(["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", iface, "netns", hns])
            ip(["ip", "-n", br, "link", "set", port, "master", bridge])
            ip(["ip", "-n", br, "link", "set", port, "up"])
            ip(["ip", "-n", hns, "addr", "add", f"{ips[i]}/{plen}", "dev", iface])
            ip(["ip", "-n", hns, "link", "set", iface, "up"])
            t = tbfs[i]
            if t is not None:
                self._shape(hns, iface, t)  # host upload
                self._shape(br, port, t)    # host download

    def _shape(self, ns: str, dev: str, t: dict[str, Any]) -> None:
        _run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                  "rate", f"{t['rate_mbit']}mbit", "burst", str(t["burst"]),
                  "latency", f"{t['latency_ms']}ms"])

    def _wait_carrier(self, timeout_s: float = 5.0) -> None:
        """Wait until every host interface reports LOWER_UP (carrier)."""
        deadline = time.monotonic() + timeout_s
        ifaces = [HOST_IFACE] + ([SECOND_IFACE] if self.second_tbfs is not None else [])
        pending = [(ns, dev) for ns in self.host_ns for dev in ifaces]
        while pending and time.monotonic() < deadline:
            pending = [(ns, dev) for ns, dev in pending if "LOWER_UP" not in
                       _run_cmd(["ip", "-n", ns, "link", "show", dev]).stdout]
            if pending:
                time.sleep(0.02)

    # -- queries ------------------------------------------------------------
    def host_ip(self, i: int) -> str:
        """IPv4 address of host ``i`` (only reachable from inside the cluster)."""
        return self._ips[self._check(i)]

    def iface(self, i: int) -> str:
        """Interface name inside host ``i`` (for ``GLOO_SOCKET_IFNAME``)."""
        self._check(i)
        return HOST_IFACE

    def second_ip(self, i: int) -> str:
        """Host ``i``'s address on the second link (``second_rate_mbit`` given), else DproError."""
        self._check(i)
        if not self._ips1:
            raise DproError("this cluster has no second link", hint="pass second_rate_mbit=R")
        return self._ips1[i]

    def link_counters(self, i: int, second: bool = False) -> dict[str, int]:
        """Bytes and packets host ``i`` sent and received on its first (or second) interface (``ip -s``)."""
        import json as _json
        dev = SECOND_IFACE if second else HOST_IFACE
        if second:
            self.second_ip(i)
        cp = _run_cmd(["ip", "-n", self.netns(i), "-s", "-j", "link", "show", dev])
        st = _json.loads(cp.stdout)[0]["stats64"]
        return {"tx_bytes": int(st["tx"]["bytes"]), "rx_bytes": int(st["rx"]["bytes"]),
                "tx_packets": int(st["tx"]["packets"]), "rx_packets": int(st["rx"]["packets"])}

    def netns(self, i: int) -> str:
        """Name of host ``i``'s network namespace (``/run/netns/<name>``; ``ip netns exec <name>``)."""
        return self.host_ns[self._check(i)]

    @property
    def master_addr(self) -> str:
        """Host 0's address: the conventional ``MASTER_ADDR`` for rank 0."""
        return self._ips[0]

    def host_env(self, i: int) -> dict[str, str]:
        """Environment a process on host ``i`` gets by default from :meth:`run`.

        ``DPRO_HOST`` (``host<i>``), ``HOST_RANK``, ``NHOSTS``, ``MASTER_ADDR``
        and ``GLOO_SOCKET_IFNAME`` -- enough for a one-process-per-host
        ``torch.distributed`` gloo job; with a second link also ``DPRO_LINK1_IFNAME``
        and ``DPRO_LINK1_ADDR`` (``dpro_torch.deft.link_group`` reads them).
        """
        self._check(i)
        env = {"DPRO_HOST": f"host{i}", "HOST_RANK": str(i), "NHOSTS": str(self.hosts),
               "MASTER_ADDR": self.master_addr, "GLOO_SOCKET_IFNAME": HOST_IFACE}
        if self._ips1:
            env.update({"DPRO_LINK1_IFNAME": SECOND_IFACE, "DPRO_LINK1_ADDR": self._ips1[i]})
        return env

    def substitute(self, i: int, argv: Sequence[str]) -> list[str]:
        """Replace ``{i}``, ``{ip}``, ``{iface}``, ``{master}`` in each argument.

        Plain string replacement (not ``str.format``), so other braces -- e.g.
        in ``python -c`` code -- are left alone.
        """
        subs = {"{i}": str(i), "{ip}": self.host_ip(i), "{iface}": self.iface(i),
                "{master}": self.master_addr}
        out = []
        for a in argv:
            for k, v in subs.items():
                a = a.replace(k, v)
            out.append(a)
        return out

    def _check(self, i: int) -> int:
        if not 0 <= i < self.hosts:
            raise DproError(f"host index {i} out of range 0..{self.hosts - 1}")
        return i

    # -- processes ----------------------------------------------------------
    def run(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
            *, inherit_env: bool = True, **popen_kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside host ``i``; return its :class:`subprocess.Popen`.

        The process environment is ``os.environ`` (unless ``inherit_env`` is
        false) + :meth:`host_env` + ``env``.  ``nsenter --net`` enters the
        host's network namespace and execs the command in place, so the
        returned Popen's pid *is* the command.  (Not ``ip netns exec``: it also
        remounts ``/sys`` for the namespace, which hides the cgroup files where a
        rank's CPU quota and throttling are read - dpro_torch records them; what
        sysfs shows of network devices is the machine's, read ``/proc/net/dev``.)
        Processes still running at :meth:`close` are terminated.
        """
        if self._closed:
            raise DproError("EmulatedCluster is closed")
        full_env = dict(os.environ) if inherit_env else {}
        full_env.update(self.host_env(i))
        if env:
            full_env.update(env)
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.netns(i)}", "--", *argv],
                                env=full_env, **popen_kwargs)
        self._procs.append(proc)
        return proc

    def run_all(self, argvs: Sequence[str] | Sequence[Sequence[str]],
                env: Mapping[str, str] | None = None,
                **popen_kwargs: Any) -> list[subprocess.Popen]:
        """Start one process per host.

        ``argvs`` is either one argv used on every host (with the
        :meth:`substitute` placeholders filled per host) or a list of
        ``hosts`` argvs, one per host.
        """
        if argvs and not isinstance(argvs[0], str):
            per_host = [list(a) for a in argvs]  # type: ignore[arg-type]
            if len(per_host) != self.hosts:
                raise DproError(f"run_all got {len(per_host)} commands for "
                                f"{self.hosts} hosts")
        else:
            per_host = [self.substitute(i, argvs) for i in range(self.hosts)]  # type: ignore[arg-type]
        return [self.run(i, a, env=env, **popen_kwargs) for i, a in enumerate(per_host)]

    # -- teardown -----------------------------------------------------------
    def close(self) -> None:
        """Stop our processes and delete every namespace (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for ns in reversed(self._created):
            _delete_ns(ns)
        self._created.clear()
        closed(self)

    def __enter__(self) -> "EmulatedCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EmulatedCluster(name={self.name!r}, hosts={self.hosts}, rate_mbit={self.rate_mbit}, "
                f"second_rate_mbit={self.second_rate_mbit}, closed={self._closed})")

