"""Settings from the environment (``AGENT_LEARNING_*``), validated once at start.

Every setting is an environment variable named ``AGENT_LEARNING_`` + the field name in
upper case (``w_intent`` → ``AGENT_LEARNING_W_INTENT``). A bad value raises
:class:`~agent_learning.core.errors.ConfigurationError` naming the variable. The configuration
reference (``docs/configuration.md``) lists them all.
"""

from __future__ import annotations

import ast
import base64
import binascii
import difflib
import inspect
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from dataclasses import field as dataclass_field
from functools import cache
from itertools import pairwise
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent_learning.agent.client import REFRESH_SECONDS
from agent_learning.app.callers import parse_key_digests, parse_principals
from agent_learning.app.ingestion import parse_episode_writers
from agent_learning.core.clock import SCORE_SETTLE_SECONDS, check_settle_window
from agent_learning.core.errors import ConfigurationError
from agent_learning.documents import (
    DEFAULT_EXPLORATION_FLOOR,
    DEFAULT_TEMPERATURE,
    MAX_TEMPERATURE,
    MAX_TRAIN_BATCH,
    MIN_TEMPERATURE,
    TRAIN_BATCH,
)
from agent_learning.evaluation import GuardrailConfig
from agent_learning.judges.evaluators import JudgeLimits, JudgeModel, JudgeTokens
from agent_learning.judges.sampling import normalise as normalise_judging
from agent_learning.learning.reinforce import LearnerConfig
from agent_learning.pipeline.drift import DriftConfig
from agent_learning.queue.base import LOCK_SECONDS, MAX_DELIVERIES
from agent_learning.rewards import RewardConfig
from agent_learning.store.sqlite import DEFAULT_PATH as SQLITE_DEFAULT_PATH

T = TypeVar("T")

