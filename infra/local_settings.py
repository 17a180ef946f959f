"""Write ``local.settings.json`` for ``func start`` against the resources ``azd up`` created.

    python infra/local_settings.py                 # reads `azd env get-values`
    python infra/local_settings.py --values FILE   # or a saved copy of its output

Starts from ``local.settings.sample.json`` (every setting the app reads, with its default) and
fills in where things are from the azd environment's outputs: the Cosmos DB endpoint and
database, the Service Bus namespace and queue, the judge, the deployment's judging and
guardrail choices and its ``appSettingOverrides`` (reward weights, learner settings...). No key
is written: the host and the library connect with your identity (``az login``), to which
``azd up`` gave the data roles. The change-feed lease prefix becomes ``local-<user>-``, so a
host on your machine keeps its own leases and never takes over the deployed app's. Standard library only.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FROM_AZD = {
    "AGENT_LEARNING_STORE": "AGENT_LEARNING_STORE",
    "AGENT_LEARNING_COSMOS_ENDPOINT": "CosmosDBConnection__accountEndpoint",
    "AGENT_LEARNING_COSMOS_DATABASE": "AGENT_LEARNING_COSMOS_DATABASE",
    "AGENT_LEARNING_QUEUE": "AGENT_LEARNING_QUEUE",
    "AGENT_LEARNING_SERVICEBUS_NAMESPACE": "ServiceBusConnection__fullyQualifiedNamespace",
    "AGENT_LEARNING_QUEUE_NAME": "AGENT_LEARNING_QUEUE_NAME",
    "AGENT_LEARNING_TRAIN_QUEUE_NAME": "AGENT_LEARNING_TRAIN_QUEUE_NAME",
    "AGENT_LEARNING_JUDGE": "AGENT_LEARNING_JUDGE",
    "AGENT_LEARNING_JUDGE_AZURE_ENDPOINT": "AGENT_LEARNING_JUDGE_AZURE_ENDPOINT",
    "AGENT_LEARNING_JUDGE_DEPLOYMENT": "AGENT_LEARNING_JUDGE_DEPLOYMENT",
}
"""azd output → the setting it fills (``infra/main.bicep`` declares the outputs)."""

FROM_AZD_IF_SET = {
    "AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE": "AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE",
    "AGENT_LEARNING_JUDGING": "AGENT_LEARNING_JUDGING",
    "AGENT_LEARNING_GUARDRAIL": "AGENT_LEARNING_GUARDRAIL",
}
"""Outputs that deployments made before them lack: copied when present, else the sample's value
stays. The judge's token pacing is one instance's share of the judge deployment's capacity; a
host run locally against that deployment paces itself as one more instance would, instead of
sending every evaluator call at once. Which episodes are judged and the publish guardrail are
the deployment's: the local host shares its queues, so a message is judged or trained alike
whichever host receives it."""

OVERRIDES = "APP_SETTING_OVERRIDES"
"""The output holding the deployment's ``appSettingOverrides`` as JSON (deployments made before
it lack it): the local host shares the queues, so it shapes rewards and trains with the same
settings as the deployed app."""

NOT_OVERRIDDEN = frozenset({
    "AGENT_LEARNING_ALLOW_OFFLINE_JUDGE",
    "AGENT_LEARNING_COSMOS_DATABASE",
    "AGENT_LEARNING_EPISODE_WRITERS",
    "AGENT_LEARNING_GUARDRAIL",
    "AGENT_LEARNING_JUDGE",
    "AGENT_LEARNING_JUDGE_API_VERSION",
    "AGENT_LEARNING_JUDGE_AZURE_ENDPOINT",
    "AGENT_LEARNING_JUDGE_BASE_URL",
    "AGENT_LEARNING_JUDGE_CLIENT_ID",
    "AGENT_LEARNING_JUDGE_DEPLOYMENT",
    "AGENT_LEARNING_JUDGE_MODEL",
    "AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE",
    "AGENT_LEARNING_JUDGING",
    "AGENT_LEARNING_LEASE_PREFIX",
    "AGENT_LEARNING_PERSONALIZER_KEY_SHA256",
    "AGENT_LEARNING_PERSONALIZER_PRINCIPALS",
    "AGENT_LEARNING_QUEUE",
    "AGENT_LEARNING_QUEUE_LOCK_SECONDS",
    "AGENT_LEARNING_QUEUE_MAX_DELIVERIES",
    "AGENT_LEARNING_QUEUE_NAME",
    "AGENT_LEARNING_STORE",
    "AGENT_LEARNING_TRAIN_QUEUE_NAME",
    "AGENT_LEARNING_TRAIN_SCHEDULE",
    "AGENT_LEARNING_TRUST_PRINCIPAL_HEADER",
    "CosmosDBConnection__accountEndpoint",
    "CosmosDBConnection__clientId",
    "CosmosDBConnection__credential",
    "ServiceBusConnection__clientId",
    "ServiceBusConnection__credential",
    "ServiceBusConnection__fullyQualifiedNamespace",
})
"""The settings ``infra/main.bicep`` gives after the overrides (its ``connectionSettings``): an
override of one is ignored in Azure, so here too (tests/app/test_infra.py keeps the two equal)."""

USER_IDENTITY = ("CosmosDBConnection__clientId", "ServiceBusConnection__clientId", "AGENT_LEARNING_JUDGE_CLIENT_ID")
"""Settings that select a user-assigned managed identity in Azure; left out locally, so your
own identity (``az login``) is used."""


def parse_env(text: str) -> dict[str, str]:
    """``KEY="value"`` lines, as ``azd env get-values`` prints them."""
    values = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        if not match:
            raise ValueError(f"line {number}: expected KEY=value, found {line[:60]!r}")
        try:
            parts = shlex.split(match.group(2)) or [""]
        except ValueError as exc:  # shlex: "No closing quotation", naming neither the line nor the key
            raise ValueError(f"line {number}: {match.group(1)}: {exc}") from None
        values[match.group(1)] = parts[0]
    return values


def overrides(text: str) -> dict[str, str]:
    """The deployment's ``appSettingOverrides`` from its JSON, each value as an app setting's text."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{OVERRIDES}: not JSON ({exc})") from None
    if not isinstance(given, dict):
        raise ValueError(f"{OVERRIDES}: expected a JSON object of settings, found {text[:60]!r}")
    settings = {}
    for name, value in given.items():
        if not isinstance(value, str | int | float | bool):
            found = json.dumps(value)[:60]
            raise ValueError(f"{OVERRIDES}: {name}: expected a string, number or boolean, found {found}")
        settings[name] = value if isinstance(value, str) else json.dumps(value)
    return settings


