"""Replay: simulate a global DFG device by device (dPRO §4.3) and analyse the schedule."""
from .engine import CompiledGraph, ReplayResult, compile_graph, replay, unroll

__all__ = ["CompiledGraph", "ReplayResult", "compile_graph", "replay", "unroll"]
