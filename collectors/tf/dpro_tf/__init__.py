"""dpro_tf: the TensorFlow collector of dpro-kit (standard library + dpro_collect; TensorFlow is imported lazily).

``dpro profile --framework tensorflow -- python train.py`` puts the shared auto-load
(``collectors/common/dpro_collect/autoload``), ``collectors/common`` and ``collectors/tf`` on
``PYTHONPATH`` with ``DPRO_COLLECTOR=dpro_tf``; every Python process of the job then records, once it has imported
TensorFlow, the profiled steps of its training loop with ``tf.profiler`` (custom loops and
Keras ``fit``, no code change). See collectors/tf/README.md and docs/tensorflow.md.
"""
__version__ = "0.1.0"
__all__ = ["__version__"]
