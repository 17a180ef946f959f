"""The Azure deployment (``infra/`` and ``azure.yaml``), parsed with pycep-parser and checked
against the code: every setting the library and the bindings read is set, the containers match
the store's, no key or connection string appears, and every role is granted on the one resource
it is for. ``make infra-check`` scans the same files with checkov."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import typing
from pathlib import Path
from typing import Any

import checkov_gate
import pytest

pytest.importorskip("azure.functions")
pytest.importorskip("pycep")
from app_functions import functions
from azure.cosmos import exceptions as cosmos_errors
from pycep import BicepParser
from pydantic import SecretStr

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.app.settings import PREFIX, Settings, environment_names
from agent_learning.core.clock import ManualClock
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.cosmos import CONTAINERS, LEASES, CosmosStore

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULES = INFRA / "modules"

# Settings the deployment must not set: secrets (keys and connection strings, which Azure never
# needs: every connection is identity-based) and the embedded store's file, unused in Azure.
# The Application Insights connection string is the exception the host needs: with local auth
# disabled on the component it carries no credential (ingestion takes the identity's token,
# APPLICATIONINSIGHTS_AUTHENTICATION_STRING), so the deployment sets it.
TELEMETRY_TARGET = "applicationinsights_connection_string"
SECRETS = {
    name
    for name, field in Settings.model_fields.items()
    if SecretStr in typing.get_args(field.annotation) and name != TELEMETRY_TARGET
}
NOT_IN_AZURE = {"sqlite_path"}

# The identity-based setting each trigger type reads for its `connection` prefix.
IDENTITY_SETTING = {"cosmosDBTrigger": "accountEndpoint", "serviceBusTrigger": "fullyQualifiedNamespace"}
HOST_SETTINGS = {
    "AzureWebJobsStorage__accountName",
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
}

# Azure built-in roles by id (Azure RBAC).
BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
SERVICE_BUS_SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
SERVICE_BUS_RECEIVER = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
OPENAI_USER = "5e0bd9bd-7b93-4f28-af87-19fc36ad61bd"

COSMOS = "Microsoft.DocumentDB/databaseAccounts"
DATA_ACTIONS = {
    "read_item": f"{COSMOS}/sqlDatabases/containers/items/read",
    "create_item": f"{COSMOS}/sqlDatabases/containers/items/create",
    "replace_item": f"{COSMOS}/sqlDatabases/containers/items/replace",
    "upsert_item": f"{COSMOS}/sqlDatabases/containers/items/upsert",
    "delete_item": f"{COSMOS}/sqlDatabases/containers/items/delete",
    "query_items": f"{COSMOS}/sqlDatabases/containers/executeQuery",
    "query_items_change_feed": f"{COSMOS}/sqlDatabases/containers/readChangeFeed",
}
READ_METADATA = f"{COSMOS}/readMetadata"


# --------------------------------------------------------------------------- reading Bicep


@functools.cache
def bicep(name: str) -> dict[str, Any]:
    """``main`` or a module of ``infra/modules`` as pycep-parser's JSON."""
    return BicepParser().parse(file_path=INFRA / "main.bicep" if name == "main" else MODULES / f"{name}.bicep")


def body(resource: dict[str, Any]) -> dict[str, Any]:
    """A resource's declaration, unwrapped from its condition or loop."""
    config = resource["config"]
    while "config" in config and ("condition" in config or "loop_type" in config):
        config = config["config"]
    return config


def literal(expr: Any) -> Any:
    """A literal's value (pycep writes -1 as a minus operator; identifiers stay strings)."""
    if isinstance(expr, dict) and expr.get("operator", {}).get("type") == "minus":
        return -expr["operator"]["operands"]["integer_value"]
    return expr


def dotted(expr: Any) -> str | None:
    """``a.b.c`` for a property access, the name for an identifier, else None."""
    if isinstance(expr, str):
        return expr
    if isinstance(expr, dict) and expr.get("operator", {}).get("type") == "property_accessor":
        operands = expr["operator"]["operands"]
        return f"{dotted(operands['operand_1'])}.{dotted(operands['operand_2'])}"
    return None


def function_args(expr: Any, name: str) -> list[Any]:
    """The arguments of a call to ``name``, in order."""
    assert isinstance(expr, dict) and expr.get("function", {}).get("type") == name, expr
    return list(expr["function"]["parameters"].values())


def resources(name: str, type_: str) -> dict[str, dict[str, Any]]:
    """Symbol → declaration of every resource of one type in a file."""
    return {s: body(r) for s, r in bicep(name).get("resources", {}).items() if r["type"] == type_}


def param_default(name: str, param: str) -> Any:
    return literal(bicep(name)["parameters"][param]["default"])


def variable(name: str, var: str) -> Any:
    return bicep(name)["variables"][var]["value"]


def app_settings() -> dict[str, Any]:
    """Every app setting the deployment gives the Function app: name → Bicep expression."""
    passed = body(bicep("main")["modules"]["functionApp"])["params"]["appSettings"]
    # Overrides come after the defaults and before the connections, which they cannot change.
    assert function_args(passed, "union") == ["pipelineSettings", "appSettingOverrides", "connectionSettings"]
    assert param_default("main", "appSettingOverrides") == {}
    config = resources("function-app", "Microsoft.Web/sites/config")["siteAppSettings"]
    assert config["name"] == "appsettings"
    assert function_args(config["properties"], "union") == ["appSettings", "hostSettings"]
    return {
        **variable("main", "pipelineSettings"),
        **variable("main", "connectionSettings"),
        **variable("function-app", "hostSettings"),
    }


def bindings() -> list[dict[str, Any]]:
    return [b for f in functions().values() for b in json.loads(f.get_function_json())["bindings"]]


