"""Gradient strategies: how the per-step upstream signals reach the model's parameters.

`full_backward`, `jagg_backward`, `jagg_cv_backward`, `jagg_causal_backward` and `knots_backward` are drop-in functions for your own training loop;
the strategy classes wrap them for the Lightning module.
"""
from jagg_lab.strategies.base import GradientStrategy, WindowedStrategy
from jagg_lab.strategies.causal import JaggCausalStrategy, jagg_causal_backward
from jagg_lab.strategies.core import MODES, BackwardStats, Route, Segment, interpolate_backward, route_backward, interpolation_weights, partition_windows, upstream_signal
from jagg_lab.strategies.cv import JaggCVStrategy, jagg_cv_backward
from jagg_lab.strategies.full import FullStrategy, full_backward
from jagg_lab.strategies.jagg import JaggStrategy, jagg_backward, jagg_window_backward
from jagg_lab.strategies.knots import JaggKnotsStrategy, adaptive_knots, knots_backward, uniform_knots
from jagg_lab.strategies.routed import JaggRoutedStrategy, route_windows, window_scores
from jagg_lab.strategies.subsample import SubsampleStrategy

__all__ = [
    "GradientStrategy", "WindowedStrategy", "BackwardStats", "Route", "Segment", "interpolate_backward", "route_backward", "interpolation_weights", "partition_windows", "upstream_signal",
    "FullStrategy", "full_backward", "MODES", "JaggStrategy", "jagg_backward", "jagg_window_backward",
    "JaggRoutedStrategy", "route_windows", "window_scores", "SubsampleStrategy",
    "JaggKnotsStrategy", "adaptive_knots", "knots_backward", "uniform_knots", "JaggCVStrategy", "jagg_cv_backward",
    "JaggCausalStrategy", "jagg_causal_backward",
]
