"""Every refusal and limit of the agent endpoint, met by the real `openai` client.

Each refusal is OpenAI's error body (`{"error": {"message", "type", "param", "code"}}`)
with the status OpenAI uses, so the client raises its own typed error."""

import threading
import time

import httpx
import openai
import pytest

from sao_jax.config import EnvConfig
from sao_jax.envs.agent import protocol, server, spec as agent_spec

LIMITS = server.Limits(host="127.0.0.1", port=0, max_sessions=2, max_body_bytes=4096,
                       max_messages=3, model_name="tiny-policy")
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def endpoint():
  return server.Endpoint(LIMITS)


@pytest.fixture
def session(endpoint):
  session = endpoint.open_session()
  yield session
  endpoint.close_session(session)


def client(endpoint, key):
  return openai.OpenAI(base_url=endpoint.base_url, api_key=key, max_retries=0, timeout=10)


def error_of(raised) -> dict:
  return raised.value.body  # the parsed "error" object of OpenAI's error body


def test_binds_to_loopback_and_lists_its_model(endpoint, session):
  assert endpoint.base_url.startswith("http://127.0.0.1:")
  assert [m.id for m in client(endpoint, session.api_key).models.list()] == ["tiny-policy"]


def test_remote_hosts_need_allow_remote():
  with pytest.raises(ValueError, match=r"env.options.host='0.0.0.0' is invalid.*allow_remote"):
    agent_spec.AgentOptions(program="m:f", host="0.0.0.0").validate()
  agent_spec.AgentOptions(program="m:f", host="0.0.0.0", allow_remote=True).validate()


def test_a_wrong_run_token_is_401(endpoint, session):
  forged = "x" * len(endpoint.run_token) + "." + session.episode
  with pytest.raises(openai.AuthenticationError) as raised:
    client(endpoint, forged).chat.completions.create(model="m", messages=USER)
  assert raised.value.status_code == 401 and error_of(raised)["code"] == "invalid_api_key"
  response = httpx.post(endpoint.base_url + "/chat/completions", json={"messages": USER})
  assert response.status_code == 401  # no Authorization header at all


def test_an_episode_that_is_not_open_is_404(endpoint):
  with pytest.raises(openai.NotFoundError) as raised:
    client(endpoint, f"{endpoint.run_token}.e999").chat.completions.create(model="m",
                                                                           messages=USER)
  assert error_of(raised)["code"] == "episode_not_found"


def test_a_body_over_the_limit_is_413(endpoint, session):
  with pytest.raises(openai.APIStatusError) as raised:
    client(endpoint, session.api_key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x" * 5000}])
  assert raised.value.status_code == 413 and error_of(raised)["code"] == "request_too_large"


def test_more_messages_than_the_limit_is_400(endpoint, session):
  with pytest.raises(openai.BadRequestError) as raised:
    client(endpoint, session.api_key).chat.completions.create(model="m", messages=USER * 4)
  assert error_of(raised)["code"] == "too_many_messages"
  assert error_of(raised)["param"] == "messages"


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("stream", True), ("stop", ["\n"]), ("tool_choice", "required"),
    ("top_logprobs", 3), ("logit_bias", {"1": 5}),
    ("response_format", {"type": "json_object"})])
def test_what_cannot_be_served_is_400_naming_the_field(endpoint, session, field, value):
  with pytest.raises(openai.BadRequestError) as raised:
    client(endpoint, session.api_key).chat.completions.create(
        model="m", messages=USER, **{field: value})
  assert error_of(raised)["param"] == field and error_of(raised)["type"] == "invalid_request_error"
  assert session.events.empty()  # refused before the episode saw it


