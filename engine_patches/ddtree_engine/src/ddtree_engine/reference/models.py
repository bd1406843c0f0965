"""Loading targets, drafters and tokenizers from Hugging Face-format directories, with checks
that turn a bad directory into one clear message; and the tiny random pairs for tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..errors import BadInputError, ModelLoadError
from .dflash import DFlashDraftModel, draft_setting

LAB_NAME = "lab"
LAB_DIR = Path(__file__).resolve().parent.parent / "lab_models"


def resolve_model_dir(name_or_path: str, role: str) -> Path:
    """A model directory, or the engine's built-in lab pair for the name `lab`."""
    if name_or_path == LAB_NAME:
        path = LAB_DIR / role
        if not (path / "config.json").exists():
            raise ModelLoadError(f"the built-in lab {role} is missing from this install ({path}); reinstall ddtree-engine")
        return path
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ModelLoadError(
            f"{role} model directory {path} does not exist: pass a Hugging Face model directory "
            f"(config.json + *.safetensors) or the name 'lab'"
        )
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{role} model directory {path} has no config.json: is it a Hugging Face model directory?")
    return path


def _read_config(path: Path, role: str) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{role} config {path / 'config.json'} is not valid JSON: {err}") from None


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    table = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in table:
        raise BadInputError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(table)}")
    return table[dtype]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInputError(f"device {device!r} was asked for but torch sees no CUDA GPU; use --device cpu")
    return torch.device(device)


@contextmanager
def quiet_weight_loading() -> Iterator[None]:
    """Silence transformers' "Loading weights" progress bar for the loads inside this block.

    A hook on transformers' own tqdm factory, installed for the block and then replaced by the
    hook that was there before: `logging.disable_progress_bar()` would also switch off
    huggingface_hub's bars for the rest of the caller's process, and re-enabling them after
    would override a choice the caller made. Bars created by other threads during the block
    are silenced too (the hook is process-wide while it is installed).
    """
    from transformers.utils import logging as hf_logging

    def no_bar(factory, args, kwargs):
        kwargs = {**kwargs, "disable": True}
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    previous = hf_logging.set_tqdm_hook(no_bar)
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(previous)


def load_target(name_or_path: str, device: torch.device, dtype: torch.dtype):
    """A `*ForCausalLM` in eval mode."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_dir(name_or_path, "target")
    config = _read_config(path, "target")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelLoadError(f"target model directory {path} has no weights (*.safetensors)")
    try:
        with quiet_weight_loading():
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ModelLoadError(
            f"could not load the target from {path} (model_type {config.get('model_type')!r}): {err}"
        ) from None
    return model.to(device).eval()


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    path = resolve_model_dir(name_or_path, "target")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load a tokenizer from {path}: {err}") from None


def load_drafter(name_or_path: str, target_model, device: torch.device, dtype: torch.dtype) -> DFlashDraftModel:
    """A DFlash drafter in z-lab's format, checked against the target it will draft for."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    path = resolve_model_dir(name_or_path, "draft")
    raw = _read_config(path, "draft")
    if "dflash_config" not in raw and "block_size" not in raw:
        raise ModelLoadError(
            f"draft model {path} is not a DFlash drafter: its config.json has no 'dflash_config' "
            "(block_size, mask_token_id, target_layer_ids)"
        )
    config = Qwen3Config.from_dict(raw)
    tcfg = target_model.config
    if config.hidden_size != tcfg.hidden_size:
        raise ModelLoadError(
            f"draft hidden size {config.hidden_size} does not match the target's {tcfg.hidden_size}: "
            "a DFlash drafter uses its target's embeddings and LM head, so it must be trained for this target"
        )
    if config.vocab_size != tcfg.vocab_size:
        raise ModelLoadError(
            f"draft vocabulary size {config.vocab_size} does not match the target's {tcfg.vocab_size}: "
            "use the drafter trained for this target"
        )
    if draft_setting(config, "mask_token_id") is None:
        raise ModelLoadError(f"draft config {path / 'config.json'} has no dflash_config.mask_token_id")
    if getattr(config, "num_target_layers", None) is None:
        config.num_target_layers = tcfg.num_hidden_layers
    model = DFlashDraftModel(config)
    bad = [i for i in model.target_layer_ids if not 0 <= i < tcfg.num_hidden_layers]
    if bad:
        raise ModelLoadError(
            f"draft target_layer_ids {model.target_layer_ids} name layers {bad} the target does not have "
            f"({tcfg.num_hidden_layers} layers)"
        )
    if model.block_size < 2:
        raise BadInputError(f"draft block size must be >= 2 (anchor + at least one draft), got {model.block_size}")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"draft model directory {path} has no weights (*.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    state = {k.removeprefix("model."): v for k, v in state.items() if "rotary_emb" not in k}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        raise ModelLoadError(f"draft weights in {path} do not fit its config.json: {str(err).splitlines()[-1].strip()}") from None
    if missing or unexpected:
        raise ModelLoadError(
            f"draft weights in {path} do not fit a DFlash drafter of this config: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
        )
    return model.to(device=device, dtype=dtype).eval()
