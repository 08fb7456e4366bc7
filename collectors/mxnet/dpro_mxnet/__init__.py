"""dpro_mxnet: profile MXNet (1.9.x) parameter-server jobs without code change (standard library only).

See collectors/mxnet/README.md and docs/ps.md.
"""
META_FORMAT = "dpro-mxnet-meta"
META_VERSION = 1
RAW_FORMAT = "dpro-mxnet"
__all__ = ["META_FORMAT", "META_VERSION", "RAW_FORMAT"]
