from rayb.models.accounting import ParamCount, count_params
from rayb.models.registry import available, build_model, check_arch, register

__all__ = ["ParamCount", "available", "build_model", "check_arch", "count_params", "register"]
