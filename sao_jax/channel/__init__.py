"""The learner-sampler contract: everything that crosses between the two sides.

- `records`, `sealed`: a finished trajectory's bytes and their authentication.
- `transport`: how trajectories travel (same host: a queue; many hosts: record files).
- `weights*`: the versioned weight channels (shared memory, directory, network),
  their digests and wire format.
- `published`: what the learner publishes each version and how a sampler turns it
  into the policy it decodes with.
- `run_secret`: the per-run key that signs both directions; `bounded_json`: the
  size- and depth-bounded JSON every peer message is parsed with.

The learner (`sao_jax.learner`, `sao_jax.jobs.train`) and the samplers
(`sao_jax.sampler`) import this package and never each other.
"""
