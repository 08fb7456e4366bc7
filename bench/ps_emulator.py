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
    PS_EMU_TRACE=/tmp/emu8 ... python bench/ps_emulator.py 500 2 20 8; python bench/ps_emulator.py _offsets /tmp/emu8
        # every transfer's times, then the W = 2 phasing step by step (docs/async.md, "Reverse-path queueing")
    python bench/ps_emulator.py _model 500 20 8 8.43,11.44,12.59,13.43 none,window   # the model of the same step,
        # calibrated on the measured W = 1 (first value), W = 2.. predicted with the paper's model (`none`) and
        # the equal-window rule (`window`), errors vs the rest
"""
import json, os, queue, socket, struct, subprocess, sys, threading, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
KEYS = [2048, 1605632, 2048, 1048576, 1024, 524288, 1024, 262144, 512, 131072, 40, 5120]
PORT = 24601
OUTP = os.environ.get('PS_EMU_TRACE', '')     # PREFIX: write every transfer's times (PREFIX-W<W>-srv.log, -w<i>.json)
H = struct.Struct('!II')
def rx(s, n, buf):
    v = memoryview(buf); got = 0
    while got < n:
        k = s.recv_into(v[:min(n - got, len(buf))])
        if not k: raise SystemExit(0)
        got += k
LOG = None
def ev(*a):
    if LOG is not None:
        LOG.write(json.dumps([time.time(), *a]) + '\n')
def serve(ms_per_mb=0.0):
    global LOG
    if len(sys.argv) > 3:
        LOG = open(sys.argv[3], 'w', buffering=1)
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(('0.0.0.0', PORT)); ls.listen(64)
    work = queue.Queue(); outq = {}
    payload = bytes(2 << 20)
    def server_thread():
        while True:
            wid, key, n = work.get()
            ev('s0', wid, key)
            if ms_per_mb > 0:
                time.sleep(ms_per_mb * n / 1e6 / 1e3)   # the server's serial per-request work (update, copy)
            ev('s1', wid, key)
            outq[wid].put((key, n))
    def sender(wid, c):
        while True:
            key, n = outq[wid].get()
            ev('d0', wid, key); c.sendall(H.pack(key, n) + payload[:n]); ev('d1', wid, key)
    def reader(wid, c):
        buf = bytearray(1 << 16)
        while True:
            h = bytearray(H.size); rx(c, H.size, h); key, n = H.unpack(h); rx(c, n, buf); ev('u1', wid, key); work.put((wid, key, n))
    threading.Thread(target=server_thread, daemon=True).start()
    print('ready', flush=True)
    while True:
        c, _ = ls.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h = bytearray(5); rx(c, 5, h); kind, wid = chr(h[0]), struct.unpack('!I', bytes(h[1:]))[0]
        if kind == 'P':
            threading.Thread(target=reader, args=(wid, c), daemon=True).start()
        else:
            outq[wid] = queue.Queue(); threading.Thread(target=sender, args=(wid, c), daemon=True).start()
def worker(srv, wid, steps, compute_ms, t_start, outp=''):
    up = socket.create_connection((srv, PORT)); up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); up.sendall(b'P' + struct.pack('!I', wid))
    dn = socket.create_connection((srv, PORT)); dn.sendall(b'D' + struct.pack('!I', wid))
    time.sleep(0.5)
    while time.time() < t_start: time.sleep(0.001)
    payload = bytes(2 << 20); buf = bytearray(1 << 16); ends = []; rec = []
    for s in range(steps):
        st = {'c0': time.time()}     # compute start, push start, per key: push handed to TCP, pull received
        time.sleep(compute_ms / 1e3)
        st['u0'] = time.time(); st['us'] = []; st['dr'] = []
        for k, n in enumerate(KEYS): up.sendall(H.pack(k, n) + payload[:n]); st['us'].append(time.time())
        for _ in KEYS:
            h = bytearray(H.size); rx(dn, H.size, h); key, n = H.unpack(h); rx(dn, n, buf); st['dr'].append(time.time())
        ends.append(time.time()); rec.append(st)
    if outp:
        Path(f'{outp}-w{wid}.json').write_text(json.dumps(rec))
    print(json.dumps(ends), flush=True)
def offsets(prefix):
    """From a W = 2 trace (PS_EMU_TRACE=PREFIX): for every pair of overlapping steps, the follower's lag at the
    push start, at the push end (last key at the server) and at the step end, and the 1.6 MB pull's duration
    (server hands it to TCP -> worker has it) of the leader and the follower, ms."""
    from collections import defaultdict
    ws = {w: json.loads(Path(f'{prefix}-W2-w{w}.json').read_text()) for w in (1, 2)}
    ev_ = defaultdict(list)
    for line in Path(f'{prefix}-W2-srv.log').read_text().splitlines():
        t, kind, wid, key = json.loads(line); ev_[(wid, kind, key)].append(t)
    ph = {w: [(st['u0'], ev_[(w, 'u1', 11)][s], st['dr'][-1], st['dr'][1] - ev_[(w, 'd0', 1)][s])
              for s, st in enumerate(ws[w])] for w in ws}
    print('lag at push start -> push end -> step end (ms) | 1.6 MB pull of leader, follower (ms)')
    for a in ph[1][5:]:
        for b in ph[2][5:]:
            if min(a[1], b[1]) > max(a[0], b[0]):
                L, F = (a, b) if a[0] <= b[0] else (b, a)
                print(f'{1e3 * (F[0] - L[0]):5.0f} -> {1e3 * (F[1] - L[1]):5.0f} -> {1e3 * (F[2] - L[2]):5.0f} | '
                      f'{1e3 * L[3]:4.0f} {1e3 * F[3]:4.0f}')
def model(rate, compute_ms, ms_per_mb, measured, caps):
    """dpro_kit.async_ps on the emulator's own step (COMPUTE_MS, then the 12 keys' up -> server -> down, the
    server's time per key a private `ps` op), calibrated on the emulator's measured W = 1 steps/s (its goodput),
    W = 2..len(measured) predicted with each reverse path (none, window); prints predicted steps/s and the error per W."""
    from dpro_kit.async_ps import StepOp, StepTemplate, calibrate, predict
    ops = [StepOp('compute', 'worker', compute_ms * 1e3)]
    for k, n in enumerate(KEYS):
        u = len(ops)
        ops += [StepOp(f'up{k}', 'up', float(n + H.size), [0]), StepOp(f'ps{k}', 'ps', ms_per_mb * n / 1e3, [u]),
                StepOp(f'down{k}', 'down', float(n + H.size), [u + 1])]
    tpl = StepTemplate(ops=ops, samples=[[o.work for o in ops]])
    bw = calibrate(tpl, measured[0], bandwidth_mbit=rate, steps=40, warmup=5)['bandwidth_mbit']
    for cap in caps:     # 'none' (or '1', as written before --reverse-cap went): the paper's model; 'window': the equal-window rule
        if cap not in ('1', 'none', 'window'):
            sys.exit(f"_model: reverse path {cap!r} is not none or window (--reverse-cap was removed)")
        kw = {'reverse_path': 'window' if cap == 'window' else 'none'}
        p = predict(tpl, list(range(2, len(measured) + 1)), seeds=4, bandwidth_mbit=bw, steps=50, warmup=10, **kw)
        print(f'rate {rate:g} compute {compute_ms:g} ms server {ms_per_mb:g} ms/MB (calibrated {bw:.0f} Mbit/s) reverse {cap}: '
              + ', '.join(f'W={x.workers} {x.steps_per_s:.2f} ({100 * (x.steps_per_s / m - 1):+.1f} %)' for x, m in zip(p, measured[1:])), flush=True)
def main():
    from dpro_kit.cluster import EmulatedCluster
    rate = float(sys.argv[1]); ws = [int(x) for x in sys.argv[2].split(',')]; compute = float(sys.argv[3]); steps = 40
    srvms = sys.argv[4] if len(sys.argv) > 4 else '0'
    for W in ws:
        with EmulatedCluster(1 + W, rate_mbit=rate, prefix=os.environ.get('PS_EMU_PREFIX', 'psemu')) as c:
            srv = c.run(0, [sys.executable, __file__, '_serve', srvms] + ([f'{OUTP}-W{W}-srv.log'] if OUTP else []), stdout=subprocess.PIPE, text=True); srv.stdout.readline()
            t0 = time.time() + 2.0
            ps = [c.run(i, [sys.executable, __file__, '_worker', c.host_ip(0), str(i), str(steps), str(compute), str(t0), f'{OUTP}-W{W}' if OUTP else ''], stdout=subprocess.PIPE, text=True) for i in range(1, W + 1)]
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
    elif sys.argv[1] == '_worker': worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7])
    elif sys.argv[1] == '_offsets': offsets(sys.argv[2])
    elif sys.argv[1] == '_model': model(float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]),
                                        [float(x) for x in sys.argv[5].split(',')], sys.argv[6].split(','))
    else: main()
