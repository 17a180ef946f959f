"""Wire tests of the patched local Cosmos server with the real azure-cosmos SDK.

Each test pins one behaviour that real Cosmos DB has and ``@vercel/cosmosdb-server`` 1.0.1 lacked or that the
project relies on, so a regression in ``tests/fakes/cosmos_server/patches.js`` (or an SDK upgrade that changes the
call patterns documented in ``cosmos_fixture``) fails here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest

pytest.importorskip("azure.cosmos")
from azure.core import MatchConditions
from azure.cosmos import PartitionKey, exceptions
from cosmos_fixture import CLIENT_KWARGS, CosmosServer, read_change_feed

COMPOSITE_SEQ_ID = {
    "compositeIndexes": [[{"path": "/seq", "order": "ascending"}, {"path": "/id", "order": "ascending"}]],
}


def make_container(database: Any, name: str = "items", **kwargs: Any) -> Any:
    """A container partitioned on /pk with a (seq, id) composite index."""
    return database.create_container_if_not_exists(
        name, partition_key=PartitionKey("/pk"), indexing_policy=COMPOSITE_SEQ_ID, **kwargs
    )


def lsn_of(token: str) -> int:
    """The LSN inside an SDK (v2, base64 JSON) change-feed continuation."""
    state = json.loads(base64.b64decode(token))
    return int(state["continuation"]["continuation"][0]["token"].strip('"'))


# 1. Missing items -> 404 ------------------------------------------------------------------------------------


def test_missing_item_is_not_found_for_every_point_operation(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    container.create_item({"id": "there", "pk": "a"})
    calls = {
        "read": lambda: container.read_item("missing", partition_key="a"),
        "read in other partition": lambda: container.read_item("there", partition_key="b"),
        "replace": lambda: container.replace_item("missing", {"id": "missing", "pk": "a"}),
        "delete": lambda: container.delete_item("missing", partition_key="a"),
        "patch": lambda: container.patch_item(
            "missing", partition_key="a", patch_operations=[{"op": "set", "path": "/x", "value": 1}]
        ),
    }
    for name, call in calls.items():
        with pytest.raises(exceptions.CosmosResourceNotFoundError) as caught:
            call()
        assert caught.value.status_code == 404, name
        assert "NotFound" in str(caught.value), name


# 2. Partition-scoped queries --------------------------------------------------------------------------------


def test_query_with_partition_key_is_scoped_to_that_partition(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    for i in range(6):
        container.create_item({"id": f"i{i}", "pk": f"p{i % 3}", "seq": i})

    scoped = container.query_items("SELECT * FROM c", partition_key="p1")
    assert sorted(d["id"] for d in scoped) == ["i1", "i4"]
    both = container.query_items(
        "SELECT VALUE c.id FROM c WHERE c.seq >= @s",
        parameters=[{"name": "@s", "value": 3}],
        partition_key="p2",
        enable_cross_partition_query=True,
    )
    assert list(both) == ["i5"]
    everything = container.query_items("SELECT VALUE COUNT(1) FROM c", enable_cross_partition_query=True)
    assert list(everything) == [6]


# 3. Incremental change feed ---------------------------------------------------------------------------------


def test_change_feed_pages_in_lsn_order_and_resumes_after_its_continuation(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    for i in range(5):
        container.upsert_item({"id": f"i{i}", "pk": f"p{i % 2}", "v": 0})
    container.upsert_item({"id": "i0", "pk": "p0", "v": 1})  # latest version: i0 moves to the end
    container.patch_item("i2", partition_key="p0", patch_operations=[{"op": "set", "path": "/v", "value": 2}])

    pages: list[list[str]] = []
    token: str | None = None
    while True:
        items, token = read_change_feed(container, token, max_item_count=2)
        if not items:
            break
        pages.append([d["id"] for d in items])
        lsns = [d["_lsn"] for d in items]
        assert lsns == sorted(lsns)
    assert pages == [["i1", "i3"], ["i4", "i0"], ["i2"]]
    assert lsn_of(token) == 7  # 5 creates + 1 upsert + 1 patch

    # Nothing new: 304, no items, and the token still resumes at the same place.
    again, same = read_change_feed(container, token)
    assert again == [] and lsn_of(same) == 7

    container.replace_item("i3", {"id": "i3", "pk": "p1", "v": 3})
    container.create_item({"id": "new", "pk": "p0"})
    container.delete_item("i4", partition_key="p0")  # latest-version feed: deletes are not reported
    items, token = read_change_feed(container, same, max_item_count=10)
    assert [d["id"] for d in items] == ["i3", "new"]
    assert items[0]["v"] == 3
    assert read_change_feed(container, token)[0] == []


def test_change_feed_not_modified_answers_304_with_the_resume_etag(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    container.create_item({"id": "a", "pk": "p"})
    _, token = read_change_feed(container, None)
    statuses: list[Any] = []
    pager = container.query_items_change_feed(
        continuation=token, response_hook=lambda headers, body: statuses.append((headers.get("etag"), body))
    ).by_page()
    assert next(pager, None) is None
    assert pager.continuation_token is None  # the SDK quirk that read_change_feed handles
    assert statuses == [('"1"', None)]  # the 304's own etag is the LSN to resume after
    assert lsn_of(container.client_connection.last_response_headers["etag"]) == 1


def test_change_feed_is_scoped_by_partition_key_and_start_now(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    for i in range(6):
        container.create_item({"id": f"i{i}", "pk": f"p{i % 3}"})
    scoped = container.query_items_change_feed(start_time="Beginning", partition_key="p1")
    assert [d["id"] for d in scoped] == ["i1", "i4"]

    assert list(container.query_items_change_feed(start_time="Now")) == []
    token = container.client_connection.last_response_headers["etag"]
    container.create_item({"id": "later", "pk": "p0"})
    assert [d["id"] for d in read_change_feed(container, token)[0]] == ["later"]


# 4. Conditional point read ----------------------------------------------------------------------------------


def test_conditional_read_returns_empty_dict_on_304_and_the_item_on_200(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    etag = container.create_item({"id": "a", "pk": "p", "n": 1})["_etag"]
    hooked: list[tuple[dict[str, str], Any]] = []

    def hook(headers: Any, body: Any) -> None:
        hooked.append((dict(headers), body))

    unchanged = container.read_item(
        "a", partition_key="p", etag=etag, match_condition=MatchConditions.IfModified, response_hook=hook
    )
    assert unchanged == {} and not unchanged  # 304 Not Modified does not raise
    assert hooked[-1][1] is None and hooked[-1][0]["etag"] == etag

    container.upsert_item({"id": "a", "pk": "p", "n": 2})
    changed = container.read_item(
        "a", partition_key="p", etag=etag, match_condition=MatchConditions.IfModified, response_hook=hook
    )
    assert changed["n"] == 2 and changed["_etag"] != etag
    assert hooked[-1][1]["id"] == "a"

    # azure-cosmos 4.17.1 accepts initial_headers but never sends them: no 304 this way.
    current = changed["_etag"]
    ignored = container.read_item("a", partition_key="p", initial_headers={"If-None-Match": current})
    assert ignored["id"] == "a"


def test_server_answers_304_without_body_to_a_matching_if_none_match(
    cosmos_server: CosmosServer, cosmos_database: Any
) -> None:
    """The same at the HTTP level (the server accepts any auth header)."""
    container = make_container(cosmos_database)
    etag = container.create_item({"id": "a", "pk": "p"})["_etag"]
    url = f"{cosmos_server.endpoint}dbs/{cosmos_database.id}/colls/items/docs/a"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"If-None-Match": etag, "x-ms-documentdb-partitionkey": '["p"]'})
    with pytest.raises(urllib.error.HTTPError) as caught:  # urllib reports 304 as an error
        urllib.request.urlopen(request, timeout=5, context=context)
    assert caught.value.code == 304
    assert caught.value.headers["etag"] == etag
    assert caught.value.read() == b""


# 5. Transactional batch -------------------------------------------------------------------------------------


def test_batch_applies_all_operation_types(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    container.create_item({"id": "x", "pk": "p", "n": 1})
    container.create_item({"id": "y", "pk": "p", "n": 1})
    results = container.execute_item_batch(
        [
            ("create", ({"id": "b1", "pk": "p"},)),
            ("upsert", ({"id": "b2", "pk": "p"},)),
            ("replace", ("x", {"id": "x", "pk": "p", "n": 2})),
            ("patch", ("y", [{"op": "incr", "path": "/n", "value": 5}])),
            ("read", ("x",)),
            ("delete", ("b2",)),
        ],
        partition_key="p",
    )
    assert [r["statusCode"] for r in results] == [201, 201, 200, 200, 200, 204]
    assert results[4]["resourceBody"]["n"] == 2
    assert container.read_item("y", partition_key="p")["n"] == 6
    assert sorted(d["id"] for d in container.query_items("SELECT * FROM c", partition_key="p")) == ["b1", "x", "y"]


def test_failed_batch_rolls_back_every_operation(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    container.create_item({"id": "x", "pk": "p", "n": 1})
    before = sorted((d["id"], d["_etag"]) for d in container.query_items("SELECT * FROM c", partition_key="p"))
    _, token = read_change_feed(container, None)

    with pytest.raises(exceptions.CosmosBatchOperationError) as caught:
        container.execute_item_batch(
            [
                ("create", ({"id": "new", "pk": "p"},)),
                ("replace", ("x", {"id": "x", "pk": "p", "n": 2})),
                ("create", ({"id": "x", "pk": "p"},)),  # 409: fails the whole batch
            ],
            partition_key="p",
        )
    assert caught.value.status_code == 409 and caught.value.error_index == 2
    assert [r["statusCode"] for r in caught.value.operation_responses] == [424, 424, 409]

    after = sorted((d["id"], d["_etag"]) for d in container.query_items("SELECT * FROM c", partition_key="p"))
    assert after == before
    assert read_change_feed(container, token)[0] == []  # nothing reached the change feed either

    with pytest.raises(exceptions.CosmosBatchOperationError) as stale:
        container.execute_item_batch(
            [("replace", ("x", {"id": "x", "pk": "p"}), {"if_match_etag": "stale"})], partition_key="p"
        )
    assert stale.value.status_code == 412


# 6. Optimistic concurrency ----------------------------------------------------------------------------------


def test_stale_etag_is_rejected_with_412(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    first = container.create_item({"id": "a", "pk": "p", "n": 1})
    second = container.replace_item(
        "a", {"id": "a", "pk": "p", "n": 2}, etag=first["_etag"], match_condition=MatchConditions.IfNotModified
    )
    assert second["_etag"] != first["_etag"]
    stale = {"etag": first["_etag"], "match_condition": MatchConditions.IfNotModified}
    with pytest.raises(exceptions.CosmosAccessConditionFailedError):
        container.replace_item("a", {"id": "a", "pk": "p", "n": 3}, **stale)
    with pytest.raises(exceptions.CosmosAccessConditionFailedError):
        container.patch_item(
            "a", partition_key="p", patch_operations=[{"op": "set", "path": "/n", "value": 3}], **stale
        )
    with pytest.raises(exceptions.CosmosAccessConditionFailedError):
        container.upsert_item({"id": "a", "pk": "p", "n": 3}, **stale)
    with pytest.raises(exceptions.CosmosAccessConditionFailedError):
        container.delete_item("a", partition_key="p", **stale)
    patched = container.patch_item(
        "a",
        partition_key="p",
        patch_operations=[{"op": "incr", "path": "/n", "value": 1}],
        etag=second["_etag"],
        match_condition=MatchConditions.IfNotModified,
    )
    assert patched["n"] == 3


# 7. Request counters ----------------------------------------------------------------------------------------


def test_stats_count_requests_by_method_resource_and_operation(
    cosmos_server: CosmosServer, cosmos_database: Any
) -> None:
    container = make_container(cosmos_database)
    cosmos_server.reset_stats()
    assert cosmos_server.stats() == {"total": 0, "by_method_resource": {}, "by_operation": {}}

    container.upsert_item({"id": "a", "pk": "p"})
    container.upsert_item({"id": "b", "pk": "p"})
    container.read_item("a", partition_key="p")
    list(container.query_items("SELECT * FROM c", partition_key="p"))
    stats = cosmos_server.stats()
    assert stats["by_method_resource"] == {"POST docs": 3, "GET docs": 1}
    assert stats["by_operation"] == {"upsert docs": 2, "read docs": 1, "query docs": 1}
    assert stats["total"] == 4  # the stats calls themselves are not counted

    cosmos_server.reset_stats()
    assert cosmos_server.stats()["total"] == 0


# 8. Hierarchical partition keys ---------------------------------------------------------------------------------

AGENT_THEN_ID = PartitionKey(path=["/agent_id", "/id"], kind="MultiHash")
BY_AGENT_SEQ_ID = {
    "compositeIndexes": [
        [
            {"path": "/agent_id", "order": "ascending"},
            {"path": "/seq", "order": "ascending"},
            {"path": "/id", "order": "ascending"},
        ]
    ],
}


def hierarchical(database: Any, name: str = "slots") -> Any:
    """A container keyed by [agent_id, id] (as the store's scores), with two agents' items e0..e3."""
    container = database.create_container(name, partition_key=AGENT_THEN_ID, indexing_policy=BY_AGENT_SEQ_ID)
    for agent in ("A", "B"):
        for i in range(4):
            container.create_item({"id": f"e{i}", "agent_id": agent, "seq": 10 - i})
    return container


def test_a_container_takes_a_hierarchical_key_of_two_or_three_levels_version_2(cosmos_database: Any) -> None:
    container = hierarchical(cosmos_database)
    assert container.read()["partitionKey"] == {"paths": ["/agent_id", "/id"], "kind": "MultiHash", "version": 2}
    three = PartitionKey(path=["/tenant", "/agent_id", "/id"], kind="MultiHash")
    assert cosmos_database.create_container("three", partition_key=three).read()["partitionKey"]["paths"] == [
        "/tenant", "/agent_id", "/id"
    ]
    for name, key in {
        "four levels": PartitionKey(path=["/a", "/b", "/c", "/d"], kind="MultiHash"),
        "version 1": PartitionKey(path=["/a", "/b"], kind="MultiHash", version=1),
    }.items():
        with pytest.raises(exceptions.CosmosHttpResponseError) as caught:
            cosmos_database.create_container(name.replace(" ", "-"), partition_key=key)
        assert caught.value.status_code == 400, name


def test_point_operations_on_a_hierarchical_key_take_the_full_key(cosmos_database: Any) -> None:
    container = hierarchical(cosmos_database)
    a1, b1 = container.read_item("e1", partition_key=["A", "e1"]), container.read_item("e1", partition_key=["B", "e1"])
    assert (a1["agent_id"], b1["agent_id"]) == ("A", "B") and a1["_rid"] != b1["_rid"]  # one id, two items
    with pytest.raises(exceptions.CosmosResourceExistsError):
        container.create_item({"id": "e1", "agent_id": "A"})
    with pytest.raises(exceptions.CosmosResourceNotFoundError):
        container.read_item("e1", partition_key=["C", "e1"])
    with pytest.raises(exceptions.CosmosHttpResponseError) as caught:  # a prefix is no key for a point read
        container.read_item("e1", partition_key=["A"])
    assert caught.value.status_code == 400

    container.replace_item("e1", {**a1, "seq": 99}, etag=a1["_etag"], match_condition=MatchConditions.IfNotModified)
    with pytest.raises(exceptions.CosmosAccessConditionFailedError):
        container.replace_item("e1", {**a1, "seq": 98}, etag=a1["_etag"], match_condition=MatchConditions.IfNotModified)
    container.upsert_item({"id": "e9", "agent_id": "B", "seq": 1})
    container.patch_item("e9", partition_key=["B", "e9"], patch_operations=[{"op": "set", "path": "/seq", "value": 2}])
    assert container.read_item("e9", partition_key=["B", "e9"])["seq"] == 2
    container.delete_item("e1", partition_key=["A", "e1"])
    assert container.read_item("e1", partition_key=["B", "e1"])["seq"] == 9  # B's e1 stays
    with pytest.raises(exceptions.CosmosResourceNotFoundError):
        container.read_item("e1", partition_key=["A", "e1"])


def test_a_write_whose_key_header_is_not_the_documents_is_rejected(
    cosmos_server: CosmosServer, cosmos_database: Any
) -> None:
    """At the HTTP level (the SDK derives the header from the document): Cosmos answers 400."""
    hierarchical(cosmos_database)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    url = f"{cosmos_server.endpoint}dbs/{cosmos_database.id}/colls/slots/docs"
    for header in ('["A", "other"]', '["A"]'):
        request = urllib.request.Request(
            url,
            data=json.dumps({"id": "new", "agent_id": "A"}).encode(),
            headers={"x-ms-documentdb-partitionkey": header, "content-type": "application/json"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5, context=context)
        assert caught.value.code == 400, header
        assert "Partition key provided" in caught.value.read().decode()


def test_a_query_or_change_feed_on_a_key_prefix_is_scoped_to_it(
    cosmos_server: CosmosServer, cosmos_database: Any
) -> None:
    container = hierarchical(cosmos_database)
    cosmos_server.reset_stats()
    rows = container.query_items(
        "SELECT TOP @n * FROM c WHERE c.seq > @seq ORDER BY c.agent_id, c.seq, c.id",
        parameters=[{"name": "@n", "value": 2}, {"name": "@seq", "value": 7}],
        partition_key=["A"],
    )
    assert [(d["agent_id"], d["id"]) for d in rows] == [("A", "e2"), ("A", "e1")]  # without B's, though unfiltered
    assert cosmos_server.stats()["by_operation"]["query docs"] == 1  # one request, not one per key
    everything = container.query_items("SELECT VALUE c.id FROM c", partition_key=["B"])
    assert sorted(everything) == ["e0", "e1", "e2", "e3"]
    assert list(container.query_items("SELECT VALUE c.agent_id FROM c", partition_key=["B", "e2"])) == ["B"]
    pages = container.query_items("SELECT * FROM c ORDER BY c.agent_id, c.seq, c.id", partition_key=["A"],
                                  max_item_count=3).by_page()
    assert [len(list(page)) for page in pages] == [3, 1]
    across = container.query_items("SELECT VALUE c.id FROM c", enable_cross_partition_query=True)
    assert len(list(across)) == 8
    feed = container.query_items_change_feed(start_time="Beginning", partition_key=["B"])  # a change feed too
    assert [(d["agent_id"], d["id"]) for d in feed] == [("B", f"e{i}") for i in range(4)]


# Behaviours of the stock server the project relies on --------------------------------------------------------


def test_order_by_two_fields_across_partitions_with_parameters_and_paging(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    for i in range(9):
        container.create_item({"id": f"i{i}", "pk": f"p{i % 3}", "seq": (9 - i) // 2, "kind": "x"})
    container.create_item({"id": "other", "pk": "p0", "seq": 0, "kind": "y"})
    pager = container.query_items(
        "SELECT * FROM c WHERE c.kind = @kind ORDER BY c.seq, c.id",
        parameters=[{"name": "@kind", "value": "x"}],
        enable_cross_partition_query=True,
        max_item_count=4,
    ).by_page()
    pages = [[(d["seq"], d["id"]) for d in page] for page in pager]
    assert [len(p) for p in pages] == [4, 4, 1]
    flat = [row for page in pages for row in page]
    assert flat == sorted(flat) and len(flat) == 9

    top = container.query_items(
        "SELECT TOP 2 c.id FROM c ORDER BY c.seq DESC, c.id DESC", enable_cross_partition_query=True
    )
    assert [d["id"] for d in top] == ["i1", "i0"]

    plain = cosmos_database.create_container_if_not_exists("plain", partition_key=PartitionKey("/pk"))
    plain.create_item({"id": "a", "pk": "p", "seq": 1})
    with pytest.raises(exceptions.CosmosHttpResponseError) as caught:  # as in Cosmos: needs a composite index
        list(plain.query_items("SELECT * FROM c ORDER BY c.seq, c.id", enable_cross_partition_query=True))
    assert caught.value.status_code == 400


def test_container_with_composite_index_and_ttl_is_created_once(cosmos_database: Any) -> None:
    container = make_container(cosmos_database, default_ttl=3600)
    again = make_container(cosmos_database, default_ttl=3600)
    properties = again.read()
    assert container.id == again.id
    assert properties["defaultTtl"] == 3600  # accepted and stored; items do not expire here
    assert properties["indexingPolicy"]["compositeIndexes"] == COMPOSITE_SEQ_ID["compositeIndexes"]
    assert properties["partitionKey"]["paths"] == ["/pk"]


def test_items_have_system_properties_and_duplicate_ids_conflict_per_partition(cosmos_database: Any) -> None:
    container = make_container(cosmos_database)
    item = container.create_item({"id": "a", "pk": "p"})
    assert isinstance(item["_ts"], int) and item["_etag"] and item["_rid"]
    assert container.read_item("a", partition_key="p")["_etag"] == item["_etag"]
    with pytest.raises(exceptions.CosmosResourceExistsError) as caught:
        container.create_item({"id": "a", "pk": "p"})
    assert caught.value.status_code == 409
    container.create_item({"id": "a", "pk": "q"})  # same id, other partition: allowed


def test_async_client_creates_and_reads(cosmos_server: CosmosServer, cosmos_database: Any) -> None:
    from azure.cosmos.aio import CosmosClient as AsyncCosmosClient

    make_container(cosmos_database)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with AsyncCosmosClient(cosmos_server.endpoint, credential=cosmos_server.key, **CLIENT_KWARGS) as client:
            container = client.get_database_client(cosmos_database.id).get_container_client("items")
            created = await container.create_item({"id": "a", "pk": "p", "n": 1})
            read = await container.read_item("a", partition_key="p")
            with pytest.raises(exceptions.CosmosResourceNotFoundError):
                await container.read_item("missing", partition_key="p")
            return created, read

    created, read = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert read["n"] == 1 and read["_etag"] == created["_etag"]


def test_client_kwargs_set_the_sdk_timeouts(cosmos_client: Any) -> None:
    policy = cosmos_client.client_connection.connection_policy
    assert policy.RequestTimeout == CLIENT_KWARGS["connection_timeout"]
    assert policy.ReadTimeout == CLIENT_KWARGS["read_timeout"]
