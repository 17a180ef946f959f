"""Settings from AGENT_LEARNING_* environment variables."""

from __future__ import annotations

import inspect
import re

import pytest

from agent_learning.agent.client import PolicyClient
from agent_learning.app.settings import PREFIX, Settings, load_settings
from agent_learning.core.errors import ConfigurationError
from agent_learning.learning.reinforce import LearnerConfig
from agent_learning.pipeline import MAX_TRAIN_BATCH
from agent_learning.policy.softmax import SoftmaxPolicy, StructuredPolicy
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardConfig

pytestmark = pytest.mark.usefixtures("clean_env")


def test_defaults() -> None:
    s = load_settings()
    assert isinstance(s, Settings)
    assert (s.store, s.sqlite_path, s.queue, s.queue_name, s.judge) == (
        "sqlite",
        ".agent-learning/local.db",
        "sqlite",
        "score-episodes",
        "offline",
    )
    assert (s.queue_max_deliveries, s.queue_lock_seconds) == (10, 60.0)
    assert (s.w_intent, s.w_adherence, s.w_completion) == (0.4, 0.3, 0.3)
    assert (s.temperature, s.exploration_floor, s.policy_refresh_seconds) == (1.0, 0.001, 30.0)
    assert (s.train_max_batch, s.train_min_batch) == (10_000, 1)
    assert s.reward_config() == RewardConfig()
    learner = s.learner_config()
    assert learner == LearnerConfig()  # the environment's defaults are the learner's defaults
    assert (learner.evidence_prior, learner.reference_batch, learner.max_logit_gap) == (3.0, 50, 8.0)


def test_the_python_api_defaults_are_the_settings_defaults() -> None:
    """A policy, a policy client or a queue made from Python without an argument gets what the
    settings give by default (a policy made from Python once had no exploration floor)."""
    s = load_settings()

    def default(call: object, name: str) -> object:
        return inspect.signature(call).parameters[name].default  # type: ignore[arg-type]

    for make in (SoftmaxPolicy.from_actions, StructuredPolicy.create, SoftmaxPolicy):
        assert default(make, "temperature") == s.temperature
        assert default(make, "exploration_floor") == s.exploration_floor
    flat, structured = SoftmaxPolicy.from_actions("bot", ["a", "b"]), StructuredPolicy.create("bot", {"k": [1, 3]})
    assert flat.exploration_floor == structured.exploration_floor == s.exploration_floor > 0
    assert default(PolicyClient, "refresh_seconds") == s.policy_refresh_seconds
    assert (default(SQLiteQueue, "lock_seconds"), default(SQLiteQueue, "max_deliveries")) == (
        s.queue_lock_seconds, s.queue_max_deliveries)


