"""Token-by-token decoding with each architecture's own memory: a KV cache, a recurrent state, or none.

* transformers models: their cache, via `use_cache`, under the name the installed transformers gives it
  (`cache` from 5.24; `past_key_values`, or Mamba's `cache_params`, before).
* rayb's recurrent models (and any model whose forward takes `state` and `return_state`): the state.
* anything else (nanoGPT, a user's candidate without a cache): the whole prefix again for every
  token; `Decoder.memory` says "recompute" so speed results are not mistaken for a cached path.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from rayb.eval.scoring import device_of

CACHE_NAMES = ("cache", "past_key_values", "cache_params")  # transformers ≥ 5.24; before: others, Mamba


class Decoder:
    def __init__(self, model: nn.Module):
        self.model = model
        self.device = device_of(model)
        params = inspect.signature(model.forward).parameters
        # transformers models (PreTrainedModel): the cache under the name the installed release gives
        # it. A name the model does not take would vanish into its **kwargs and drop the cache silently,
        # so it comes from the signature (and the decoding self-check holds the result to the forward).
        self._cache_name = next((n for n in CACHE_NAMES if n in params), None)
        self._positions = "cache_position" in params
        if hasattr(model, "generation_config") and self._cache_name is not None:
            self.memory = "cache"
        elif "state" in params and "return_state" in params:
            self.memory = "state"
        else:
            self.memory = "recompute"
        self._carry = None
        self._ids: torch.Tensor | None = None
        self._seen = 0

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Run a prompt [batch, T]; returns the logits of its last position [batch, vocab]."""
        self._ids, self._seen = ids.to(self.device), ids.shape[1]
        return self._forward(self._ids, first=True)

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [batch]; returns the next logits [batch, vocab]."""
        token = token.to(self.device)[:, None]
        self._ids = torch.cat([self._ids, token], dim=1)
        self._seen += 1
        return self._forward(token, first=False)

    def _forward(self, ids: torch.Tensor, first: bool) -> torch.Tensor:
        if self.memory == "cache":
            kwargs = {"use_cache": True}
            if not first:
                kwargs[self._cache_name] = self._carry
                if self._positions:
                    kwargs["cache_position"] = torch.tensor([self._seen - 1], device=self.device)
            out = self.model(ids, **kwargs)
            self._carry = getattr(out, self._cache_name)
        elif self.memory == "state":
            out = self.model(ids, state=None if first else self._carry, return_state=True)
            self._carry = out.state
        else:
            out = self.model(self._ids)
        return out.logits[:, -1].float()
