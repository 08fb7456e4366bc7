"""Replay: simulate a global DFG device by device (dPRO §4.3) and analyse the schedule."""
from .engine import CompiledGraph, ReplayResult, compile_graph, replay, unroll
from .rules import DEVICE_MODELS, SCHEDULES, register_device_model, register_schedule

__all__ = ["CompiledGraph", "ReplayResult", "compile_graph", "replay", "unroll", "SCHEDULES", "DEVICE_MODELS",
           "register_schedule", "register_device_model"]
