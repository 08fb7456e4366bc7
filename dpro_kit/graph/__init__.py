"""The global data-flow graph: model conventions, the builder, communication schemes and topologies."""
from .build import ITERATION_RULES, build, build_global_dfg, register_iteration_rule
from .model import add_op, compute_device, load_graph, op_key, save_graph, validate
from .schemes import SCHEMES, CommScheme, register_scheme
from .topology import Links, txn_id

__all__ = ["build", "build_global_dfg", "ITERATION_RULES", "register_iteration_rule", "add_op", "compute_device",
           "load_graph", "op_key", "save_graph", "validate", "SCHEMES", "CommScheme", "register_scheme", "Links",
           "txn_id"]
