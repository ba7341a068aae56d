"""`probe_set` and `probe_set_create`: which frames, how many, in which order, and errors."""

from __future__ import annotations

from collections import Counter

import pytest

from probes.models import ProbeQuestion, ProbeSet
from probes.services import ProbeSetError, probe_set_create
from probes.tests.helpers import recorded, run
from rollouts.models import Frame, Turn
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

STEPS = 40


@pytest.fixture
def batch():
    return recorded(seeds=(1, 2, 3), steps=STEPS)


def _questions(probe_set: ProbeSet) -> list[tuple]:
    return list(
        ProbeQuestion.objects.filter(probe_set=probe_set)
        .order_by("index")
        .values_list("index", "frame_id", "turn_id", "kind", "subject", "text", "choices", "answer")
    )


def test_its_last_line_is_the_summary_spec_section_4_names(batch):
    args = ["--batch", str(batch.id), "--kinds", "night", "asleep", "--seed", "4"]
    outcome = run("probe_set", *args)
    assert outcome.code == 0, outcome.stderr
    summary = outcome.summary
    assert set(summary) == {"set_id", "questions", "frames", "kinds"}
    probe_set = ProbeSet.objects.get(id=summary["set_id"])
    # One turn a step with the baselines: the frames of turns 0..39 of each of 3 episodes.
    assert summary["frames"] == 3 * STEPS == probe_set.frames_count
    assert summary["questions"] == 2 * 3 * STEPS == probe_set.questions_count
    # The first 40 steps are day (daylight > 0.5 until step ~147), and nobody sleeps.
    assert summary["kinds"] == {
        "night": {"questions": 120, "answers": {"no": 120}},
        "asleep": {"questions": 120, "answers": {"no": 120}},
    }
    assert probe_set.answers == {"night": {"no": 120}, "asleep": {"no": 120}}
    assert probe_set.kinds == ["night", "asleep"] and probe_set.seed == 4
    assert probe_set.filters["batches"] == [batch.id]
    # The distribution is shown to a person too, with the warning of a one-answer kind.
    assert "night: 120 questions; answers no 100% (warning" in outcome.stdout


def test_the_same_inputs_and_seed_give_the_same_set_and_another_seed_other_choices(batch):
    filters = TurnSelection(batches=(batch.id,))
    first = probe_set_create(filters=filters, seed=11, per_episode=5)
    second = probe_set_create(filters=filters, seed=11, per_episode=5)
    other = probe_set_create(filters=filters, seed=12, per_episode=5)
    assert _questions(first) == _questions(second)
    assert first.answers == second.answers
    # Another seed samples other frames or orders the choices otherwise.
    assert _questions(other) != _questions(first)


def test_per_episode_samples_n_frames_of_each_episode_in_step_order(batch):
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), seed=2, per_episode=7, kinds=["night"]
    )
    rows = list(
        ProbeQuestion.objects.filter(probe_set=probe_set)
        .order_by("index")
        .values_list("episode_id", "frame__step", "frame__episode_id")
    )
    assert Counter(e for e, _, _ in rows) == dict.fromkeys(
        batch.episodes.values_list("id", flat=True), 7
    )
    assert all(e == fe for e, _, fe in rows)
    assert [r[:2] for r in rows] == sorted(r[:2] for r in rows)
    assert probe_set.frames_count == 21 and probe_set.episodes_count == 3
    assert probe_set.per_episode == 7


def test_only_frames_a_turn_with_a_text_observation_showed_qualify(batch):
    episode = batch.episodes.order_by("seed").first()
    blanked = Turn.objects.filter(episode=episode, index__lt=10)
    frames = set(blanked.values_list("frame_id", flat=True))
    blanked.update(observation_text="")
    probe_set = probe_set_create(filters=TurnSelection(batches=(batch.id,)), kinds=["asleep"])
    asked = set(ProbeQuestion.objects.filter(probe_set=probe_set).values_list("frame", flat=True))
    assert not asked & frames
    # The last frame of each episode (after its last action) was shown by no turn.
    last = Frame.objects.filter(episode__batch=batch, step=STEPS)
    assert not asked & set(last.values_list("id", flat=True))
    assert probe_set.frames_count == 3 * STEPS - 10


def test_each_question_names_the_turn_that_showed_its_frame(batch):
    probe_set = probe_set_create(filters=TurnSelection(batches=(batch.id,)), kinds=["night"])
    for question in ProbeQuestion.objects.filter(probe_set=probe_set).select_related("turn"):
        assert question.turn.frame_id == question.frame_id
        assert question.turn.episode_id == question.episode_id
        assert question.turn.observation_text


