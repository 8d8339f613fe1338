#!/usr/bin/env bash
# The accelerator figures in one run (one GPU, JAX with CUDA, <= 8 minutes), all in
# bfloat16: sampler decode tokens/s, the paged decode step's bandwidth fraction and
# the sampler/learner behavior_logp parity (benchmarks/sampler.py), and the learner
# step's MFU (benchmarks/learner.py). Each prints its table and a RESULT line.
#
#   benchmarks/accelerator.sh            # on the GPU; PEAK_TFLOPS=989 (H100/H200 bf16
#                                        # dense) makes `mfu` nominal, else vs a measured dot
#   benchmarks/accelerator.sh --small    # the same pieces at tiny sizes, on CPU
#
# PYTHON (default: python) is the interpreter of an environment with sao_jax's deps
# and jax[cuda]; the repository root goes on PYTHONPATH.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="${ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

case "${1:-}" in
  --small)
    sampler_args=(--small)
    learner_args=(--small)
    limit_s=600 ;;
  "")
    # ~230M params: a decode step at batch 8-32 is a weight read, as on a real model.
    sampler_args=(--hidden 1024 --layers 16 --repeats 3)
    learner_args=(--batch 16 --seq 1024 --steps 5 --matmul-size 8192
                  --peak-tflops "${PEAK_TFLOPS:-0}")
    limit_s=240 ;;
  *)
    echo "usage: $0 [--small]" >&2
    exit 2 ;;
esac

timeout "${limit_s}" "${PYTHON}" "${ROOT}/benchmarks/sampler.py" --dtype bfloat16 --no-hf \
  "${sampler_args[@]}"
timeout "${limit_s}" "${PYTHON}" "${ROOT}/benchmarks/learner.py" --dtype bfloat16 --accelerator \
  "${learner_args[@]}"
