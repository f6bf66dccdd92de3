"""Analytic FLOPs of a decoder-only transformer: :class:`TransformerArch`.

Counted: the matrix multiplications, 2 FLOP per multiply-add, which are
> 99 % of a transformer's arithmetic. Not counted: layer norms, softmax,
activations, residual adds, the embedding lookup, the optimizer — each
O(d_model) per token (well under 1 % at d_model ≥ 512), and the same set
``torch.utils.flop_counter.FlopCounterMode`` leaves out.

Forward FLOPs per token (``h`` query heads, ``g`` KV heads, ``dh`` head
size, ``T`` sequence length, ``V`` vocabulary, ``E``/``k`` experts/top-k)::

    attention projections  2·d·h·dh (Q) + 2·2·d·g·dh (K, V) + 2·h·dh·d (O)
    attention scores       2·T·h·dh (QKᵀ) + 2·T·h·dh (A·V)      ("full")
    MLP                    k · (2 if plain else 3) · 2·d·d_ff  (+ 2·d·E router)
    LM head                2·d·V                                  (once)

With ``h·dh = d``, ``g = h``, ``d_ff = 4d``, plain MLP that is
``2·(12·L·d² + d·V) + 4·L·T·d`` = ``2·N + 4·L·T·d``: Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", Table 1 (``C_forward ≈ 2N +
2·n_layer·n_ctx·d_attn``; Kaplan counts the scores at half, i.e. causal),
and Hoffmann et al. 2022 (Chinchilla), Appendix F (logits and attention
reduce, ``2·T·T·dh·h`` each per sequence: full). Training is forward +
backward = 3 × forward (backward: a gradient for the input and one for the
weight, each as costly as the forward matmul): Kaplan's ``6N`` rule plus
the attention term, which is exactly Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
eq. (3) without recomputation: ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``.

**Causal attention** (``attention="full"``, the default) is counted as the
full ``T × T`` score matrix, as Chinchilla, Megatron-LM, PaLM's MFU
(``6N + 12·L·H·Q·T``, Chowdhery et al. 2022, Appendix B) and
FlopCounterMode do; ``attention="causal"`` counts half (what a causal
FlashAttention kernel actually computes), which makes MFU look lower.

**Gradient checkpointing** re-runs each layer's forward during backward
(Megatron-LM eq. (3): 4 × forward for the layers, the LM head still 3 ×).
Those are *hardware* FLOPs: MFU by definition (PaLM, Appendix B; Korthikanti
et al. 2022 "MFU vs HFU") counts the model's FLOPs only, so
:meth:`TransformerArch.train_flops_per_token` leaves the recompute out and
:meth:`TransformerArch.hardware_flops_per_token` puts it in.

**LoRA** (``lora_rank > 0``): every base weight is frozen. A frozen matmul
still needs its input gradient in backward (to reach earlier layers) but
no weight gradient: 2 × forward instead of 3 ×. The adapters ``A`` (d_in ×
r) and ``B`` (r × d_out) on the target modules are trained: 3 × their
forward, ``2·r·(d_in + d_out)`` per token. Attention scores have no
weights and stay 3 ×. (The first layer's input gradient is not needed in
fact; it is counted, < 1/L of the frozen part.)

**Agreement with FlopCounterMode** (H200 fixture, a 4-layer GPT, d=1024,
h=16, T=1024, V=8192, B=8; ``tests/gpuprof/test_flops.py``): this module
gives 3.2985e12 FLOP per training step. FlopCounterMode counted exactly
that (3,298,534,883,328 = 3·2⁴⁰) for the hand-written attention, and
3.3673e12 (+2.08 %) for ``F.scaled_dot_product_attention``: its formula
for SDPA's backward counts 5 batched matmuls instead of 4 (it adds the
recompute of ``QKᵀ`` that fused kernels do), i.e. ``+2·T·h·dh`` per token
per layer = +2⁶·2³⁰ FLOP here. That extra is hardware work, not model FLOPs.
On the CPU (torch 2.13) FlopCounterMode has no formula for SDPA's CPU
kernel and counts its attention as 0: 7.1 % under this module for the
2-layer test GPT (``tests/shim/tiny_gpt.py``), exact with hand-written
attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: LoRA target names (Hugging Face PEFT's Llama module names): the four
#: attention projections and the three MLP matrices (``gate_proj`` exists
#: only with a gated MLP), plus the LM head.
LORA_TARGETS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)
#: PEFT's default targets for Llama-style models.
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")
ATTENTION_MODES = ("full", "causal")

#: Upper bounds of each integer field (validation on both sides of the wire):
#: far above any model trained today, small enough that FLOPs stay < 1e30.
_INT_BOUNDS: dict[str, int] = {
    "layers": 10_000,
    "d_model": 1 << 20,
    "heads": 1 << 14,
    "kv_heads": 1 << 14,
    "head_dim": 1 << 16,
    "seq_len": 1 << 27,
    "vocab": 1 << 24,
    "d_ff": 1 << 24,
    "experts": 1 << 16,
    "top_k": 1 << 16,
    "lora_rank": 1 << 16,
}
_OPTIONAL_INTS = ("kv_heads", "head_dim", "d_ff")
_BOOLS = ("gated_mlp", "checkpointing")
#: Keys of :meth:`TransformerArch.to_dict` (the wire form in ``options["arch"]``).
ARCH_KEYS = frozenset([*_INT_BOUNDS, "mlp_ratio", *_BOOLS, "lora_targets", "attention"])


@dataclass(frozen=True)
class TransformerArch:
    """A decoder-only transformer, for analytic FLOPs (see the module docstring).

    Args:
        layers: transformer blocks ``L``.
        d_model: hidden size ``d``.
        heads: query heads ``h``.
        seq_len: tokens per sequence ``T`` (the attention ``T²`` term).
        vocab: vocabulary size ``V`` (the LM head, ``2·d·V`` FLOP per token).
        kv_heads: key/value heads (grouped-query attention); None = ``heads``.
        head_dim: size of one head; None = ``d_model // heads``.
        mlp_ratio: ``d_ff / d_model`` when ``d_ff`` is not given.
        d_ff: the MLP's hidden size; wins over ``mlp_ratio``.
        gated_mlp: SwiGLU/GeGLU MLP, three matrices (gate, up, down) not two.
        experts: MoE experts per layer (1: a dense MLP).
        top_k: experts each token goes through (MoE).
        lora_rank: LoRA rank ``r``; 0: full fine-tuning / pre-training.
        lora_targets: modules with adapters (names in :data:`LORA_TARGETS`).
        checkpointing: activation (gradient) checkpointing of every layer.
        attention: ``"full"`` (count the whole ``T × T`` scores, the MFU
            convention) or ``"causal"`` (half).

    Raises:
        ValueError: a field out of range.
    """

    layers: int
    d_model: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int | None = None
    head_dim: int | None = None
    mlp_ratio: float = 4.0
    d_ff: int | None = None
    gated_mlp: bool = False
    experts: int = 1
    top_k: int = 1
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = field(default=DEFAULT_LORA_TARGETS)
    checkpointing: bool = False
    attention: str = "full"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        problem = arch_problem(self.to_dict())
        if problem:
            raise ValueError(f"gpuprof: TransformerArch: {problem}")

    # --- shape ---------------------------------------------------------------

    @property
    def dh(self) -> int:
        """Head size."""
        return self.head_dim or self.d_model // self.heads

    @property
    def ff(self) -> int:
        """The MLP's hidden size ``d_ff``."""
        return self.d_ff or round(self.mlp_ratio * self.d_model)

    def _matmuls(self) -> list[tuple[str, int, int, float]]:
        """Per token: (module, d_in, d_out, times used) of each weight matmul."""
        d, h, dh = self.d_model, self.heads, self.dh
        g = self.kv_heads or h
        k = self.top_k if self.experts > 1 else 1
        mlp = [("up_proj", d, self.ff, k), ("down_proj", self.ff, d, k)]
        if self.gated_mlp:
            mlp.insert(0, ("gate_proj", d, self.ff, k))
        per_layer = [
            ("q_proj", d, h * dh, 1),
            ("k_proj", d, g * dh, 1),
            ("v_proj", d, g * dh, 1),
            ("o_proj", h * dh, d, 1),
            *mlp,
        ]
        if self.experts > 1:
            per_layer.append(("router", d, self.experts, 1))
        out = [(n, i, o, c * self.layers) for n, i, o, c in per_layer]
        out.append(("lm_head", d, self.vocab, 1))
        return out

    @property
    def active_params(self) -> int:
        """Weights one token multiplies by (``N`` of the ``6N`` rule; MoE:
        the top-k experts only; embeddings lookup excluded, LM head included)."""
        return int(sum(i * o * c for _, i, o, c in self._matmuls()))

    # --- FLOPs per token ------------------------------------------------------

    def attention_flops_per_token(self) -> float:
        """Forward FLOP per token of the scores: QKᵀ and A·V over all layers,
        ``4·L·T·h·dh`` (``"full"``) or half of it (``"causal"``)."""
        full = 4.0 * self.layers * self.seq_len * self.heads * self.dh
        return full / 2 if self.attention == "causal" else full

    def _lora_fwd(self) -> float:
        if not self.lora_rank:
            return 0.0
        r = self.lora_rank
        return sum(
            2.0 * r * (i + o) * c for n, i, o, c in self._matmuls() if n in self.lora_targets
        )

    def _layer_fwd(self) -> float:
        """Forward FLOP per token inside the layers (LM head excluded)."""
        weights = sum(2.0 * i * o * c for n, i, o, c in self._matmuls() if n != "lm_head")
        lora = self._lora_fwd() - (
            2.0 * self.lora_rank * (self.d_model + self.vocab)
            if self.lora_rank and "lm_head" in self.lora_targets
            else 0.0
        )
        return weights + self.attention_flops_per_token() + lora

    def forward_flops_per_token(self) -> float:
        """Forward FLOP per token: ``2·active_params + attention`` (+ LoRA adapters)."""
        return 2.0 * self.active_params + self.attention_flops_per_token() + self._lora_fwd()

    def train_flops_per_token(self) -> float:
        """Model FLOP per trained token, forward + backward (the MFU numerator).

        Dense: ``3 × forward``. LoRA: frozen weights ``2 ×`` their forward,
        adapters and attention scores ``3 ×``. Recomputation under
        checkpointing is not included (see :meth:`hardware_flops_per_token`).
        """
        fwd = self.forward_flops_per_token()
        if not self.lora_rank:
            return 3.0 * fwd
        frozen = 2.0 * self.active_params
        return 2.0 * frozen + 3.0 * (fwd - frozen)

    def hardware_flops_per_token(self) -> float:
        """FLOP per trained token the GPU executes: :meth:`train_flops_per_token`
        plus, with ``checkpointing``, one more forward of the layers (not the
        LM head) — Megatron-LM eq. (3)'s 4 × for the layers."""
        extra = self._layer_fwd() if self.checkpointing else 0.0
        return self.train_flops_per_token() + extra

    # --- per step -------------------------------------------------------------

    def flops_per_step(self, tokens_per_step: int, *, hardware: bool = False) -> float:
        """Training FLOP of one optimizer step over *tokens_per_step* tokens
        (batch × seq_len × gradient-accumulation micro-batches, on this
        rank); ``hardware`` adds the checkpointing recompute."""
        per = self.hardware_flops_per_token() if hardware else self.train_flops_per_token()
        return per * tokens_per_step

    # --- wire form ------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The arch as a small JSON-able dict (``options["arch"]`` in ``hello``)."""
        d = asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TransformerArch:
        """The inverse of :meth:`to_dict`. Raises ValueError for a bad dict."""
        problem = arch_problem(d)
        if problem:
            raise ValueError(f"gpuprof: arch: {problem}")
        return cls(**{k: v for k, v in d.items() if k in ARCH_KEYS})


