#!/usr/bin/env bash
# The bench lock: timing benches on a shared machine run one at a time.
#     bench/quietrun.sh python bench/stragglers.py ...      (sudo where the bench needs root)
# Waits for the lock (an flock on $DPRO_BENCH_LOCK, default /tmp/dpro-bench.lock), prints how long it
# waited and the load average at start and end on stderr, runs the command, releases the lock and
# exits with the command's status.  It only serialises benches that use it: anything else running
# still disturbs them (run other work at `nice -n 19`).  Every bench runs the same without it.
# The docs' commands name /work/notes/quietrun.sh: the development machine's copy of this script.
# With kernel.sched_autogroup_enabled=1 (the default) each session is its own scheduling group and
# `nice` in another session does not yield to the bench: it warns, it does not change the setting.
if [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ]; then
    echo "[quietrun] warning: kernel.sched_autogroup_enabled=1: niced work in other sessions still competes" \
         "with this bench at full weight; 'sysctl -w kernel.sched_autogroup_enabled=0' makes nice apply machine-wide" >&2
fi
exec 9>"${DPRO_BENCH_LOCK:-/tmp/dpro-bench.lock}"
t0=$(date +%s)
flock -x 9
echo "[quietrun] lock after $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%H:%M:%S) UTC: $*" >&2
"$@"; rc=$?
echo "[quietrun] done rc=$rc $(date -u +%H:%M:%S) UTC; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exit $rc
