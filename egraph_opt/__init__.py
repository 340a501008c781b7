"""egraph-opt: an equality-saturation optimizer for ML programs."""
from .analyzer import CurvatureReport, curvature
from .api import OptimizedFunction, saturate_and_extract
from .capture import CaptureError, capture
from .pipeline import Limits, Phase, optimize
from .term import Term, evaluate, pretty

__all__ = ["saturate_and_extract", "curvature", "CurvatureReport", "OptimizedFunction", "Limits", "Phase", "optimize", "capture",
           "CaptureError", "Term", "evaluate", "pretty"]