def required_settings() -> set[str]:
    """What the code reads: the library's settings and the bindings' placeholders and connections."""
    names = environment_names()
    required = {names[field] for field in names if field not in SECRETS | NOT_IN_AZURE}
    for binding in bindings():
        for value in binding.values():
            required.update(re.findall(r"%([^%]+)%", str(value)))
        if "connection" in binding:
            prefix = binding["connection"]
            required |= {
                f"{prefix}__{IDENTITY_SETTING[binding['type']]}",
                f"{prefix}__credential",
                f"{prefix}__clientId",
            }
    return required | HOST_SETTINGS


# --------------------------------------------------------------------------- files


def test_every_bicep_file_parses_and_main_uses_every_module() -> None:
    files = sorted(INFRA.rglob("*.bicep"))
    assert len(files) >= 2
    for path in files:
        parsed = BicepParser().parse(file_path=path)
        assert parsed.get("resources") or parsed.get("modules"), f"{path} declares nothing"
    main = bicep("main")
    assert main["globals"]["scope"]["value"] == "subscription"
    used = {INFRA / m["detail"]["path"] for m in main["modules"].values()}
    assert used == set(MODULES.glob("*.bicep")), "a module is missing or unused"
    assert all(m["type"] == "local" for m in main["modules"].values())
    # Everything lives in the one resource group main creates.
    assert {body(m)["scope"] for m in main["modules"].values()} == {"rg"}
    assert set(main["resources"]) == {"rg"}


def test_every_resource_uses_a_dated_stable_api_version() -> None:
    for path in MODULES.glob("*.bicep"):
        for symbol, resource in bicep(path.stem)["resources"].items():
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", resource["api_version"]), f"{path.name} {symbol}"


def test_parameters_file_maps_azd_variables_to_existing_parameters() -> None:
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    declared = bicep("main")["parameters"]
    assert set(parameters) <= set(declared)
    without_default = {name for name, p in declared.items() if p["default"] is None}
    assert without_default <= set(parameters), "azd would prompt for these"
    assert all(re.fullmatch(r"\$\{[A-Z][A-Z0-9_]*(=[^}]*)?\}", p["value"]) for p in parameters.values())
    assert parameters["principalId"]["value"] == "${AZURE_PRINCIPAL_ID}"


def test_azure_yaml_deploys_this_folder_to_the_tagged_function_app() -> None:
    text = (ROOT / "azure.yaml").read_text()
    service = re.search(r"^services:\n  (\w+):\n((?:    .*\n)+)", text, re.M)
    assert service is not None
    name, fields = service.group(1), dict(re.findall(r"^    (\w+): (.+)$", service.group(2), re.M))
    assert fields == {"project": ".", "language": "python", "host": "function"}
    site = resources("function-app", "Microsoft.Web/sites")["site"]
    assert function_args(site["tags"], "union")[1] == {"'azd-service-name'": "serviceName"}
    assert body(bicep("main")["modules"]["functionApp"])["params"]["serviceName"] == name
    assert re.search(r"^  path: infra$", text, re.M) and re.search(r"^  module: main$", text, re.M)


def test_deployment_tooling_stays_out_of_the_package_and_the_repository() -> None:
    funcignore = (ROOT / ".funcignore").read_text().splitlines()
    assert {"infra/", "azure.yaml", ".venv-checkov/"} <= set(funcignore)
    assert ".venv-checkov/" in (ROOT / ".gitignore").read_text().splitlines()


# --------------------------------------------------------------------------- app settings


def test_every_setting_the_code_and_the_bindings_read_is_set() -> None:
    missing = sorted(required_settings() - set(app_settings()))
    assert not missing, f"add these to infra/main.bicep (connectionSettings or pipelineSettings): {missing}"


def test_every_agent_learning_setting_in_bicep_is_one_the_code_reads() -> None:
    known = set(environment_names().values())
    unknown = sorted(k for k in app_settings() if k.startswith(PREFIX) and k not in known)
    assert not unknown, f"the app ignores misspelt or removed settings: {unknown}"


def test_secrets_and_local_only_settings_are_not_set() -> None:
    names = environment_names()
    assert {names[f] for f in SECRETS} == {
        "AGENT_LEARNING_COSMOS_KEY",
        "AGENT_LEARNING_SERVICEBUS_CONNECTION_STRING",
        "AGENT_LEARNING_JUDGE_API_KEY",
    }
    assert not {names[f] for f in SECRETS | NOT_IN_AZURE} & set(app_settings())
    # Flex Consumption takes the runtime from functionAppConfig; these app settings are deprecated there.
    assert not {"FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE"} & set(
        app_settings()
    )
    assert "AzureWebJobsStorage" not in app_settings()


def test_a_setting_with_its_own_parameter_cannot_be_overridden() -> None:
    """appSettingOverrides outranks pipelineSettings: a setting there that a parameter (an azd
    variable) gives would ignore that parameter whenever an override names it."""
    params = set(bicep("main")["parameters"])
    pipeline = variable("main", "pipelineSettings")
    from_params = {name for name, value in pipeline.items() if references("main", value, params)}
    assert not from_params, f"move to connectionSettings, which overrides cannot change: {sorted(from_params)}"
    assert {"AGENT_LEARNING_JUDGING", "AGENT_LEARNING_GUARDRAIL"} <= set(variable("main", "connectionSettings"))


def test_connections_are_identity_based_with_the_app_identity() -> None:
    settings = app_settings()
    prefixes = {b["connection"] for b in bindings() if "connection" in b} | {"AzureWebJobsStorage"}
    for prefix in prefixes:
        assert settings[f"{prefix}__credential"] == "managedidentity"
        assert dotted(settings[f"{prefix}__clientId"]) in {"identity.outputs.clientId", "identityClientId"}
    assert dotted(settings["CosmosDBConnection__accountEndpoint"]) == "cosmos.outputs.endpoint"
    assert (
        dotted(settings["ServiceBusConnection__fullyQualifiedNamespace"])
        == "serviceBus.outputs.fullyQualifiedNamespace"
    )
    assert dotted(settings["AGENT_LEARNING_JUDGE_CLIENT_ID"]) == "identity.outputs.clientId"
    assert settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == "Authorization=AAD;ClientId=${identityClientId}"
    assert settings["AGENT_LEARNING_STORE"] == "cosmos" and settings["AGENT_LEARNING_QUEUE"] == "servicebus"


