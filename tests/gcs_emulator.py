"""A local GCS for tests: gcp-storage-emulator (GCS's JSON API over HTTP, in memory), with
the parts of GCS it lacks and orbax's clients use added, and read over its API with urllib.

What is added (`complete`), each as GCS documents it:
  - generations on reads: a media download answers `x-goog-generation` and
    `x-goog-metageneration`, and honours `ifGenerationMatch` (412 when it differs) and
    `ifGenerationNotMatch` (304 when it equals). TensorStore's OCDBT driver writes its manifest
    with `ifGenerationMatch=0` and re-reads it with `ifGenerationNotMatch=<the generation it
    wrote>`; without these it takes the emulator's full answer for a changed object of an
    unknown generation, and a save fails now and then with "Malformed StorageGeneration";
  - preconditions on simple (`uploadType=media`) uploads, TensorStore's kind: 412 when
    `ifGenerationMatch` differs from the object's generation ("0": the object must not exist);
  - objects.move (`POST .../o/SOURCE/moveTo/o/DESTINATION`), with which gcsfs renames: the
    emulator answers 501, which gcsfs retries for half a minute before it copies instead.
"""

import json
import urllib.parse
import urllib.request
from http import HTTPStatus


class Emulator:
  """The objects under `prefix` of `bucket` on the emulator at `url`, read and written over
  its JSON API with urllib (none of the clients under test); `uploads` is filled by `complete`."""

  def __init__(self, url: str, bucket: str, prefix: str):
    self.url, self.bucket, self.prefix = url, bucket, prefix
    self.directory = f"gs://{bucket}/{prefix}"
    self.uploads: dict[str, str] = {}  # name -> the client (User-Agent product) that sent it

  def names(self) -> list[str]:
    """The names of the objects under `prefix`, relative to it."""
    query = urllib.parse.urlencode({"prefix": self.prefix + "/"})
    with urllib.request.urlopen(f"{self.url}/storage/v1/b/{self.bucket}/o?{query}") as response:
      items = json.load(response).get("items", [])
    return sorted(item["name"].removeprefix(self.prefix + "/") for item in items)

  def read(self, name: str) -> bytes:
    quoted = urllib.parse.quote(f"{self.prefix}/{name}", safe="")
    with urllib.request.urlopen(
        f"{self.url}/download/storage/v1/b/{self.bucket}/o/{quoted}?alt=media") as response:
      return response.read()

  def write(self, name: str, data: bytes) -> None:
    query = urllib.parse.urlencode({"uploadType": "media", "name": f"{self.prefix}/{name}"})
    request = urllib.request.Request(f"{self.url}/upload/storage/v1/b/{self.bucket}/o?{query}",
                                     data=data, method="POST")
    with urllib.request.urlopen(request):
      pass


def _generation(storage, bucket: str, name: str) -> str | None:
  """The object's generation, None when there is no such object."""
  from gcp_storage_emulator.exceptions import NotFound

  try:
    return str(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return None


def _failed_precondition(request, generation: str, *, read: bool) -> HTTPStatus | None:
  """GCS's status for a request whose generation preconditions do not hold against the
  object's `generation` ("0" for none), None when they hold."""
  match = request.query.get("ifGenerationMatch", [None])[0]
  not_match = request.query.get("ifGenerationNotMatch", [None])[0]
  if match is not None and match != generation:
    return HTTPStatus.PRECONDITION_FAILED
  if not_match is not None and not_match == generation:
    return HTTPStatus.NOT_MODIFIED if read else HTTPStatus.PRECONDITION_FAILED
  return None


def complete(monkeypatch, emulator: Emulator) -> None:
  """Adds to the emulator (for this test, through `monkeypatch`) what the module docstring
  lists, and records in `emulator.uploads` which client sent each object that names itself in
  the upload URL (TensorStore's uploads do; gcsfs' put the name in the body)."""
  from gcp_storage_emulator import server
  from gcp_storage_emulator.handlers import objects

  real_download, real_media_upload = objects.download, objects._media_upload  # pylint: disable=protected-access

  def download(request, response, storage, *args, **kwargs):
    generation = _generation(storage, request.params["bucket_name"], request.params["object_id"])
    if generation is None:  # the emulator's 404
      return real_download(request, response, storage, *args, **kwargs)
    failed = _failed_precondition(request, generation, read=True)
    if failed is not None:
      response.status = failed
      return None
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    response["x-goog-generation"] = generation
    response["x-goog-metageneration"] = str(obj["metageneration"])
    return real_download(request, response, storage, *args, **kwargs)

  def media_upload(request, response, storage):
    request.data  # pylint: disable=pointless-statement  # read the body whatever the answer
    name = request.query["name"][0]
    generation = _generation(storage, request.params["bucket_name"], name) or "0"
    failed = _failed_precondition(request, generation, read=False)
    if failed is not None:
      response.status = failed
      return None
    relative = name.removeprefix(emulator.prefix + "/")
    emulator.uploads[relative] = request.get_header("User-Agent", "").split("/")[0]
    return real_media_upload(request, response, storage)

  def move(request, response, storage, *args, **kwargs):
    """Within a bucket: the emulator's own copy, then the source deleted; answers the moved
    object's resource."""
    from gcp_storage_emulator.exceptions import NotFound

    del args, kwargs
    bucket, source = request.params["bucket_name"], request.params["object_id"]
    try:
      moved = objects._copy(request.base_url, storage, bucket, source, bucket,  # pylint: disable=protected-access
                            request.params["dest_object_id"])
    except NotFound:
      response.status = HTTPStatus.NOT_FOUND
      return
    objects._delete(storage, bucket, source)  # pylint: disable=protected-access
    response.json(moved)

  move_route = (r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
                r"(?P<dest_object_id>.*[^/]+)$", {"POST": move})
  monkeypatch.setattr(objects, "download", download)  # `objects.get` with alt=media calls it
  monkeypatch.setattr(objects, "_media_upload", media_upload)  # `objects.insert` calls it
  monkeypatch.setattr(server, "HANDLERS", (move_route, *server.HANDLERS))
