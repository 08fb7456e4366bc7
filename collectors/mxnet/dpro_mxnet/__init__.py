"""dpro_mxnet: profile MXNet (1.9.x) parameter-server jobs without code change.

Standard library + :mod:`dpro_collect` only (MXNet is imported by the job): it runs in MXNet's own
environment. See collectors/mxnet/README.md and docs/ps.md.
"""
from dpro_collect.schema import MXNET_META_FORMAT as META_FORMAT
from dpro_collect.schema import MXNET_META_VERSION as META_VERSION
from dpro_collect.schema import MXNET_RAW_FORMAT as RAW_FORMAT

__version__ = "0.1.0"
__all__ = ["META_FORMAT", "META_VERSION", "RAW_FORMAT", "__version__"]
