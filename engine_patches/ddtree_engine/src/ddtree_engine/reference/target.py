"""The target model over a tree: a forward pass that reuses a Hugging Face model's own modules
(norms, projections, MLPs, rotary embedding) but owns the cache, so that

- attention layers see an ancestor-only mask and positions prefix + depth, and
- Gated-DeltaNet layers take each node's conv window and recurrent state from its parent.

`forward` never changes the cache; `commit` keeps the accepted path (KV compaction and the
hybrid state of the last accepted node). Batch size 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..core.hybrid import conv_window_index, l2norm, window_after
from ..errors import ModelLoadError
from ..kernels.gdn_tree import commit_gdn_state, gated_delta_tree, tree_causal_conv
from ..kernels.tree_mask import ancestor_mask
from .rotary import apply_rotary

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_next", "qwen3_5_text")


@dataclass
class LayerCache:
    # Attention: k, v [Hkv, S, D]. Gated-DeltaNet: window [K-1, C], state [H, Dk, Dv].
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    window: torch.Tensor | None = None
    state: torch.Tensor | None = None


@dataclass
class TargetCache:
    layers: list[LayerCache]
    length: int = 0


@dataclass
class PendingLayer:
    k: torch.Tensor | None = None  # [Hkv, T, D]
    v: torch.Tensor | None = None
    conv_input: torch.Tensor | None = None  # [T, C]
    window_index: torch.Tensor | None = None  # [T, K]
    states: torch.Tensor | None = None  # [T, H, Dk, Dv] (tree) or [1, ...] (linear)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [T, V] float32
    features: torch.Tensor | None  # [T, len(capture_layers) * hidden], the drafter's context
    pending: list[PendingLayer] = field(default_factory=list)
    num_nodes: int = 0
    linear: bool = False


class TargetRunner:
    """Wraps a loaded `*ForCausalLM` (Qwen3, Qwen3-Next or dense Qwen3.5 family) for tree verification."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"target model type {config.model_type!r} is not supported by the reference backend; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", False):
            raise ModelLoadError("sliding-window attention targets are not supported by the reference backend")
        self.model = model.eval()
        self.config = config
        self.body = model.model
        self.layer_types = [
            "linear_attention" if hasattr(layer, "linear_attn") else "full_attention" for layer in self.body.layers
        ]
        self.is_hybrid = "linear_attention" in self.layer_types
        self.num_layers = len(self.layer_types)
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # Recurrent state in at least fp32, as the upstream kernels keep it.
        self.state_dtype = torch.promote_types(self.dtype, torch.float32)

    def new_cache(self) -> TargetCache:
        layers = []
        for layer, kind in zip(self.body.layers, self.layer_types):
            if kind == "linear_attention":
                gdn = layer.linear_attn
                layers.append(
                    LayerCache(
                        window=torch.zeros(gdn.conv_kernel_size - 1, gdn.conv_dim, dtype=self.dtype, device=self.device),
                        state=torch.zeros(
                            gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, dtype=self.state_dtype, device=self.device
                        ),
                    )
                )
            else:
                attn = layer.self_attn
                kv_heads = self.config.num_key_value_heads
                empty = torch.zeros(kv_heads, 0, attn.head_dim, dtype=self.dtype, device=self.device)
                layers.append(LayerCache(k=empty, v=empty.clone()))
        return TargetCache(layers=layers)

    @torch.inference_mode()
    def forward(
        self,
        cache: TargetCache,
        tokens: torch.Tensor,
        parents: torch.Tensor,
        depths: torch.Tensor,
        capture_layers: list[int] | tuple[int, ...] = (),
        hybrid_parents: torch.Tensor | None = None,
        linear: bool = False,
    ) -> ForwardOutput:
        """Run the target over T nodes placed after the cache.

        Args:
            cache: committed state (unchanged by this call).
            tokens, parents, depths: [T] node arrays (see core.tree.DraftTree); a linear
                sequence (prefill) is the chain parents [-1, 0, ...], depths [0, 1, ...].
            capture_layers: decoder layers whose outputs form the drafter's context features.
            hybrid_parents: parents the Gated-DeltaNet layers use (default `parents`); the
                `unsafe` mode passes the flattened order here.
            linear: the nodes are a chain that will be committed whole (keeps no per-node state).

        Returns:
            Logits [T, V] (fp32), captured features, and what `commit` needs.
        """
        n = int(tokens.shape[0])
        tokens = tokens.to(self.device)
        parent_list = parents.tolist()
        gdn_parents = parent_list if hybrid_parents is None else hybrid_parents.tolist()
        positions = (depths + cache.length).to(self.device)
        # Ancestor-only mask over [cache, nodes]: every committed token is visible.
        visible = torch.ones(n, cache.length, dtype=torch.bool)
        mask = torch.cat([visible, ancestor_mask(parent_list)], dim=1).to(self.device)

        h = self.body.embed_tokens(tokens).unsqueeze(0)  # [1, T, hidden]
        cos, sin = self.body.rotary_emb(h, positions.unsqueeze(0))
        window_index = None
        pending: list[PendingLayer] = []
        captured: dict[int, torch.Tensor] = {}
        capture = set(capture_layers)
        for i, (layer, kind) in enumerate(zip(self.body.layers, self.layer_types)):
            residual = h
            x = layer.input_layernorm(h)
            if kind == "linear_attention":
                if window_index is None:
                    window_index = conv_window_index(gdn_parents, layer.linear_attn.conv_kernel_size).to(self.device)
                x, pend = self._gated_delta_net(layer.linear_attn, x, cache.layers[i], gdn_parents, window_index, linear)
            else:
                x, pend = self._attention(layer.self_attn, x, cache.layers[i], cos, sin, mask)
            pending.append(pend)
            h = residual + x
            residual = h
            mlp_out = layer.mlp(layer.post_attention_layernorm(h))
            if isinstance(mlp_out, tuple):
                mlp_out = mlp_out[0]
            h = residual + mlp_out
            if i in capture:
                captured[i] = h[0]
        logits = self.model.lm_head(self.body.norm(h))[0].float()
        features = torch.cat([captured[i] for i in capture_layers], dim=-1) if capture_layers else None
        return ForwardOutput(logits=logits, features=features, pending=pending, num_nodes=n, linear=linear)

    def _attention(self, attn, x, layer_cache: LayerCache, cos, sin, mask):
        t = x.shape[1]
        head_dim = attn.head_dim
        gated = attn.q_proj.out_features == 2 * self.config.num_attention_heads * head_dim
        if gated:  # Qwen3-Next: the query projection also carries an output gate
            q, gate = torch.chunk(attn.q_proj(x).view(1, t, -1, head_dim * 2), 2, dim=-1)
            gate = gate.reshape(1, t, -1)
        else:
            q, gate = attn.q_proj(x).view(1, t, -1, head_dim), None
        q = attn.q_norm(q).transpose(1, 2)  # [1, H, T, D]
        k = attn.k_norm(attn.k_proj(x).view(1, t, -1, head_dim)).transpose(1, 2)
        v = attn.v_proj(x).view(1, t, -1, head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys = torch.cat([layer_cache.k, k[0]], dim=1)  # [Hkv, S+T, D]
        values = torch.cat([layer_cache.v, v[0]], dim=1)
        groups = q.shape[1] // keys.shape[0]
        keys_rep = keys.repeat_interleave(groups, dim=0)
        values_rep = values.repeat_interleave(groups, dim=0)
        scores = torch.matmul(q[0], keys_rep.transpose(1, 2)) * attn.scaling  # [H, T, S+T]
        scores = scores.masked_fill(~mask.unsqueeze(0), float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(values.dtype)
        out = torch.matmul(probs, values_rep).transpose(0, 1).reshape(1, t, -1)  # [1, T, H*D]
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return attn.o_proj(out), PendingLayer(k=k[0], v=v[0])

    def _gated_delta_net(self, gdn, x, layer_cache: LayerCache, parents, window_index, linear):
        t = x.shape[1]
        conv_input, z, b, a = _gdn_projections(gdn, x)
        mixed = tree_causal_conv(
            conv_input, layer_cache.window, gdn.conv1d.weight.squeeze(1), gdn.conv1d.bias, window_index
        )
        query, key, value = torch.split(mixed, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        query = query.reshape(t, -1, gdn.head_k_dim)
        key = key.reshape(t, -1, gdn.head_k_dim)
        value = value.reshape(t, -1, gdn.head_v_dim)
        beta = b[0].sigmoid()
        g = -gdn.A_log.float().exp() * F.softplus(a[0].float() + gdn.dt_bias)
        ratio = gdn.num_v_heads // gdn.num_k_heads
        if ratio > 1:
            query = query.repeat_interleave(ratio, dim=1)
            key = key.repeat_interleave(ratio, dim=1)
        sd = self.state_dtype
        query = l2norm(query.to(sd)) * (query.shape[-1] ** -0.5)
        key = l2norm(key.to(sd))
        core, states = gated_delta_tree(query, key, value, g, beta, parents, layer_cache.state, keep_states=not linear)
        core = core.to(x.dtype)
        z_shape = z.shape
        core = gdn.norm(core.reshape(-1, core.shape[-1]), z.reshape(-1, z.shape[-1]))
        out = gdn.out_proj(core.reshape(z_shape).reshape(1, t, -1))
        return out, PendingLayer(conv_input=conv_input, window_index=window_index, states=states)

    @torch.inference_mode()
    def commit(self, cache: TargetCache, output: ForwardOutput, path: list[int]) -> None:
        """Keep the accepted path: its KV at positions cache.length + depth, and the hybrid
        state and conv window of its last node. `path` must start at node 0."""
        if output.linear and path != list(range(output.num_nodes)):
            raise ValueError("a linear forward can only be committed whole")
        idx = torch.tensor(path, dtype=torch.long, device=self.device)
        last = path[-1]
        for layer_cache, pend in zip(cache.layers, output.pending):
            if pend.k is not None:
                layer_cache.k = torch.cat([layer_cache.k, pend.k.index_select(1, idx)], dim=1)
                layer_cache.v = torch.cat([layer_cache.v, pend.v.index_select(1, idx)], dim=1)
            elif output.linear:
                # A chain keeps only its final state; the window is the last node's.
                layer_cache.window = window_after(pend.conv_input, layer_cache.window, pend.window_index, last).to(
                    layer_cache.window.dtype
                )
                layer_cache.state = pend.states[0].clone()
            else:
                # One gather (a kernel on CUDA): the node's recurrent state and its conv window. Fresh
                # tensors, so nothing else holding the old ones (a copied cache) sees them change.
                state, window = torch.empty_like(layer_cache.state), layer_cache.window.clone()
                commit_gdn_state(pend.states, committed_state_node(path), state, pend.conv_input, pend.window_index, window)
                layer_cache.state, layer_cache.window = state, window
        cache.length += len(path)


def _gdn_projections(gdn, x: torch.Tensor):
    """A Gated-DeltaNet layer's input projections, in either checkpoint layout.

    Qwen3-Next packs q, k, v, z (and b, a) per key-head group in `in_proj_qkvz` / `in_proj_ba`;
    Qwen3.5 keeps them flat in `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`. Both give
    the conv input in the order [all q | all k | all v], so the rest of the layer is shared.

    Args:
        gdn: the layer's `linear_attn` module.
        x: [1, T, hidden].

    Returns:
        conv_input [T, C], z [1, T, Hv, Dv], b and a [1, T, Hv].
    """
    t = x.shape[1]
    if hasattr(gdn, "in_proj_qkvz"):
        query, key, value, z, b, a = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))
        query, key, value = (y.reshape(1, t, -1) for y in (query, key, value))
        return torch.cat((query, key, value), dim=-1)[0], z, b, a
    z = gdn.in_proj_z(x).reshape(1, t, -1, gdn.head_v_dim)
    return gdn.in_proj_qkv(x)[0], z, gdn.in_proj_b(x), gdn.in_proj_a(x)


def committed_state_node(path: list[int]) -> int:
    """The tree node whose recurrent state `TargetRunner.commit` keeps.

    Args:
        path: accepted node indices, root (0) first.

    Returns:
        The last accepted node. Not `len(path) - 1`: nodes are depth-major, so the node at that
        flattened index is usually a sibling or cousin of the accepted one (tests patch this
        function to check that such a slip is caught).
    """
    return path[-1]

