"""``infra/local_settings.py``: local.settings.json for ``func start`` from an azd environment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("azure.functions")

from app_functions import functions

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "local_settings.py"

AZD_VALUES = """\
AGENT_LEARNING_COSMOS_DATABASE="agent-learning"
AGENT_LEARNING_COSMOS_ENDPOINT="https://cosmos-abc.documents.azure.com:443/"
AGENT_LEARNING_JUDGE="evaluators"
AGENT_LEARNING_JUDGE_AZURE_ENDPOINT="https://oai-abc.openai.azure.com/"
AGENT_LEARNING_JUDGE_DEPLOYMENT="judge"
AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE="18000"
AGENT_LEARNING_JUDGING="support-*=0.2, *=all"
AGENT_LEARNING_GUARDRAIL="warn"
AGENT_LEARNING_QUEUE="servicebus"
AGENT_LEARNING_QUEUE_NAME="score-episodes"
AGENT_LEARNING_SERVICEBUS_NAMESPACE="sb-abc.servicebus.windows.net"
AGENT_LEARNING_STORE="cosmos"
AGENT_LEARNING_TRAIN_QUEUE_NAME="train-agents-dev"
AZURE_RESOURCE_GROUP="rg-dev"
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_settings_come_from_the_azd_outputs_and_select_the_users_identity(tmp_path: Path) -> None:
    values = tmp_path / "azd.env"
    values.write_text(AZD_VALUES)
    out = tmp_path / "local.settings.json"
    done = run("--values", str(values), "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())["Values"]
    assert written["CosmosDBConnection__accountEndpoint"] == "https://cosmos-abc.documents.azure.com:443/"
    assert written["ServiceBusConnection__fullyQualifiedNamespace"] == "sb-abc.servicebus.windows.net"
    assert written["AGENT_LEARNING_JUDGE_AZURE_ENDPOINT"] == "https://oai-abc.openai.azure.com/"
    assert written["AGENT_LEARNING_TRAIN_QUEUE_NAME"] == "train-agents-dev"  # not the sample's default
    assert written["AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE"] == "18000"  # paced as the app's instances are
    # The queues are shared: the local host judges and trains with the deployment's choices.
    assert written["AGENT_LEARNING_JUDGING"] == "support-*=0.2, *=all"
    assert written["AGENT_LEARNING_GUARDRAIL"] == "warn"
    assert not [v for v in written.values() if "<" in v], "a placeholder was left in"
    assert not [k for k in written if k.endswith("clientId") or k == "AGENT_LEARNING_JUDGE_CLIENT_ID"]
    assert re.fullmatch(r"local-[A-Za-z0-9]{1,20}-", written["AGENT_LEARNING_LEASE_PREFIX"])
    # Every %NAME% a binding reads is set, so the host can index the functions.
    for name, function in functions().items():
        for binding in json.loads(function.get_function_json())["bindings"]:
            for setting in re.findall(r"%([^%]+)%", json.dumps(binding)):
                assert written.get(setting), f"{name} reads %{setting}%, which is empty"
    assert "Cosmos DB https://cosmos-abc" in done.stdout


def test_it_refuses_to_replace_a_file_or_to_guess_a_missing_output(tmp_path: Path) -> None:
    values = tmp_path / "azd.env"
    values.write_text("AGENT_LEARNING_STORE=cosmos\n")
    out = tmp_path / "local.settings.json"
    done = run("--values", str(values), "--out", str(out))
    assert done.returncode == 2 and "AGENT_LEARNING_COSMOS_ENDPOINT" in done.stderr and "azd up" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    out.write_text("{}")
    values.write_text(AZD_VALUES)
    done = run("--values", str(values), "--out", str(out))
    assert done.returncode == 2 and "--force" in done.stderr and out.read_text() == "{}"
    assert run("--values", str(values), "--out", str(out), "--force").returncode == 0


FROM_OUTPUTS_IF_SET = (
    "AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE",
    "AGENT_LEARNING_JUDGING",
    "AGENT_LEARNING_GUARDRAIL",
    "APP_SETTING_OVERRIDES",
)
"""Outputs that deployments made before them lack."""


def test_a_deployment_without_the_newer_outputs_keeps_the_samples_values(tmp_path: Path) -> None:
    values = tmp_path / "azd.env"
    older = [line for line in AZD_VALUES.splitlines(keepends=True) if not line.startswith(FROM_OUTPUTS_IF_SET)]
    values.write_text("".join(older))
    out = tmp_path / "local.settings.json"
    done = run("--values", str(values), "--out", str(out))
    assert done.returncode == 0, done.stderr
    sample = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
    written = json.loads(out.read_text())["Values"]
    for name in FROM_OUTPUTS_IF_SET[:-1]:
        assert written[name] == sample[name], name
    assert written["AGENT_LEARNING_W_INTENT"] == sample["AGENT_LEARNING_W_INTENT"]  # no overrides to apply


# As `azd env get-values` prints a string output holding JSON.
OVERRIDES = (
    'APP_SETTING_OVERRIDES="{\\"AGENT_LEARNING_W_INTENT\\":\\"0.5\\",\\"AGENT_LEARNING_LATENCY_PENALTY\\":0.2,'
    '\\"AGENT_LEARNING_NORMALIZE_ADVANTAGES\\":false,\\"AGENT_LEARNING_QUEUE_NAME\\":\\"elsewhere\\"}"\n'
)


def test_the_deployments_overrides_reach_the_local_host_except_where_azure_ignores_them(tmp_path: Path) -> None:
    """A local host shares the deployed app's queues: it must shape rewards and train with the
    same settings, or a message's reward depends on which host received it."""
    values = tmp_path / "azd.env"
    values.write_text(AZD_VALUES + OVERRIDES)
    out = tmp_path / "local.settings.json"
    done = run("--values", str(values), "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())["Values"]
    assert written["AGENT_LEARNING_W_INTENT"] == "0.5"
    assert written["AGENT_LEARNING_LATENCY_PENALTY"] == "0.2"  # app settings are text
    assert written["AGENT_LEARNING_NORMALIZE_ADVANTAGES"] == "false"
    assert written["AGENT_LEARNING_QUEUE_NAME"] == "score-episodes"  # a connection setting: Azure ignores it too
    values.write_text(AZD_VALUES + 'APP_SETTING_OVERRIDES="{\\"AGENT_LEARNING_W_INTENT\\": [0.5]}"\n')
    done = run("--values", str(values), "--out", str(out), "--force")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "APP_SETTING_OVERRIDES: AGENT_LEARNING_W_INTENT: expected a string, number or boolean" in done.stderr


def test_an_unwritable_destination_or_a_broken_value_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    values = tmp_path / "azd.env"
    values.write_text(AZD_VALUES)
    done = run("--values", str(values), "--out", str(tmp_path / "missing" / "local.settings.json"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "No such file or directory" in done.stderr and "missing" in done.stderr
    done = run("--values", str(values), "--out", str(tmp_path), "--force")  # a directory
    assert done.returncode == 2 and "Traceback" not in done.stderr and str(tmp_path) in done.stderr
    values.write_text(AZD_VALUES.replace('AGENT_LEARNING_QUEUE="servicebus"', 'AGENT_LEARNING_QUEUE="servicebus'))
    out = tmp_path / "local.settings.json"
    done = run("--values", str(values), "--out", str(out))
    line = AZD_VALUES.splitlines().index('AGENT_LEARNING_QUEUE="servicebus"') + 1
    assert done.returncode == 2 and f"line {line}: AGENT_LEARNING_QUEUE: No closing quotation" in done.stderr
    assert not out.exists()
