"""dpro_torch auto-load: put this folder on PYTHONPATH to profile unmodified PyTorch scripts.

Python's ``site`` module imports ``sitecustomize`` at interpreter start-up, in
every process (torchrun workers, multiprocessing children included).  This file
does nothing unless ``DPRO_OUT`` is set; then it registers an import hook that
enables :mod:`dpro_torch.auto` once the script imports torch (torch itself is
not imported here, so unrelated Python processes stay fast).  Any other
``sitecustomize`` further down ``sys.path`` still runs afterwards.
"""
import os
import sys


def _dpro_torch_setup():
    if not os.environ.get("DPRO_OUT"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    pkg_parent = os.path.dirname(os.path.dirname(here))  # the folder that contains dpro_torch/
    import importlib.util
    if importlib.util.find_spec("dpro_torch") is None:  # not installed: use the copy this file is in
        sys.path.append(pkg_parent)
    try:
        from dpro_torch.auto import install_import_hook
        install_import_hook()
    except Exception as exc:  # never break start-up
        print(f"[dpro_torch] auto-load failed: {exc!r}", file=sys.stderr, flush=True)


def _chain_next_sitecustomize():
    """Run the sitecustomize this one shadows, if any."""
    import importlib.machinery
    import importlib.util
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        print(f"[dpro_torch] the chained sitecustomize {spec.origin} failed: {exc!r}", file=sys.stderr)


_dpro_torch_setup()
_chain_next_sitecustomize()
