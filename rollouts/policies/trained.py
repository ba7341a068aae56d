"""The `grpo` kind: the model a GRPO job is training, played on that job's train worker.

No worker of the rollouts queue plays it (no factory): the train worker builds each
episode's policy around the model it is training (`training.grpo_runs.TrainedPolicy`) and
hands it to `episode_run`. A local model costs nothing, so the kind calls no paid model: no
spend, no endpoint, and it is never offered on the batch form or by `rollout`. Declared in
rollouts because the batch pages must know the kind of every batch they show.
"""

from rollouts.policies.kinds import PolicyKind, register

GRPO = register(
    PolicyKind(
        name="grpo",
        label="GRPO (the model a GRPO job is training)",
        help="grpo plays the model a GRPO job is training, played on its train worker",
        page_help="the model a GRPO job is training, played on its train worker",
        offered=False,
        calls_model=False,
        options=("model",),
    )
)