def test_literal_settings_are_valid_and_the_stated_defaults_equal_the_library() -> None:
    by_env = {env: field for field, env in environment_names().items()}
    # pycep writes an identifier and a string alike, so the quoted literals are read from the text.
    quoted = re.findall(r"^  (AGENT_LEARNING_\w+): '([^'$]*)'$", (INFRA / "main.bicep").read_text(), re.M)
    literals = {by_env[name]: value for name, value in quoted}
    assert literals["store"] == "cosmos" and literals["queue"] == "servicebus"
    settings = Settings(**literals)  # raises on an invalid value
    for name, value in variable("main", "pipelineSettings").items():
        field = by_env[name]
        assert getattr(settings, field) == Settings.model_fields[field].default, (
            f"{name}={value} in infra/main.bicep differs from the library default "
            f"{Settings.model_fields[field].default!r}: change one of them"
        )


def test_deployment_defaults_equal_the_library_defaults() -> None:
    defaults = {f: Settings.model_fields[f].default for f in Settings.model_fields}
    assert param_default("main", "cosmosDatabaseName") == defaults["cosmos_database"]
    assert param_default("main", "queueName") == defaults["queue_name"]
    assert param_default("main", "queueMaxDeliveryCount") == defaults["queue_max_deliveries"]
    assert param_default("main", "queueLockSeconds") == defaults["queue_lock_seconds"]
    assert param_default("main", "trainSchedule") == defaults["train_schedule"]
    assert param_default("main", "judgeApiVersion") == defaults["judge_api_version"]
    assert param_default("main", "judging") == defaults["judging"]
    assert app_settings()["AGENT_LEARNING_JUDGING"] == "judging"  # the parameter, with the library's default


def evaluate(expr: Any, names: dict[str, Any]) -> Any:
    """The value of a pycep arithmetic expression (integer division, as Bicep's) given its names."""
    expr = literal(expr)
    if isinstance(expr, bool | int):
        return expr
    if isinstance(expr, str):
        return names[expr]
    if "function" in expr:
        kind, params = expr["function"]["type"], expr["function"]["parameters"]
        if kind == "to_lower":
            return evaluate(params["string_to_change"], names).lower()
        assert kind == "empty", expr
        return not evaluate(params["item_to_test"], names)
    kind, operands = expr["operator"]["type"], expr["operator"]["operands"]
    if kind == "conditional":
        chosen = operands["true_value"] if evaluate(operands["condition"], names) else operands["false_value"]
        return evaluate(chosen, names)
    if kind == "not":
        return not evaluate(operands["bool_value"], names)
    if kind == "property_accessor":
        return names[dotted(expr)]
    a, b = evaluate(operands["operand_1"], names), evaluate(operands["operand_2"], names)
    return {
        "add": lambda: a + b,
        "multiply": lambda: a * b,
        "divide": lambda: a // b,
        "equals": lambda: a == b,
        "equals_case_insensitive": lambda: a.lower() == b.lower(),
        "and": lambda: a and b,
        "or": lambda: a or b,
    }[kind]()



