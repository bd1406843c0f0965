"""Train the lab model pair: a small Qwen3-Next-style hybrid target, then a DFlash drafter on
its hidden states. Reproducible from a seed; about ten minutes on one H200.

    python training/train_lab_pair.py --out OUT [--device cuda] [--seed 0]

Writes OUT/target and OUT/draft (bf16 safetensors, byte-level tokenizer) in the formats the
engine loads, plus OUT/draft-step{N} snapshots of the drafter and OUT/train_log.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import build_corpus  # noqa: E402

from ddtree_engine.reference.dflash import DFlashDraftModel  # noqa: E402
from ddtree_engine.reference.tiny import draft_config, save_drafter, target_config  # noqa: E402
from ddtree_engine.reference.tokenizer import MASK, build_byte_tokenizer  # noqa: E402

IGNORE = -100


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def encode_corpus(texts: list[str], tok, max_len: int) -> list[list[int]]:
    return [tok.encode(t)[:max_len] for t in texts]


def pad_batch(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs])
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids.to(device), lengths.to(device)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_target(seqs, tok, args, device, log):
    from transformers import AutoModelForCausalLM

    cfg = target_config("qwen3-next", vocab_size=len(tok), hidden_size=args.hidden, num_layers=args.layers)
    model = AutoModelForCausalLM.from_config(cfg).to(device)
    params = sum(p.numel() for p in model.parameters())
    log(f"target: {params / 1e6:.2f}M parameters, layer types {cfg.layer_types}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = random.Random(args.seed)
    model.train()
    start = time.time()
    for step in range(args.target_steps):
        batch = rng.sample(seqs, args.batch)
        ids, lengths = pad_batch(batch, tok.pad_token_id, device)
        labels = ids.clone()
        labels[torch.arange(ids.shape[1], device=device)[None, :] >= lengths[:, None]] = IGNORE
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.target_steps, args.target_lr, 100)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.target_steps - 1:
            log(f"target step {step} loss {loss.item():.4f} ({time.time() - start:.0f}s)")
        if args.target_stop_step is not None and step + 1 >= args.target_stop_step:
            log(f"target: stopped at step {step + 1} of a {args.target_steps}-step schedule")
            break
        if time.time() - start > args.max_seconds_target:
            log(f"target: stopped early at step {step} (time guard {args.max_seconds_target}s)")
            break
    return model.eval()


class LayerCapture:
    """Forward hooks that keep the outputs of the decoder layers the drafter reads."""

    def __init__(self, model, layer_ids):
        self.layer_ids = list(layer_ids)
        self.outputs = {}
        self.handles = [
            model.model.layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids
        ]

    def _hook(self, i):
        def hook(module, inputs, output):
            self.outputs[i] = output[0] if isinstance(output, tuple) else output
        return hook

    def features(self) -> torch.Tensor:
        return torch.cat([self.outputs[i] for i in self.layer_ids], dim=-1)


def drafter_batch(ids, lengths, block: int, anchors: int, mask_id: int, rng: random.Random):
    """Pack `anchors` blocks per sequence: block tokens, positions, labels, and the attention mask
    (block j sees context positions < its anchor and its own block only)."""
    bsz, width = ids.shape
    device = ids.device
    starts = []
    for b in range(bsz):
        n = int(lengths[b])
        starts.append([rng.randint(1, max(1, n - 2)) for _ in range(anchors)])
    starts_t = torch.tensor(starts, device=device)  # [B, J]
    offs = torch.arange(block, device=device)
    pos = (starts_t[:, :, None] + offs[None, None, :]).reshape(bsz, -1)  # [B, J*block]
    tokens = torch.full_like(pos, mask_id)
    tokens[:, ::block] = ids.gather(1, starts_t)
    label_pos = pos.clamp(max=width - 1)
    labels = ids.gather(1, label_pos)
    labels[pos >= lengths[:, None]] = IGNORE
    labels[:, ::block] = IGNORE  # the anchor is given, not predicted
    block_id = torch.arange(anchors, device=device).repeat_interleave(block)
    anchor_of_query = starts_t.repeat_interleave(block, dim=1)  # [B, J*block]
    ctx_visible = torch.arange(width, device=device)[None, None, :] < anchor_of_query[:, :, None]
    same_block = block_id[:, None] == block_id[None, :]
    mask = torch.cat([ctx_visible, same_block[None].expand(bsz, -1, -1)], dim=-1)
    return tokens, pos, labels, mask


def train_drafter(target, seqs, tok, args, device, log, out_dir: Path):
    tcfg = target.config
    dcfg = draft_config(tcfg, mask_token_id=tok.convert_tokens_to_ids(MASK), block_size=args.block_size,
                        num_layers=args.draft_layers)
    drafter = DFlashDraftModel(dcfg).to(device)
    log(f"drafter: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M parameters, "
        f"context layers {drafter.target_layer_ids}")
    capture = LayerCapture(target, drafter.target_layer_ids)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    for p in target.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(args.seed + 1)
    block = args.block_size
    # DFlash's loss weights: nearer positions matter more (gamma = 7 for block 16).
    weights = torch.exp(-(torch.arange(block, device=device) - 1).clamp(min=0) / args.loss_gamma)
    snapshots = sorted(set(args.draft_snapshots + [args.ship_draft_step]))
    start = time.time()
    drafter.train()
    for step in range(args.draft_steps):
        batch = rng.sample(seqs, args.batch)
        ids, lengths = pad_batch(batch, tok.pad_token_id, device)
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                             enabled=device.type == "cuda"):
            target(input_ids=ids)
            feats = capture.features().float()
        tokens, pos, labels, mask = drafter_batch(ids, lengths, block, args.anchors, drafter.mask_token_id, rng)
        ctx_pos = torch.arange(ids.shape[1], device=device)[None].expand(ids.shape[0], -1)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.draft_steps, args.draft_lr, 100)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            ctx_kv = drafter.context_kv(feats, ctx_pos)
            hidden = drafter.forward_block(embed(tokens) * drafter.input_embedding_scale, pos, ctx_kv, mask)
            logits = drafter.logits(hidden, lm_head).float()
        per_tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                                  reduction="none").view(labels.shape)
        w = weights.repeat(args.anchors)[None, :] * (labels != IGNORE)
        loss = (per_tok * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.draft_steps - 1:
            with torch.no_grad():
                hit = ((logits.argmax(-1) == labels) & (labels != IGNORE)).float().sum() / (labels != IGNORE).sum()
            log(f"draft step {step} loss {loss.item():.4f} top1 {hit.item():.3f} ({time.time() - start:.0f}s)")
        stop = time.time() - start > args.max_seconds_draft
        if step + 1 in snapshots or stop:
            save_drafter(_bf16_copy(drafter, dcfg), out_dir / f"draft-step{step + 1}")
        if stop:
            log(f"draft: stopped early at step {step} (time guard {args.max_seconds_draft}s)")
            break
        if step + 1 >= max(snapshots):
            break
    return drafter.eval()


def _bf16_copy(drafter: DFlashDraftModel, dcfg) -> DFlashDraftModel:
    copy = DFlashDraftModel(dcfg)
    copy.load_state_dict(drafter.state_dict())
    copy.config.dtype = "bfloat16"
    return copy.to(torch.bfloat16)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=40000)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target-steps", type=int, default=3000)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    # Stop before the schedule ends (the shipped target ran 2051 of 3000 steps).
    ap.add_argument("--target-stop-step", type=int, default=2051)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--draft-steps", type=int, default=3000)
    ap.add_argument("--draft-snapshots", type=int, nargs="*", default=[50, 100, 200, 400, 800])
    # The snapshot that becomes OUT/draft (the shipped drafter is step 200 of a 3000-step schedule:
    # trained longer, it drafts the lab prompts so well that a tree has little left to add).
    ap.add_argument("--ship-draft-step", type=int, default=200)
    ap.add_argument("--draft-lr", type=float, default=1e-3)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--loss-gamma", type=float, default=7.0)
    # Safety nets for a leased GPU; a run that hits one says so in its log.
    ap.add_argument("--max-seconds-target", type=float, default=1e9)
    ap.add_argument("--max-seconds-draft", type=float, default=1e9)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    set_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    tok = build_byte_tokenizer()
    texts = build_corpus(args.samples, args.seed)
    seqs = encode_corpus(texts, tok, args.max_len)
    log(f"corpus: {len(seqs)} transcripts, {sum(map(len, seqs))} tokens, longest {max(map(len, seqs))}")
    target = train_target(seqs, tok, args, device, log)
    target_dir = args.out / "target"
    target.to(torch.bfloat16).save_pretrained(str(target_dir))
    tok.save_pretrained(str(target_dir))
    target.float()
    drafter = train_drafter(target, seqs, tok, args, device, log, args.out)
    final = args.out / f"draft-step{args.ship_draft_step}"
    (args.out / "draft").mkdir(exist_ok=True)
    for f in final.iterdir():
        (args.out / "draft" / f.name).write_bytes(f.read_bytes())
    tok.save_pretrained(str(args.out / "draft"))
    (args.out / "train_log.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                         "log": lines}, indent=1))
    del drafter


if __name__ == "__main__":
    main()
