from rayb.models.accounting import ParamCount, count_params
from rayb.models.registry import available, build_model, register

__all__ = ["ParamCount", "available", "build_model", "count_params", "register"]
