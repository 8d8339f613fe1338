"""Weight sync of a ~100M-parameter policy: network channel (loopback TCP) vs directory.

  .venv/bin/python benchmarks/weight_sync.py [--reps 5 --param-dtype float32 --dir DIR]

Model: the ~100M dense Qwen3 of benchmarks/forward.py, params in `--param-dtype`
(default float32: 403 MB). One sync = the learner's `publish(params, version)`
of a new version followed by a subscriber's `poll()` that adopts it and its
`jax.device_put` onto the sampler's device (what `sao_jax.sampler.worker` does),
timed until the placed arrays are ready. Both backends run in this process:

  * network   `NetworkWeights` serving over 127.0.0.1; the publisher copies the
              params to host memory and digests them (SHA-256 per 4 MiB chunk, on
              a few threads), and signs each header for the request it answers
              (HMAC-SHA256); the subscriber (authenticated once per connection)
              fetches, checks the signature and every chunk's digest (hashed while
              the next shard arrives) and assembles every leaf.
  * directory `DirectoryWeights`: one orbax checkpoint per version in `--dir`
              (default: a temporary directory on local disk; a bucket or NFS is
              slower), restored by the subscriber.

Each backend syncs a warm-up version, then `--reps` timed new versions; medians
are reported, and the adopted params are checked bit-exact against the published
ones. What authentication adds to a sync is timed on its own: signing the
version's header for a request and checking it at adopt (the handshake happens
once per connection, in the warm-up), and digesting every shard's bytes once
(`digest_seconds_per_sync`: done at publish and again at adopt, partly
overlapped with the transfer; `crc32_seconds_per_sync`, the crc32 protocol 2
computed in its place, is timed alongside); `auth_overhead_ratio` is network sync time over
that time minus the signature's.

LoRA (`lora.enabled`): the learner publishes only the adapters (rank 16 on all
seven projections, float32) and samplers merge them into the base they hold.
`lora_sync_bytes_ratio` is bytes per sync, adapters over the full policy (target
<= 0.05); the adapters are also synced through the network channel, timed the same
way (`lora_sync_seconds_network`). The last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
import zlib

import jax
import numpy as np

from sao_jax.channel import weights, weights_net, weights_wire
from sao_jax.config import LoraConfig, ModelConfig
from sao_jax.models import lora
from sao_jax.models.transformer import init_params

# The model of benchmarks/forward.py.
MODEL = ModelConfig(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                    num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                    tie_word_embeddings=True, logits_chunk=128)
LORA = LoraConfig(enabled=True, rank=16)


def sync_times(publisher, params, reps: int) -> dict[str, float]:
  """Median publish, adopt and total seconds over `reps` new versions after one
  untimed warm-up version (connections, first-touch allocations); checks exactness."""
  subscriber = weights.subscribe(publisher.spec)
  publish, adopt = [], []
  try:
    for version in range(reps + 1):
      start = time.perf_counter()
      publisher.publish(params, version)
      published = time.perf_counter()
      got = subscriber.poll()
      if got is None or got[1] != version:
        raise RuntimeError(f"{type(publisher).__name__}: version {version} was not adopted")
      placed = jax.block_until_ready(jax.device_put(got[0]))
      if version:
        adopt.append(time.perf_counter() - published)
        publish.append(published - start)
    for sent, received in zip(jax.tree.leaves(params), jax.tree.leaves(jax.device_get(placed))):
      if not np.array_equal(np.asarray(sent).reshape(-1).view(np.uint8),
                            np.asarray(received).reshape(-1).view(np.uint8)):
        raise RuntimeError(f"{type(publisher).__name__}: adopted params differ from published")
  finally:
    subscriber.close()
    publisher.close()
  total = [p + a for p, a in zip(publish, adopt)]
  return {"publish": statistics.median(publish), "adopt": statistics.median(adopt),
          "sync": statistics.median(total)}


def auth_seconds(params, reps: int = 20) -> tuple[float, float, float]:
  """Median seconds of what authentication adds to one sync: (sign + check the header
  for a request, SHA-256 of every chunk of every shard once on one thread, and the
  crc32 of every shard it replaced, timed alongside)."""
  publisher = weights_net.NetworkWeights(params)
  try:
    publisher.publish(params, 0)
    header, payloads = publisher._snapshots[0].header, publisher._snapshots[0].payloads
    secret = publisher.spec.secret
  finally:
    publisher.close()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    nonce = weights_wire.new_nonce()
    weights_wire.check_reply(secret, b"header", nonce, header,
                             weights_wire.sign_reply(secret, b"header", nonce, header))
    times.append(time.perf_counter() - start)
  digests, crcs = [], []
  for _ in range(3):  # interleaved with the crc32 that protocol 2 computed, same load
    start = time.perf_counter()
    for payload in payloads:
      weights_wire.chunk_digests(payload)
    digests.append(time.perf_counter() - start)
    start = time.perf_counter()
    for payload in payloads:
      zlib.crc32(payload)
    crcs.append(time.perf_counter() - start)
  return statistics.median(times), statistics.median(digests), statistics.median(crcs)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--dir", help="directory for the directory backend (default: a temp dir)")
  args = parser.parse_args()

  model = dataclasses.replace(MODEL, param_dtype=args.param_dtype)
  params = jax.block_until_ready(init_params(model, jax.random.key(0)))
  count = sum(x.size for x in jax.tree.leaves(params))
  megabytes = sum(x.nbytes for x in jax.tree.leaves(params)) / 1e6
  print(f"model: {count / 1e6:.1f}M params, {args.param_dtype}, {megabytes:.0f} MB; "
        f"{args.reps} syncs per backend")

  network = sync_times(weights_net.NetworkWeights(params), params, args.reps)
  with tempfile.TemporaryDirectory() as tmp:
    directory = sync_times(weights.DirectoryWeights(args.dir or tmp, params), params, args.reps)
  for name, t in (("network", network), ("directory", directory)):
    print(f"{name:9s}  sync {t['sync']:.2f} s (publish {t['publish']:.2f} s, "
          f"adopt {t['adopt']:.2f} s)  {megabytes / 1e3 / t['sync']:.2f} GB/s")
  ratio = directory["sync"] / network["sync"]
  print(f"network sync is {ratio:.1f}x faster than directory")
  adapters = jax.block_until_ready(lora.init_adapters(model, LORA, jax.random.key(1)))
  adapter_megabytes = sum(x.nbytes for x in jax.tree.leaves(adapters)) / 1e6
  bytes_ratio = adapter_megabytes / megabytes
  lora_network = sync_times(weights_net.NetworkWeights(adapters), adapters, args.reps)
  print(f"LoRA r={LORA.rank} ({len(LORA.targets)} projections, float32): "
        f"{adapter_megabytes:.1f} MB per sync, {bytes_ratio:.4f} of the full policy; "
        f"network sync {lora_network['sync']:.3f} s "
        f"({network['sync'] / lora_network['sync']:.1f}x faster than full)")
  auth, digest, crc = auth_seconds(params)
  overhead = network["sync"] / (network["sync"] - auth)
  print(f"authentication: {auth * 1e6:.0f} us per sync (x{overhead:.4f} of network sync); "
        f"SHA-256 of the shards, once, one thread: {digest:.2f} s (their crc32: {crc:.2f} s)")
  print("RESULT " + json.dumps({
      "name": "weight_sync", "params_millions": round(count / 1e6, 1),
      "param_dtype": args.param_dtype, "megabytes": round(megabytes),
      "sync_seconds_network": round(network["sync"], 3),
      "sync_seconds_directory": round(directory["sync"], 3),
      "publish_seconds_network": round(network["publish"], 3),
      "adopt_seconds_network": round(network["adopt"], 3),
      "publish_seconds_directory": round(directory["publish"], 3),
      "adopt_seconds_directory": round(directory["adopt"], 3),
      "directory_over_network": round(ratio, 2),
      "auth_seconds_per_sync": round(auth, 6), "auth_overhead_ratio": round(overhead, 4),
      "digest_seconds_per_sync": round(digest, 3), "crc32_seconds_per_sync": round(crc, 3),
      "lora_rank": LORA.rank, "lora_megabytes": round(adapter_megabytes, 2),
      "lora_sync_bytes_ratio": round(bytes_ratio, 4),
      "lora_sync_seconds_network": round(lora_network["sync"], 4)}))


if __name__ == "__main__":
  main()
