"""Reading the traces `sao-train --profile` writes (`sao_jax.run.profile`), for the tests."""

import gzip
import json
import pathlib


def trace_events(directory: pathlib.Path) -> list[dict]:
  """The events of the one trace under `directory` (`<host>.trace.json.gz`, the Chrome
  trace format TensorBoard's profile plugin and Perfetto read), once the xplane and
  Perfetto files of the same trace are there too."""
  [path] = directory.glob("plugins/profile/*/*.trace.json.gz")
  assert list(path.parent.glob("*.xplane.pb")) and (path.parent / "perfetto_trace.json.gz").is_file()
  return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def spans(events: list[dict], name: str) -> list[int]:
  """The step numbers of the complete spans called `name`, in trace order."""
  return [int(e["args"]["step_num"]) for e in events if e.get("name") == name and e["ph"] == "X"]
