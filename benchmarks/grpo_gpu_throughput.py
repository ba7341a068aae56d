"""GRPO iterations of the trl provider's online RL on a real-size Qwen2-VL: episodes/s,
generated tokens/s, update time and peak GPU memory, with random weights (nothing downloaded).

The model is `trl_gpu_throughput.py`'s: a Qwen2-VL of Qwen2-VL-2B-Instruct's shape (`--size
2b`) built from its config with random weights, the tokenizer and processor
`training.open_models.tiny`'s, saved to a scratch directory as the run's base model. The
trainer is the trl provider's own (`training.open_models.grpo.run_grpo`, TRL's GRPOTrainer)
with `[training.grpo]` set from the flags; the player is Django-free: each episode is a
seeded `rollouts.game.crafter_env.StudioEnv` game, each turn shows the model the text
observation and the frame, and its answer's actions (`rollouts.game.text_actions`) are
played (noop when it names none). Nothing is recorded: the studio's recorder is the same
for every policy and `rollout_throughput.py` measures it.

An iteration plays `--seeds` x `--group` episodes of `--steps` game steps (a turn is one
model answer of at most `--max-answer-tokens` tokens, its actions a step each: a random
model seldom ends an answer early, so most answers are that long), then scores them and
makes one optimizer step. Throughput is over the iterations after `--warmup-iterations`
(CUDA kernels chosen, memory pools grown): episodes per second of wall time, generated
tokens per second of playing, and each
iteration's time split into playing and the update (the log-probabilities' forward pass,
the backward pass and the optimizer step). No checkpoint is written during the run; the
trained model is saved after it, outside the timed iterations.

It prints one JSON line (the trainer's log goes to stderr). Without a CUDA device that line
says so and it exits 0 (`--allow-cpu` runs the same code on the CPU with `--size tiny`, to
check the script itself).

    python benchmarks/grpo_gpu_throughput.py [--size 2b] [--train-kind lora|fft]
        [--seeds 2] [--group 4] [--steps 8] [--iterations 5] [--warmup-iterations 1]
        [--max-answer-tokens 64] [--image-size 256]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trl_gpu_throughput import SIZES, model_built  # noqa: E402


def base_model(size: str, directory: Path, image_size: int) -> tuple[Path, int]:
    """A Qwen2-VL of `size` with random weights and the tiny processor, saved in `directory`;
    with its parameter count."""
    from training.open_models.tiny import TinySize, build_tiny_vlm

    build_tiny_vlm(directory, size=TinySize(max_pixels=image_size * image_size))
    import torch
    from transformers import AutoProcessor

    tokenizer = AutoProcessor.from_pretrained(directory).tokenizer
    # Saved in bf16 (half the disk; the weights are random): the trainer loads it as it loads
    # any base model.
    model = model_built(size, directory, torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    # The tiny model's own weights go: a sharded save beside them would not be the one read.
    for stale in directory.glob("*.safetensors*"):
        stale.unlink()
    model.save_pretrained(directory)
    return directory, sum(p.numel() for p in model.parameters())


def sections_of(args) -> dict[str, dict]:
    """The TOML sections the trl provider would read for this run."""
    grpo = {
        "group_size": args.group,
        "seeds_per_iteration": args.seeds,
        "steps_per_episode": args.steps,
        "iterations": args.iterations,
        "reward": "crafter",
        "max_answer_tokens": args.max_answer_tokens,
        "temperature": 1.0,
    }
    hp = {
        "n_epochs": 1,  # every config has it; a GRPO run ignores it
        "learning_rate": 1e-5,
        "train_kind": args.train_kind,
        "save_steps": 10**6,
    }
    parallelism = {"bf16": args.device == "cuda", "activation_checkpointing": args.checkpointing}
    return {
        "job": {"seed": 42},
        "training": {"mode": "grpo"},
        "training.grpo": grpo,
        "hyperparameters": hp,
        "hyperparameters.parallelism": parallelism,
    }


def generated_tokens(model) -> int:
    """The tokens a `TurnModel` sampled over its episode (its env mask's ones; the user
    turns and an EOS it did not write are the environment's)."""
    return sum(model.env_mask)


def timed_player(*, steps: int, image_size: int, sync):
    """The tests' Django-free `CrafterPlayer` (a seeded StudioEnv game each episode, nothing
    recorded), timed: the seconds each iteration's playing took, the tokens the model
    generated in it and the turns it played."""
    from training.tests.grpo_players import CrafterPlayer

    class TimedPlayer(CrafterPlayer):
        def __init__(self) -> None:
            super().__init__(steps=steps, image_size=image_size)
            self.seconds: list[float] = []
            self.tokens: list[int] = []
            self.turns: list[int] = []

        def play(self, **kwargs):
            start = time.perf_counter()
            played = super().play(**kwargs)
            sync()
            self.seconds.append(time.perf_counter() - start)
            self.tokens.append(sum(generated_tokens(episode.model) for episode in played))
            self.turns.append(sum(len(episode.actions) for episode in played))
            return played

    return TimedPlayer()


class Sink:
    """The run's `GrpoSink`: when each iteration's update was logged, and its events."""

    def __init__(self, sync) -> None:
        self.sync = sync
        self.logged: list[float] = []
        self.events: list[str] = []

    def event(self, type, message, *, level="info", data=None) -> None:
        self.events.append(f"{level} {type}: {message}")

    def should_stop(self) -> bool:
        return False

    def checkpoint_saved(self, step, directory) -> None:
        pass

    def resuming(self, step) -> None:
        pass

    def iteration_scored(self, iteration, scored) -> None:
        pass

    def iteration_logged(self, iteration, *, loss, kl) -> None:
        self.sync()
        self.logged.append(time.perf_counter())


def measure(args) -> dict:
    import torch

    from training.open_models.grpo import GrpoSpec, run_grpo

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    player = timed_player(steps=args.steps, image_size=args.image_size, sync=sync)
    sink = Sink(sync)
    with tempfile.TemporaryDirectory(prefix="grpo-throughput-") as tmp:
        model_dir, parameters = base_model(args.size, Path(tmp) / "base", args.image_size)
        spec = GrpoSpec(
            base_model=str(model_dir), sections=sections_of(args), work_dir=Path(tmp) / "work"
        )
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        result = run_grpo(spec, sink, player)
    if result.status != "succeeded" or len(sink.logged) != args.iterations:
        raise SystemExit(f"the run ended {result.status}: {sink.events[-3:]}")
    first = args.warmup_iterations
    timed = args.iterations - first
    seconds = sink.logged[-1] - sink.logged[first - 1]
    playing = sum(player.seconds[first:])
    tokens = sum(player.tokens[first:])
    turns = sum(player.turns[first:])
    episodes = timed * args.seeds * args.group
    return {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "size": args.size,
        "parameters": parameters,
        "train_kind": args.train_kind,
        "episodes_per_iteration": args.seeds * args.group,
        "steps_per_episode": args.steps,
        "turns_per_episode": round(turns / episodes, 2),
        "max_answer_tokens": args.max_answer_tokens,
        "image_size": args.image_size,
        "iterations_timed": timed,
        "episodes_per_second": round(episodes / seconds, 4),
        "generated_tokens_per_second": round(tokens / playing, 1),
        "generated_tokens_per_turn": round(tokens / turns, 1),
        "seconds_per_iteration": round(seconds / timed, 3),
        "play_seconds_per_iteration": round(playing / timed, 3),
        "update_seconds_per_iteration": round((seconds - playing) / timed, 3),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if args.device == "cuda"
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="2b")
    parser.add_argument("--train-kind", choices=("lora", "fft"), default="lora")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per iteration")
    parser.add_argument("--group", type=int, default=4, help="episodes per seed")
    parser.add_argument("--steps", type=int, default=8, help="game steps per episode")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup-iterations", type=int, default=1)
    parser.add_argument("--max-answer-tokens", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    parser.add_argument("--allow-cpu", action="store_true", help="check the script on the CPU")
    args = parser.parse_args()
    if args.warmup_iterations < 1 or args.iterations <= args.warmup_iterations:
        parser.error("--warmup-iterations must be at least 1 and below --iterations")
    if args.group < 2:
        parser.error("--group must be at least 2 (GRPO compares a seed's episodes)")
    import torch

    if torch.cuda.is_available():
        args.device = "cuda"
    elif args.allow_cpu:
        args.device = "cpu"
    else:
        print(json.dumps({"cuda": False, "skipped": "no CUDA device: nothing measured"}))
        return
    # The trainer prints its log lines: on stderr, so that stdout is the one JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        measured = measure(args)
    print(json.dumps({"cuda": args.device == "cuda", **measured}))


if __name__ == "__main__":
    main()
