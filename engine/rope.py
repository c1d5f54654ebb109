"""Rotary position embedding: inverse frequencies for the HF `rope_scaling` variants, and a
cos/sin table indexed by absolute position (paged KV needs positions, not offsets)."""

from __future__ import annotations

import math

import torch

from engine.arch import ModelArch


def inv_freq_and_scale(arch: ModelArch) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim/2] fp32, cos/sin multiplier), as transformers computes them."""
    dim, base = arch.head_dim, arch.rope_theta
    sc = arch.rope_scaling or {}
    kind = sc.get("rope_type", "default")
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if kind == "dynamic":
        # NOTE: HF grows the base with the *current* length beyond max_position_embeddings. A paged
        # cache holds keys rotated once, so we fix the base for the longest context we serve
        # (equal to HF up to max_position_embeddings, where the factor has no effect).
        factor, seq_len = sc["factor"], arch.max_position_embeddings
        base = base * ((factor * seq_len / arch.max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** exponents)
    if kind == "linear":
        return inv_freq / sc["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, sc), 1.0
    if kind == "yarn":
        return _yarn(arch, sc, dim, base)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, sc: dict) -> torch.Tensor:
    factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    old_len = sc["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(arch: ModelArch, sc: dict, dim: int, base: float) -> tuple[torch.Tensor, float]:
    orig = sc["original_max_position_embeddings"]
    factor = sc.get("factor") or arch.max_position_embeddings / orig

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = sc.get("attention_factor")
    if attn is None:
        m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = sc.get("beta_fast") or 32, sc.get("beta_slow") or 1

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return inter * (1 - keep) + extra * keep, float(attn)


class RotaryTable:
    """cos/sin [max_pos, head_dim] in fp32, grown on demand; `apply` rotates [T, heads, head_dim]."""

    def __init__(self, arch: ModelArch, device: torch.device):
        self.inv_freq, self.scale = inv_freq_and_scale(arch)
        self.inv_freq = self.inv_freq.to(device)
        self.device = device
        self.cos = self.sin = torch.empty(0, arch.head_dim, device=device)
        self._grow(min(arch.max_position_embeddings, 4096))

    def _grow(self, n: int) -> None:
        pos = torch.arange(n, dtype=torch.float32, device=self.device)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos() * self.scale, emb.sin() * self.scale

    def cos_sin(self, positions: torch.Tensor, max_pos: int, dtype: torch.dtype):
        if max_pos >= self.cos.shape[0]:
            self._grow(max(max_pos + 1, 2 * self.cos.shape[0]))
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, HF's half-split convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
