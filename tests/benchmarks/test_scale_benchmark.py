"""The scale benchmark (``benchmarks/scale.py``) with tiny sizes over the wire, and the request
counter it counts with (``tests/support/cosmos_requests.py``) against the server's own count."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

pytest.importorskip("azure.cosmos")

from benchmark_modules import load_benchmark
from cosmos_fixture import CLIENT_KWARGS
from cosmos_requests import RequestCounter, operation_kind

from agent_learning.store.cosmos import SCORES

bench = load_benchmark("scale")

pytestmark = pytest.mark.timeout(300)


def test_the_counter_sees_what_the_server_serves(cosmos_server: Any) -> None:
    from azure.cosmos import PartitionKey
    from azure.cosmos.exceptions import CosmosResourceNotFoundError

    counter = RequestCounter()
    client = cosmos_server.client(**CLIENT_KWARGS, **counter.client_kwargs())
    name = f"count-{uuid.uuid4().hex[:8]}"
    try:
        cosmos_server.reset_stats()
        counter.reset()
        container = client.create_database(name).create_container("c", partition_key=PartitionKey("/id"))
        with counter.measure() as m:
            container.create_item({"id": "a"})
            container.upsert_item({"id": "a", "v": 1})
            container.replace_item("a", {"id": "a", "v": 2})
            container.read_item("a", partition_key="a")
            with pytest.raises(CosmosResourceNotFoundError):
                container.read_item("missing", partition_key="missing")
            list(container.query_items("SELECT * FROM c", enable_cross_partition_query=True))
            container.delete_item("a", partition_key="a")
        server, counted = cosmos_server.stats(), counter.snapshot()
    finally:
        client.delete_database(name)
        client.close()
    assert counted.by_kind == server["by_operation"]  # every request, by the same kinds
    docs = {k: v for k, v in m.by_kind.items() if k.endswith(" docs")}
    assert docs == {
        "create docs": 1,
        "upsert docs": 1,
        "replace docs": 1,
        "read docs": 2,
        "query docs": 1,
        "delete docs": 1,
    }
    assert m.counts.by_status == {"read docs 404": 1}
    assert m.counts.container("c") == docs
    assert m.writes == 4


@pytest.mark.parametrize(
    ("method", "url", "headers", "kind"),
    [
        ("GET", "https://h/dbs/d/colls/c/docs/x", {}, "read docs"),
        ("GET", "https://h/dbs/d/colls/c/docs", {"A-IM": "Incremental feed"}, "changefeed docs"),
        ("POST", "https://h/dbs/d/colls/c/docs", {"x-ms-documentdb-isquery": "True"}, "query docs"),
        ("POST", "https://h/dbs/d/colls/c/docs", {"x-ms-documentdb-is-upsert": "True"}, "upsert docs"),
        ("POST", "https://h/dbs/d/colls/c/docs", {}, "create docs"),
        ("GET", "https://h/dbs/d/colls/c/pkranges", {}, "readfeed other"),
        ("GET", "https://h/", {}, "read other"),
    ],
)
def test_operation_kinds(method: str, url: str, headers: dict[str, str], kind: str) -> None:
    assert operation_kind(method, url, headers) == kind


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("scale") / "scale.json"
    with pytest.MonkeyPatch.context() as env:
        # Batches of 4: too few for the guardrail to judge (it would hold them); it warns, so every busy tick
        # publishes and its requests are those of a published version.
        env.setenv("AGENT_LEARNING_GUARDRAIL", "warn")
        bench.main(["--quick", "--agents", "1,3", "--batches", "4", "--episodes", "8", "--json", str(out)])
    return json.loads(out.read_text())


def test_every_request_of_the_run_is_counted(results: dict[str, Any]) -> None:
    check = results["cross_check"]
    assert check["client_counted"] == check["server_counted"] > 0


def test_the_per_episode_counts_follow_the_code_path(results: dict[str, Any]) -> None:
    path = results["episode_path"]
    writes = {k: v for k, v in path["agent_write"]["per_episode"].items() if k != "metadata"}
    assert writes == {"create docs": 1.0}  # one create, nothing read
    assert path["enqueue"]["requests"] == 0 and path["enqueue"]["messages"] == path["episodes"]
    embedded, bare, dupe = path["scorer_embedded"], path["scorer_not_embedded"], path["scorer_duplicate"]
    assert set(embedded["statuses"]) == {"scored"} and set(bare["statuses"]) == {"scored"}
    assert set(dupe["statuses"]) == {"duplicate"}
    # The message without the episode costs exactly one more point read (the episode), no other request.
    assert bare["per_episode"]["read docs"] == embedded["per_episode"]["read docs"] + 1
    assert bare["documents_per_episode"] == embedded["documents_per_episode"] + 1
    # A duplicate is found by a read and written nowhere.
    assert not any(k.split()[0] in ("create", "upsert", "replace") for k in dupe["per_episode"])
    assert dupe["documents_per_episode"] < embedded["documents_per_episode"]
    total = results["totals"]["batch_4"]
    parts = sum(path[s]["documents_per_episode"] for s in ("agent_write", "enqueue", "scorer_embedded"))
    assert total == pytest.approx(parts + results["trainer_batches"][0]["documents_per_episode"], abs=1e-3)


def test_the_request_unit_estimate_counts_every_container_the_scorer_used(results: dict[str, Any]) -> None:
    embedded = results["episode_path"]["scorer_embedded"]
    assert sum(n for kinds in embedded["containers"].values() for n in kinds.values()) == embedded["documents"]
    assert results["estimate"]["cosmos_ru_per_episode"][SCORES] > 0  # the score written to its slot


def test_an_idle_agent_costs_the_same_every_tick_and_publishes_nothing(results: dict[str, Any]) -> None:
    ticks = {(r["agents"], r["new_scores"]): r for r in results["ticks"]}
    for n in (1, 3):
        assert ticks[(n, True)]["statuses"] == {"published": n}
        assert ticks[(n, False)]["statuses"] == {"no_new_scores": n}
        assert ticks[(n, True)]["problems"] == {} == ticks[(n, False)]["problems"]  # failures name their reason
        idle = ticks[(n, False)]["per_agent"]
        assert "replace docs" not in idle and "upsert docs" not in idle  # no policy, version or run written
    # requests = per-tick part + agents x per-agent part: each idle agent costs the same whole number
    one, three = ticks[(1, False)]["documents"], ticks[(3, False)]["documents"]
    per_agent = (three - one) / 2
    assert per_agent == 1  # its "anything new?" query: the target is at most one request per idle agent
    assert 0 <= one - per_agent <= 5  # what a tick reads once (feedback sweep, the agent list)
    assert three <= ticks[(3, True)]["documents"]  # nothing new never costs more than training


def test_the_estimate_is_computed_from_the_counts_and_the_defaults(results: dict[str, Any]) -> None:
    estimate, defaults = results["estimate"], results["defaults"]
    limits = estimate["limits"]
    assert estimate["first_bottleneck"] == min(limits, key=lambda k: limits[k]["episodes_per_s"])
    tokens = bench.JUDGE_PROMPT_TOKENS_PER_EPISODE + bench.JUDGE_MAX_COMPLETION_TOKENS_PER_EPISODE
    assert limits["judge tokens per minute"]["episodes_per_s"] == pytest.approx(
        defaults["judge_capacity_ktpm"] * 1000 / tokens / 60, abs=1e-3
    )
    assert defaults["tick_seconds"] == bench.schedule_seconds(defaults["train_schedule"]) > 0
    assert (
        estimate["agents_per_tick"]["fanout, nothing new"]["agents"]
        > estimate["agents_per_tick"]["fanout, with new scores"]["agents"]
    )
    text = bench.report(results)
    assert "TOTAL per judged episode, trainer batch 4" in text and "first bottleneck" in text


def test_schedules() -> None:
    assert bench.schedule_seconds("0 */5 * * * *") == 300
    assert bench.schedule_seconds("*/30 * * * * *") == 30
    with pytest.raises(ValueError, match="AGENT_LEARNING_TRAIN_SCHEDULE"):
        bench.schedule_seconds("0 5 * *")