def test_env_overrides(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_W_INTENT", "0.5")
    clean_env.setenv("AGENT_LEARNING_STORE", "memory")
    clean_env.setenv("AGENT_LEARNING_QUEUE_MAX_DELIVERIES", "3")
    clean_env.setenv("AGENT_LEARNING_DIRECTION", "plain")
    clean_env.setenv("AGENT_LEARNING_MAX_LOGIT_GAP", "0")
    clean_env.setenv("AGENT_LEARNING_LATENCY_BUDGET_MS", "1500")
    s = load_settings()
    assert s.w_intent == 0.5
    assert s.reward_config().w_intent == 0.5
    assert s.reward_config().latency_budget_ms == 1500.0
    assert s.reward_config().w_adherence == 0.3
    assert (s.store, s.queue_max_deliveries) == ("memory", 3)
    assert s.learner_config().direction == "plain"
    assert s.learner_config().max_logit_gap is None  # 0 turns the limit off


@pytest.mark.parametrize(("value", "expected"), [("0.8", 0.8), ("0", None)])
def test_the_guardrails_safe_confidence_is_a_setting(clean_env: pytest.MonkeyPatch, value: str,
                                                     expected: float | None) -> None:
    clean_env.setenv("AGENT_LEARNING_GUARDRAIL_SAFE_CONFIDENCE", value)
    assert load_settings().guardrail_config().safe_confidence == expected  # 0: no safety bound, as None


def test_a_safe_confidence_below_one_half_is_refused_naming_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_GUARDRAIL_SAFE_CONFIDENCE", "0.3")
    with pytest.raises(ConfigurationError, match=r"_SAFE_CONFIDENCE: 0\.3 must be at least 0\.5"):
        load_settings().guardrail_config()


def test_keyword_overrides_win_over_env(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_W_INTENT", "0.5")
    assert load_settings(w_intent=0.2).w_intent == 0.2


def test_variables_without_the_prefix_are_ignored(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("W_INTENT", "0.9")
    clean_env.setenv("AGENT_LEARNING_EMPTY_IS_UNSET", "")
    assert load_settings().w_intent == 0.4


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("AGENT_LEARNING_W_INTNET", "AGENT_LEARNING_W_INTENT"),
        ("agent_learning_learning_rat", "AGENT_LEARNING_LEARNING_RATE"),  # read whatever the case
        ("AGENT_LEARNING_COSMOS_DB", "AGENT_LEARNING_COSMOS_DATABASE"),
        ("AGENT_LEARNING_NOT_A_SETTING", None),
    ],
)
def test_an_unknown_variable_is_refused_naming_the_closest_setting(
    clean_env: pytest.MonkeyPatch, name: str, closest: str | None
) -> None:
    clean_env.setenv(name, "0.5")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert f"{name.upper()} is not a setting" in str(info.value)
    assert (f"did you mean {closest}?" if closest else "docs/configuration.md lists the settings") in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("W_INTENT", "abc"),
        ("W_INTENT", "-1"),
        ("W_INTENT", "nan"),
        ("QUEUE_MAX_DELIVERIES", "0"),
        ("QUEUE_MAX_DELIVERIES", "2.5"),
        ("STORE", "postgres"),
        ("JUDGE", "gpt"),
        ("DIRECTION", "sideways"),
        ("EXPLORATION_FLOOR", "1"),
        ("TEMPERATURE", "0"),
        ("TEMPERATURE", "1e-310"),  # below MIN_TEMPERATURE: every training would fail
        ("SCORE_SETTLE_SECONDS", "0"),  # no settle window: scores could land behind the cursor
        ("SCORE_SETTLE_SECONDS", "15"),  # not more than the write timeout plus the clock-skew allowance
        ("TRAIN_MAX_BATCH", "190000"),  # beyond MAX_TRAIN_BATCH's memory budget
        ("LATENCY_BUDGET_MS", "0"),
        ("GUARDRAIL_SAFE_CONFIDENCE", "1"),
        ("QUEUE_NAME", "x" * 261),
        ("QUEUE_NAME", "score episodes"),  # Service Bus: letters, digits, . - _ in segments joined by /
        ("TRAIN_QUEUE_NAME", "/train"),
        ("COSMOS_DATABASE", "agents/prod"),  # Cosmos DB: none of / \ # ?
        ("COSMOS_DATABASE", "agents "),
        ("TRAIN_SCHEDULE", "hello world"),
        ("TRAIN_SCHEDULE", "*/5 * * * *"),  # five fields: cron without NCRONTAB's seconds
        ("TRAIN_SCHEDULE", "0 */5 * * * * *"),
        ("JUDGE_CLIENT_ID", "id-func"),  # the identity's name, not its client id: every token request would fail
    ],
)
def test_bad_values_name_the_variable(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(PREFIX + name, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert PREFIX + name in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        ("0 0 25 * * *", "the hour field '25': 25 is not in 0-23"),
        ("0 5-70 * * * *", "the minute field '5-70': 70 is not in 0-59"),
        ("0 */0 * * * *", "the minute field '*/0': step /0 must be at least 1"),
        ("0 0 0 0 * *", "the day field '0': 0 is not in 1-31"),
        ("0 0 9 * * 7", "the day-of-week field '7': 7 is not in 0-6"),
        ("0 0 9 * * Mo", "the day-of-week field 'Mo': 'Mo' is not a number or a name (Sun, Mon, "),
        ("0 0 9 * Jam *", "the month field 'Jam': 'Jam' is not a number or a name (Jan, Feb, "),
    ],
)
def test_a_schedule_that_can_never_match_as_written_names_its_field(
    clean_env: pytest.MonkeyPatch, schedule: str, problem: str
) -> None:
    clean_env.setenv(PREFIX + "TRAIN_SCHEDULE", schedule)
    with pytest.raises(ConfigurationError, match=re.escape(f"{PREFIX}TRAIN_SCHEDULE: {problem}")):
        load_settings()


@pytest.mark.parametrize(
    "schedule", ["0 */5 * * * *", "0 0 9-17 * * Mon-Fri", "0 30 9,21 1/2 Jan,Jul *", "59 59 23 31 12 6",
                 "0 0 9 * * monday"],
)
def test_ncrontab_schedules_are_accepted(clean_env: pytest.MonkeyPatch, schedule: str) -> None:
    clean_env.setenv(PREFIX + "TRAIN_SCHEDULE", schedule)
    assert load_settings().train_schedule == schedule


