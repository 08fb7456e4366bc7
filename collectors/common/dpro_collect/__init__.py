"""dpro_collect: what every dpro-kit collector shares (standard library only).

Collectors (``collectors/<fw>/dpro_<fw>``) run inside the user's training job, in the
framework's own environment (MXNet 1.9 with numpy<1.24, a TensorFlow or PyTorch env without
dpro-kit installed), so they import only the standard library, this package and their
framework, never :mod:`dpro_kit`.  ``dpro profile`` puts ``collectors/common`` (this
package's folder) and ``collectors/<fw>`` on the job's ``PYTHONPATH``
(:func:`dpro_collect.launch.profile_env`); ``tests/test_collector_imports.py`` enforces
the rule.  :mod:`dpro_kit` may import this package (``dpro_kit.errors`` and
``dpro_kit.schema`` re-export it), so each concept has one definition.

==========================  ==================================================================
:mod:`dpro_collect.schema`   format names and versions of the files collectors write, marker names
:mod:`dpro_collect.errors`   :class:`DproError` (one line, exit 2) and :class:`TraceFormatError`
:mod:`dpro_collect.files`    :func:`atomic_write_text`, :func:`find_metas`
:mod:`dpro_collect.plan`     ``plan.json`` format and :func:`validate_plan` (``dpro optimize`` writes it)
:mod:`dpro_collect.launch`   :func:`parse_steps`, :func:`profile_env`, the ``python -m dpro_<fw>.launch`` CLI
:mod:`dpro_collect.auto`     the auto-load (``autoload/sitecustomize.py``) and the import hook
==========================  ==================================================================
"""
__version__ = "0.1.0"
__all__ = ["__version__"]
