"""Statistics over seeds for architecture comparisons."""
