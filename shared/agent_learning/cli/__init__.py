"""``agent-learn``: run the demo, inspect and steer policies, runs, episodes and dead letters.

Every command reads its settings from ``AGENT_LEARNING_*`` environment variables, so the same
commands work on the embedded SQLite store and on Cosmos DB (``AGENT_LEARNING_STORE=cosmos``
with ``CosmosDBConnection__accountEndpoint``: Entra ID through ``DefaultAzureCredential``, or
``AGENT_LEARNING_COSMOS_KEY`` for a local server). ``--db`` overrides the SQLite file. The
dead-letter commands use the queue the settings choose (``AGENT_LEARNING_QUEUE``). List and
show commands print JSON with ``--json``. Errors are reported in one line, with exit code 2
for bad input and 1 for anything else.

Each command group is a module of this package and registers its commands on :data:`.root.main`, the
group that reports errors; :mod:`.output`, :mod:`.options` and :mod:`.access` hold what the commands
share (printing, option types, the store and queues they open).
"""

from __future__ import annotations

from agent_learning.cli import (  # noqa: F401  (each registers its commands)
    agents,
    audit,
    config,
    demo,
    dlq,
    episodes,
    evaluate,
    feedback,
    history,
    init_policy,
    keys,
    logs,
    pipeline,
    policy,
    report,
    runs,
    serve,
    store,
)
from agent_learning.cli.root import main

__all__ = ["main"]
