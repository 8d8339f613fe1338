"""Rotary position embedding and its context-length scalings, as transformers computes them.

  inverse_frequencies(cfg) -> (inv_freq_h float32 [H/2], attention_scaling)
  layer_frequencies(cfg, index) -> the same for decoder layer `index`
  apply(x_BxTxNxH, pos_BxT, inv_freq_h, attention_scaling) -> x rotated

Base frequencies, with base = rope_theta and i = 0 .. H/2 - 1:

    f_i = base^(-2i / H)

`cfg.rope_type` rescales them (factor s = rope_factor, L = rope_original_max_position_embeddings):

  default  f_i
  linear   f_i / s                                   (position interpolation)
  llama3   wavelength w_i = 2 pi / f_i; with w_lo = L / low_freq_factor and
           w_hi = L / high_freq_factor:
             w_i < w_hi         f_i                  (high frequencies kept)
             w_i > w_lo         f_i / s              (low frequencies interpolated)
             otherwise          (1 - a) f_i / s + a f_i,  a = (L / w_i - low) / (high - low)
  yarn     d(r) = H ln(L / (2 pi r)) / (2 ln base), the dimension rotating r times over L;
           lo = max(floor(d(beta_fast)), 0), hi = min(ceil(d(beta_slow)), H - 1)
           (no floor/ceil when rope_truncate is False);
           ramp_i = clip((i - lo) / (hi - lo), 0, 1);
             f'_i = f_i / s * ramp_i + f_i * (1 - ramp_i)
           and cos/sin are multiplied by attention_scaling =
           rope_attention_factor, or 0.1 ln(s) + 1 when unset (1 when s <= 1).

A sliding-window layer (`cfg.sliding_layer(index)`, Gemma 3's local layers)
rotates with the default rule and base = rope_local_base_freq; every other
layer uses rope_theta and `cfg.rope_type`.

The rotation ("rotate half" layout, as Hugging Face): with phi = pos * f',
x -> (x * cos(phi) + rotate_half(x) * sin(phi)) * attention_scaling,
rotate_half([a, b]) = [-b, a]. Frequencies are computed once on the host in
float32 like transformers; the rotation runs in float32.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.config import ModelConfig


def _yarn_scaling(cfg: ModelConfig) -> float:
  if cfg.rope_attention_factor is not None:
    return float(cfg.rope_attention_factor)
  return 1.0 if cfg.rope_factor <= 1 else 0.1 * math.log(cfg.rope_factor) + 1.0


def _linear(cfg: ModelConfig, inv_freq_h: np.ndarray) -> tuple[np.ndarray, float]:
  return inv_freq_h / np.float32(cfg.rope_factor), 1.0


def _llama3(cfg: ModelConfig, inv_freq_h: np.ndarray) -> tuple[np.ndarray, float]:
  factor, old_len = np.float32(cfg.rope_factor), cfg.rope_original_max_position_embeddings
  low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
  wavelen_h = 2 * math.pi / inv_freq_h
  scaled_h = np.where(wavelen_h > old_len / low, inv_freq_h / factor, inv_freq_h)
  smooth_h = (old_len / wavelen_h - low) / (high - low)
  smoothed_h = (1 - smooth_h) * scaled_h / factor + smooth_h * scaled_h
  medium_h = ~(wavelen_h < old_len / high) & ~(wavelen_h > old_len / low)
  return np.where(medium_h, smoothed_h, scaled_h).astype(np.float32), 1.0


def _yarn(cfg: ModelConfig, inv_freq_h: np.ndarray) -> tuple[np.ndarray, float]:
  dim, old_len = cfg.head_dim, cfg.rope_original_max_position_embeddings

  def correction_dim(rotations: float) -> float:
    return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

  low, high = correction_dim(cfg.rope_beta_fast), correction_dim(cfg.rope_beta_slow)
  if cfg.rope_truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # transformers' guard against a zero-width ramp
  ramp_h = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  keep_h = (1 - ramp_h).astype(np.float32)  # weight of the unscaled frequency
  inv_freq_h = (inv_freq_h / np.float32(cfg.rope_factor)) * (1 - keep_h) + inv_freq_h * keep_h
  if cfg.rope_attention_factor is not None:
    scaling = float(cfg.rope_attention_factor)
  else:
    scaling = 1.0 if cfg.rope_factor <= 1 else 0.1 * math.log(cfg.rope_factor) + 1.0
  return inv_freq_h.astype(np.float32), scaling


# ModelConfig.rope_type -> (cfg, f_i) -> (f'_i, attention_scaling).
_RULES = {"default": lambda cfg, inv_freq_h: (inv_freq_h, 1.0), "linear": _linear,
          "llama3": _llama3, "yarn": _yarn}


def inverse_frequencies(cfg: ModelConfig) -> tuple[np.ndarray, float]:
  """f'_i (float32, [head_dim / 2]) and the cos/sin scaling for `cfg` (module docstring)."""
  dim = cfg.head_dim
  base_h = np.float32(cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
  return _RULES[cfg.rope_type](cfg, (np.float32(1.0) / base_h).astype(np.float32))


def layer_frequencies(cfg: ModelConfig, index: int) -> tuple[np.ndarray, float]:
  """`inverse_frequencies` of decoder layer `index` (module docstring: local layers)."""
  if cfg.sliding_layer(index):
    return inverse_frequencies(dataclasses.replace(cfg, rope_type="default",
                                                   rope_theta=cfg.rope_local_base_freq))
  return inverse_frequencies(cfg)


def apply(x_BxTxNxH: jax.Array, pos_BxT: jax.Array, inv_freq_h: np.ndarray,
          attention_scaling: float) -> jax.Array:
  """Rotates every head of x by its token's position (module docstring), in float32."""
  half = x_BxTxNxH.shape[-1] // 2
  freqs_BxTxh = pos_BxT.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq_h)[None, None, :]
  angles_BxTx1xH = jnp.concatenate([freqs_BxTxh, freqs_BxTxh], -1)[:, :, None, :]
  cos_BxTx1xH = jnp.cos(angles_BxTx1xH) * attention_scaling
  sin_BxTx1xH = jnp.sin(angles_BxTx1xH) * attention_scaling
  x = x_BxTxNxH.astype(jnp.float32)
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
  return (x * cos_BxTx1xH + rotated * sin_BxTx1xH).astype(x_BxTxNxH.dtype)
