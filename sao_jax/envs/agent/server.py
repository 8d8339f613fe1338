"""The HTTP door: an OpenAI-compatible endpoint whose calls are episodes' turns.

    endpoint = Endpoint.shared(limits)         # one per process and set of limits, started once
    session = endpoint.open_session()          # an episode's rendezvous; its api_key
    kind, *payload = session.next_event(timeout_s)   # on the environment's thread
    session.answer(200, body)                  # the pending call's response
    endpoint.close_session(session)

Routes (OpenAI's; docs/reference/agent-endpoint.md): `POST /v1/chat/completions`,
`GET /v1/models`, and `POST /v1/episode/end` (`{"reward": number}` optional) by
which a program ends its episode. Every route needs `Authorization: Bearer
<run-token>.<episode-id>`, the API key each episode's program is given: the
run token (random, per endpoint) authenticates, the episode id routes. The
openai client sends its `api_key` exactly so, so an unmodified client carries
the episode's identity.

Why aiohttp: one maintained package (no separate ASGI server), asyncio all the
way, so thousands of idle keep-alive connections of agents waiting on their
tools cost a coroutine each, not a thread; it reads bodies under
`client_max_size`, which is the body-size bound. The event loop runs on one
daemon thread; a call is handed to its episode's environment, which runs on the
sampler's step threads (`sao_jax.sampler.env_steps`), through a queue, and the
handler awaits the answer as a future: a program's slow tool never holds a
thread of the engine, and the engine's continuous batching serves every
episode's turns together.

Refusals, each with OpenAI's error body (`protocol.error_body`): 401 without the
run's token, 404 for an episode that is not open, 409 for a second call of one
episode while its first is pending or after the episode ended, 413 for a body
over `max_body_bytes`, 400 for what cannot be rendered (`protocol`) or more than
`max_messages` messages. An episode that finds `max_sessions` sessions open fails
at `open_session` (`SessionLimit`) before its program starts. The endpoint binds
to loopback unless the options allow another host (`spec.AgentOptions`).

Served alone (`open_on_call`, `sao-eval --serve`): a chat call whose key names an
episode that is not open opens it, under the client's own name (`EPISODE_NAME`),
and queues its session on `arrivals`, where an episode waiting for a client takes
it; with `max_sessions` open, such a call gets 429. An episode that ended can be
opened again under its name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import itertools
import json
import queue
import re
import secrets
import threading
from typing import Any

from sao_jax.envs.agent import protocol
from sao_jax.envs.agent.protocol import ApiError


@dataclasses.dataclass(frozen=True)
class Limits:
  """What an endpoint binds to and bounds (`env.options` of the agent environment)."""

  host: str
  port: int
  max_sessions: int
  max_body_bytes: int
  max_messages: int
  model_name: str


# An episode name a client chooses (`open_on_call`): what an API key can carry unescaped.
EPISODE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SessionLimit(RuntimeError):
  """`max_sessions` episodes are already open."""


class Session:
  """One episode's calls: the HTTP side puts events, the environment takes them.

  Events: ("call", ChatRequest) with the call pending until `answer`; ("end",
  reward or None) from `POST /v1/episode/end`; ("exit", value or exception) when the
  program returns (`AgentEnv` puts it)."""

  def __init__(self, episode: str, api_key: str):
    self.episode, self.api_key = episode, api_key
    self.events: queue.SimpleQueue = queue.SimpleQueue()
    self.closed = False
    self._pending: concurrent.futures.Future | None = None
    self._lock = threading.Lock()

  def call(self, request: protocol.ChatRequest) -> concurrent.futures.Future:
    """From the HTTP side: queues a call; its future resolves to (status, body)."""
    with self._lock:
      if self.closed:
        raise ApiError(409, f"episode {self.episode} has ended; start a new episode",
                       code="episode_ended")
      if self._pending is not None:
        raise ApiError(409, f"episode {self.episode} already has a call in flight; an episode "
                       "is one conversation, called one turn at a time", code="call_in_flight")
      self._pending = concurrent.futures.Future()
      self.events.put(("call", request))
      return self._pending

  def post(self, *event: Any) -> None:
    self.events.put(event)

  def next_event(self, timeout_s: float) -> tuple:
    """The next event; queue.Empty after `timeout_s` seconds."""
    return self.events.get(timeout=max(timeout_s, 0.0))

  def answer(self, status: int, body: dict[str, Any]) -> None:
    """Resolves the pending call."""
    with self._lock:
      pending, self._pending = self._pending, None
    if pending is not None and not pending.done():
      pending.set_result((status, body))

  def close(self) -> None:
    with self._lock:
      self.closed = True
    self.answer(409, protocol.error_body(ApiError(
        409, f"episode {self.episode} has ended", code="episode_ended")))


class Endpoint:
  """An aiohttp server on a daemon thread (module docstring)."""

  _shared: dict[Limits, "Endpoint"] = {}
  _shared_lock = threading.Lock()

  @classmethod
  def shared(cls, limits: Limits) -> "Endpoint":
    """This process's endpoint for `limits`, started on first use."""
    with cls._shared_lock:
      if limits not in cls._shared:
        cls._shared[limits] = cls(limits)
      return cls._shared[limits]

  def __init__(self, limits: Limits, *, open_on_call: bool = False):
    self.limits, self.open_on_call = limits, open_on_call
    self.arrivals: queue.SimpleQueue = queue.SimpleQueue()  # sessions a first call opened
    self.run_token = secrets.token_urlsafe(24)
    self._sessions: dict[str, Session] = {}
    self._lock = threading.Lock()
    self._ids = itertools.count()
    self._loop = asyncio.new_event_loop()
    started = concurrent.futures.Future()
    self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True,
                                    name="agent-endpoint")
    self._thread.start()
    self.port = started.result(timeout=30)

  @property
  def base_url(self) -> str:
    return f"http://{self.limits.host}:{self.port}/v1"

  def open_session(self) -> Session:
    with self._lock:
      return self._open(f"e{next(self._ids)}")

  def _open(self, episode: str) -> Session:
    """Under the lock: a new session named `episode` (SessionLimit when full)."""
    if len(self._sessions) >= self.limits.max_sessions:
      raise SessionLimit(f"{len(self._sessions)} agent episodes are open, the endpoint's limit "
                         f"(env.options.max_sessions={self.limits.max_sessions})")
    session = Session(episode, f"{self.run_token}.{episode}")
    self._sessions[episode] = session
    return session

  def close_session(self, session: Session) -> None:
    session.close()
    with self._lock:
      self._sessions.pop(session.episode, None)

  def stop(self) -> None:
    """Closes the listening socket and the connections, and ends the event loop's thread
    (an endpoint served alone; the shared ones live as long as their process)."""
    asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=30)

  @property
  def open_sessions(self) -> int:
    with self._lock:
      return len(self._sessions)

  # ---- the event loop's side ----

  def _serve(self, started: concurrent.futures.Future) -> None:
    from aiohttp import web  # the `agent` extra: only this path needs it

    asyncio.set_event_loop(self._loop)
    app = web.Application(client_max_size=self.limits.max_body_bytes)
    app.router.add_post("/v1/chat/completions", self._completions)
    app.router.add_get("/v1/models", self._models)
    app.router.add_post("/v1/episode/end", self._end)
    runner = self._runner = web.AppRunner(app, access_log=None)
    try:
      self._loop.run_until_complete(runner.setup())
      site = web.TCPSite(runner, self.limits.host, self.limits.port)
      self._loop.run_until_complete(site.start())
      started.set_result(site._server.sockets[0].getsockname()[1])  # the bound port (0: any)
    except BaseException as error:  # the caller raises it (a port in use, a bad host)
      started.set_exception(error)
      return
    self._loop.run_forever()

  @staticmethod
  def _reply(status: int, body: dict[str, Any]):
    from aiohttp import web
    return web.json_response(body, status=status)

  def _session(self, request) -> Session:
    header = request.headers.get("Authorization", "")
    token, _, episode = header.removeprefix("Bearer ").strip().partition(".")
    if not header.startswith("Bearer ") or not hmac.compare_digest(
        token.encode(), self.run_token.encode()):
      raise ApiError(401, "invalid API key: send the episode's key (OPENAI_API_KEY) as "
                     "'Authorization: Bearer <run-token>.<episode-id>'",
                     type="authentication_error", code="invalid_api_key")
    with self._lock:
      session = self._sessions.get(episode)
      if session is None and self.open_on_call and request.path == "/v1/chat/completions":
        session = self._arrive(episode)
    if session is None:
      raise ApiError(404, f"episode {episode[:40]!r} is not open (ended, or never started)",
                     code="episode_not_found")
    return session

  def _arrive(self, episode: str) -> Session:
    """Under the lock (`open_on_call`): the session a client's first call opens."""
    if not EPISODE_NAME.fullmatch(episode):
      raise ApiError(401, f"episode name {episode[:40]!r} in the API key: expected 1 to 64 "
                     "letters, digits, '_' or '-' after the run token and a '.'",
                     type="authentication_error", code="invalid_api_key")
    try:
      session = self._open(episode)
    except SessionLimit as error:
      raise ApiError(429, f"{error}; end an episode (POST /v1/episode/end) first",
                     type="rate_limit_error", code="too_many_sessions") from None
    self.arrivals.put(session)
    return session

  async def _json(self, request) -> Any:
    from aiohttp import web
    try:
      raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
      raise ApiError(413, f"the request body exceeds the endpoint's limit of "
                     f"{self.limits.max_body_bytes} bytes (env.options.max_body_bytes)",
                     code="request_too_large") from None
    try:
      return json.loads(raw)
    except ValueError:
      raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None

  async def _completions(self, request):
    try:
      session = self._session(request)
      chat = protocol.parse_request(await self._json(request),
                                    max_messages=self.limits.max_messages)
      status, body = await asyncio.wrap_future(session.call(chat))
    except ApiError as error:
      return self._reply(error.status, protocol.error_body(error))
    return self._reply(status, body)

  async def _models(self, request):
    try:
      self._session(request)
    except ApiError as error:
      return self._reply(error.status, protocol.error_body(error))
    return self._reply(200, {"object": "list", "data": [
        {"id": self.limits.model_name, "object": "model", "created": 0, "owned_by": "sao_jax"}]})

  async def _end(self, request):
    try:
      session = self._session(request)
      body = await self._json(request)
      reward = body.get("reward") if isinstance(body, dict) else None
      if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise ApiError(400, f"reward: {reward!r} is not a number", param="reward",
                       code="invalid_value")
      if session.closed:
        raise ApiError(409, f"episode {session.episode} has ended", code="episode_ended")
      session.post("end", reward)
    except ApiError as error:
      return self._reply(error.status, protocol.error_body(error))
    return self._reply(200, {"episode": session.episode, "ended": True})