def test_an_empty_variable_counts_as_unset(clean_env: pytest.MonkeyPatch) -> None:
    """local.settings.json lists every setting; an empty value means "use the default"."""
    clean_env.setenv("AGENT_LEARNING_QUEUE_NAME", "")
    clean_env.setenv("AGENT_LEARNING_COSMOS_KEY", "")
    settings = load_settings()
    assert settings.queue_name == "score-episodes" and settings.cosmos_key is None


def test_azure_backends_require_their_endpoints(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_STORE", "cosmos")
    clean_env.setenv("AGENT_LEARNING_QUEUE", "servicebus")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "CosmosDBConnection__accountEndpoint" in str(info.value)
    assert "ServiceBusConnection__fullyQualifiedNamespace" in str(info.value)
    clean_env.setenv("CosmosDBConnection__accountEndpoint", "https://acct.documents.azure.com:443/")
    clean_env.setenv("ServiceBusConnection__fullyQualifiedNamespace", "ns.servicebus.windows.net")
    clean_env.setenv("CosmosDBConnection__clientId", "00000000-0000-0000-0000-000000000001")
    settings = load_settings()
    assert settings.cosmos_endpoint == "https://acct.documents.azure.com:443/"
    assert settings.servicebus_namespace == "ns.servicebus.windows.net"
    assert settings.cosmos_client_id == "00000000-0000-0000-0000-000000000001"


def test_every_bad_variable_is_reported(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_W_INTENT", "abc")
    clean_env.setenv("AGENT_LEARNING_STORE", "postgres")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "AGENT_LEARNING_W_INTENT" in str(info.value) and "AGENT_LEARNING_STORE" in str(info.value)


def test_all_zero_weights(clean_env: pytest.MonkeyPatch) -> None:
    for name in ("W_INTENT", "W_ADHERENCE", "W_COMPLETION"):
        clean_env.setenv(PREFIX + name, "0")
    with pytest.raises(ConfigurationError, match="cannot all be 0") as info:
        load_settings()  # invalid together: caught at start, not at the first scoring
    assert "AGENT_LEARNING_W_INTENT" in str(info.value)


def test_the_recent_half_life_must_be_shorter_than_the_evidence_half_life(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_EVIDENCE_HALF_LIFE", "200")
    with pytest.raises(ConfigurationError, match="must be less than") as info:
        load_settings()
    assert "AGENT_LEARNING_RECENT_HALF_LIFE=300" in str(info.value)
    assert "AGENT_LEARNING_EVIDENCE_HALF_LIFE=200" in str(info.value)
    clean_env.setenv("AGENT_LEARNING_CHANGE_THRESHOLD", "0")
    clean_env.setenv("AGENT_LEARNING_RECENT_HALF_LIFE", "100")
    assert load_settings().learner_config().change_threshold is None


def test_zero_max_kl_turns_the_trust_region_off(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_MAX_KL", "0")
    assert load_settings().learner_config().max_kl is None
    clean_env.setenv("AGENT_LEARNING_MAX_KL", "0.1")
    assert load_settings().learner_config().max_kl == 0.1


def test_settings_that_cannot_work_together_are_refused(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_TRAIN_MIN_BATCH", "500")
    clean_env.setenv("AGENT_LEARNING_TRAIN_MAX_BATCH", "100")
    with pytest.raises(ConfigurationError, match=r"AGENT_LEARNING_TRAIN_MIN_BATCH .*must not exceed"):
        load_settings()
    settle = load_settings(score_settle_seconds=15.5, train_max_batch=MAX_TRAIN_BATCH, train_min_batch=1)
    assert (settle.score_settle_seconds, settle.train_max_batch) == (15.5, MAX_TRAIN_BATCH)
    with pytest.raises(ConfigurationError, match=r"write timeout .*plus the clock-skew allowance"):
        load_settings(score_settle_seconds=0)


def test_infinite_weight_rejected_at_load(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AGENT_LEARNING_W_INTENT", "inf")
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_W_INTENT"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COSMOS_ENDPOINT", "garbage"),
        ("COSMOS_ENDPOINT", "127.0.0.1:8081"),  # no scheme: the SDK would call it an unreachable URL
        ("COSMOS_ENDPOINT", "https://<your-cosmos-account>.documents.azure.com:443/"),  # the sample's placeholder
        ("SERVICEBUS_NAMESPACE", "not a namespace"),  # the SDK would fail on DNS, as if the network were down
        ("SERVICEBUS_NAMESPACE", "<your-namespace>.servicebus.windows.net"),
    ],
)
def test_an_azure_address_that_cannot_be_one_names_the_variable(
    clean_env: pytest.MonkeyPatch, name: str, value: str
) -> None:
    clean_env.setenv(PREFIX + name, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert PREFIX + name in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COSMOS_ENDPOINT", "https://acct.documents.azure.com:443/"),
        ("COSMOS_ENDPOINT", "https://127.0.0.1:8081/"),
        ("SERVICEBUS_NAMESPACE", "ns.servicebus.windows.net"),
        ("SERVICEBUS_NAMESPACE", "sb://ns.servicebus.windows.net/"),  # the SDK strips the scheme
        ("SERVICEBUS_NAMESPACE", "localhost"),
    ],
)
def test_azure_addresses_in_the_forms_the_sdks_take_are_accepted(
    clean_env: pytest.MonkeyPatch, name: str, value: str
) -> None:
    clean_env.setenv(PREFIX + name, value)
    assert load_settings().model_dump()[name.lower()] == value


@pytest.mark.parametrize(
    ("variable", "value", "named", "alias"),
    [
        ("CosmosDBConnection__accountEndpoint", "ftp://acct", "COSMOS_ENDPOINT", "CosmosDBConnection__accountEndpoint"),
        ("AGENT_LEARNING_COSMOS_ENDPOINT", "ftp://acct", "COSMOS_ENDPOINT", "CosmosDBConnection__accountEndpoint"),
        ("ServiceBusConnection__fullyQualifiedNamespace", "a b", "SERVICEBUS_NAMESPACE",
         "ServiceBusConnection__fullyQualifiedNamespace"),
        ("CosmosDBConnection__clientId", "id-func", "COSMOS_CLIENT_ID", "CosmosDBConnection__clientId"),
        ("ServiceBusConnection__clientId", "/subscriptions/x/resourceGroups/rg", "SERVICEBUS_CLIENT_ID",
         "ServiceBusConnection__clientId"),
    ],
)
def test_a_bad_aliased_setting_is_named_by_both_its_variables(
    clean_env: pytest.MonkeyPatch, variable: str, value: str, named: str, alias: str
) -> None:
    """The error names both variables the setting is read from (not the prefix twice)."""
    clean_env.setenv(variable, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    message = str(info.value)
    assert f"configuration: {PREFIX}{named} or {alias}: " in message and PREFIX + PREFIX not in message


def test_a_setting_given_twice_with_different_values_is_refused(clean_env: pytest.MonkeyPatch) -> None:
    """The library reads the first variable, the Functions host the second: two identities."""
    one, other = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
    clean_env.setenv("AGENT_LEARNING_COSMOS_CLIENT_ID", one)
    clean_env.setenv("CosmosDBConnection__clientId", other)
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_COSMOS_CLIENT_ID and CosmosDBConnection__clientId are "
                                                 "both set, to different values") as info:
        load_settings()
    assert one not in str(info.value) and other not in str(info.value)
    assert load_settings(cosmos_client_id=one).cosmos_client_id == one  # an override wins over both
    clean_env.setenv("CosmosDBConnection__clientId", one)
    assert load_settings().cosmos_client_id == one  # both alike


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CosmosDBConnection__accountEndpoint", "AccountEndpoint=https://acct.documents.azure.com:443/;AccountKey=s3cret=="),
        (
            "ServiceBusConnection__fullyQualifiedNamespace",
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=s3cret=",
        ),
    ],
)
def test_a_connection_string_pasted_as_an_endpoint_is_not_repeated(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """The error is logged: the key in a connection string given in place of an endpoint stays out of it."""
    clean_env.setenv(variable, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert variable in str(info.value) and "s3cret" not in str(info.value)


def test_a_cosmos_key_that_is_not_base64_names_the_variable_without_repeating_it(clean_env: pytest.MonkeyPatch) -> None:
    """The SDK would fail at the first request with "Incorrect padding", naming nothing."""
    clean_env.setenv(PREFIX + "COSMOS_KEY", "not-the-key-s3cret")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert PREFIX + "COSMOS_KEY" in str(info.value) and "s3cret" not in str(info.value)
    clean_env.setenv(PREFIX + "COSMOS_KEY", "Y29zbW9zLXRlc3Qta2V5LW5vdC1hLXNlY3JldA==")
    assert load_settings().cosmos_key is not None
