"""Which caller may write which agent's episodes: the ingestion route's permissions.

Isolation model. By default agents write their episodes straight to Cosmos DB under one
identity with the "episode writer" role on the ``episodes`` container (and read their
policy with the "policy reader" role on ``policies``). Cosmos DB data-plane roles stop at
the container: whoever holds that role can create an episode under *any* ``agent_id``,
with any id not taken yet (so it can also take an id another agent would use later), and
read any agent's policy. It cannot replace, delete or query anything, nor touch scores,
runs or feedback. That is one trust domain: fine when the agents are one team's, not when
they belong to tenants that must not influence each other's learning.

For those deployments, agents get no Cosmos DB role (Bicep ``agentDirectCosmosAccess:
false``) and send episodes to ``POST /api/agents/{agent_id}/episodes`` instead
(:class:`agent_learning.agent.client.HttpEpisodeWriter`), which writes an episode only for a
caller allowed to write that agent. ``AGENT_LEARNING_EPISODE_WRITERS`` maps each caller
identity (:mod:`agent_learning.app.callers`: ``key-<16 hex>`` from
:func:`~agent_learning.app.callers.key_identity` of a function key, ``principal-<object id>``
under App Service Authentication, or ``anonymous``) to the agent ids it may write, as
exact ids or ``fnmatch`` patterns (``support-*``)::

    {"key-0123456789abcdef": ["support-*"], "principal-00000000-0000-0000-0000-000000000000": ["billing"]}

An empty map (the default) turns the route off. Episode ids stay global (the ``episodes``
container is partitioned by id): an id that is already taken answers 409 whichever agent
holds it, so an id can be taken ahead of its owner only by a caller that knows it before it
is written. ``EpisodeCapture``'s default ids are random 128-bit UUIDs, which nobody can
know in advance; agents that choose their own ids must make them unguessable too (for
example a UUID, not a session number).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agent_learning.app.callers import ANONYMOUS
from agent_learning.core.limits import AGENT_PATTERN

_IDENTITY = re.compile(
    r"^(key-[0-9a-f]{16}|principal-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16})|"
    + re.escape(ANONYMOUS)
    + ")$"
)


class _Entries(list[tuple[str, Any]]):
    """A JSON object's entries in order, a repeated name included (``dict`` keeps only the last)."""


def parse_episode_writers(value: Any) -> dict[str, list[str]]:
    """The caller identity → agent-pattern map from its JSON text (or an already parsed
    object); raises ValueError naming the problem, an identity given twice included (JSON keeps
    only the last entry of a repeated name: the first would be dropped unseen). Never repeats a
    rejected key in full: a function key pasted in place of its identity must not end up in the logs."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value, object_pairs_hook=_Entries)
        except ValueError as exc:
            raise ValueError(
                f"must be a JSON object (caller identity → list of agent ids), not valid JSON: {exc}"
            ) from None
    if isinstance(value, Mapping):
        value = _Entries(value.items())
    if not isinstance(value, _Entries):
        raise ValueError(f"must be a JSON object (caller identity → list of agent ids), got {type(value).__name__}")
    writers: dict[str, list[str]] = {}
    for raw, patterns in value:
        identity = str(raw).strip().lower()
        if not _IDENTITY.match(identity):
            shown = f"{str(raw)[:4]}… ({len(str(raw))} characters)" if len(str(raw)) > 8 else repr(raw)
            raise ValueError(
                f"{shown} is not a caller identity: use key-<16 hex digits> (agent_learning.app.callers.key_identity "
                f"of the function key), principal-<Entra ID object id> or {ANONYMOUS}; never the key itself"
            )
        if identity in writers:
            raise ValueError(f"{identity}: given twice; list all of its agent ids in one entry")
        if isinstance(patterns, str | _Entries) or not isinstance(patterns, Sequence) or not patterns:
            raise ValueError(f"{identity}: must be a non-empty list of agent ids or patterns")
        bad = [p for p in patterns if not isinstance(p, str) or not AGENT_PATTERN.match(p)]
        if bad:
            raise ValueError(
                f"{identity}: {bad[0]!r} is not an agent id or pattern (letters, digits, . _ - and the "
                "wildcards * ? [ ] !, at most 128 characters)"
            )
        writers[identity] = list(patterns)
    return writers


def may_write(writers: Mapping[str, Sequence[str]], caller_id: str, agent_id: str) -> bool:
    """Whether ``caller_id`` may write episodes of ``agent_id`` (case-sensitive patterns)."""
    return any(fnmatch.fnmatchcase(agent_id, pattern) for pattern in writers.get(caller_id, ()))
