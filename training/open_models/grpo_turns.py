"""`TurnModel`: one GRPO episode's view of the model being trained (the `EpisodeModel`).

Torch and transformers are used inside the methods only (the `.[train]` extra).

Each `reply` adds a user turn and samples an answer from the model on every token of the
episode so far, with every image so far. What it keeps is what the update needs, token for
token as the model saw them:

- `prompt_ids`: the first turn, rendered whole (the system turn with the tool block, the
  first user turn, the assistant header);
- `completion_ids`: every answer and every later user turn, in order, with `env_mask` 1 for
  the tokens the model sampled and 0 for those the environment added. A later user turn is
  tokenized as a suffix of the conversation (rendered with and without it, the shorter one
  cut after its last end-of-turn token, as TRL's `_get_tool_suffix_ids` does): generated
  text is never tokenized again, which could give other tokens than those sampled. An answer
  cut at `max_answer_tokens` gets its end-of-turn token added with mask 0: the model did not
  write it;
- `images` and `messages`: the frames and the conversation (image parts and answers), which
  the trainer renders to build the pixel values of its own forward pass.
"""

from __future__ import annotations

from typing import Any

_VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
# A conversation rendered before each later user turn, to cut that turn's tokens out.
_DUMMY = [
    {"role": "user", "content": "dummy"},
    {"role": "assistant", "content": "dummy"},
]


class TurnModel:
    def __init__(
        self,
        *,
        model: Any,
        processor: Any,
        system_prompt: str,
        tool: dict[str, Any],
        max_answer_tokens: int,
        temperature: float,
        seed: int,
    ) -> None:
        self.model = model
        self.processor = processor
        self.system_prompt = system_prompt
        self.tool = tool
        self.max_answer_tokens = int(max_answer_tokens)
        self.temperature = float(temperature)
        self.seed = int(seed)
        tokenizer = processor.tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        generation_eos = model.generation_config.eos_token_id
        if generation_eos is None:
            generation_eos = []
        elif isinstance(generation_eos, int):
            generation_eos = [generation_eos]
        self.stop_ids = sorted({self.eos_id, *[int(i) for i in generation_eos]})
        self.pad_id = tokenizer.pad_token_id
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        # Never sampled: an image pad the model wrote would be taken for a frame's patch by
        # the forward pass (which counts them against the frames), so an answer cannot hold
        # one; the answer is sampled from the policy without these few tokens.
        self.suppressed = [
            tokenizer.convert_tokens_to_ids(text)
            for text in _VISION_TOKENS
            if tokenizer.convert_tokens_to_ids(text) != tokenizer.unk_token_id
        ]
        self.prompt_ids: list[int] = []
        self.completion_ids: list[int] = []
        self.env_mask: list[int] = []
        self.images: list[Any] = []
        # Each image's pixel values and grid, made once when its turn is tokenized: every
        # later answer is sampled on all of them.
        self._pixel_values: list[Any] = []
        self._image_grids: list[Any] = []
        self._dummy_ids: list[int] | None = None
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}]
        self.answers: list[str] = []
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0

    @property
    def turns(self) -> int:
        return len(self.answers)

    def reply(self, content: list[dict[str, Any]]) -> str:
        turn_images = [part["image"] for part in content if part.get("type") == "image"]
        user = {"role": "user", "content": list(content)}
        if not self.prompt_ids:
            text = self.processor.apply_chat_template(
                [*self.messages, user],
                tools=[self.tool],
                add_generation_prompt=True,
                tokenize=False,
            )
            self.prompt_ids = self._tokenize(text, turn_images)
        else:
            suffix = self._suffix_ids(user, turn_images)
            self.completion_ids += suffix
            self.env_mask += [0] * len(suffix)
        self.messages.append(user)
        self.images += turn_images
        # What this answer was sampled on and how long it is, as a server's usage says it.
        self.last_prompt_tokens = len(self.prompt_ids) + len(self.completion_ids)
        answer = self._sample()
        self.last_completion_tokens = len(answer)
        self.completion_ids += answer
        self.env_mask += [1] * len(answer)
        if not answer or answer[-1] not in self.stop_ids:
            # Cut at max_answer_tokens: the turn still ends, but the model did not end it.
            self.completion_ids.append(self.eos_id)
            self.env_mask.append(0)
        kept = [i for i in answer if i not in self.stop_ids and i != self.pad_id]
        # Special tokens kept: `<tool_call>` is one, and the policy's parser reads it.
        text = self.processor.tokenizer.decode(kept, skip_special_tokens=False)
        self.messages.append({"role": "assistant", "content": text})
        self.answers.append(text)
        return text

    def _tokenize(self, text: str, images: list[Any]) -> list[int]:
        """`text` as the processor tokenizes it, each image's pad token repeated per patch;
        the images' pixel values and grids are kept for sampling."""
        encoded = self.processor(text=[text], images=images or None, return_tensors="pt")
        if images:
            self._pixel_values.append(encoded["pixel_values"])
            self._image_grids.append(encoded["image_grid_thw"])
        return [int(i) for i in encoded["input_ids"][0].tolist()]

    def _suffix_ids(self, user: dict[str, Any], images: list[Any]) -> list[int]:
        render = self.processor.apply_chat_template
        if self._dummy_ids is None:
            # The same conversation before every later user turn: rendered once.
            dummy = self._tokenize(render(_DUMMY, add_generation_prompt=False, tokenize=False), [])
            ends = [i for i, token in enumerate(dummy) if token == self.eos_id]
            self._dummy_ids = dummy[: ends[-1] + 1] if ends else dummy
        prefix = self._dummy_ids
        full = self._tokenize(
            render([*_DUMMY, user], add_generation_prompt=True, tokenize=False), images
        )
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template renders a user turn into the turns before it")
        return full[len(prefix) :]

    def _sample(self) -> list[int]:
        """The answer's token ids, sampled from the model on the whole episode so far."""
        import torch  # the train extra

        ids = self.prompt_ids + self.completion_ids
        input_ids = torch.tensor([ids], dtype=torch.long)
        inputs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
        }
        if self._pixel_values:
            inputs["pixel_values"] = torch.cat(self._pixel_values)
            inputs["image_grid_thw"] = torch.cat(self._image_grids)
            # Which tokens are image patches: Qwen2-VL's multimodal positions need it.
            inputs["mm_token_type_ids"] = (input_ids == self.image_token_id).long()
        device = next(self.model.parameters()).device
        inputs = {key: value.to(device) for key, value in inputs.items()}
        was_training = self.model.training
        devices = [device] if device.type == "cuda" else []
        # The episode's own seed: the same (iteration, seed, member) samples the same answers,
        # whatever ran before it in the process (a resumed run plays what it would have).
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed((self.seed * 1009 + len(self.answers)) % 2**63)
            self.model.eval()  # no dropout: the answer is the policy's own
            try:
                out = self.model.generate(
                    **inputs,
                    max_new_tokens=self.max_answer_tokens,
                    do_sample=True,
                    temperature=self.temperature,
                    top_k=0,
                    top_p=1.0,
                    eos_token_id=self.stop_ids,
                    pad_token_id=self.pad_id,
                    suppress_tokens=self.suppressed or None,
                )
            finally:
                self.model.train(was_training)
        return [int(i) for i in out[0, len(ids) :].tolist()]
