"""`OpenAIPolicy`: one chat call a turn (`ChatClient`), its answer read as the turn's actions."""

from __future__ import annotations

import openai
from django.conf import settings as django_settings

from rollouts.game.tools import INTERACT_MANY_TOOL
from rollouts.policies.base import Decision, Observation, policy_seed
from rollouts.policies.openai.answers import read_answer
from rollouts.policies.openai.chat_client import (
    PLACEHOLDER_API_KEY,
    ChatClient,
    ChatOptions,
    HoldsChatClient,
    retry_after_seconds,
    shared_client,
)
from rollouts.policies.openai.messages import ImageUrls, build_messages
from rollouts.rollout_settings import RolloutSettings
from studio.untrusted import storable

__all__ = ["PLACEHOLDER_API_KEY", "OpenAIPolicy", "retry_after_seconds", "shared_client"]


class OpenAIPolicy(HoldsChatClient):
    # Each turn is a paid request: the recorder checks for a cancel before each one.
    calls_model = True

    def __init__(
        self,
        settings: RolloutSettings,
        *,
        seed: int,
        sample: int = 0,
        client: openai.OpenAI | None = None,
        cli_api_key: str = "",
    ) -> None:
        self.settings = settings
        self.seed = seed
        self.chat = ChatClient(
            ChatOptions.of(settings),
            params={
                "temperature": settings.temperature,
                "max_tokens": settings.max_tokens,
                "tool_choice": "required",
                # The one thing that differs between the samples of a seed: the same batch
                # settings replay the same samples on servers that honour it.
                "seed": policy_seed(seed=seed, sample=sample),
            },
            tools=[INTERACT_MANY_TOOL],
            client=client,
            cli_api_key=cli_api_key,
        )
        # History shows each frame again in later turns: its base64 is made once.
        self.image_urls = ImageUrls(keep=settings.history_frames + 1)

    def close(self) -> None:
        pass  # the client is shared by this process's episodes and outlives them

    def decide(self, observation: Observation) -> Decision:
        stored, sent = build_messages(self.settings, observation, urls=self.image_urls)
        decision = Decision(actions=[], request_messages=stored)
        body, failure = self.chat.call(sent, decision)
        if failure is not None:
            return self._bad(decision, *failure)
        bad = read_answer(body, decision, max_field_bytes=django_settings.STUDIO_MAX_ANSWER_BYTES)
        return self._bad(decision, *bad) if bad else decision

    def _bad(self, decision: Decision, kind: str, message: str) -> Decision:
        decision.error_kind = kind
        decision.error = storable(message, max_bytes=4000)
        if self.settings.on_bad_output == "end":
            decision.actions = []
            decision.end_episode = True
        else:
            decision.actions = ["noop"]
        return decision