PREFIX = "AGENT_LEARNING_"
NOT_ECHOED = frozenset({"episode_writers", "personalizer_key_sha256", "cosmos_key", "servicebus_connection_string"})
"""Settings whose rejected value is not repeated in errors (a key, or one pasted by mistake)."""
HOLDS_A_SECRET = re.compile(r"(key|secret|signature|password|token)\s*=", re.IGNORECASE)
"""A rejected value of any setting with this in it (a connection string pasted in place of an
endpoint: ``AccountKey=``, ``SharedAccessKey=``) is not repeated in errors either."""
HOST_NAME = re.compile(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*")
"""The host of the Cosmos DB endpoint and of the Service Bus namespace (no placeholder left in it)."""
QUEUE_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
"""A Service Bus queue name: letters, digits, ``.``, ``-`` and ``_``, in segments joined by ``/``."""
DATABASE_NAME = re.compile(r"[^/\\#?]*[^/\\#? ]")
"""A Cosmos DB database id: none of ``/ \\ # ?``, and no space at the end."""
CLIENT_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
"""A user-assigned managed identity's client id: a GUID, not the identity's name or resource id."""


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


COMPONENTS: dict[type, ComponentSettings] = {
    RewardConfig: ComponentSettings(),
    LearnerConfig: ComponentSettings(
        zero_is_none=frozenset(
            {"max_kl", "reference_batch", "max_logit_gap", "gap_per_evidence", "evidence_half_life", "change_threshold"}
        )
    ),
    DriftConfig: ComponentSettings(renames={"window": "drift_window", "evidence_z": "drift_z"}),
    JudgeModel: ComponentSettings(prefix="judge_"),
    JudgeLimits: ComponentSettings(prefix="judge_"),
    JudgeTokens: ComponentSettings(prefix="judge_"),
    GuardrailConfig: ComponentSettings(
        prefix="guardrail_",
        renames={"mode": "guardrail"},
        zero_is_none=frozenset({"safe_confidence", "budget_latency_ms", "budget_tool_failure_rate", "budget_tokens"}),
    ),
}
"""Every component configured from settings, and how its fields are named there."""


@cache
def _module_tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (the string literal after its annotation)."""
    tree = _module_tree(inspect.getfile(cls))
    (node,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    return {
        field.target.id: " ".join(doc.value.value.split())
        for field, doc in pairwise(node.body)
        if isinstance(field, ast.AnnAssign)
        and isinstance(field.target, ast.Name)
        and isinstance(doc, ast.Expr)
        and isinstance(doc.value, ast.Constant)
        and isinstance(doc.value.value, str)
    }


def tunable(cls: type, name: str, **constraints: Any) -> Any:
    """A :class:`Settings` field stating nothing twice: its default and description are those of
    the field ``name`` of the component dataclass ``cls`` (a ``None`` default, meaning off, is 0 in
    the environment); ``constraints`` are pydantic's (``ge=0``...), checked when settings are read."""
    spec = COMPONENTS[cls]
    (f,) = (f for f in fields(cls) if f.name == name)
    default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
    description = field_docs(cls).get(name)
    if name in spec.zero_is_none:
        default = 0 if default is None else default
        description = f"{description} In the environment, 0 is None."
    return Field(default, description=description, **constraints)


NCRONTAB_FIELDS = ("second", "minute", "hour", "day", "month", "day-of-week")
"""The fields of the Functions timer's schedule (NCRONTAB: cron with seconds first)."""
_NCRONTAB_ITEM = r"(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?"
NCRONTAB_FIELD = re.compile(rf"{_NCRONTAB_ITEM}(,{_NCRONTAB_ITEM})*")
"""One field: ``*``, a number or a name (``Mon``, ``Jan``), a range, a step, or a list of these."""
NCRONTAB_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
"""Each field's numbers (NCRONTAB's: Sunday is 0)."""
NCRONTAB_NAMES = {4: ("january", "february", "march", "april", "may", "june", "july", "august", "september",
                      "october", "november", "december"),
                  5: ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")}
"""The names the month and day-of-week fields take (any case; three letters or more of one)."""


def ncrontab_problem(index: int, text: str) -> str | None:
    """Why field ``index`` of a schedule cannot match (a number out of its range, an unknown name,
    a step of 0), or None."""
    low, high = NCRONTAB_RANGES[index]
    names = NCRONTAB_NAMES.get(index, ())
    for item in text.split(","):
        span, _, step = item.partition("/")
        if step and int(step) < 1:
            return f"step /{step} must be at least 1"
        for part in ([] if span == "*" else span.split("-")):
            if part.isdecimal():
                if not low <= int(part) <= high:
                    return f"{part} is not in {low}-{high}"
            elif len(part) < 3 or not any(n.startswith(part.lower()) for n in names):
                known = f" or a name ({', '.join(n[:3].title() for n in names)})" if names else ""
                return f"{part!r} is not a number{known}"
    return None


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
    sqlite_path: str = SQLITE_DEFAULT_PATH
    queue: Literal["sqlite", "servicebus"] = "sqlite"
    queue_name: str = Field("score-episodes", min_length=1, max_length=260)
    train_queue_name: str = Field(
        "train-agents", min_length=1, max_length=260, description="the queue of one training message per agent"
    )
    queue_max_deliveries: int = Field(MAX_DELIVERIES, ge=1, le=2000)
    queue_lock_seconds: float = Field(LOCK_SECONDS, gt=0, le=300)
    judge: Literal["offline", "evaluators"] = "offline"
    allow_offline_judge: bool = Field(False, description="allow the offline judge inside Azure Functions")

    judging: str = Field(
        "*=all",
        description="which episodes are judged per agent: pattern=spec entries, spec all, a fraction or N/min "
        "(see agent_learning.judges.sampling)",
    )

    # The judge model of the azure-ai-evaluation evaluators: Azure OpenAI or OpenAI-compatible.
    judge_azure_endpoint: str | None = None
    judge_deployment: str | None = None
    judge_api_version: str = tunable(JudgeModel, "api_version")
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key: SecretStr | None = Field(None, description="Azure OpenAI without a key uses Entra ID")
    judge_client_id: str | None = Field(None, description="user-assigned managed identity for Azure OpenAI")
    judge_attempt_timeout: float = tunable(JudgeLimits, "attempt_timeout", gt=0, le=600)
    judge_evaluator_deadline: float = tunable(JudgeLimits, "evaluator_deadline", gt=0, le=3600)
    judge_episode_deadline: float = tunable(JudgeLimits, "episode_deadline", gt=0, le=3600)
    judge_max_attempts: int = tunable(JudgeLimits, "max_attempts", ge=1, le=20)
    judge_retry_after_cap: float = tunable(JudgeLimits, "retry_after_cap", gt=0, le=600)
    judge_max_tokens_intent_resolution: int = tunable(JudgeTokens, "max_tokens_intent_resolution", ge=1, le=16384)
    judge_max_tokens_task_adherence: int = tunable(JudgeTokens, "max_tokens_task_adherence", ge=1, le=16384)
    judge_max_tokens_task_completion: int = tunable(JudgeTokens, "max_tokens_task_completion", ge=1, le=16384)
    judge_tokens_per_minute: int = tunable(JudgeTokens, "tokens_per_minute", ge=0)

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
        SCORE_SETTLE_SECONDS,
        le=3600,
        description="more than the score write timeout plus the clock-skew allowance (clock.py)",
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
    train_schedule: str = "0 */5 * * * *"

    # Reward (see agent_learning.rewards).
    w_intent: float = tunable(RewardConfig, "w_intent", ge=0)
    w_adherence: float = tunable(RewardConfig, "w_adherence", ge=0)
    w_completion: float = tunable(RewardConfig, "w_completion", ge=0)
    tool_failure_penalty: float = tunable(RewardConfig, "tool_failure_penalty", ge=0)
    max_tool_failure_penalty: float = tunable(RewardConfig, "max_tool_failure_penalty", ge=0)
    latency_budget_ms: float = tunable(RewardConfig, "latency_budget_ms", gt=0)
    latency_penalty: float = tunable(RewardConfig, "latency_penalty", ge=0)
    empty_output_penalty: float = tunable(RewardConfig, "empty_output_penalty", ge=0)
    cost_per_thousand_tokens: float = tunable(RewardConfig, "cost_per_thousand_tokens", ge=0, le=10)
    feedback_weight: float = tunable(RewardConfig, "feedback_weight", ge=0, le=1)

    # Learner (see agent_learning.learning.reinforce).
    # A learner setting whose off is None in LearnerConfig is turned off with 0 here.
    learning_rate: float = tunable(LearnerConfig, "learning_rate", gt=0)
    direction: Literal["evidence", "plain"] = tunable(LearnerConfig, "direction")
    normalize_advantages: bool = tunable(LearnerConfig, "normalize_advantages")
    min_reward_std: float = tunable(LearnerConfig, "min_reward_std", gt=0)
    entropy_coef: float = tunable(LearnerConfig, "entropy_coef", ge=0)
    importance_clip: float = tunable(LearnerConfig, "importance_clip", ge=1)
    max_kl: float = tunable(LearnerConfig, "max_kl", ge=0)
    evidence_prior: float = tunable(LearnerConfig, "evidence_prior", ge=0)
    reference_batch: int = tunable(LearnerConfig, "reference_batch", ge=0)
    max_logit_gap: float = tunable(LearnerConfig, "max_logit_gap", ge=0)
    gap_per_evidence: float = tunable(LearnerConfig, "gap_per_evidence", ge=0)
    gap_slack: float = tunable(LearnerConfig, "gap_slack", ge=0)
    calibration: float = tunable(LearnerConfig, "calibration", ge=0, le=1000)
    thompson_floor: float = tunable(LearnerConfig, "thompson_floor", ge=0, le=1000)
    dimension_thompson_floor: float = tunable(LearnerConfig, "dimension_thompson_floor", ge=0, le=1000)
    odds_cap: float = tunable(LearnerConfig, "odds_cap", ge=0, le=1000)
    evidence_half_life: float = tunable(LearnerConfig, "evidence_half_life", ge=0)
    change_threshold: float = tunable(LearnerConfig, "change_threshold", ge=0, le=1000)
    recent_half_life: float = tunable(LearnerConfig, "recent_half_life", gt=0)
    logit_bound: float = tunable(LearnerConfig, "logit_bound", gt=0, le=1000)
    baseline_prior: float = tunable(LearnerConfig, "baseline_prior", ge=0)
    segment_prior: float = tunable(LearnerConfig, "segment_prior", ge=0)
    segment_gap_slack: float = tunable(LearnerConfig, "segment_gap_slack", ge=0)
    train_max_batch: int = Field(
        TRAIN_BATCH, ge=1, le=MAX_TRAIN_BATCH, description="bounded by memory, see MAX_TRAIN_BATCH"
    )
    train_min_batch: int = Field(1, ge=1)

    # Exploration-collapse and reward-drop warnings (see agent_learning.pipeline.drift).
    collapse_entropy: float = tunable(DriftConfig, "collapse_entropy", ge=0, le=1)
    collapse_reward_fall: float = tunable(DriftConfig, "collapse_reward_fall", ge=0)
    reward_drop: float = tunable(DriftConfig, "reward_drop", gt=0)
    drift_window: int = tunable(DriftConfig, "window", ge=1, le=100_000)
    drift_z: float = tunable(DriftConfig, "evidence_z", ge=0, le=10)
    auto_pin: bool = tunable(DriftConfig, "auto_pin")

    # The publish guardrail: each candidate evaluated off-policy first (see agent_learning.evaluation).
    guardrail: Literal["off", "warn", "enforce"] = tunable(GuardrailConfig, "mode")
    guardrail_margin: float = tunable(GuardrailConfig, "margin", ge=0, le=2)
    guardrail_confidence: float = tunable(GuardrailConfig, "confidence", gt=0, lt=1)
    guardrail_min_effective_samples: float = tunable(GuardrailConfig, "min_effective_samples", ge=2)
    guardrail_safe_confidence: float = tunable(GuardrailConfig, "safe_confidence", ge=0, lt=1)
    guardrail_budget_latency_ms: float = tunable(GuardrailConfig, "budget_latency_ms", ge=0)
    guardrail_budget_tool_failure_rate: float = tunable(GuardrailConfig, "budget_tool_failure_rate", ge=0, le=1)
    guardrail_budget_tokens: float = tunable(GuardrailConfig, "budget_tokens", ge=0)

    # Telemetry (see agent_learning.core.telemetry).
    telemetry: Literal["auto", "off", "console", "azure-monitor"] = "auto"
    applicationinsights_connection_string: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(
            f"{PREFIX}APPLICATIONINSIGHTS_CONNECTION_STRING", "APPLICATIONINSIGHTS_CONNECTION_STRING"
        ),
    )

    # New policies and agents.
    temperature: float = Field(DEFAULT_TEMPERATURE, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
    exploration_floor: float = Field(DEFAULT_EXPLORATION_FLOOR, ge=0, lt=1)
    policy_refresh_seconds: float = Field(REFRESH_SECONDS, ge=0)

    # Episode ingestion over HTTP for deployments that isolate agents (see agent_learning.app.ingestion).
    episode_writers: Annotated[dict[str, list[str]], NoDecode] = Field(
        {}, description="JSON: caller identity → agent ids or patterns it may write; empty: the route is off"
    )

    personalizer_create_agents: bool = Field(
        True,
        description="the first Personalizer rank for an unknown agent creates it from the request's actions",
    )

    trust_principal_header: bool = Field(
        False,
        description="App Service Authentication is on: its X-MS-CLIENT-PRINCIPAL-ID header names the caller",
    )

    # Who may call the Personalizer routes where the host does not check keys (see agent_learning.app.callers).
    personalizer_key_sha256: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated SHA-256 digests (hex) of the keys Personalizer clients send; "
                        "empty: no key is accepted",
    )
    personalizer_principals: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated Entra ID object ids that may call the Personalizer routes with a token "
                        "(with trust_principal_header); empty: no token is accepted",
    )

    @field_validator("episode_writers", mode="before")
    @classmethod
    def _episode_writers(cls, value: Any) -> dict[str, list[str]]:
        return parse_episode_writers(value)

    @field_validator("personalizer_key_sha256", mode="before")
    @classmethod
    def _personalizer_key_sha256(cls, value: Any) -> tuple[str, ...]:
        return parse_key_digests(value)

    @field_validator("personalizer_principals", mode="before")
    @classmethod
    def _personalizer_principals(cls, value: Any) -> tuple[str, ...]:
        return parse_principals(value)

    @field_validator("cosmos_endpoint")
    @classmethod
    def _cosmos_endpoint(cls, value: str | None) -> str | None:
        parts = urlsplit(value) if value is not None else None
        if parts is not None and (parts.scheme not in ("https", "http") or not _host_name(parts.hostname)):
            raise ValueError("must be the account's URL, https://<account>.documents.azure.com:443/")
        return value

    @field_validator("cosmos_key")
    @classmethod
    def _cosmos_key(cls, value: SecretStr | None) -> SecretStr | None:
        try:
            if value is not None:
                base64.b64decode(value.get_secret_value(), validate=True)
        except binascii.Error:
            raise ValueError("must be the account key, in base64 as the portal shows it") from None
        return value

    @field_validator("servicebus_namespace")
    @classmethod
    def _servicebus_namespace(cls, value: str | None) -> str | None:
        if value is not None and not _host_name(urlsplit(value if "://" in value else "//" + value).hostname):
            raise ValueError("must be the namespace's host name, <namespace>.servicebus.windows.net")
        return value

    @field_validator("cosmos_client_id", "servicebus_client_id", "judge_client_id")
    @classmethod
    def _client_id(cls, value: str | None) -> str | None:
        if value is not None and not CLIENT_ID.fullmatch(value):
            raise ValueError(
                "must be the client id of a user-assigned managed identity, a GUID "
                "(az identity show --query clientId), not its name or resource id"
            )
        return value

    @field_validator("judging")
    @classmethod
    def _judging(cls, value: str) -> str:
        return normalise_judging(value)

    @field_validator("queue_name", "train_queue_name")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        if not QUEUE_NAME.fullmatch(value):
            raise ValueError("must be a Service Bus queue name: letters, digits, '.', '-' and '_', in segments "
                             "joined by '/'")
        return value

    @field_validator("cosmos_database")
    @classmethod
    def _database_name(cls, value: str) -> str:
        if not DATABASE_NAME.fullmatch(value):
            raise ValueError("must be a Cosmos DB database id: none of / \\ # ?, and no space at the end")
        return value

    @field_validator("train_schedule")
    @classmethod
    def _ncrontab(cls, value: str) -> str:
        fields = value.split()
        if len(fields) != len(NCRONTAB_FIELDS) or not all(NCRONTAB_FIELD.fullmatch(f) for f in fields):
            raise ValueError(
                f"must be an NCRONTAB expression of {len(NCRONTAB_FIELDS)} fields ({' '.join(NCRONTAB_FIELDS)}),"
                " each '*', a number or name, a range a-b, a step /n or a list of those, e.g. '0 */5 * * * *';"
                f" got {value!r:.80}"
            )
        for i, (name, text) in enumerate(zip(NCRONTAB_FIELDS, fields, strict=True)):
            problem = ncrontab_problem(i, text)
            if problem:
                raise ValueError(f"the {name} field {text!r}: {problem}")
        return value

    @field_validator("score_settle_seconds")
    @classmethod
    def _settle_window_can_work(cls, value: float) -> float:
        check_settle_window(value)
        return value

    # Kept for compatibility: the library builds its components in :mod:`agent_learning.app.wiring`.
    def reward_config(self) -> RewardConfig:
        return component(self, RewardConfig)

    def learner_config(self) -> LearnerConfig:
        return component(self, LearnerConfig)

    def judge_model_config(self) -> JudgeModel:
        return component(self, JudgeModel)

    def judge_limits(self) -> JudgeLimits:
        return component(self, JudgeLimits)

    def judge_tokens(self) -> JudgeTokens:
        return component(self, JudgeTokens)

    def drift_config(self) -> DriftConfig:
        return component(self, DriftConfig)

    def guardrail_config(self) -> GuardrailConfig:
        return component(self, GuardrailConfig)


