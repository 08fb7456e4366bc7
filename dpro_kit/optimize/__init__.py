"""dpro optimize: critical-path strategy search (dPRO §5). See docs/optimizer.md."""
from .driver import OptimizeOptions, Optimized, optimize
from .passes import PASSES, Change, GraphPass, PassRefused, load_pass, register_pass
from .search import SearchOptions, SearchResult, Searcher
from .state import BaseJob, Strategy, build, extract_base, initial_strategy
from .theory import theorem1_fuse_ops, theorem2_fuse_tensors, theorem3_joint

__all__ = ["OptimizeOptions", "Optimized", "optimize", "PASSES", "Change", "GraphPass", "PassRefused", "load_pass", "register_pass", "SearchOptions",
           "SearchResult", "Searcher", "BaseJob", "Strategy", "build", "extract_base", "initial_strategy",
           "theorem1_fuse_ops", "theorem2_fuse_tensors", "theorem3_joint"]