def arch_problem(d: object) -> str | None:
    """What is wrong with an arch dict (the :meth:`TransformerArch.to_dict`
    form, from the wire: untrusted), or None. Checks types and bounds only;
    missing optional keys take their defaults."""
    if type(d) is not dict:
        return "not a dict"
    if len(d) > len(ARCH_KEYS) or not set(d) <= ARCH_KEYS:
        return f"unknown keys {sorted(set(map(str, d)) - ARCH_KEYS)[:4]}"
    for key in ("layers", "d_model", "heads", "seq_len", "vocab"):
        if key not in d:
            return f"{key} missing"
    for key, hi in _INT_BOUNDS.items():
        v = d.get(key)
        if v is None and (key in _OPTIONAL_INTS or key not in d):
            continue
        lo = 0 if key == "lora_rank" else 1
        if type(v) is not int or not lo <= v <= hi:
            return f"{key} must be an int in [{lo}, {hi}], got {v!r}"[:120]
    ratio = d.get("mlp_ratio", 4.0)
    if type(ratio) not in (int, float) or not 0 < ratio <= 1024:
        return f"mlp_ratio must be in (0, 1024], got {ratio!r}"[:120]
    for key in _BOOLS:
        if type(d.get(key, False)) is not bool:
            return f"{key} must be a bool"
    targets = d.get("lora_targets", list(DEFAULT_LORA_TARGETS))
    if type(targets) not in (list, tuple) or len(targets) > len(LORA_TARGETS):
        return "lora_targets must be a list"
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad:
        return f"lora_targets: unknown {str(bad[0])[:40]!r} (known: {', '.join(LORA_TARGETS)})"
    if d.get("attention", "full") not in ATTENTION_MODES:
        return "attention must be 'full' or 'causal'"
    experts, top_k = d.get("experts", 1), d.get("top_k", 1)
    if top_k > experts:
        return f"top_k {top_k} > experts {experts}"
    if d.get("head_dim") is None and d["d_model"] % d["heads"]:
        return "d_model must be a multiple of heads (or give head_dim)"
    kv = d.get("kv_heads")
    if kv is not None and (kv > d["heads"] or d["heads"] % kv):
        return "heads must be a multiple of kv_heads"
    return None