def local_settings(sample: dict, azd: dict[str, str], user: str) -> dict:
    """The sample with the azd environment's values filled in."""
    missing = [name for name in FROM_AZD if name not in azd]
    if missing:
        raise ValueError(f"the azd environment has no {', '.join(missing)}: run `azd up` (or `azd env refresh`) first")
    values = dict(sample["Values"])
    if azd.get(OVERRIDES):
        values.update({k: v for k, v in overrides(azd[OVERRIDES]).items() if k not in NOT_OVERRIDDEN})
    for output, setting in FROM_AZD.items():
        values[setting] = azd[output]
    for output, setting in FROM_AZD_IF_SET.items():
        if azd.get(output):
            values[setting] = azd[output]
    for setting in USER_IDENTITY:
        values.pop(setting, None)
    values["AGENT_LEARNING_LEASE_PREFIX"] = f"local-{re.sub(r'[^A-Za-z0-9]', '', user)[:20] or 'dev'}-"
    return {**sample, "Values": values}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=Path, help="a saved `azd env get-values` output (default: run azd)")
    parser.add_argument("--out", type=Path, default=ROOT / "local.settings.json", help="where to write")
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and not args.force:
            raise ValueError(f"{args.out} exists; pass --force to replace it")
        if args.values:
            text = args.values.read_text()
        else:
            try:
                text = subprocess.run(["azd", "env", "get-values"], check=True, capture_output=True, text=True).stdout
            except FileNotFoundError:
                raise ValueError("azd is not installed (https://aka.ms/azd-install); or pass --values FILE") from None
        sample = json.loads((ROOT / "local.settings.sample.json").read_text())
        settings = local_settings(sample, parse_env(text), getpass.getuser())
        args.out.write_text(json.dumps(settings, indent=2) + "\n")
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        print(f"error: {detail}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: Cosmos DB {settings['Values']['CosmosDBConnection__accountEndpoint']}, "
          f"Service Bus {settings['Values']['ServiceBusConnection__fullyQualifiedNamespace']}, "
          f"judge {settings['Values']['AGENT_LEARNING_JUDGE']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
