"""dpro_mxnet auto-load: put this folder on PYTHONPATH to profile unmodified MXNet PS jobs.

Does nothing unless ``DPRO_OUT`` is set. Then: a parameter-server process (``DMLC_ROLE=server``)
writes its meta.json now (MXNet runs the server inside ``import mxnet``); any other process
gets an import hook that enables :mod:`dpro_mxnet.auto` once the script imported mxnet.
Any other ``sitecustomize`` further down ``sys.path`` still runs afterwards.
"""
import os
import sys


def _dpro_mxnet_setup():
    if not os.environ.get("DPRO_OUT"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    pkg_parent = os.path.dirname(os.path.dirname(here))  # the folder that contains dpro_mxnet/
    import importlib.util
    if importlib.util.find_spec("dpro_mxnet") is None:
        sys.path.append(pkg_parent)
    try:
        from dpro_mxnet.auto import install
        install()
    except Exception as exc:  # never break start-up
        print(f"[dpro_mxnet] auto-load failed: {exc!r}", file=sys.stderr, flush=True)


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
        print(f"[dpro_mxnet] the chained sitecustomize {spec.origin} failed: {exc!r}", file=sys.stderr)


_dpro_mxnet_setup()
_chain_next_sitecustomize()
