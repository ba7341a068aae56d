"""A person's games in the browser, and forks of recorded episodes."""

from rollouts.policies.kinds import PolicyKind, register

# Played in the browser (`rollouts.play.services`), never by a worker; a fork may pick it.
HUMAN = register(PolicyKind(name="human", label="human (play it yourself)", offered=False))
