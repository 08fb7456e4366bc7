"""dpro_torch: record PyTorch (DDP) training for dpro.

Two ways to use it:

* in your own loop (2 lines)::

      from dpro_torch import Recorder
      rec = Recorder("traces/run1", steps=(10, 15))
      for batch in data:
          ...; opt.step()
          rec.step()                    # marks the end of an iteration

  or ``with Recorder("traces/run1", steps=(10, 15)):`` around the training
  loop, where iterations are counted by ``optimizer.step()`` calls;

* unmodified scripts: ``python -m dpro_torch.launch --out DIR -- CMD`` (or ``dpro profile``)
  sets ``DPRO_OUT``, ``DPRO_STEPS``, ``DPRO_COLLECTOR=dpro_torch`` ... and puts the shared
  auto-load (``collectors/common/dpro_collect/autoload``), ``collectors/common`` and
  ``collectors/torch`` on ``PYTHONPATH``; see :mod:`dpro_torch.auto`.

Imports only the standard library, :mod:`dpro_collect` and torch (never dpro_kit): it runs in
the user's environment.

Every rank writes ``DIR/<host>/<rank>/`` with the Kineto trace of the profiled
steps and ``meta.json``; once every rank's ``meta.json`` is present,
``DIR/manifest.json`` is written (raw format ``torch-kineto``), so ``dpro`` can
read the directory.
"""
__version__ = "0.1.0"
__all__ = ["Recorder", "active_recorder", "__version__"]


def __getattr__(name):  # torch is imported only when the Recorder is used (the auto-load must not)
    if name in ("Recorder", "active_recorder"):
        from . import recorder
        return getattr(recorder, name)
    raise AttributeError(f"module 'dpro_torch' has no attribute {name!r}")
