"""Cost models and extraction: from a saturated e-graph to the best equivalent program."""
from .cost import CostModel, NodeFacts, Objective, program_cost
from .dag import ExtractionError, extract

__all__ = ["Objective", "CostModel", "NodeFacts", "program_cost", "ExtractionError", "extract"]
