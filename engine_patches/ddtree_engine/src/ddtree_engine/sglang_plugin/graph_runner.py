"""The target's CUDA-graph runner for DDTREE: SGLang's, capturing a tree-masked verify.

SGLang 0.5.23 captures a DFLASH-family target verify with `custom_mask=None` on backends that can
verify a chain causally (`DecodeCudaGraphRunner.get_spec_info` -> `resolve_dflash_verify_mask_policy`:
Triton is one), and the Triton backend bakes that choice into the graph: its captured metadata
points at the static verify-mask buffer only when the capture-time `spec_info.custom_mask` was
set, and a replay copies a step's mask into that buffer only then. A DDTREE verify replayed from
such a graph would attend causally, i.e. check the wrong tree.

`DDTreeDecodeCudaGraphRunner.get_spec_info` is SGLang's, plus the runner's static `custom_mask`
buffer on the target's capture-time verify input (as SGLang's EAGLE branch does), so the captured
graph reads the per-step tree mask. The hybrid GDN backend needs nothing here: with
`speculative_eagle_topk` > 1 it captures its static first-child / next-sibling buffers and copies
the step's links (`DDTreeVerifyInput.retrieve_next_token/sibling`) into them at replay.

The worker installs the class on the target's model runner only (`install`), through SGLang's
own override point `ModelRunner._decode_cuda_graph_runner_cls`, before SGLang captures (the
scheduler creates the speculative worker, then captures every runner's graphs). The drafter's
runner keeps SGLang's class. Imported by `worker` only (torch, CUDA).
"""

from __future__ import annotations

from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner


class DDTreeDecodeCudaGraphRunner(DecodeCudaGraphRunner):
    """SGLang's decode/verify graph runner; the target's verify is captured with the tree mask."""

    def get_spec_info(self, num_tokens: int):
        spec_info = super().get_spec_info(num_tokens)
        if spec_info is not None and not self.model_runner.is_draft_worker and spec_info.custom_mask is None:
            spec_info.custom_mask = self.buffers.custom_mask
        return spec_info


def install(model_runner) -> None:
    """Make `model_runner` (the target's) capture its decode graphs with DDTreeDecodeCudaGraphRunner.

    Raises:
        RuntimeError: SGLang would build another runner class here (e.g. a UNO runner), which
            this plugin does not extend; or the runner already captured its graphs.
    """
    current = model_runner._decode_cuda_graph_runner_cls()
    if current is not DecodeCudaGraphRunner:
        raise RuntimeError(
            f"DDTREE: the target's CUDA-graph runner class is {current.__qualname__}, not SGLang's "
            "DecodeCudaGraphRunner this plugin extends; start with --disable-cuda-graph"
        )
    if getattr(model_runner, "decode_cuda_graph_runner", None) is not None:
        raise RuntimeError("DDTREE: the target captured its CUDA graphs before the DDTREE worker was created")
    # An instance attribute: only this model runner (the target's) builds the subclass.
    model_runner._decode_cuda_graph_runner_cls = lambda: DDTreeDecodeCudaGraphRunner
