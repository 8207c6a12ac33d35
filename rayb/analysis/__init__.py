"""Statistics over seeds for architecture comparisons."""

from rayb.analysis.stats import Comparison, Summary, best_by, compare, summarize

__all__ = ["Comparison", "Summary", "best_by", "compare", "summarize"]