def _host_name(host: str | None) -> bool:
    return host is not None and HOST_NAME.fullmatch(host) is not None


def _variables(key: str) -> str:
    """The environment variable a validation error's location stands for: both names of a
    setting read from two (``AGENT_LEARNING_COSMOS_ENDPOINT or CosmosDBConnection__accountEndpoint``)."""
    for info in Settings.model_fields.values():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices) and key in alias.choices:
            return " or ".join(str(choice) for choice in alias.choices)
    return PREFIX + key.upper()


def _set_twice(overrides: dict[str, Any]) -> list[str]:
    """Settings read from two variables that are both set, to different values: the library would
    use the first and the Functions host the second (e.g. two managed identities)."""
    environ = {k.lower(): v.strip() for k, v in os.environ.items() if v.strip()}
    problems = []
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        if name in overrides or not isinstance(alias, AliasChoices):
            continue
        given = {str(c): environ[str(c).lower()] for c in alias.choices if str(c).lower() in environ}
        if len(set(given.values())) > 1:
            problems.append(f"{' and '.join(given)} are both set, to different values (the Functions host reads "
                            f"{alias.choices[-1]}): set one of them, or both alike")
    return problems


SEED_NAMES = {
    f"{PREFIX}LR": "learning_rate",
    f"{PREFIX}JUDGE_ENDPOINT": "judge_azure_endpoint",
}
"""Variables of the ``azure-agents-learning-sdk`` README that this library names otherwise →
the setting that does their job (docs/migrating.md). Its other variables have the same names here."""
SEED_REFUSED = {
    f"{PREFIX}BASELINE_DECAY": (
        "this learner keeps no moving-average baseline to decay: each training run's baseline is the "
        f"importance-weighted mean reward of its own batch; unset it ({PREFIX}BASELINE_PRIOR shrinks a context's "
        "baseline towards the batch's for structured policies)"
    ),
}
"""Variables of that README with no knob here → what replaces them; setting one is an error."""
SEED_SWITCHES = {
    f"{PREFIX}COSMOS_ENDPOINT": ("store", "cosmos"),
    f"{PREFIX}JUDGE_ENDPOINT": ("judge", "evaluators"),
}
"""Seed variables that, set alone, also choose what they imply (as in that README): the Cosmos DB
store, the azure-ai-evaluation judges. An explicit ``AGENT_LEARNING_STORE`` / ``_JUDGE`` wins."""


