"""Training throughput of the trl provider's path on a real-size Qwen2-VL: samples/s, tokens/s
and peak GPU memory, with random weights (nothing downloaded).

The model is a Qwen2-VL of Qwen2-VL-2B-Instruct's shape (`--size 2b`: 28 text layers of
1,536, 12 heads, 2 KV heads, a 151,936-token vocabulary; a 32-layer vision tower of 1,280)
built from its config with random weights, in bf16. The tokenizer and processor are
`training.open_models.tiny`'s (Qwen's special tokens; their ids are the config's). The rows
are probe questions as the studio exports them (`probes.prompting.question_messages`, a
frame of `rollouts.game`'s Crafter at `--image-size` px, a one-word reply), in the export's
`images` / `prompt` / `completion` shape. The arguments are the trl provider's own
(`training.open_models.arguments.sft_arguments` of the TOML sections below) and the trainer
is TRL's `SFTTrainer`, LoRA on all linear layers as the shipped config, or `--train-kind
fft`. Throughput is over the steps after `--warmup-steps` (CUDA kernels chosen, memory pools
grown): samples and tokens (attention mask) seen per second of wall time.

Without a CUDA device it prints one JSON line saying so and exits 0 (`--allow-cpu` runs the
same code on the CPU with `--size tiny`, to check the script itself).

    python benchmarks/trl_gpu_throughput.py [--size 2b] [--train-kind lora|fft]
        [--batch 4] [--steps 30] [--warmup-steps 5] [--image-size 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Qwen2-VL-2B-Instruct's config.json, the parts that size it.
SIZES = {
    "2b": {
        "text": {
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
            "mrope_section": [16, 24, 24],
        },
        "vision": {"depth": 32, "embed_dim": 1280, "num_heads": 16},
    },
    "tiny": {
        "text": {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "vocab_size": 1024,
            "tie_word_embeddings": False,
            "mrope_section": [2, 3, 3],
        },
        "vision": {"depth": 2, "embed_dim": 32, "num_heads": 2},
    },
}
QUESTION = ("Is it night?", ["yes", "no"])


def model_built(size: str, processor_dir: Path, dtype):
    """A Qwen2-VL of `size` with random weights; special token ids from the tiny processor."""
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from training.open_models.tiny import qwen2_vl_config

    shape = SIZES[size]
    tokenizer = AutoProcessor.from_pretrained(processor_dir).tokenizer
    text = dict(shape["text"])
    sections = text.pop("mrope_section")
    config = qwen2_vl_config(
        tokenizer,
        text={**text, "max_position_embeddings": 32768},
        mrope_section=sections,
        rope_theta=1000000.0,
        vision=shape["vision"],
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    model = Qwen2VLForConditionalGeneration(config).to(dtype)
    return model


def rows(count: int, image_size: int):
    """Probe rows in the export's shape, on frames of seeded Crafter games."""
    import datasets
    from PIL import Image

    from probes.prompting import question_messages
    from rollouts.game.crafter_env import StudioEnv

    env = StudioEnv(seed=0, size=image_size)
    frame = env.reset()
    records = []
    for index in range(count):
        frame, *_ = env.step(index % 5)
        messages = question_messages(
            observation="image", text=QUESTION[0], choices=QUESTION[1], png=b""
        )
        prompt = [
            {"role": "system", "content": [{"type": "text", "text": messages[0]["content"]}]},
            {
                "role": "user",
                "content": [
                    {"type": "image"} if part["type"] == "image_url" else part
                    for part in messages[1]["content"]
                ],
            },
        ]
        completion = [{"role": "assistant", "content": [{"type": "text", "text": "no"}]}]
        image = Image.fromarray(frame)
        records.append({"images": [image], "prompt": prompt, "completion": completion})
    return datasets.Dataset.from_list(records)


class Counted:
    """TRL's vision collator, counting the tokens (attention mask) of each batch it makes."""

    def __init__(self, collator) -> None:
        self.collator = collator
        self.tokens: list[int] = []

    def __call__(self, examples):
        batch = self.collator(examples)
        self.tokens.append(int(batch["attention_mask"].sum()))
        return batch


def sections_of(args) -> dict[str, dict]:
    """The TOML sections the trl provider would read for this run."""
    hp = {
        "max_steps": args.steps,
        "per_device_batch": args.batch,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1e-4,
        "train_kind": args.train_kind,
        "logging_steps": args.steps,
        "save_steps": 10**6,
    }
    parallelism = {"bf16": args.device == "cuda", "activation_checkpointing": args.checkpointing}
    return {"hyperparameters": hp, "hyperparameters.parallelism": parallelism}


def measure(args) -> dict:
    import torch
    from peft import LoraConfig
    from transformers import AutoProcessor, TrainerCallback
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from training.open_models.arguments import lora_settings, sft_arguments
    from training.open_models.tiny import TinySize, build_tiny_vlm

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            if args.device == "cuda":
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="trl-throughput-") as tmp:
        pixels = TinySize(max_pixels=args.image_size * args.image_size)
        processor_dir = build_tiny_vlm(Path(tmp) / "processor", size=pixels)
        processor = AutoProcessor.from_pretrained(processor_dir)
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        model = model_built(args.size, processor_dir, dtype).to(args.device)
        parameters = sum(p.numel() for p in model.parameters())
        sections = sections_of(args)
        arguments = sft_arguments(sections, output_dir=str(Path(tmp) / "out"), has_validation=False)
        arguments["use_cpu"] = args.device != "cuda"
        collator = Counted(
            DataCollatorForVisionLanguageModeling(processor, completion_only_loss=True)
        )
        peft = None
        if args.train_kind == "lora":
            peft = LoraConfig(
                task_type="CAUSAL_LM", target_modules="all-linear", **lora_settings(sections)
            )
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**arguments),
            train_dataset=rows(args.batch * args.steps, args.image_size),
            processing_class=processor,
            data_collator=collator,
            peft_config=peft,
            callbacks=[Clock()],
        )
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    timed = len(ends) - 1 - args.warmup_steps
    seconds = ends[-1] - ends[args.warmup_steps]
    tokens = sum(collator.tokens[args.warmup_steps + 1 : len(ends)])
    return {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "size": args.size,
        "parameters": parameters,
        "train_kind": args.train_kind,
        "batch": args.batch,
        "image_size": args.image_size,
        "steps_timed": timed,
        "samples_per_second": round(timed * args.batch / seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1),
        "tokens_per_sample": round(tokens / (timed * args.batch), 1),
        "seconds_per_step": round(seconds / timed, 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if args.device == "cuda"
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="2b")
    parser.add_argument("--train-kind", choices=("lora", "fft"), default="lora")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    parser.add_argument("--allow-cpu", action="store_true", help="check the script on the CPU")
    args = parser.parse_args()
    if args.steps <= args.warmup_steps + 1:
        parser.error("--steps must exceed --warmup-steps by at least 2")
    import torch

    if torch.cuda.is_available():
        args.device = "cuda"
    elif args.allow_cpu:
        args.device = "cpu"
    else:
        print(json.dumps({"cuda": False, "skipped": "no CUDA device: nothing measured"}))
        return
    print(json.dumps({"cuda": args.device == "cuda", **measure(args)}))


if __name__ == "__main__":
    main()
