"""The `openai` policy: chat completions on any OpenAI-compatible endpoint.

One turn is one model call. The request holds the system prompt and one user message: the
last K turns when `history_frames` is K (a text of the actions taken, then their frames,
oldest first), then the text observation and the current frame as a
`data:image/png;base64,...` URL of exactly the stored PNG. `observation_mode` drops the
image (`text`) or the text observation (`image`). The one tool is `interact_many`
(`rollouts.game.tools`), with `tool_choice` `required`.

What is stored on the turn is the same request with each image part holding
`{"frame_step": N, "detail": ...}` instead of base64: the frame row is the one copy.

Faults, all recorded on the turn (`error_kind`, `error`, `retries`):

* 429, 408, 409, 5xx, timeouts and dropped connections are retried with jittered
  exponential backoff, honouring `Retry-After` / `retry-after-ms`, up to `max_retries`; each
  retry holds the endpoint's limiter again (and waits for the limiter's Redis when it is
  away, as for a slot: `rate_limit`; a cancel or a lost claim still stops it, through
  `before_retry`). After the last one the turn failed
  (`http_<status>`, `timeout`, `connection`) and `on_bad_output` decides: play `noop` or end
  the episode.
* Bad output (`malformed_arguments`, `unknown_action`, `wrong_tool`, `no_tool_call`,
  `empty_answer`, `refusal`) is not retried: the answer is what the model does with this
  observation. Same `on_bad_output` rule. A text answer without a tool call goes through the
  documented fallback in `rollouts.game.text_actions` first (`text_fallback`).
* A hostile or broken answer is bad output too, never a lost episode: bodies are read in
  bounded memory (`transport`), parsed and cleaned by `answers.read_answer`
  (`invalid_response`, `answer_too_large`, `truncated_answer`, `invalid_text`).
* The URL and key come from `rollouts.policies.endpoints`: an admin-named endpoint's key goes
  to that endpoint's URL only. Connection errors say "unreachable" and nothing more.
* The endpoint is read again before every request, the first and each retry (one read a
  second or so serves the process): once an admin disabled, removed or moved it or gave it
  another key, `PolicyUnavailable` says so in one line ("endpoint 'x' was disabled by an
  admin") and no request carries its key any more.
* An endpoint that cannot be reached on the episode's first call (after a short bounded
  retry), or that rejects it as misconfigured (401, 403, 404), raises `PolicyUnavailable`:
  the batch fails in seconds with one clear error. So does an endpoint that fails
  `STUDIO_OPENAI_MAX_FAILED_TURNS` turns in a row after all retries.
* A 400 that names a parameter the server does not take (`max_tokens` on reasoning models,
  `temperature`, `tool_choice` "required" on some local servers) is adapted once and resent.
"""

from rollouts.policies.kinds import PolicyKind, register
from rollouts.policies.openai.answers import read_answer
from rollouts.policies.openai.chat_client import (
    PLACEHOLDER_API_KEY,
    ChatClient,
    ChatOptions,
    HoldsChatClient,
    retry_after_seconds,
    shared_client,
)
from rollouts.policies.openai.messages import build_messages
from rollouts.policies.openai.policy import OpenAIPolicy

# The batch options of a model behind an endpoint: shown on the page for this kind, and for
# any other kind that lists them.
OPTIONS = (
    "model",
    "endpoint",
    "history_frames",
    "concurrency",
    "temperature",
    "max_tokens",
    "image_detail",
    "observation_mode",
    "on_bad_output",
    "max_retries",
    "request_timeout",
    "requests_per_minute",
)


def _images_per_call(settings) -> int:
    return 0 if settings.observation_mode == "text" else 1 + settings.history_frames


OPENAI = register(
    PolicyKind(
        name="openai",
        factory=OpenAIPolicy,
        help="openai asks a model",
        calls_model=True,
        options=OPTIONS,
        images_per_call=_images_per_call,
    )
)

__all__ = [
    "OPENAI",
    "OPTIONS",
    "PLACEHOLDER_API_KEY",
    "ChatClient",
    "ChatOptions",
    "HoldsChatClient",
    "OpenAIPolicy",
    "build_messages",
    "read_answer",
    "retry_after_seconds",
    "shared_client",
]
