"""A tiny vision-language model of a real architecture, built from scratch in seconds.

Nothing can be downloaded from a hub here, and a first run of the open-model loop should not
need a GPU: `build_tiny_vlm` makes a `Qwen2VLForConditionalGeneration` with a few layers and
random weights, a byte-level BPE tokenizer trained on the fly with Qwen's special tokens, and
the real `Qwen2VLProcessor`, saved as a directory the Auto classes load offline. TRL trains
it, `transformers serve` serves it, exactly as a real Qwen2-VL checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Qwen2-VL's special tokens, in its order: the processor and the serving engine's tool-call
# parser look them up by text.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
)

# Qwen's chat template in spirit: tools render into the system turn as Qwen2.5 does, and a
# tool call is `<tool_call>{json}</tool_call>` text, which `transformers serve` parses back
# into `tool_calls` for the qwen2_vl model type. No whitespace control (`{%-`): it once
# swallowed the newline after `<|im_start|>assistant`, which the serving parser anchors on.
CHAT_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% if messages[0]['content'] is string %}{% set ns.system = messages[0]['content'] %}"
    "{% else %}{% for part in messages[0]['content'] %}{% if part['type'] == 'text' %}"
    "{% set ns.system = ns.system + part['text'] %}{% endif %}{% endfor %}{% endif %}"
    "{% endif %}"
    "{% if tools %}{% set ns.system = ns.system + '\n\n# Tools\n\n<tools>' %}"
    "{% for tool in tools %}{% set ns.system = ns.system + '\n' + (tool | tojson) %}{% endfor %}"
    "{% set ns.system = ns.system + '\n</tools>\n\nCall a tool as <tool_call>"
    '{"name": <name>, "arguments": <arguments>}</tool_call>\' %}{% endif %}'
    "{% if ns.system %}<|im_start|>system\n{{ ns.system }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    '<tool_call>{"name": "{{ function[\'name\'] }}", "arguments": '
    "{{ function['arguments'] if function['arguments'] is string "
    "else (function['arguments'] | tojson) }}}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySize:
    """The model's shape: the defaults train a few dozen steps a minute on two CPU cores."""

    text_layers: int = 2
    hidden: int = 64
    heads: int = 4
    vision_depth: int = 2
    vision_dim: int = 32
    vocab: int = 1024
    # Crafter frames are small: at most this many pixels reach the vision tower (28 x 28
    # pixel cells, each one image token after the 2 x 2 merge).
    max_pixels: int = 112 * 112


def _corpus() -> list[str]:
    """Lines the tokenizer learns from: the words the studio's prompts, tools and answers
    use, so they become few tokens each."""
    from rollouts.game.crafter_env import ACTIONS

    words = [
        "You are playing Crafter. Look at the frame and choose actions.",
        "Answer with one letter.",
        "interact_many actions",
        '{"name": "interact_many", "arguments": {"actions": ["noop"]}}',
        "health food drink energy sapling wood stone coal iron diamond table furnace",
        "pickaxe sword water grass sand tree lava zombie skeleton cow plant arrow",
        "up down left right north south east west facing nearest inventory",
        "A B C D E F yes no day night asleep awake",
    ]
    words += [f'"{name}"' for name in ACTIONS]
    return words * 40 + [json.dumps({"actions": list(ACTIONS)})] * 20


def _tokenizer(size: TinySize) -> Any:
    """A byte-level BPE trained on `_corpus`, with Qwen's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        _corpus(),
        trainers.BpeTrainer(
            vocab_size=size.vocab,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_vlm(directory: Path | str, *, size: TinySize | None = None, seed: int = 0) -> Path:
    """Write a tiny Qwen2-VL (random weights, `seed`), its tokenizer and processor to
    `directory` and return it. Needs the `.[train]` extra; downloads nothing."""
    import torch
    from transformers import (
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    size = size or TinySize()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    tokenizer = _tokenizer(size)
    token = tokenizer.convert_tokens_to_ids

    image_processor = Qwen2VLImageProcessor(
        min_pixels=28 * 28, max_pixels=size.max_pixels, patch_size=14, merge_size=2
    )
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    config = qwen2_vl_config(
        tokenizer,
        text={
            "vocab_size": len(tokenizer),
            "hidden_size": size.hidden,
            "intermediate_size": size.hidden * 4,
            "num_hidden_layers": size.text_layers,
            "num_attention_heads": size.heads,
            "num_key_value_heads": size.heads,
            "max_position_embeddings": 4096,
        },
        # Qwen2-VL's multimodal rotary sections (time, height, width) sum to half a head's width.
        mrope_section=_mrope_sections(size.hidden // size.heads),
        rope_theta=10000.0,
        vision={"depth": size.vision_depth, "embed_dim": size.vision_dim, "num_heads": 2},
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = token("<|im_end|>")
    model.generation_config.pad_token_id = token("<|endoftext|>")
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def qwen2_vl_config(
    tokenizer,
    *,
    text: dict,
    vision: dict,
    mrope_section: list[int],
    rope_theta: float,
    **outer,
):
    """A `Qwen2VLConfig` of the given text and vision shapes whose special token ids are
    `tokenizer`'s (Qwen's tokens, by text): the tiny model's, and a real-size shape's with
    random weights (benchmarks/trl_gpu_throughput.py)."""
    from transformers import Qwen2VLConfig

    token = tokenizer.convert_tokens_to_ids
    return Qwen2VLConfig(
        text_config={
            **text,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": rope_theta,
                "mrope_section": mrope_section,
            },
            "bos_token_id": token("<|endoftext|>"),
            "eos_token_id": token("<|im_end|>"),
            "pad_token_id": token("<|endoftext|>"),
        },
        vision_config={
            "mlp_ratio": 4,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            **vision,
            "hidden_size": text["hidden_size"],
        },
        image_token_id=token("<|image_pad|>"),
        video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"),
        vision_end_token_id=token("<|vision_end|>"),
        **outer,
    )


def _mrope_sections(head_dim: int) -> list[int]:
    half = head_dim // 2
    time = half // 4
    height = (half - time) // 2
    return [time, height, half - time - height]
