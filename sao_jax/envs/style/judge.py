"""LLM judge over any OpenAI-compatible chat-completions endpoint (stdlib only).

`HttpJudge(base_url=..., model=...)(task, response, style)` POSTs one request
to `{base_url}/chat/completions` asking for `{"quality": 0|1, "style": 0|1}`
and returns the two verdicts as booleans.

Failure handling: each attempt has a `timeout_s` deadline; timeouts, connection
errors, HTTP 429/5xx and malformed replies (not JSON, no `choices`, no JSON
object with 0/1 `quality` and `style` in the message) are retried up to
`retries` more times with exponential backoff; other HTTP errors (401, 404...)
are not retried. When no attempt succeeds, `JudgeError` is raised: the
environment reports an environment failure, never reward 0.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request

from sao_jax.envs.base import Task

_JSON_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)
_INSTRUCTIONS = (
    "You grade one response. Answer with a JSON object and nothing else: "
    '{"quality": 0 or 1, "style": 0 or 1}. quality is 1 if the response does what the '
    "request asks (on topic, mentions the required keyword, respects the length). style is "
    "1 if the response is clearly written in the requested style.")


class JudgeError(RuntimeError):
  """The judge could not give a verdict (unreachable, timed out, malformed)."""


class HttpJudge:
  """Grades (quality, style) with a chat model behind an OpenAI-compatible API.

  `api_key_env` names the environment variable holding the key (sent as
  `Authorization: Bearer ...`); empty means no authentication.
  """

  def __init__(self, *, base_url: str, model: str, api_key_env: str = "",
               timeout_s: float = 30.0, retries: int = 2, backoff_s: float = 0.5):
    if not base_url.startswith(("http://", "https://")):
      raise ValueError(f"judge base_url={base_url!r} is invalid: expected an http:// or "
                       "https:// URL such as 'http://127.0.0.1:8000/v1'.")
    if not model:
      raise ValueError("judge model='' is invalid: name the model the endpoint serves.")
    if not timeout_s > 0 or retries < 0 or backoff_s < 0:
      raise ValueError(f"judge timeout_s={timeout_s!r}, retries={retries!r}, "
                       f"backoff_s={backoff_s!r}: expected timeout > 0, retries >= 0, backoff >= 0.")
    self.api_key = ""
    if api_key_env:
      self.api_key = os.environ.get(api_key_env, "")
      if not self.api_key:
        raise ValueError(f"judge api_key_env={api_key_env!r}: that environment variable is not "
                         "set; export it or set api_key_env='' for an endpoint without auth.")
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model, self.timeout_s, self.retries, self.backoff_s = model, timeout_s, retries, backoff_s

  def __call__(self, task: Task, response: str, style: str) -> tuple[bool, bool]:
    """(quality, style) verdicts; raises JudgeError when every attempt failed."""
    body = json.dumps({
        "model": self.model, "temperature": 0,
        "messages": [
            {"role": "system", "content": _INSTRUCTIONS},
            {"role": "user", "content": f"Request:\n{task.prompt}\n\nRequested style: {style}\n\n"
                                        f"Response:\n{response}"}],
    }).encode()
    headers = {"Content-Type": "application/json"}
    if self.api_key:
      headers["Authorization"] = f"Bearer {self.api_key}"
    errors = []
    for attempt in range(self.retries + 1):
      if attempt:
        time.sleep(self.backoff_s * 2**(attempt - 1))
      try:
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
          return _parse_verdict(reply.read())
      except urllib.error.HTTPError as e:
        errors.append(f"HTTP {e.code}")
        if e.code != 429 and e.code < 500:
          break
      except (urllib.error.URLError, OSError, http.client.HTTPException, JudgeError) as e:
        errors.append(str(getattr(e, "reason", e)) or type(e).__name__)
    raise JudgeError(f"judge at {self.url} failed after {len(errors)} attempt(s): "
                     f"{'; '.join(errors)}")


def _parse_verdict(raw: bytes) -> tuple[bool, bool]:
  try:
    content = json.loads(raw)["choices"][0]["message"]["content"]
    verdict = json.loads(_JSON_OBJECT.search(content).group(0))
    quality, style = verdict["quality"], verdict["style"]
  except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
    raise JudgeError(f"malformed judge reply ({type(e).__name__}): {raw[:200]!r}") from None
  if quality not in (0, 1) or style not in (0, 1):
    raise JudgeError(f"judge verdict must have quality and style in {{0, 1}}, got {verdict}")
  return bool(quality), bool(style)
