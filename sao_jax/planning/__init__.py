"""Planning pod runs without the pod: AOT-compile for a named TPU topology, check HBM.

  hardware  TPU chip table (HBM, peak bf16 FLOP/s, HBM bandwidth), topology names
  estimate  pure arithmetic: memory totals, analytic FLOPs, roofline, does-not-fit advice
  aot       compile the learner's train step and the sampler's decode step; the plan table

The command line is `sao-plan` (`sao_jax.cli.plan`).
"""
