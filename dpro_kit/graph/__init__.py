"""The global data-flow graph: model conventions, builder, communication topologies."""
from .build import build_global_dfg
from .model import add_op, compute_device, load_graph, op_key, save_graph, validate
from .topology import TOPOLOGIES, Links, txn_id

__all__ = ["build_global_dfg", "add_op", "compute_device", "load_graph", "op_key", "save_graph", "validate",
           "TOPOLOGIES", "Links", "txn_id"]