JUDGE_MODEL_SETTINGS = ("judge_azure_endpoint", "judge_deployment", "judge_base_url", "judge_model")
"""The settings that choose a judge model: set while the judge is left at offline, they are refused."""


def known_variables() -> set[str]:
    """Every ``AGENT_LEARNING_*`` variable the library reads or refuses with a reason."""
    names = {PREFIX + name.upper() for name in Settings.model_fields}
    for info in Settings.model_fields.values():
        if isinstance(info.validation_alias, AliasChoices):
            names.update(str(c).upper() for c in info.validation_alias.choices if str(c).upper().startswith(PREFIX))
    return names | set(SEED_NAMES) | set(SEED_REFUSED)


def _given(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment's non-empty ``AGENT_LEARNING_*`` variables, names in upper case (they are
    read whatever their case; an empty one is unset)."""
    return {k.upper(): v for k, v in environ.items() if k.upper().startswith(PREFIX) and v.strip()}


def check_variables(environ: Mapping[str, str] | None = None) -> None:
    """Refuse unknown ``AGENT_LEARNING_*`` variables (a typo would be ignored) and the seed's
    variables that have no knob here, naming each and what to use instead."""
    given = _given(os.environ if environ is None else environ)
    known = sorted(n.removeprefix(PREFIX) for n in known_variables() - set(SEED_REFUSED))
    problems = [f"{name}: {SEED_REFUSED[name]}" for name in sorted(given) if name in SEED_REFUSED]
    for name in sorted(set(given) - known_variables()):
        close = difflib.get_close_matches(name.removeprefix(PREFIX), known, n=1, cutoff=0.75)
        hint = f"did you mean {PREFIX}{close[0]}?" if close else "docs/configuration.md lists the settings"
        problems.append(f"{name} is not a setting ({hint})")
    if problems:
        raise ConfigurationError("invalid configuration: " + "; ".join(problems))


def seed_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Setting → value from the seed's names (:data:`SEED_NAMES`, :data:`SEED_SWITCHES`). Its
    name and this library's set to different values is an error."""
    given = _given(os.environ if environ is None else environ)
    values: dict[str, Any] = {}
    for seed, field in SEED_NAMES.items():
        if seed not in given:
            continue
        ours = PREFIX + field.upper()
        if ours in given and given[ours].strip() != given[seed].strip():
            raise ConfigurationError(
                f"invalid configuration: {seed} and {ours} are both set, to different values (they are one "
                "setting): set one of them"
            )
        values[field] = given[seed]
    for seed, (field, value) in SEED_SWITCHES.items():
        if seed in given and PREFIX + field.upper() not in given:
            values[field] = value
    return values


