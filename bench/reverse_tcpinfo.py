"""TCP_INFO of the flows in the reverse-path experiment (docs/async.md, "The equal-window rule").

The ``reverse2`` case of bench/link_sharing.py with every sender's TCP state sampled: hosts 2 and 3
upload MB each to host 0 (the PS) from 0, host 1 downloads MB from it from F * T1 (T1 = 8 MB / (0.956 RATE),
the transfer at tbf's TCP goodput, computed, not measured as bench/link_sharing.py does); repetitions
4.5 T1 apart on persistent connections (the first left out). Each sender (the uploading clients, the
PS's serving thread for the download) reads getsockopt(TCP_INFO) of its socket every ~1 ms while a
transfer runs: smoothed RTT, cwnd x MSS, unacked x MSS (in flight), pacing rate. Prints, per
repetition and BIN_MS bin from the uploads' start, the download's RTT / in flight / cwnd and the
uploads' RTT / in flight / pacing rate, and writes every sample to OUT.

    /work/notes/quietrun.sh python bench/reverse_tcpinfo.py 500 1.6 0.25 8 OUT.json [BIN_MS] [PREFIX]
"""
import json, socket, statistics, struct, subprocess, sys, threading, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
PORT = 24677
CH = 1 << 16
def info(s):
    b = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    rtt, = struct.unpack_from('I', b, 68); cwnd, = struct.unpack_from('I', b, 80); mss, = struct.unpack_from('I', b, 16)
    pacing, = struct.unpack_from('Q', b, 104); acked, = struct.unpack_from('Q', b, 120)
    minrtt, = struct.unpack_from('I', b, 148); dr, = struct.unpack_from('Q', b, 160); unacked, = struct.unpack_from('I', b, 24)
    return [time.monotonic(), rtt, cwnd * mss, pacing * 8 / 1e6, acked, minrtt, dr * 8 / 1e6, unacked * mss]
class Poll:
    def __init__(self):
        self.sock = None; self.smp = None; threading.Thread(target=self.run, daemon=True).start()
    def run(self):
        while True:
            s, out = self.sock, self.smp
            if s is not None and out is not None:
                try: out.append(info(s))
                except OSError: pass
            time.sleep(0.001)
    def start(self, s):
        self.smp = []; self.sock = s; return self.smp
    def stop(self):
        self.sock = None; smp, self.smp = self.smp, None; return smp
def rx(s, n):
    buf = bytearray(CH); v = memoryview(buf)
    while n > 0:
        k = s.recv_into(v[:min(n, CH)])
        if not k: raise SystemExit(0)
        n -= k
def serve():
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(('0.0.0.0', PORT)); ls.listen(8)
    print('ready', flush=True)
    def h(c):
        out = []; P = Poll()
        data = b'x' * CH
        while True:
            try: hdr = c.recv(9, socket.MSG_WAITALL)
            except OSError: return
            if len(hdr) < 9: return
            op, n = hdr[:1], struct.unpack('!Q', hdr[1:])[0]
            if op == b'u': rx(c, n); c.sendall(b'k')
            elif op == b'd':
                P.start(c); sent = 0
                while sent < n:
                    k = min(CH, n - sent); c.sendall(data[:k]); sent += k
                c.recv(1)
                out.append(P.stop())
            elif op == b'q':
                c.sendall(json.dumps(out).encode() + b'\n'); return
    while True:
        c, _ = ls.accept(); threading.Thread(target=h, args=(c,), daemon=True).start()
