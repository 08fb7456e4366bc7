"""dpro-kit's auto-load: with this folder on ``PYTHONPATH`` every Python process of a job starts a collector.

``dpro profile`` (:func:`dpro_collect.launch.profile_env`) puts it there.  Without ``DPRO_OUT``
it does nothing but run the ``sitecustomize`` it shadows; with it, it calls
``<DPRO_COLLECTOR>.auto.install()`` (:func:`dpro_collect.auto.autoload`), which imports no
framework: the collector waits for the script's own import.  Standard library only.
"""
import os
import sys


def _dpro_autoload():
    try:
        import importlib.util
        if importlib.util.find_spec("dpro_collect") is None:   # not on PYTHONPATH: the copy this file is in
            sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        from dpro_collect.auto import autoload
        autoload(__file__)
    except Exception as exc:  # never break start-up
        print(f"[dpro] auto-load failed: {exc!r}", file=sys.stderr, flush=True)


_dpro_autoload()
