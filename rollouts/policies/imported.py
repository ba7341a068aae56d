"""The `imported` kind: a batch an import wrote (`curation.importing`), never played here.

Declared in rollouts, not in curation: the batch pages come before curation in the apps'
order and must know the kind of every batch they show.
"""

from rollouts.policies.kinds import PolicyKind, register

IMPORTED = register(PolicyKind(name="imported", offered=False, plays=False))
