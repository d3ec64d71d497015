"""vLLM's hidden-state extraction, with a real (small) model run by transformers on CPU.

A vLLM server started with the ``extract_hidden_states`` speculative method and the
``ExampleHiddenStatesConnector`` answers a token-id completion with ``max_tokens`` 1 by naming,
in ``kv_transfer_params.hidden_states_path``, a safetensors file it writes afterwards behind a
``.lock`` file: ``{"hidden_states": [n, k, H], "token_ids": [n]}``, the ``k`` layers of
``eagle_aux_hidden_state_layer_ids`` in ascending order, each the residual stream before any
final norm (id 0 the embeddings, id ``i`` the output of layer ``i - 1``, id ``L`` the last
layer's before the norm). See ``capture/vllm_backend.py`` for the vLLM source this follows.

Here the states are the model's own (transformers, on CPU, one request at a time); the file is
written on a thread after the answer, under an exclusive ``flock`` on the lock file, which is
then removed. torch and transformers are imported only when the simulator is given a model.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from pathlib import Path
from typing import Any


class HiddenStates:
    """The model, its layer ids and the folder the files go to."""

    def __init__(
        self, model_dir: Path, out_dir: Path, layers: list[int], wrong_ids: bool,
        zeros: bool = False,
    ) -> None:  # fmt: skip
        import torch
        from transformers import AutoModelForCausalLM

        self.torch: Any = torch
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        self.model: Any = model.eval()  # type: ignore[no-untyped-call]
        self.layers = sorted(set(layers))
        count = int(model.config.num_hidden_layers)
        if any(not 0 <= h <= count for h in self.layers):
            raise ValueError(f"hidden-state layers {self.layers} out of 0..{count}")
        self.count = count
        self.out_dir = out_dir
        self.wrong_ids = wrong_ids  # a fault: the echo and the file name other ids
        # A fault: the first layer's states all zero, as vLLM gave on hybrid targets (#46301).
        self.zeros = zeros
        out_dir.mkdir(parents=True, exist_ok=True)
        self._pre: dict[str, Any] = {}
        model.get_decoder().norm.register_forward_hook(self._keep_pre)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()

    def _keep_pre(self, _module: Any, args: tuple[Any, ...], _out: Any) -> None:
        self._pre["pre"] = args[0]

    def extract(self, ids: list[int]) -> tuple[str, list[int]]:
        """Compute the states, lock the file's name, write it on a thread; returns the path
        and the prompt ids as echoed."""
        torch = self.torch
        with self._lock, torch.inference_mode():
            out = self.model.get_decoder()(
                input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False
            )
            pre = self._pre.pop("pre")
        picked = [pre[0] if h == self.count else out.hidden_states[h][0] for h in self.layers]
        states = torch.stack(picked, dim=1).contiguous()  # [n, k, H]
        if self.zeros:
            states[:, 0] = 0
        echoed = [ids[0] + 1, *ids[1:]] if self.wrong_ids else list(ids)
        path = str(self.out_dir / f"{uuid.uuid4().hex}.safetensors")
        lock = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)  # taken before the answer names the file, as vLLM does
        tensors = {"hidden_states": states, "token_ids": torch.tensor(echoed, dtype=torch.long)}
        threading.Thread(target=self._write, args=(tensors, path, lock), daemon=True).start()
        return path, echoed

    @staticmethod
    def _write(tensors: dict[str, Any], path: str, lock: int) -> None:
        from safetensors.torch import save_file

        try:
            save_file(tensors, path)
        finally:
            os.remove(path + ".lock")
            os.close(lock)


def answer(job_id: str, created: int, model: str, ids: list[int], path: str, echo: list[int],
           return_ids: bool) -> dict[str, Any]:  # fmt: skip
    """The completion vLLM sends for a hidden-state request: one token, the file's path."""
    choice: dict[str, Any] = {
        "index": 0, "text": "", "logprobs": None, "finish_reason": "length",
    }  # fmt: skip
    if return_ids:
        choice["prompt_token_ids"] = echo
        choice["token_ids"] = [0]
    usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
    return {
        "id": job_id, "object": "text_completion", "created": created, "model": model,
        "choices": [choice], "usage": usage, "kv_transfer_params": {"hidden_states_path": path},
    }  # fmt: skip