@dataclass(frozen=True)
class Effective:
    """One setting as the library uses it, and where its value came from (``agent-learn config``)."""

    setting: str
    variable: str
    """Its documented variable (docs/configuration.md)."""
    value: Any
    """The value; a secret's is ``"<set>"``."""
    source: Literal["default", "environment", "implied", "option", "local.settings.json"]
    """``implied``: chosen by another variable (:data:`SEED_SWITCHES`); ``local.settings.json``: not
    set here, only in that file, which ``func start`` reads (the value is then the default)."""
    origin: str = ""
    """The variable that set it (another name of it, the seed's included) or implied it."""


def effective_settings(
    settings: Settings,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    local_settings: Mapping[str, str] | None = None,
) -> list[Effective]:
    """Every setting of ``settings``, with its source: an ``overrides`` option, an environment
    variable, implied by one, or the default (noted when ``local_settings``, the ``Values`` of a
    local.settings.json, set it for the Functions host)."""
    environ = os.environ if environ is None else environ
    upper = {k.upper(): k for k, v in environ.items() if v.strip()}
    readers: dict[str, list[str]] = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        readers[name] = ([str(c) for c in alias.choices] if isinstance(alias, AliasChoices)
                         else [PREFIX + name.upper()])
    for seed, name in SEED_NAMES.items():
        readers[name].insert(0, seed)
    switched = {field: seed for seed, (field, _) in SEED_SWITCHES.items() if seed in upper}
    documented = environment_names()
    rows = []
    for name in Settings.model_fields:
        value = getattr(settings, name)
        value = "<set>" if isinstance(value, SecretStr) else value
        found = next((upper[r.upper()] for r in readers[name] if r.upper() in upper), None)
        if overrides and name in overrides:
            rows.append(Effective(name, documented[name], value, "option"))
        elif found is not None:
            rows.append(Effective(name, documented[name], value, "environment", found))
        elif name in switched and PREFIX + name.upper() not in upper:
            rows.append(Effective(name, documented[name], value, "implied", switched[name]))
        elif local_settings and any(local_settings.get(r, "").strip() for r in readers[name]):
            rows.append(Effective(name, documented[name], value, "local.settings.json"))
        else:
            rows.append(Effective(name, documented[name], value, "default"))
    return rows


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the environment; ``overrides`` win over it. Unknown ``AGENT_LEARNING_*``
    variables are refused (:func:`check_variables`); the seed's names are read (:func:`seed_overrides`)."""
    check_variables()
    seeded = {k: v for k, v in seed_overrides().items() if k not in overrides}
    try:
        settings = Settings(**seeded, **overrides)
    except ValidationError as exc:
        problems = []
        seed_of = {field: seed for seed, field in SEED_NAMES.items()}
        for err in exc.errors(include_url=False):
            name = _variables(".".join(str(p) for p in err["loc"]))
            if err["loc"] and err["loc"][0] in seeded and err["loc"][0] in seed_of:
                name = seed_of[str(err["loc"][0])]
            given = err.get("input")
            if err["loc"] and err["loc"][0] in NOT_ECHOED:
                got = ""
            elif isinstance(given, str) and HOLDS_A_SECRET.search(given):
                got = " (not repeated: it holds a key, as a connection string does)"
            else:
                got = f" (got {given!r})"
            problems.append(f"{name}: {err['msg'].removeprefix('Value error, ')}{got}")
        raise ConfigurationError("invalid configuration: " + "; ".join(problems)) from None
    twice = _set_twice(overrides)
    if twice:
        raise ConfigurationError("invalid configuration: " + "; ".join(twice))
    # Settings that are only invalid together fail now, not later.
    component(settings, RewardConfig)
    component(settings, LearnerConfig)
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
        component(settings, JudgeModel)  # raises ConfigurationError naming the missing variables
    elif "judge" not in settings.model_fields_set:
        unused = [PREFIX + name.upper() for name in JUDGE_MODEL_SETTINGS if getattr(settings, name) is not None]
        if unused:  # a judge model configured for a judge that is not chosen would be ignored
            raise ConfigurationError(
                f"invalid configuration: {' and '.join(unused)} configure the judge model, but the judge is the "
                f"offline one ({PREFIX}JUDGE unset): set {PREFIX}JUDGE=evaluators (with {PREFIX}JUDGE_ENDPOINT "
                f"or {PREFIX}JUDGE_AZURE_ENDPOINT and {PREFIX}JUDGE_DEPLOYMENT), or {PREFIX}JUDGE=offline to keep it"
            )
    return settings


def environment_names() -> dict[str, str]:
    """Field name → the environment variable ``docs/configuration.md`` documents for it."""
    names = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names[name] = str(alias.choices[-1])  # the Functions host's identity-based setting
        else:
            names[name] = PREFIX + name.upper()
    return names


def component(settings: Settings, cls: type[T]) -> T:
    """``cls`` (a component's configuration dataclass) with the values of ``settings``.

    Fields without a setting keep their defaults. A value the component rejects raises
    :class:`~agent_learning.core.errors.ConfigurationError` naming the environment variables.
    """
    spec = COMPONENTS[cls]
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