def test_balance_cuts_the_majority_answer_down_to_the_runner_up(batch):
    plain = probe_set_create(filters=TurnSelection(batches=(batch.id,)), kinds=["count"], seed=1)
    balanced = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), kinds=["count"], balance=True, seed=1
    )
    counts = plain.answers["count"]
    ranked = sorted(counts.values(), reverse=True)
    assert ranked[0] > ranked[1], "the walk should see mostly one count"
    assert balanced.answers["count"] == {a: min(n, ranked[1]) for a, n in counts.items()}
    assert balanced.balanced and balanced.questions_count == sum(balanced.answers["count"].values())
    # The kept questions are those of the plain set (same frames, same choices).
    kept = {repr(q[1:]) for q in _questions(balanced)}
    assert kept <= {repr(q[1:]) for q in _questions(plain)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kinds", "colour"], "kinds: unknown kind 'colour'"),
        (["--batch", "999999"], "batch: there is no batch 999999"),
        (["--model", "nobody"], "model: no batch was played by 'nobody'"),
        (["--per-episode", "0"], "per-episode: 0 is not at least 1"),
        (["--require-achievement", "collect_diamond"], "selection: no frame"),
    ],
)
def test_it_refuses_bad_input_in_one_line_and_writes_nothing(batch, args, message):
    outcome = run("probe_set", *args)
    assert outcome.code == 2
    assert message in outcome.stderr
    assert len(outcome.stderr.strip().splitlines()) == 1
    assert not ProbeSet.objects.exists() and not ProbeQuestion.objects.exists()


def test_a_set_of_imported_frames_without_game_state_is_refused():
    episode_batch = recorded(seeds=(5,), steps=5)
    Frame.objects.filter(episode__batch=episode_batch).update(state={})
    with pytest.raises(ProbeSetError, match="game state and text local view"):
        probe_set_create(filters=TurnSelection(batches=(episode_batch.id,)))
    assert not ProbeSet.objects.exists()


def test_a_dataset_selects_the_frames_as_its_filters_do(batch, django_user_model):
    from curation.models import Dataset

    dataset = Dataset.objects.create(
        name="seed 2", filters=TurnSelection(batches=(batch.id,), seeds=(2,)).to_json()
    )
    outcome = run("probe_set", "--dataset", str(dataset.id), "--kinds", "night")
    assert outcome.code == 0, outcome.stderr
    probe_set = ProbeSet.objects.get(id=outcome.summary["set_id"])
    seeds = set(ProbeQuestion.objects.filter(probe_set=probe_set).values_list("episode__seed"))
    assert seeds == {(2,)}
    assert outcome.summary["frames"] == STEPS


def test_a_selection_past_the_bound_of_a_set_is_refused_before_anything_is_written(
    batch, monkeypatch
):
    from probes import services

    monkeypatch.setattr(services, "MAX_QUESTIONS", 50)
    with pytest.raises(ProbeSetError, match="more than 50 questions in one set"):
        probe_set_create(filters=TurnSelection(batches=(batch.id,)))
    assert not ProbeSet.objects.exists()
    # Sampled down, the same selection fits.
    fits = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), per_episode=10, kinds=["night"]
    )
    assert fits.questions_count == 30


def test_a_name_is_stored_clean_and_bounded(batch):
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), kinds=["night"], name=" a\x00b" + "x" * 300
    )
    assert probe_set.name == "ab" + "x" * 198


def test_per_episode_passes_over_frames_it_cannot_read_for_others(batch):
    episode = batch.episodes.order_by("seed").first()
    # 30 of the episode's 40 frames lose their state (as imported frames have none).
    Frame.objects.filter(episode=episode, step__lt=30).update(state={})
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), per_episode=8, kinds=["night"], seed=5
    )
    steps = list(
        ProbeQuestion.objects.filter(probe_set=probe_set, episode=episode).values_list(
            "frame__step", flat=True
        )
    )
    assert len(steps) == 8 and all(step >= 30 for step in steps)
    assert probe_set.frames_count == 3 * 8


def test_a_share_under_one_percent_reads_as_under_one_percent_whatever_the_total():
    from types import SimpleNamespace

    from probes.management.commands.probe_set import distribution_lines

    def shares(**answers: int) -> str:
        probe_set = SimpleNamespace(kinds=["k"], answers={"k": answers}, balanced=False)
        (line,) = distribution_lines(probe_set)
        return line.split("answers ", 1)[1]

    warned = " (warning: one answer is right >99% of the time; --balance evens it)"
    # 1 of 200 is 0.5% and 1 of 800 is 0.125%: both under 1%, neither none; 199 of 200 is
    # 99.5%, not all.
    assert shares(a=199, b=1) == "a >99%, b <1%" + warned
    assert shares(a=799, b=1) == "a >99%, b <1%" + warned
    assert shares(a=99, b=1) == "a 99%, b 1%" + warned.replace(">99%", "99%")
    assert shares(a=150, b=50) == "a 75%, b 25%"