def client(server, sched):
    s = socket.create_connection((server, PORT)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = b'x' * CH; recs = []; P = Poll()
    for t, op, n in json.loads(sched):
        while time.monotonic() < t: time.sleep(min(0.002, max(0, t - time.monotonic())))
        t0 = time.monotonic(); P.start(s)
        s.sendall((b'u' if op == 'up' else b'd') + struct.pack('!Q', n))
        if op == 'up':
            sent = 0
            while sent < n:
                k = min(CH, n - sent); s.sendall(data[:k]); sent += k
            s.recv(1)
        else:
            rx(s, n); s.sendall(b'k')
        recs.append([op, t0, time.monotonic(), P.stop()])
    s.sendall(b'q' + struct.pack('!Q', 0))
    srv = b''
    while not srv.endswith(b'\n'):
        k = s.recv(1 << 20)
        if not k: break
        srv += k
    print(json.dumps({'recs': recs, 'srv': json.loads(srv) if srv else []}), flush=True)
def main():
    from dpro_kit.cluster import EmulatedCluster
    rate, mb, f, reps = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    n = int(mb * 1e6); t1 = 8 * n / (rate * 1e6) / 0.956
    out = {}
    binms = float(sys.argv[6]) if len(sys.argv) > 6 else 5.0
    with EmulatedCluster(4, rate_mbit=rate, prefix=sys.argv[7] if len(sys.argv) > 7 else 'rtinfo') as c:
        srv = c.run(0, [sys.executable, __file__, '_serve'], stdout=subprocess.PIPE, text=True); srv.stdout.readline()
        period = 4.5 * t1; t0 = time.monotonic() + 1.5
        sch = {1: [[t0 + r * period + f * t1, 'down', n] for r in range(reps)],
               2: [[t0 + r * period, 'up', n] for r in range(reps)], 3: [[t0 + r * period, 'up', n] for r in range(reps)]}
        ps = {h: c.run(h, [sys.executable, __file__, '_client', c.host_ip(0), json.dumps(s)], stdout=subprocess.PIPE, text=True) for h, s in sch.items()}
        for h, p in ps.items():
            o, _ = p.communicate(timeout=120); out[h] = json.loads(o.strip().splitlines()[-1])
        srv.kill()
    out['t0'] = t0; out['period'] = period; out['t1'] = t1
    Path(sys.argv[5]).write_text(json.dumps(out))
    report(out, binms)
def report(d, binms):
    t1 = d['t1']
    med = lambda ss, k, lo, hi: statistics.median([x[k] for x in ss if lo <= x[0] < hi] or [float('nan')])
    summ = []
    for r in range(1, len(d[1]['recs']) if 1 in d else len(d['1']['recs'])):
        g = (lambda h: d[h]) if 1 in d else (lambda h: d[str(h)])
        _, a, b, _ = g(1)['recs'][r]; dn = g(1)['srv'][r]; ups = [g(h)['recs'][r] for h in (2, 3)]
        u0 = min(u[1] for u in ups); end = max([b] + [u[2] for u in ups])
        print(f"rep {r}: download {(b - a) / t1:.2f} T1 ({1e3 * (a - u0):.0f} .. {1e3 * (b - u0):.0f} ms), "
              f"uploads end at {', '.join(f'{1e3 * (u[2] - u0):.0f}' for u in ups)} ms")
        print("  from ms | download: RTT ms, in flight KB, cwnd KB | upload 2: RTT, in flight, pacing Mbit/s | upload 3")
        for i in range(int((end - u0) * 1e3 / binms) + 1):
            lo = u0 + i * binms / 1e3; hi = lo + binms / 1e3
            f = lambda ss, k, sc: med(ss, k, lo, hi) / sc
            print(f"  {i * binms:7.0f} | {f(dn, 1, 1e3):5.1f} {f(dn, 7, 1e3):4.0f} {f(dn, 2, 1e3):4.0f} | "
                  + " | ".join(f"{f(u[3], 1, 1e3):5.1f} {f(u[3], 7, 1e3):4.0f} {f(u[3], 3, 1):6.0f}" for u in ups))
        # while the download and both uploads run: the window-limited rate C_down / RTT, and the
        # equal-window rule's ingredients (the RTT shared with the uploads; C_down / (C_up2 + C_up3))
        lo, hi = a, min([b] + [u[2] for u in ups])
        if hi > lo:
            rtt, infl = med(dn, 1, lo, hi) / 1e6, med(dn, 7, lo, hi)
            cu = [med(u[3], 7, lo, hi) for u in ups]
            summ.append(((b - a) / t1, rtt, statistics.median([med(u[3], 1, lo, hi) / 1e6 for u in ups]), infl / sum(cu)))
    if summ:
        m = lambda k: statistics.median(x[k] for x in summ)
        print(f"\nmedian over {len(summ)} repetitions, while all three run: download {m(0):.2f} T1 (rate {1 / m(0):.2f} "
              f"of alone); its RTT {1e3 * m(1):.1f} ms, the uploads' {1e3 * m(2):.1f} ms; its in flight / the uploads' "
              f"together = {m(3):.2f} (equal windows: 0.50)")
if __name__ == '__main__':
    if sys.argv[1] == '_serve': serve()
    elif sys.argv[1] == '_client': client(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == '_report': report(json.loads(Path(sys.argv[2]).read_text()), float(sys.argv[3]))
    else: main()
