"""`fetch_and_commit`: the last statement and the COMMIT in one round trip, only where that
is the transaction's end, and nothing committed when the statement fails."""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction

from rollouts.models import RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.transactions import fetch_and_commit

pytestmark = pytest.mark.django_db(transaction=True)
UPDATE = (
    "UPDATE rollouts_rolloutbatch SET name = %s, episodes_failed = %s WHERE id = %s RETURNING name"
)


def _batch() -> RolloutBatch:
    return services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(1,), steps=2, name="before"),
        enqueue=False,
    )


def _seen_elsewhere(batch_id: int) -> str:
    """The batch's name as another connection (another worker) reads it now."""
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as other:
        return other.execute(
            "SELECT name FROM rollouts_rolloutbatch WHERE id = %s", [batch_id]
        ).fetchone()[0]


def test_it_commits_with_the_statement_in_the_outermost_block():
    batch = _batch()
    hooks = []
    with transaction.atomic():
        connection.cursor().execute(
            "UPDATE rollouts_rolloutbatch SET model = 'earlier' WHERE id = %s", [batch.id]
        )
        transaction.on_commit(lambda: hooks.append("ran"))
        assert fetch_and_commit(UPDATE, ["it's after", 0, batch.id]) == ("it's after",)
        # Committed already, the earlier write with it, before the block's own end.
        assert _seen_elsewhere(batch.id) == "it's after"
        assert hooks == []
    assert hooks == ["ran"]
    batch.refresh_from_db()
    assert (batch.name, batch.model) == ("it's after", "earlier")
    # The connection goes on as usual afterwards.
    with transaction.atomic():
        RolloutBatch.objects.filter(id=batch.id).update(name="next")
    assert _seen_elsewhere(batch.id) == "next"


def test_a_failed_statement_commits_nothing_written_before_it():
    batch = _batch()
    with pytest.raises(IntegrityError), transaction.atomic():
        connection.cursor().execute(
            "UPDATE rollouts_rolloutbatch SET model = 'earlier' WHERE id = %s", [batch.id]
        )
        fetch_and_commit(UPDATE, ["after", -1, batch.id])  # a negative count: refused
    batch.refresh_from_db()
    assert (batch.name, batch.model) == ("before", "")
    assert _seen_elsewhere(batch.id) == "before"


def test_inside_a_callers_transaction_it_leaves_the_commit_to_the_caller():
    batch = _batch()
    with transaction.atomic():
        with transaction.atomic():  # a savepoint: the caller's transaction goes on
            assert fetch_and_commit(UPDATE, ["inner", 0, batch.id]) == ("inner",)
        assert _seen_elsewhere(batch.id) == "before"
    assert _seen_elsewhere(batch.id) == "inner"

    with pytest.raises(RuntimeError), transaction.atomic():
        with transaction.atomic():
            fetch_and_commit(UPDATE, ["rolled back", 0, batch.id])
        raise RuntimeError("the caller fails after it")
    assert _seen_elsewhere(batch.id) == "inner"


def test_in_a_transaction_opened_by_hand_it_leaves_the_commit_to_its_owner():
    batch = _batch()
    transaction.set_autocommit(False)
    try:
        with transaction.atomic():
            assert fetch_and_commit(UPDATE, ["by hand", 0, batch.id]) == ("by hand",)
        assert _seen_elsewhere(batch.id) == "before"
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert _seen_elsewhere(batch.id) == "by hand"