@pytest.mark.parametrize("messages, param", [
    ([{"role": "narrator", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0]"),
    ([{"role": "tool", "content": "4"}], "messages[0].tool_call_id")])
def test_messages_that_cannot_be_rendered_are_400(endpoint, session, messages, param):
  with pytest.raises(openai.BadRequestError) as raised:
    client(endpoint, session.api_key).chat.completions.create(model="m", messages=messages)
  assert error_of(raised)["param"] == param


def test_one_call_at_a_time_per_episode_and_none_after_it_ends(endpoint, session):
  first = {}
  thread = threading.Thread(target=lambda: first.setdefault("error", _call_error(endpoint, session)))
  thread.start()
  kind, request = session.next_event(10.0)  # the first call reached the episode
  assert kind == "call" and request.messages == tuple(USER)
  with pytest.raises(openai.ConflictError) as raised:
    client(endpoint, session.api_key).chat.completions.create(model="m", messages=USER)
  assert error_of(raised)["code"] == "call_in_flight"
  endpoint.close_session(session)  # the episode ends with the first call pending
  thread.join(10)
  assert first["error"].status_code == 409 and first["error"].body["code"] == "episode_ended"
  with pytest.raises(openai.NotFoundError):  # and it is gone
    client(endpoint, session.api_key).chat.completions.create(model="m", messages=USER)


def _call_error(endpoint, session):
  try:
    client(endpoint, session.api_key).chat.completions.create(model="m", messages=USER)
  except openai.APIStatusError as error:
    return error
  return None


def test_a_reward_must_be_a_number(endpoint, session):
  response = httpx.post(endpoint.base_url + "/episode/end", json={"reward": "1.0"},
                        headers={"Authorization": f"Bearer {session.api_key}"})
  assert response.status_code == 400 and response.json()["error"]["param"] == "reward"
  response = httpx.post(endpoint.base_url + "/episode/end", json={"reward": 0.25},
                        headers={"Authorization": f"Bearer {session.api_key}"})
  assert response.status_code == 200 and session.next_event(1.0) == ("end", 0.25)


def test_sessions_are_bounded():
  endpoint = server.Endpoint(LIMITS)
  endpoint.open_session(), endpoint.open_session()
  with pytest.raises(server.SessionLimit, match="max_sessions=2"):
    endpoint.open_session()


def test_the_time_limit_stays_below_the_step_timeout():
  with pytest.raises(ValueError, match="time_limit_s=300.0 is not below env.step_timeout_s=300.0"):
    agent_spec.check(agent_spec.AgentOptions(program="m:f", time_limit_s=300.0),
                     EnvConfig(step_timeout_s=300.0))


def test_turn_ends_map_to_openai_finish_reasons():
  assert protocol.FINISH_REASONS == {"stop_token": "stop", "stop_pattern": "stop",
                                     "max_new_tokens": "length", "max_seq_len": "length"}
  text = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>' \
         '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
  head, calls = protocol.split_calls(text, "hermes")
  assert head == "Adding." and [c.arguments["a"] for c in calls] == [1, 2]
  assert protocol.split_calls("<tool_call>{bad json</tool_call>", "hermes") == (
      "<tool_call>{bad json</tool_call>", [])


def test_a_tool_calling_turn_is_an_openai_completion_with_tool_calls():
  from openai.types.chat import ChatCompletion

  from sao_jax.envs.base import SampledTurn
  request = protocol.parse_request({"messages": USER, "logprobs": True}, max_messages=3)
  text = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
  turn = SampledTurn(tokens=(7, 8), behavior_logp=(-0.5, -1.25), finish_reason="stop_token",
                     policy_versions=(3, 3), token_text=lambda i: f"<{i}>", context_tokens=40)
  body, message, _ = protocol.completion(request, turn, text, fmt="hermes", call_ids="e0_1")
  parsed = ChatCompletion.model_validate(body)  # the client's own model of the response
  choice = parsed.choices[0]
  assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
  call, = choice.message.tool_calls
  assert (call.id, call.function.name, call.function.arguments) == (
      "call_e0_1_0", "add", '{"a": 1, "b": 2}')
  assert [(e.token, e.logprob) for e in choice.logprobs.content] == [("<7>", -0.5), ("<8>", -1.25)]
  usage = parsed.usage
  assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (40, 2, 42)


def test_served_alone_a_new_name_opens_an_episode_until_max_sessions_then_429():
  served = server.Endpoint(LIMITS, open_on_call=True)
  ended = []

  def call(name):
    with pytest.raises(openai.ConflictError) as raised:  # never answered: its episode ends
      client(served, f"{served.run_token}.{name}").chat.completions.create(model="m",
                                                                           messages=USER)
    ended.append(error_of(raised)["code"])

  pending = [threading.Thread(target=call, args=(name,)) for name in ("a", "b")]
  try:
    for thread in pending:  # two calls open two episodes and wait for their turns
      thread.start()
    opened = sorted(served.arrivals.get(timeout=10).episode for _ in pending)
    assert opened == ["a", "b"] and served.open_sessions == LIMITS.max_sessions
    with pytest.raises(openai.RateLimitError) as raised:
      client(served, f"{served.run_token}.c").chat.completions.create(model="m", messages=USER)
    assert raised.value.status_code == 429 and error_of(raised)["code"] == "too_many_sessions"
    # Only a chat call opens an episode; and the run token still authenticates.
    with pytest.raises(openai.NotFoundError):
      client(served, f"{served.run_token}.d").models.list()
    with pytest.raises(openai.AuthenticationError):
      client(served, "forged.e").chat.completions.create(model="m", messages=USER)
  finally:
    for name in ("a", "b"):
      with served._lock:
        session = served._sessions[name]
      served.close_session(session)  # the pending calls get 409 and return
    for thread in pending:
      thread.join(timeout=10)
    served.stop()
  assert ended == ["episode_ended"] * 2
