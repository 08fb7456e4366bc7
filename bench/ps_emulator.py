"""Raw-TCP parameter-server emulator: ps-lite's traffic pattern on the emulated cluster, without MXNet
(docs/async.md, "Why the real W >= 2 MXNet job reaches only ~80 % of the link").

Per worker two TCP connections (pushes worker -> PS, pulls PS -> worker, as ps-lite's ZMQ sockets);
the PS serves complete pushes one at a time in arrival order (one server thread; optionally holding it
SERVER_MS_PER_MB per MB of the push, a stand-in for the server's update and copy) and queues each pull
(the same bytes) on that worker's pull connection; a worker step = COMPUTE_MS of sleep, then the 12 keys
of examples/mxnet/train.py's MLP pushed in key order (1.6 MB dense0_weight second), the next step after
all 12 pulls. 40 steps per worker; steps/s = sum over workers of 1 / mean step gap after 5 steps.
Hosts unconstrained (no CPU budget).

    sudo bench/quietrun.sh python bench/ps_emulator.py 500 1,2,4 20        # RATE_MBIT WORKERS COMPUTE_MS
    sudo bench/quietrun.sh python bench/ps_emulator.py 500 1,2 20 8        # ... SERVER_MS_PER_MB
"""
import json, queue, socket, struct, subprocess, sys, threading, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
KEYS = [2048, 1605632, 2048, 1048576, 1024, 524288, 1024, 262144, 512, 131072, 40, 5120]
PORT = 24601
H = struct.Struct('!II')
def rx(s, n, buf):
    v = memoryview(buf); got = 0
    while got < n:
        k = s.recv_into(v[:min(n - got, len(buf))])
        if not k: raise SystemExit(0)
        got += k
def serve(ms_per_mb=0.0):
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(('0.0.0.0', PORT)); ls.listen(64)
    work = queue.Queue(); outq = {}
    payload = bytes(2 << 20)
    def server_thread():
        while True:
            wid, key, n = work.get()
            if ms_per_mb > 0:
                time.sleep(ms_per_mb * n / 1e6 / 1e3)   # the server's serial per-request work (update, copy)
            outq[wid].put((key, n))
    def sender(wid, c):
        while True:
            key, n = outq[wid].get()
            c.sendall(H.pack(key, n) + payload[:n])
    def reader(wid, c):
        buf = bytearray(1 << 16)
        while True:
            h = bytearray(H.size); rx(c, H.size, h); key, n = H.unpack(h); rx(c, n, buf); work.put((wid, key, n))
    threading.Thread(target=server_thread, daemon=True).start()
    print('ready', flush=True)
    while True:
        c, _ = ls.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h = bytearray(5); rx(c, 5, h); kind, wid = chr(h[0]), struct.unpack('!I', bytes(h[1:]))[0]
        if kind == 'P':
            threading.Thread(target=reader, args=(wid, c), daemon=True).start()
        else:
            outq[wid] = queue.Queue(); threading.Thread(target=sender, args=(wid, c), daemon=True).start()
def worker(srv, wid, steps, compute_ms, t_start):
    up = socket.create_connection((srv, PORT)); up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); up.sendall(b'P' + struct.pack('!I', wid))
    dn = socket.create_connection((srv, PORT)); dn.sendall(b'D' + struct.pack('!I', wid))
    time.sleep(0.5)
    while time.time() < t_start: time.sleep(0.001)
    payload = bytes(2 << 20); buf = bytearray(1 << 16); ends = []
    for s in range(steps):
        time.sleep(compute_ms / 1e3)
        for k, n in enumerate(KEYS): up.sendall(H.pack(k, n) + payload[:n])
        for _ in KEYS:
            h = bytearray(H.size); rx(dn, H.size, h); key, n = H.unpack(h); rx(dn, n, buf)
        ends.append(time.time())
    print(json.dumps(ends), flush=True)
def main():
    from dpro_kit.cluster import EmulatedCluster
    rate = float(sys.argv[1]); ws = [int(x) for x in sys.argv[2].split(',')]; compute = float(sys.argv[3]); steps = 40
    srvms = sys.argv[4] if len(sys.argv) > 4 else '0'
    for W in ws:
        with EmulatedCluster(1 + W, rate_mbit=rate, prefix='psemu') as c:
            srv = c.run(0, [sys.executable, __file__, '_serve', srvms], stdout=subprocess.PIPE, text=True); srv.stdout.readline()
            t0 = time.time() + 2.0
            ps = [c.run(i, [sys.executable, __file__, '_worker', c.host_ip(0), str(i), str(steps), str(compute), str(t0)], stdout=subprocess.PIPE, text=True) for i in range(1, W + 1)]
            tot = 0.0; gaps_all = []
            for p in ps:
                o, _ = p.communicate(timeout=300); ends = json.loads(o.strip().splitlines()[-1])
                g = [b - a for a, b in zip(ends[5:], ends[6:])]; tot += len(g) / sum(g); gaps_all.append(statistics.median(g) * 1e3)
            srv.kill()
            print(f'rate {rate:g} W={W} compute {compute:g} ms server {srvms} ms/MB: {tot:.2f} steps/s (median step per worker {", ".join(f"{x:.0f}" for x in gaps_all)} ms)', flush=True)
if __name__ == '__main__':
    if len(sys.argv) < 4 and (len(sys.argv) < 2 or not sys.argv[1].startswith('_')):
        sys.exit(__doc__)
    if sys.argv[1] == '_serve': serve(float(sys.argv[2]))
    elif sys.argv[1] == '_worker': worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]))
    else: main()
