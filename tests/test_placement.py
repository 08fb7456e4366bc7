"""Ranks that time-share CPU cores (dpro_kit.placement): found from the recorded CPU sets, worded for the user."""
from __future__ import annotations

from dpro_kit.placement import placement_warnings, shared_core_groups, shared_gpu_groups, world_size_warnings


def _extra(**ranks) -> dict:
    """``name=(cpus, threads, machine)`` -> manifest.extra with cpu_placement as the collector writes it."""
    return {"cpu_placement": {n.replace("_", "/"): {"affinity": c, "count": 2, "machine": m, "threads": t}
                              for n, (c, t, m) in ranks.items()}}


def test_four_ranks_pinned_on_two_cores():
    # train.py --pin local with 4 ranks on 2 cores: ranks 0 and 2 on CPU 0, ranks 1 and 3 on CPU 1
    ex = _extra(h_0=([0], 1, "m"), h_1=([1], 1, "m"), h_2=([0], 1, "m"), h_3=([1], 1, "m"))
    assert shared_core_groups(ex) == [
        {"nodes": ["h/0", "h/2"], "machine": "m", "cpus": [0], "threads": 2},
        {"nodes": ["h/1", "h/3"], "machine": "m", "cpus": [1], "threads": 2}]
    w = placement_warnings(ex)
    assert len(w) == 2 and w[0].startswith("ranks h/0, h/2 time-share CPU(s) 0 (2 torch threads on 1 CPU(s)")


def test_ranks_with_their_own_cores_or_enough_cores_are_fine():
    assert shared_core_groups(_extra(h_0=([0], 1, "m"), h_1=([1], 1, "m"))) == []
    # unpinned: both may use both CPUs, but 2 threads fit on 2 CPUs
    assert shared_core_groups(_extra(h_0=([0, 1], 1, "m"), h_1=([0, 1], 1, "m"))) == []
    # ... 2 threads each do not
    assert shared_core_groups(_extra(h_0=([0, 1], 2, "m"), h_1=([0, 1], 2, "m")))[0]["threads"] == 4


def test_machines_come_from_the_boot_id_not_the_host_name():
    # emulated hosts (network namespaces) of one machine share its boot id and its cores
    ex = _extra(a_0=([0], 1, "boot1"), b_1=([0], 1, "boot1"), c_2=([0], 1, "boot2"))
    assert [g["nodes"] for g in shared_core_groups(ex)] == [["a/0", "b/1"]]


def test_chains_of_overlapping_sets_form_one_group():
    ex = _extra(h_0=([0, 1], 1, "m"), h_1=([1, 2], 1, "m"), h_2=([2, 3], 2, "m"))
    assert shared_core_groups(ex) == []          # 4 threads on the 4 CPUs of the chain fit
    ex["cpu_placement"]["h/2"]["threads"] = 3   # 5 threads on 4 CPUs
    assert shared_core_groups(ex)[0]["nodes"] == ["h/0", "h/1", "h/2"]


def test_old_or_partial_traces_give_no_warning():
    assert shared_core_groups({}) == [] and shared_core_groups(None) == []
    assert shared_core_groups({"cpu_placement": {"h/0": {"affinity": None}, "h/1": "junk"}}) == []


def test_world_size_what_if_that_would_not_fit_the_profiled_machine():
    # 2 ranks, a core each, on a 2-CPU machine: 4 ranks would time-share the cores
    ex = _extra(h_0=([0], 1, "m"), h_1=([1], 1, "m"))
    w = world_size_warnings(ex, 4)
    assert len(w) == 1 and w[0].startswith("--world-size 4:") and "2 CPU(s)" in w[0]
    assert world_size_warnings(ex, 2) == []                       # fits
    # ranks on two machines: a bigger world means more machines, nothing to say
    assert world_size_warnings(_extra(a_0=([0], 1, "m1"), b_1=([0], 1, "m2")), 8) == []
    assert world_size_warnings({}, 8) == [] and world_size_warnings(None, 8) == []


def test_ranks_sharing_one_gpu():
    # the H100 run of bench/gpu_check.sh: two ranks on one machine, one GPU (same uuid), no MPS
    ex = _extra(host0_0=([0, 1], 1, "m"), host1_1=([0, 1], 1, "m"), other_2=([0], 1, "m2"))
    gpu = {"index": 0, "uuid": "GPU-1234", "name": "NVIDIA H100 80GB HBM3", "visible_devices": None, "mps": False}
    for n in ("host0/0", "host1/1", "other/2"):
        ex["cpu_placement"][n]["gpu"] = dict(gpu)
    assert shared_gpu_groups(ex) == [{"nodes": ["host0/0", "host1/1"], "gpu": "NVIDIA H100 80GB HBM3", "mps": False}]
    w = placement_warnings(ex)
    assert len(w) == 1 and w[0].startswith("ranks host0/0, host1/1 share one GPU (NVIDIA H100 80GB HBM3) without MPS")
    for n in ("host0/0", "host1/1"):
        ex["cpu_placement"][n]["gpu"]["mps"] = True
    assert "under MPS" in placement_warnings(ex)[0]
    ex["cpu_placement"]["host1/1"]["gpu"]["uuid"] = "GPU-5678"     # a GPU each: nothing to say
    assert shared_gpu_groups(ex) == [] and placement_warnings(ex) == []
    # traces recorded before the collector wrote the GPU (or on CPU) have none
    assert shared_gpu_groups(_extra(h_0=([0], 1, "m"), h_1=([1], 1, "m"))) == [] and shared_gpu_groups(None) == []


def test_collector_gpu_placement_without_cuda_is_none():
    from dpro_torch.recorder import gpu_placement
    assert gpu_placement() is None       # this machine has no CUDA: nothing recorded, never an error