def test_the_judge_capacity_follows_its_rule_and_paces_the_scorer() -> None:
    from agent_learning.judges.evaluators import JudgeTokens
    from agent_learning.judges.metrics import INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION

    rule = variable("main", "judgeCapacity")
    for per_minute, per_episode in ((4, 9_000), (1, 1), (3, 7_481), (10, 12_500), (7, 1_000)):
        names = {"judgeEpisodesPerMinute": per_minute, "judgeTokensPerEpisode": per_episode}
        assert evaluate(rule, names) == -(-per_minute * per_episode // 1000)  # rounded up
    assert body(bicep("main")["modules"]["judge"])["params"]["capacity"] == "judgeCapacity"
    defaults = {p: param_default("main", p) for p in ("judgeEpisodesPerMinute", "judgeTokensPerEpisode")}
    instances = param_default("main", "judgeScoringInstances")
    capacity = evaluate(rule, defaults)
    share = variable("main", "judgeTokensPerMinute")
    names = {"judgeCapacity": capacity, "judgeScoringInstances": instances}
    assert evaluate(share, {**names, "judgeConfigured": True}) == capacity * 1000 // instances
    assert evaluate(share, {**names, "judgeConfigured": False}) == 0  # the offline judge is not paced
    assert function_args(app_settings()["AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE"], "string") == ["judgeTokensPerMinute"]
    # The smallest share the parameters admit still paces: 0 would turn the budget off (JudgeTokens: 0 is unpaced).
    params = bicep("main")["parameters"]
    bounds = {
        p: {d["type"]: d["argument"] for d in params[p]["decorators"]}
        for p in ("judgeEpisodesPerMinute", "judgeTokensPerEpisode", "judgeScoringInstances")
    }
    smallest = evaluate(rule, {p: bounds[p]["min_value"] for p in ("judgeEpisodesPerMinute", "judgeTokensPerEpisode")})
    most = bounds["judgeScoringInstances"]["max_value"]
    assert most == {d["type"]: d["argument"] for d in params["maximumInstanceCount"]["decorators"]}["max_value"]
    assert evaluate(share, {"judgeCapacity": smallest, "judgeScoringInstances": most, "judgeConfigured": True}) >= 1
    # Episodes are sized at least as large as the judge's calls measure: prompt tokens + completion limits.
    measured = json.loads((ROOT / "benchmarks" / "results" / "judge_tokens.json").read_text())
    limits = sum(JudgeTokens().max_tokens(m) for m in (INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION))
    assert measured["admitted_per_episode"] == measured["prompt_tokens_per_episode"] + limits
    assert defaults["judgeTokensPerEpisode"] >= measured["admitted_per_episode"]
    # One instance's share admits a full set of concurrent messages before the evaluator deadline,
    # so the budget's waits do not fail (and redeliver) messages at the default concurrency.
    concurrent = json.loads((ROOT / "host.json").read_text())["extensions"]["serviceBus"]["maxConcurrentCalls"]
    deadline = Settings.model_fields["judge_evaluator_deadline"].default
    assert capacity * 1000 // instances * deadline / 60 >= concurrent * defaults["judgeTokensPerEpisode"]


def test_a_given_judge_endpoint_is_the_judge_and_no_model_is_created_beside_it() -> None:
    """JUDGE_AZURE_ENDPOINT alone (DEPLOY_JUDGE_MODEL keeps its default, true) judges with that
    endpoint: the app is not pointed at a new model while the given endpoint is dropped."""
    assert bicep("main")["modules"]["judge"]["config"]["condition"] == "deployJudge"
    created = "https://oai-created.openai.azure.com/"
    for deploy, given, expected_model, expected_endpoint in (
        (True, "", True, created),
        (True, "https://mine.openai.azure.com/", False, "https://mine.openai.azure.com/"),
        (False, "https://mine.openai.azure.com/", False, "https://mine.openai.azure.com/"),
        (False, "", False, ""),
    ):
        names = {"deployJudgeModel": deploy, "judgeAzureEndpoint": given}
        names["deployJudge"] = evaluate(variable("main", "deployJudge"), names)
        assert names["deployJudge"] is expected_model, names
        endpoint = evaluate(variable("main", "judgeEndpoint"), {**names, "judge.outputs.endpoint": created})
        assert endpoint == expected_endpoint, names
        assert evaluate(variable("main", "judgeConfigured"), names) is bool(expected_endpoint), names
    assert dotted(app_settings()["AGENT_LEARNING_JUDGE_AZURE_ENDPOINT"]) == "judgeEndpoint"
    assert dotted(bicep("main")["outputs"]["AGENT_LEARNING_JUDGE_AZURE_ENDPOINT"]["value"]) == "judgeEndpoint"


def test_the_queue_and_the_app_get_the_same_delivery_count_and_lock() -> None:
    settings = app_settings()
    assert function_args(settings["AGENT_LEARNING_QUEUE_MAX_DELIVERIES"], "string") == ["queueMaxDeliveryCount"]
    assert function_args(settings["AGENT_LEARNING_QUEUE_LOCK_SECONDS"], "string") == ["queueLockSeconds"]
    params = body(bicep("main")["modules"]["serviceBus"])["params"]
    assert params["maxDeliveryCount"] == "queueMaxDeliveryCount" and params["lockSeconds"] == "queueLockSeconds"
    queue = resources("servicebus", "Microsoft.ServiceBus/namespaces/queues")["queue"]["properties"]
    assert queue["maxDeliveryCount"] == "maxDeliveryCount" and queue["lockDuration"] == "PT${lockSeconds}S"
    assert bicep("servicebus")["parameters"]["lockSeconds"]["decorators"][-1] == {"type": "max_value", "argument": 300}


# --------------------------------------------------------------------------- resources


def test_function_app_runs_python_3_11_on_flex_consumption_as_a_user_assigned_identity() -> None:
    plan = resources("function-app", "Microsoft.Web/serverfarms")["plan"]
    assert plan["sku"] == {"tier": "FlexConsumption", "name": "FC1"} and plan["properties"]["reserved"] is True
    site = resources("function-app", "Microsoft.Web/sites")["site"]
    assert site["kind"] == "functionapp,linux"
    assert site["identity"]["type"] == "UserAssigned"
    config = site["properties"]["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"] == {"type": "UserAssignedIdentity", "userAssignedIdentityResourceId": "identityId"}
    assert set(config["scaleAndConcurrency"]) == {"maximumInstanceCount", "instanceMemoryMB"}
    assert site["properties"]["httpsOnly"] is True
    assert site["properties"]["siteConfig"]["minTlsVersion"] == "1.2"
    assert site["properties"]["siteConfig"]["ftpsState"] == "Disabled"
    basic_auth = resources("function-app", "Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    assert {p["name"]: p["properties"]["allow"] for p in basic_auth.values()} == {"scm": False, "ftp": False}


def test_storage_monitoring_service_bus_and_judge_accept_only_entra_id() -> None:
    storage = resources("storage", "Microsoft.Storage/storageAccounts")["storage"]["properties"]
    assert storage["allowSharedKeyAccess"] is False and storage["allowBlobPublicAccess"] is False
    assert storage["minimumTlsVersion"] == "TLS1_2" and storage["defaultToOAuthAuthentication"] is True
    insights = resources("monitoring", "Microsoft.Insights/components")["applicationInsights"]["properties"]
    assert insights["DisableLocalAuth"] is True
    workspace = resources("monitoring", "Microsoft.OperationalInsights/workspaces")["logAnalytics"]["properties"]
    assert workspace["features"]["disableLocalAuth"] is True
    namespace = resources("servicebus", "Microsoft.ServiceBus/namespaces")["namespace"]
    assert namespace["properties"]["disableLocalAuth"] is True
    assert namespace["sku"]["name"] == "Standard"  # duplicate detection is not in Basic
    judge = resources("judge", "Microsoft.CognitiveServices/accounts")["account"]["properties"]
    assert judge["disableLocalAuth"] is True and judge["customSubDomainName"] == "name"


def test_scoring_queue_dead_letters_and_detects_duplicates() -> None:
    queue = resources("servicebus", "Microsoft.ServiceBus/namespaces/queues")["queue"]["properties"]
    assert queue["requiresDuplicateDetection"] is True
    assert queue["duplicateDetectionHistoryTimeWindow"] == "duplicateDetectionWindow"
    assert queue["deadLetteringOnMessageExpiration"] is True
    assert queue["requiresSession"] is False
    assert param_default("servicebus", "duplicateDetectionWindow") == "PT1H"


def test_cosmos_account_is_serverless_by_default_and_keyless() -> None:
    account = resources("cosmos", f"{COSMOS}")["account"]["properties"]
    assert account["disableLocalAuth"] is True and account["disableKeyBasedMetadataWriteAccess"] is True
    capabilities = account["capabilities"]["operator"]["operands"]
    assert capabilities["condition"] == "serverless" and capabilities["true_value"] == [{"name": "EnableServerless"}]
    assert variable("cosmos", "serverless")["operator"]["operands"]["operand_2"] == "Serverless"
    assert param_default("cosmos", "capacityMode") == param_default("main", "cosmosCapacityMode") == "Serverless"


def test_enumerated_parameters_work_in_any_case_as_resource_manager_admits_them() -> None:
    """Resource Manager checks a value against @allowed without regard to case, so
    COSMOS_CAPACITY_MODE=serverless or GUARDRAIL=Enforce deploy: each must mean what it says."""
    serverless = variable("cosmos", "serverless")
    literal = {"Serverless": "Serverless"}  # pycep writes a string literal as it writes a name
    for mode in ("Serverless", "serverless", "SERVERLESS"):
        assert evaluate(serverless, {**literal, "capacityMode": mode}) is True, mode
    for mode in ("Provisioned", "provisioned", "PROVISIONED"):
        assert evaluate(serverless, {**literal, "capacityMode": mode}) is False, mode
    setting = app_settings()["AGENT_LEARNING_GUARDRAIL"]
    output = bicep("main")["outputs"]["AGENT_LEARNING_GUARDRAIL"]["value"]
    allowed = {d["type"]: d["argument"] for d in bicep("main")["parameters"]["guardrail"]["decorators"]}["allowed"]
    for mode in allowed:
        for given in (mode, mode.upper(), mode.capitalize()):
            assert evaluate(setting, {"guardrail": given}) == evaluate(output, {"guardrail": given}) == mode
            assert Settings(guardrail=evaluate(setting, {"guardrail": given})).guardrail == mode


def test_cosmos_containers_partition_keys_and_indexes_equal_the_store() -> None:
    declared = {c["name"]: c for c in variable("cosmos", "containers")}
    expected = {**CONTAINERS, LEASES.name: LEASES}
    assert set(declared) == set(expected)
    assert declared["leases"]["partitionKey"] == {"paths": ["/id"], "kind": "Hash"}
    assert declared["agent-scores"]["partitionKey"] == {
        "paths": ["/agent_id", "/id"], "kind": "MultiHash", "version": 2
    }
    loop = bicep("cosmos")["resources"]["container"]["config"]["loop_type"]["detail"]
    assert loop == {"item_name": "c", "array_name": "containers"}
    resource = body(bicep("cosmos")["resources"]["container"])["properties"]["resource"]
    assert dotted(resource["partitionKey"]) == "c.partitionKey"
    indexing = resource["indexingPolicy"]
    for name, spec in expected.items():
        assert declared[name]["partitionKey"] == spec.partition_key_definition, name
        built = {
            "indexingMode": indexing["indexingMode"],
            "includedPaths": variable("cosmos", indexing["includedPaths"]),
            "excludedPaths": variable("cosmos", indexing["excludedPaths"]),
            "compositeIndexes": declared[name]["compositeIndexes"],
        }
        assert built == {"compositeIndexes": [], **spec.indexing_policy}, name


def test_only_episodes_expire_and_only_when_asked() -> None:
    declared = {c["name"]: c for c in variable("cosmos", "containers")}
    # A container honours an episode's own `ttl` only when its default TTL is set; -1 = never by default.
    assert declared["episodes"]["defaultTtl"] == "episodeDefaultTtl"
    assert param_default("cosmos", "episodeTtlSeconds") == param_default("main", "episodeTtlSeconds") == -1
    assert all(declared[name]["defaultTtl"] is None for name in declared if name != "episodes")


def test_every_episode_ttl_the_parameter_admits_is_one_cosmos_accepts() -> None:
    """Cosmos DB takes a default TTL of -1 or 1 to 2^31 - 1 seconds and refuses 0: EPISODE_TTL_SECONDS=0
    means no default lifetime (-1), and the bounds are Cosmos DB's."""
    cosmos_max = 2**31 - 1
    for name in ("main", "cosmos"):
        decorators = {d["type"]: d["argument"] for d in bicep(name)["parameters"]["episodeTtlSeconds"]["decorators"]}
        assert (decorators["min_value"], decorators["max_value"]) == (-1, cosmos_max), name
    assert body(bicep("main")["modules"]["cosmos"])["params"]["episodeTtlSeconds"] == "episodeTtlSeconds"
    rule = variable("cosmos", "episodeDefaultTtl")
    given = (-1, 0, 1, 86_400, cosmos_max)
    applied = [evaluate(rule, {"episodeTtlSeconds": seconds}) for seconds in given]
    assert applied == [-1, -1, 1, 86_400, cosmos_max]


# --------------------------------------------------------------------------- no secrets


def test_no_key_or_connection_string_appears_anywhere() -> None:
    forbidden = re.compile(
        r"listKeys|listConnectionStrings|listAuthorizationRules|primaryMasterKey|primaryKey|AccountKey=|"
        r"SharedAccessKey|authorizationRules|@secure|connectionString|_KEY\b|API_KEY",
        re.I,
    )
    # The one allowed: Application Insights' connection string locates the component and holds no
    # credential; with DisableLocalAuth ingestion needs the Entra ID token of the identity.
    allowed = "APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsights.properties.ConnectionString"
    files = [*INFRA.rglob("*.bicep"), INFRA / "main.parameters.json", ROOT / "azure.yaml"]
    for path in files:
        text = path.read_text().replace(allowed, "")
        hits = [m.group(0) for m in forbidden.finditer(text)]
        assert not hits, f"{path.relative_to(ROOT)}: {hits}"
    assert allowed in (MODULES / "function-app.bicep").read_text()


def test_outputs_give_agents_the_endpoints_and_name_real_settings() -> None:
    outputs = bicep("main")["outputs"]
    assert dotted(outputs["AGENT_LEARNING_COSMOS_ENDPOINT"]["value"]) == "cosmos.outputs.endpoint"
    assert dotted(outputs["AGENT_LEARNING_COSMOS_DATABASE"]["value"]) == "cosmos.outputs.databaseName"
    assert dotted(outputs["FUNCTION_APP_URL"]["value"]) == "functionApp.outputs.url"
    # What a host run locally must share with the deployed app (infra/local_settings.py copies them).
    settings = app_settings()
    for name in ("AGENT_LEARNING_JUDGING", "AGENT_LEARNING_GUARDRAIL", "AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE"):
        assert outputs[name]["value"] == settings[name], name
    # The overrides too (reward weights...), except where connectionSettings outrank them in Azure.
    assert function_args(outputs["APP_SETTING_OVERRIDES"]["value"], "string") == ["appSettingOverrides"]
    spec = importlib.util.spec_from_file_location("local_settings", INFRA / "local_settings.py")
    assert spec is not None and spec.loader is not None
    local_settings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(local_settings)
    assert set(variable("main", "connectionSettings")) == local_settings.NOT_OVERRIDDEN
    aliases = {
        str(choice)
        for field in Settings.model_fields.values()
        if field.validation_alias is not None
        for choice in field.validation_alias.choices  # type: ignore[union-attr]
    }
    readable = set(environment_names().values()) | aliases
    for name in outputs:
        assert not name.startswith(PREFIX) or name in readable, f"output {name} is not a setting the library reads"


# --------------------------------------------------------------------------- roles


def role_assignments() -> set[tuple[str, str, str, str]]:
    """(module, scope symbol, role id, principal parameter) of every Azure role assignment."""
    found = set()
    for path in MODULES.glob("*.bicep"):
        for assignment in resources(path.stem, "Microsoft.Authorization/roleAssignments").values():
            role_var = function_args(assignment["properties"]["roleDefinitionId"], "subscription_resource_id")[1]
            role = variable(path.stem, role_var)
            found.add((path.stem, assignment["scope"], role, assignment["properties"]["principalId"]))
    return found


def test_azure_roles_are_the_least_needed_each_on_its_one_resource() -> None:
    fn, user = "functionPrincipalId", "userPrincipalId"
    assert role_assignments() == {
        ("storage", "storage", BLOB_DATA_OWNER, fn),
        ("monitoring", "applicationInsights", METRICS_PUBLISHER, fn),
        ("servicebus", "queue", SERVICE_BUS_SENDER, fn),
        ("servicebus", "queue", SERVICE_BUS_RECEIVER, fn),
        ("servicebus", "queue", SERVICE_BUS_SENDER, user),
        ("servicebus", "queue", SERVICE_BUS_RECEIVER, user),
        ("servicebus", "trainQueue", SERVICE_BUS_SENDER, fn),  # the timer sends, train_agent receives
        ("servicebus", "trainQueue", SERVICE_BUS_RECEIVER, fn),
        ("servicebus", "trainQueue", SERVICE_BUS_SENDER, user),  # the app run locally (func start)
        ("servicebus", "trainQueue", SERVICE_BUS_RECEIVER, user),
        ("judge", "account", OPENAI_USER, fn),
        ("judge", "account", OPENAI_USER, user),
    }
    # Service Bus roles are on the queue, not the namespace.
    assert bicep("servicebus")["resources"]["queue"]["type"] == "Microsoft.ServiceBus/namespaces/queues"


def test_user_roles_are_granted_only_when_a_user_is_given() -> None:
    for path in MODULES.glob("*.bicep"):
        for symbol, resource in bicep(path.stem)["resources"].items():
            principal = body(resource).get("properties", {}).get("principalId")
            if principal in {"userPrincipalId", "agentPrincipalId"}:
                condition = resource["config"]["condition"]["operator"]
                if principal == "agentPrincipalId":  # agentDirectCosmosAccess && !empty(agentPrincipalId)
                    assert condition["type"] == "and", f"{path.name} {symbol}"
                    assert condition["operands"]["operand_1"] == "agentDirectCosmosAccess"
                    condition = condition["operands"]["operand_2"]["operator"]
                assert condition["type"] == "not", f"{path.name} {symbol}"
                assert function_args(condition["operands"]["bool_value"], "empty") == [principal]


def test_isolated_deployments_give_agents_no_cosmos_role_and_configure_the_ingestion_route() -> None:
    """agentDirectCosmosAccess=false: the agent roles are not assigned (agents go through the app),
    and episodeWriters becomes AGENT_LEARNING_EPISODE_WRITERS, which the library parses."""
    for name in ("main", "cosmos"):
        param = bicep(name)["parameters"]["agentDirectCosmosAccess"]
        assert param["type"] == "bool" and param["default"] is True, name
    assert body(bicep("main")["modules"]["cosmos"])["params"]["agentDirectCosmosAccess"] == "agentDirectCosmosAccess"
    assignments = resources("cosmos", f"{COSMOS}/sqlRoleAssignments")
    agent_roles = {s for s, a in assignments.items() if a["properties"]["principalId"] == "agentPrincipalId"}
    assert agent_roles == {"agentPolicyReader", "agentEpisodeWriter"}
    for symbol in agent_roles:
        condition = bicep("cosmos")["resources"][symbol]["config"]["condition"]["operator"]
        assert condition["type"] == "and" and condition["operands"]["operand_1"] == "agentDirectCosmosAccess"
    writers = bicep("main")["parameters"]["episodeWriters"]
    assert writers["type"] == "object" and writers["default"] == {}
    assert function_args(app_settings()["AGENT_LEARNING_EPISODE_WRITERS"], "string") == ["episodeWriters"]
    assert Settings(episode_writers=json.dumps(writers["default"])).episode_writers == {}  # Bicep's string({})


def test_the_guide_says_that_turning_agent_access_off_keeps_roles_already_given() -> None:
    """The agent roles are conditional resources: a provision with the condition false skips them
    and leaves assignments made before in place (deployments add and update, never delete), so
    the guide must say how to delete them rather than promise they are gone."""
    assignments = bicep("cosmos")["resources"]
    conditional = {s for s in ("agentPolicyReader", "agentEpisodeWriter") if "condition" in assignments[s]["config"]}
    assert conditional == {"agentPolicyReader", "agentEpisodeWriter"}
    guide = (ROOT / "docs" / "deploying.md").read_text(encoding="utf-8")
    revoking = guide[guide.index("**Revoking a role.**"):]
    assert "AGENT_DIRECT_COSMOS_ACCESS false" in revoking and "AGENT_PRINCIPAL_ID" in revoking
    assert "az cosmosdb sql role assignment delete" in revoking
    row = re.search(r"^\| `AGENT_DIRECT_COSMOS_ACCESS` \|.*$", guide, re.M)
    assert row and "stay until" in row.group(0)


def sql_roles() -> tuple[dict[str, dict[str, Any]], set[tuple[str, str, str]]]:
    definitions = resources("cosmos", f"{COSMOS}/sqlRoleDefinitions")
    assignments = {
        (dotted(a["properties"]["roleDefinitionId"]) or "", a["properties"]["principalId"], a["properties"]["scope"])
        for a in resources("cosmos", f"{COSMOS}/sqlRoleAssignments").values()
    }
    return definitions, assignments


def test_cosmos_data_roles_pipeline_and_user_on_the_database_agents_on_two_containers() -> None:
    definitions, assignments = sql_roles()
    assert assignments == {
        ("builtInDataContributor", "functionPrincipalId", "databaseScope"),
        ("builtInDataContributor", "userPrincipalId", "databaseScope"),
        ("policyReaderRole.id", "agentPrincipalId", "policiesScope"),
        ("episodeWriterRole.id", "agentPrincipalId", "episodesScope"),
    }
    assert variable("cosmos", "builtInDataContributor").endswith(
        "/sqlRoleDefinitions/00000000-0000-0000-0000-000000000002"
    )
    assert variable("cosmos", "databaseScope") == "${account.id}/dbs/${databaseName}"
    assert variable("cosmos", "policiesScope") == "${databaseScope}/colls/policies"
    assert variable("cosmos", "episodesScope") == "${databaseScope}/colls/episodes"
    for symbol, scope in {"policyReaderRole": "policiesScope", "episodeWriterRole": "episodesScope"}.items():
        assert definitions[symbol]["properties"]["type"] == "CustomRole"
        assert definitions[symbol]["properties"]["assignableScopes"] == [scope]


def references(name: str, expr: Any, symbols: set[str]) -> set[str]:
    """The resources of ``symbols`` that ``expr`` depends on: named in ``dependsOn`` or referred to
    (``symbol.id``, ``${symbol.x}``), also through the variables it uses, as Bicep infers them."""
    variables = bicep(name)["variables"]
    found: set[str] = set()
    if isinstance(expr, dict):
        for value in expr.values():
            found |= references(name, value, symbols)
    elif isinstance(expr, list):
        for value in expr:
            found |= references(name, value, symbols)
    elif isinstance(expr, str):
        found |= {s for s in symbols if expr == s or expr.startswith(f"{s}.") or f"${{{s}." in expr}
        if expr in variables:
            found |= references(name, variables[expr]["value"], symbols)
    return found


def test_cosmos_role_definitions_and_assignments_are_made_one_at_a_time() -> None:
    """Cosmos DB refuses a role definition or assignment while another is in progress on the
    account (412 PreconditionFailed), so a first `azd up` that made them in parallel failed: each
    must depend, directly or through the others, on every one before it, and on the containers."""
    cosmos = bicep("cosmos")["resources"]
    roles = {
        s for s, r in cosmos.items() if r["type"] in (f"{COSMOS}/sqlRoleDefinitions", f"{COSMOS}/sqlRoleAssignments")
    }
    assert len(roles) == 6
    direct = {s: references("cosmos", body(cosmos[s]), set(cosmos) - {s}) for s in roles}

    def before(symbol: str) -> set[str]:
        seen, todo = set(), [symbol]
        while todo:
            for dependency in direct.get(todo.pop(), set()) - seen:
                seen.add(dependency)
                todo.append(dependency)
        return seen

    for a in roles:
        assert "container" in before(a), f"{a} may run while the containers are created"
        for b in roles - {a}:
            assert b in before(a) or a in before(b), f"{a} and {b} may run at the same time"


class RecordingContainer:
    """A container client that records which SDK methods are called on it."""

    def __init__(self, name: str, calls: set[tuple[str, str]], items: dict[str, dict[str, Any]]) -> None:
        self.name, self.calls, self.items = name, calls, items

    def read_item(self, item: str, partition_key: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.add((self.name, "read_item"))
        if "etag" in kwargs and kwargs["etag"] == self.items[item].get("_etag"):
            return {}  # 304: unchanged
        return self.items[item]

    def create_item(self, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.calls.add((self.name, "create_item"))
        if body["id"] in self.items:
            raise cosmos_errors.CosmosResourceExistsError(status_code=409, message="exists")
        self.items[body["id"]] = body
        return body


def agent_calls() -> set[tuple[str, str]]:
    """(container, SDK method) of everything the agent side does: read its policy twice, write
    an episode, and retry that write as a network failure would make it."""
    calls: set[tuple[str, str]] = set()
    clock = ManualClock()
    policy = SoftmaxPolicy.from_actions("bot", ["a", "b"]).to_document(created_at=clock.now(), kind="current")
    items = {"policies": {policy.id: {**policy.to_dict(), "_etag": '"1"'}}, "episodes": {}}

    class Database:
        def get_container_client(self, name: str) -> RecordingContainer:
            return RecordingContainer(name, calls, items.setdefault(name, {}))

    store = CosmosStore(Database())  # type: ignore[arg-type]
    client = PolicyClient(store, "bot", refresh_seconds=0, clock=clock)
    client.choose()
    decision = client.choose()  # a conditional re-read
    with EpisodeCapture(store, decision, input="question", clock=clock) as run:
        episode = run.end("answer")
    store.add_episode(episode)  # the retried write: already there with the same content
    return calls


def test_agent_roles_grant_exactly_what_the_agent_side_code_calls() -> None:
    definitions, _ = sql_roles()
    calls = agent_calls()
    assert {c for c, _ in calls} == {"policies", "episodes"}
    for symbol, container in {"policyReaderRole": "policies", "episodeWriterRole": "episodes"}.items():
        (permission,) = definitions[symbol]["properties"]["permissions"]
        granted = {variable("cosmos", a) for a in permission["dataActions"]}
        needed = {DATA_ACTIONS[method] for name, method in calls if name == container}
        assert granted == needed | {READ_METADATA}, symbol


# --------------------------------------------------------------------------- checkov


def test_every_checkov_skip_in_infra_gives_a_reason() -> None:
    skips = [
        (path.name, m.group(1), m.group(2))
        for path in INFRA.rglob("*.bicep")
        for m in re.finditer(r"//\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?", path.read_text())
    ]
    assert skips, "expected the documented skips"
    for name, check, reason in skips:
        assert reason and len(reason.strip()) >= 30, f"{name}: {check} needs a reason"


def report(
    failed: tuple[Any, ...] = (), skipped: tuple[Any, ...] = (), parsing_errors: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "results": {
            "failed_checks": list(failed),
            "skipped_checks": list(skipped),
            "parsing_errors": list(parsing_errors),
        },
        "summary": {
            "failed": len(failed),
            "skipped": len(skipped),
            "parsing_errors": len(parsing_errors),
            "resource_count": 5,
        },
    }


def check(reason: str | None = None) -> dict[str, Any]:
    return {
        "check_id": "CKV_AZURE_1",
        "resource": "r",
        "file_path": "/m.bicep",
        "check_result": {"suppress_comment": reason},
    }


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (report(failed=(check(),)), "failed CKV_AZURE_1"),
        (report(parsing_errors=("/modules/x.bicep",)), "could not be parsed"),
        (report(skipped=(check("No comment provided"),)), "without a reason"),
        (report(skipped=(check(""),)), "without a reason"),
        ({**report(), "summary": {"resource_count": 0}}, "no resource"),
    ],
)
def test_checkov_gate_fails_on_failures_parse_errors_and_unexplained_skips(data: Any, problem: str) -> None:
    found = checkov_gate.problems(data)
    assert len(found) == 1 and problem in found[0]


def test_checkov_gate_passes_a_clean_report_and_reads_lists_of_reports() -> None:
    clean = report(skipped=(check("a reason that explains the skip"),))
    assert checkov_gate.problems(clean) == []
    assert checkov_gate.problems([clean, report(failed=(check(),))]) != []


AZD_BUILT_IN = {"AZURE_ENV_NAME", "AZURE_LOCATION", "AZURE_PRINCIPAL_ID"}
"""Variables azd sets itself (`azd up` asks for the first two); docs/deploying.md need not list them."""


def test_the_deploying_guide_lists_every_azd_variable_with_its_default() -> None:
    """Every `${NAME=default}` of main.parameters.json is a row of the guide's azd table, stating
    that default (an empty default is stated as a word: `—`, `region`)."""
    parameters = (INFRA / "main.parameters.json").read_text(encoding="utf-8")
    defaults = dict(re.findall(r"\$\{([A-Z_]+)(?:=([^}]*))?\}", parameters))
    guide = (ROOT / "docs" / "deploying.md").read_text(encoding="utf-8")
    table = re.search(r"^\| azd variable \|.*?\n((?:\|.*\n)+)", guide, re.M)
    assert table, "docs/deploying.md has no table headed | azd variable |"
    documented: dict[str, str] = {}
    for line in table.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([A-Z_]+)`", cells[0])
        stated = [d.strip() for d in cells[1].split(" / ")]
        documented.update(zip(names, stated if len(stated) == len(names) else stated[:1] * len(names), strict=True))
    wrong = {
        name: (documented.get(name), default)
        for name, default in defaults.items()
        if name not in AZD_BUILT_IN
        and (name not in documented or (default and documented[name] != f"`{default}`"))
    }
    assert not wrong, f"docs/deploying.md's azd table (stated, parameter default): {wrong}"


def test_app_authentication_is_on_only_for_a_registration_and_lets_keyed_requests_reach_the_app() -> None:
    """Given ``entraClientId``, tokens for the app or for Azure AI services (what Personalizer
    clients ask for) are vouched for; a request without one still reaches the app, which checks
    keys (function keys, the Personalizer routes' own). The principal header is trusted then."""
    module = bicep("main")["modules"]["appAuthentication"]
    condition = module["config"]["condition"]["operator"]
    assert condition["type"] == "not" and function_args(condition["operands"]["bool_value"], "empty") == [
        "entraClientId"]
    assert body(module)["params"]["clientId"] == "entraClientId"
    (auth,) = resources("app-authentication", "Microsoft.Web/sites/config").values()
    assert auth["name"] == "authsettingsV2"
    validation = auth["properties"]["globalValidation"]
    assert validation == {"requireAuthentication": False, "unauthenticatedClientAction": "AllowAnonymous"}
    entra = auth["properties"]["identityProviders"]["azureActiveDirectory"]
    assert "https://cognitiveservices.azure.com" in entra["validation"]["allowedAudiences"]
    trust = str(app_settings()["AGENT_LEARNING_TRUST_PRINCIPAL_HEADER"])
    assert "entraClientId" in trust and "appServiceAuthentication" in trust
