"""Settings from the environment (``AGENT_LEARNING_*``), validated once at start.

Every setting is an environment variable named ``AGENT_LEARNING_`` + the field name in
upper case (``w_intent`` → ``AGENT_LEARNING_W_INTENT``). A bad value raises
:class:`~agent_learning.errors.ConfigurationError` naming the variable. The README's
configuration table lists them all.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .clock import check_settle_window
from .documents import MAX_TEMPERATURE, MAX_TRAIN_BATCH, MIN_TEMPERATURE
from .errors import ConfigurationError
from .ingestion import parse_episode_writers
from .policy import DEFAULT_EXPLORATION_FLOOR

T = TypeVar("T")

PREFIX = "AGENT_LEARNING_"
NOT_ECHOED = frozenset({"episode_writers"})
"""Settings whose rejected value is not repeated in errors (it may hold a key pasted by mistake)."""


class Settings(BaseSettings):
    """Everything the library reads from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        extra="ignore",
        frozen=True,
        allow_inf_nan=False,
        env_ignore_empty=True,
        populate_by_name=True,
    )

    # Where things live.
    store: Literal["sqlite", "memory", "cosmos"] = "sqlite"
    sqlite_path: str = ".agent-learning/local.db"
    queue: Literal["sqlite", "servicebus"] = "sqlite"
    queue_name: str = Field("score-episodes", min_length=1, max_length=260)
    queue_max_deliveries: int = Field(10, ge=1, le=2000)
    queue_lock_seconds: float = Field(60.0, gt=0, le=300)
    judge: Literal["offline", "evaluators"] = "offline"
    allow_offline_judge: bool = Field(False, description="allow the offline judge inside Azure Functions")

    # The judge model of the azure-ai-evaluation evaluators: Azure OpenAI or OpenAI-compatible.
    judge_azure_endpoint: str | None = None
    judge_deployment: str | None = None
    judge_api_version: str = "2024-10-21"
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key: SecretStr | None = Field(None, description="Azure OpenAI without a key uses Entra ID")
    judge_client_id: str | None = Field(None, description="user-assigned managed identity for Azure OpenAI")
    judge_attempt_timeout: float = Field(60.0, gt=0, le=600)
    judge_evaluator_deadline: float = Field(150.0, gt=0, le=3600)
    judge_episode_deadline: float = Field(180.0, gt=0, le=3600)
    judge_max_attempts: int = Field(4, ge=1, le=20)
    judge_retry_after_cap: float = Field(30.0, gt=0, le=600)

    # Cosmos DB. The endpoint and identity are read from the same identity-based connection
    # settings the Functions host uses for its Cosmos trigger, so nothing is configured twice.
    cosmos_endpoint: str | None = Field(
        None, validation_alias=AliasChoices(f"{PREFIX}COSMOS_ENDPOINT", "CosmosDBConnection__accountEndpoint")
    )
    cosmos_key: SecretStr | None = Field(None, description="local servers only; Azure uses Entra ID")
    cosmos_database: str = Field("agent-learning", min_length=1, max_length=255)
    cosmos_client_id: str | None = Field(
        None, validation_alias=AliasChoices(f"{PREFIX}COSMOS_CLIENT_ID", "CosmosDBConnection__clientId")
    )
    score_settle_seconds: float = Field(
        60.0, le=3600, description="more than the score write timeout plus the clock-skew allowance (clock.py)"
    )
    lease_prefix: str = Field("", max_length=64, description="lease prefix of the change-feed trigger")

    # Service Bus: identity-based (namespace) in Azure, a connection string for local brokers.
    servicebus_namespace: str | None = Field(
        None,
        validation_alias=AliasChoices(f"{PREFIX}SERVICEBUS_NAMESPACE", "ServiceBusConnection__fullyQualifiedNamespace"),
    )
    servicebus_connection_string: SecretStr | None = Field(None, description="local brokers only")
    servicebus_client_id: str | None = Field(
        None, validation_alias=AliasChoices(f"{PREFIX}SERVICEBUS_CLIENT_ID", "ServiceBusConnection__clientId")
    )

    # The timer that trains (an NCRONTAB expression, read by the Functions host).
    train_schedule: str = Field("0 */5 * * * *", min_length=11)

    # Reward (see agent_learning.rewards).
    w_intent: float = Field(0.4, ge=0)
    w_adherence: float = Field(0.3, ge=0)
    w_completion: float = Field(0.3, ge=0)
    tool_failure_penalty: float = Field(0.1, ge=0)
    max_tool_failure_penalty: float = Field(0.3, ge=0)
    latency_budget_ms: float = Field(30_000.0, gt=0)
    latency_penalty: float = Field(0.1, ge=0)
    empty_output_penalty: float = Field(0.5, ge=0)
    feedback_weight: float = Field(0.5, ge=0, le=1, description="weight of user feedback in the reward")

    # Learner (see agent_learning.learner).
    learning_rate: float = Field(1.2, gt=0)
    direction: Literal["evidence", "natural", "plain"] = "evidence"
    normalize_advantages: bool = True
    min_reward_std: float = Field(0.05, gt=0)
    entropy_coef: float = Field(0.001, ge=0)
    importance_clip: float = Field(5.0, ge=1)
    max_kl: float = Field(1.0, ge=0, description="0 turns the trust region off")
    evidence_prior: float = Field(3.0, ge=0)
    reference_batch: int = Field(50, ge=0, description="0: the same step whatever the batch size")
    max_logit_gap: float = Field(8.0, ge=0, description="0 turns the limit off")
    gap_per_evidence: float = Field(4.0, ge=0, description="0 turns the evidence bound off")
    gap_slack: float = Field(1.0, ge=0)
    evidence_half_life: float = Field(3000.0, ge=0, description="episodes; 0: evidence never fades")
    logit_bound: float = Field(20.0, gt=0, le=1000)
    train_max_batch: int = Field(10_000, ge=1, le=MAX_TRAIN_BATCH, description="bounded by memory, see MAX_TRAIN_BATCH")
    train_min_batch: int = Field(1, ge=1)

    # Exploration-collapse and reward-drop warnings (see agent_learning.drift).
    collapse_entropy: float = Field(0.1, ge=0, le=1, description="normalised entropy H/log K of a collapsed policy")
    collapse_reward_fall: float = Field(0.1, ge=0, description="reward fall that, with collapse, warns")
    reward_drop: float = Field(0.25, gt=0, description="reward drop between two runs that warns")
    drift_window: int = Field(3, ge=1, le=100, description="earlier runs the latest is compared with")
    auto_pin: bool = Field(False, description="pin an agent's policy when a warning fires")

    # Telemetry (see agent_learning.telemetry).
    telemetry: Literal["auto", "off", "console", "azure-monitor"] = "auto"
    applicationinsights_connection_string: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(
            f"{PREFIX}APPLICATIONINSIGHTS_CONNECTION_STRING", "APPLICATIONINSIGHTS_CONNECTION_STRING"
        ),
    )

    # New policies and agents.
    temperature: float = Field(1.0, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
    exploration_floor: float = Field(DEFAULT_EXPLORATION_FLOOR, ge=0, lt=1)
    policy_refresh_seconds: float = Field(30.0, ge=0)

    # Episode ingestion over HTTP for deployments that isolate agents (see agent_learning.ingestion).
    episode_writers: Annotated[dict[str, list[str]], NoDecode] = Field(
        {}, description="JSON: caller identity → agent ids or patterns it may write; empty: the route is off"
    )

    @field_validator("episode_writers", mode="before")
    @classmethod
    def _episode_writers(cls, value: Any) -> dict[str, list[str]]:
        return parse_episode_writers(value)

    @field_validator("score_settle_seconds")
    @classmethod
    def _settle_window_can_work(cls, value: float) -> float:
        check_settle_window(value)
        return value

    # Kept for compatibility: the library builds its components in :mod:`agent_learning.wiring`.
    def reward_config(self) -> Any:
        return component(self, _component_class("RewardConfig"))

    def learner_config(self) -> Any:
        return component(self, _component_class("LearnerConfig"))

    def judge_model_config(self) -> Any:
        return component(self, _component_class("JudgeModel"))

    def judge_limits(self) -> Any:
        return component(self, _component_class("JudgeLimits"))

    def drift_config(self) -> Any:
        return component(self, _component_class("DriftConfig"))


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the environment; ``overrides`` win over it."""
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            name = PREFIX + ".".join(str(p) for p in err["loc"]).upper()
            got = "" if err["loc"] and err["loc"][0] in NOT_ECHOED else f" (got {err.get('input')!r})"
            problems.append(f"{name}: {err['msg'].removeprefix('Value error, ')}{got}")
        raise ConfigurationError("invalid configuration: " + "; ".join(problems)) from None
    # Settings that are only invalid together fail now, not later.
    component(settings, _component_class("RewardConfig"))
    component(settings, _component_class("LearnerConfig"))
    if settings.train_min_batch > settings.train_max_batch:
        raise ConfigurationError(
            f"invalid configuration: {PREFIX}TRAIN_MIN_BATCH ({settings.train_min_batch}) must not exceed "
            f"{PREFIX}TRAIN_MAX_BATCH ({settings.train_max_batch}): a training run never reads more scores than that"
        )
    missing = []
    if settings.store == "cosmos" and not settings.cosmos_endpoint:
        missing.append(f"{PREFIX}COSMOS_ENDPOINT (or CosmosDBConnection__accountEndpoint)")
    if settings.queue == "servicebus" and not (settings.servicebus_namespace or settings.servicebus_connection_string):
        missing.append(
            f"{PREFIX}SERVICEBUS_NAMESPACE (or ServiceBusConnection__fullyQualifiedNamespace) or "
            f"{PREFIX}SERVICEBUS_CONNECTION_STRING"
        )
    if settings.telemetry == "azure-monitor" and not settings.applicationinsights_connection_string:
        missing.append("APPLICATIONINSIGHTS_CONNECTION_STRING (AGENT_LEARNING_TELEMETRY=azure-monitor)")
    if missing:
        raise ConfigurationError("invalid configuration: missing " + " and ".join(missing))
    if settings.judge == "evaluators":
        component(settings, _component_class("JudgeModel"))  # raises ConfigurationError naming the missing variables
    return settings


def environment_names() -> dict[str, str]:
    """Field name → the environment variable the README documents for it."""
    names = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names[name] = str(alias.choices[-1])  # the Functions host's identity-based setting
        else:
            names[name] = PREFIX + name.upper()
    return names


@dataclass(frozen=True)
class ComponentSettings:
    """How a component's configuration dataclass reads its fields from :class:`Settings`."""

    prefix: str = ""
    """Settings field = prefix + component field (``judge_`` + ``attempt_timeout``)."""
    renames: Mapping[str, str] = dataclass_field(default_factory=dict)
    """Component field → settings field, where the name differs otherwise."""
    zero_is_none: frozenset[str] = frozenset()
    """Fields whose ``None`` (off) is 0 in the environment."""

    def setting(self, name: str) -> str:
        return self.renames.get(name, self.prefix + name)


COMPONENTS: dict[str, tuple[str, ComponentSettings]] = {
    "RewardConfig": ("agent_learning.rewards", ComponentSettings()),
    "LearnerConfig": (
        "agent_learning.learner",
        ComponentSettings(
            zero_is_none=frozenset(
                {"max_kl", "reference_batch", "max_logit_gap", "gap_per_evidence", "evidence_half_life"}
            )
        ),
    ),
    "DriftConfig": ("agent_learning.drift", ComponentSettings(renames={"window": "drift_window"})),
    "JudgeModel": ("agent_learning.judges.evaluators", ComponentSettings(prefix="judge_")),
    "JudgeLimits": ("agent_learning.judges.evaluators", ComponentSettings(prefix="judge_")),
}
"""Every component configured from settings: its class's module and how its fields are named."""


def _component_class(name: str) -> type:
    # By name: the learner's module imports numpy, which reading settings does not need.
    module, _ = COMPONENTS[name]
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def component(settings: Settings, cls: type[T]) -> T:
    """``cls`` (a component's configuration dataclass) with the values of ``settings``.

    Fields without a setting keep their defaults. A value the component rejects raises
    :class:`~agent_learning.errors.ConfigurationError` naming the environment variables.
    """
    spec = COMPONENTS[cls.__name__][1]
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        name = spec.setting(f.name)
        if name not in Settings.model_fields:
            continue
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        values[f.name] = None if f.name in spec.zero_is_none and not value else value
    try:
        return cls(**values)
    except ConfigurationError:
        raise
    except ValueError as exc:
        # Name the environment variables, not the Python fields.
        message = re.sub(
            r"\b(" + "|".join(values) + r")\b", lambda m: PREFIX + spec.setting(m.group(1)).upper(), str(exc)
        )
        raise ConfigurationError(f"invalid configuration: {message}") from None
