"""Settings → components: each tunable is stated once, on its component's dataclass, and
:mod:`agent_learning.app.wiring` builds every component from settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent_learning.app import wiring
from agent_learning.app.settings import COMPONENTS, Settings, field_docs, load_settings
from agent_learning.core.errors import ConfigurationError
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import LearnerConfig, Reinforce
from agent_learning.pipeline import Scorer
from agent_learning.pipeline.drift import DriftConfig
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardConfig, RewardFunction
from agent_learning.store.sqlite import SQLiteStore


@pytest.mark.parametrize("cls", list(COMPONENTS), ids=lambda c: c.__name__)
def test_every_setting_of_a_component_takes_its_default_and_meaning_from_the_component(cls: type) -> None:
    spec = COMPONENTS[cls]
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        name = spec.setting(f.name)
        if name not in Settings.model_fields or f.default is None:
            continue  # no setting, or a setting with nothing to tune (a judge model's address)
        assert f.name in docs, f"{cls.__name__}.{f.name} has no docstring"
        setting = Settings.model_fields[name]
        assert setting.default == f.default, name
        assert setting.description is not None and setting.description.startswith(docs[f.name]), name


def test_tunables_are_the_components_own_fields() -> None:
    tuned = {spec.setting(f.name) for cls, spec in COMPONENTS.items() for f in dataclasses.fields(cls)}
    assert {"w_intent", "learning_rate", "drift_window", "judge_attempt_timeout", "max_kl"} <= tuned
    assert Settings.model_fields["max_kl"].default == LearnerConfig().max_kl
    assert "0 is None" in (Settings.model_fields["evidence_half_life"].description or "")


def test_wiring_builds_every_component_from_settings(tmp_path: Path) -> None:
    settings = load_settings(sqlite_path=str(tmp_path / "w.db"), store="sqlite", queue="sqlite", drift_window=5)
    assert wiring.reward_config(settings) == RewardConfig()
    assert wiring.learner_config(settings) == LearnerConfig()
    assert wiring.drift_config(settings) == DriftConfig(window=5)
    store = wiring.open_store(settings)
    assert isinstance(store, SQLiteStore)
    assert isinstance(wiring.open_queue(settings), SQLiteQueue)
    assert isinstance(wiring.open_judge(settings), OfflineJudge)
    assert isinstance(wiring.open_reward(settings), RewardFunction)
    assert isinstance(wiring.open_learner(settings), Reinforce)
    scorer = wiring.open_scorer(settings, store)
    assert isinstance(scorer, Scorer) and scorer.store is store


def test_a_malformed_service_bus_connection_string_names_the_variable_without_repeating_it() -> None:
    pytest.importorskip("azure.servicebus")
    settings = load_settings(queue="servicebus", servicebus_connection_string="Endpoint=s3cret")
    with pytest.raises(ConfigurationError) as info:
        wiring.open_queue(settings)
    assert "AGENT_LEARNING_SERVICEBUS_CONNECTION_STRING" in str(info.value) and "s3cret" not in str(info.value)


def test_a_service_bus_queue_carries_the_deployed_lock_that_the_embedded_runner_sizes_its_receives_by() -> None:
    """The runner (``agent-learn train`` on Service Bus) planned with a 60 s lock whatever the
    deployment set: at 30 s, batches sized to half a 60 s lock outlasted the lock."""
    pytest.importorskip("azure.servicebus")
    conn = "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=a2V5"
    settings = load_settings(queue="servicebus", servicebus_connection_string=conn, queue_lock_seconds=30)
    queue, train_queue = wiring.open_queue(settings), wiring.open_train_queue(settings)
    try:
        assert (queue.lock_seconds, train_queue.lock_seconds) == (30.0, 30.0)
    finally:
        queue.close()
        train_queue.close()
    assert SQLiteQueue(":memory:").lock_seconds == load_settings().queue_lock_seconds  # one default
