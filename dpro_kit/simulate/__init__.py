"""Strategy simulation (Proteus): predict data, sharded, tensor and pipeline parallel strategies.

=================  ==============================================================
:mod:`.strategy`   strategy trees: parse, validate, propagate (Proteus §IV, §VII)
:mod:`.model`      the model's layers from one ``dpro profile --shapes`` profile (§VII op estimator)
:mod:`.compiler`   model + strategy -> distributed execution graph with collectives, memory (§V)
:mod:`.predict`    replay it: time, breakdown, peak memory, OOM verdict, ranking
=================  ==============================================================

``dpro simulate`` (:mod:`dpro_kit.cli.simulate`) is the command; docs/simulate.md the rules.
"""
from .compiler import Compiled, compile_strategy
from .model import Layer, ModelGraph, Op, from_profile
from .predict import Prediction, predict, rank_strategies
from .strategy import Settings, Strategy, load_strategy, parse_memory, parse_strategy

__all__ = ["Compiled", "Layer", "ModelGraph", "Op", "Prediction", "Settings", "Strategy", "compile_strategy",
           "from_profile", "load_strategy", "parse_memory", "parse_strategy", "predict", "rank_strategies"]
