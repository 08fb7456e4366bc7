"""dpro_tf auto-load: put this folder on PYTHONPATH to profile unmodified TensorFlow scripts.

Does nothing unless ``DPRO_OUT`` is set; then registers an import hook that enables
:mod:`dpro_tf.auto` once the script imports tensorflow (tensorflow is not imported here).
Any other ``sitecustomize`` further down ``sys.path`` (e.g. dpro_torch's) still runs afterwards.
"""
import os
import sys


def _dpro_tf_setup():
    if not os.environ.get("DPRO_OUT"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    pkg_parent = os.path.dirname(os.path.dirname(here))  # the folder that contains dpro_tf/
    import importlib.util
    if importlib.util.find_spec("dpro_tf") is None:
        sys.path.append(pkg_parent)
    try:
        from dpro_tf.auto import install_import_hook
        install_import_hook()
    except Exception as exc:  # never break start-up
        print(f"[dpro_tf] auto-load failed: {exc!r}", file=sys.stderr, flush=True)


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
        print(f"[dpro_tf] the chained sitecustomize {spec.origin} failed: {exc!r}", file=sys.stderr)


_dpro_tf_setup()
_chain_next_sitecustomize()
